"""No function in src/reservo is 70 lines long or longer (its decorators, signature
and docstring included): a longer one does several things that want names."""

from __future__ import annotations

import ast
from pathlib import Path

import reservo

LIMIT = 70
SRC = Path(reservo.__file__).parent


def long_functions() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                length = (node.end_lineno or node.lineno) - first + 1
                if length >= LIMIT:
                    where = path.relative_to(SRC.parent)
                    found.append(f"{where}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_is_70_lines_or_longer() -> None:
    assert long_functions() == []
