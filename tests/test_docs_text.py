"""Runs the fenced python blocks of docs/text.md, in order, in one namespace."""

import pathlib
import re

import pytest

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "text.md"


def python_blocks(path: pathlib.Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)


def test_text_page_blocks_run():
    pytest.importorskip("sentencepiece")
    pytest.importorskip("transformers")
    blocks = python_blocks(PAGE)
    assert len(blocks) >= 6
    namespace: dict = {}
    for i, block in enumerate(blocks):
        exec(compile(block, f"{PAGE.name}[block {i}]", "exec"), namespace)
