"""docs/migrating.md: its Python blocks run, in order, in one namespace (as a reader would paste them)."""

import contextlib
import io
import os
import re

DOC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "migrating.md")


def test_every_python_block_runs():
    text = open(DOC, encoding="utf-8").read()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) >= 5
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        for i, block in enumerate(blocks):
            exec(compile(block, f"{DOC}:block{i}", "exec"), namespace)
    printed = out.getvalue()
    # the outputs the page states in its comments
    assert "sample_and_rank 2 4" in printed and "beam_search 3" in printed
    assert "(2, 6)" in printed and "(2, 1, 5)" in printed and "(2, 2, 6)" in printed
    assert "need eos_token_id" in printed and "unknown field 'num_beem'" in printed
    assert "temperature must be in [0, 2]" in printed and "n must be 1 when using greedy sampling" in printed
    assert "['grammar', 'top_k', 'temperature'] adaptive_p" in printed
    assert "('\\n\\n',) ['allowed_tokens', 'bad_words']" in printed
