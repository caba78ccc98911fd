"""The README's Python examples run as written, and the results their comments state hold.

A line ``expression  # [[64770]] ...`` states its value: the comment's leading literal is
compared with the expression's value (as a nested list). Blocks run in order, each in a
fresh namespace, the way a reader pastes them.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import numpy as np
import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
_STATED = re.compile(r"^(?P<code>[^#]+?)\s+#\s*(?P<value>\[[\[\]\d\s,.-]*\])")


def _blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.S)


def _stated(block: str) -> list[tuple[str, object]]:
    """(expression, stated value) for the block's lines whose comment states a value."""
    found = []
    for line in block.splitlines():
        m = _STATED.match(line)
        if m:
            code = m.group("code").strip()
            try:
                ast.parse(code, mode="eval")
            except SyntaxError:
                continue  # a statement (an assignment): nothing stated
            found.append((code, ast.literal_eval(m.group("value"))))
    return found


def test_the_readme_has_examples_with_stated_results():
    blocks = _blocks()
    assert len(blocks) >= 2
    assert sum(len(_stated(b)) for b in blocks) >= 2


@pytest.mark.parametrize("index", range(len(_blocks())))
def test_readme_example_runs(index, capsys):
    block = _blocks()[index]
    namespace: dict = {"__name__": f"readme_example_{index}"}
    exec(compile(block, f"README.md python block {index}", "exec"), namespace)
    for code, value in _stated(block):
        got = np.asarray(eval(code, namespace)).tolist()
        assert got == value, f"README: {code} gives {got}, the comment says {value}"
