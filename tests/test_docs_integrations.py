"""The docs pages of the model-integration paths run: every fenced ``python`` block of each page is
executed in order in one namespace (a page is one script)."""

import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["own_model.md", "generate.md", "padding.md", "nnx.md", "gemma_style.md", "shared_index_caches.md"]


def python_blocks(text: str) -> list[str]:
    """The fenced ```python blocks of a markdown page, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


@pytest.mark.parametrize("page", PAGES)
def test_page_code_blocks_run(page):
    with open(os.path.join(ROOT, "docs", page), encoding="utf-8") as f:
        blocks = python_blocks(f.read())
    assert blocks, f"docs/{page} has no python blocks"
    namespace: dict = {"__name__": f"docs_{page[:-3]}"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"docs/{page}[block {i}]", "exec"), namespace)  # noqa: S102
