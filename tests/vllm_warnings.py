"""The "not supported" texts vLLM logs at WARNING or INFO level, read from its source.

A healthy engine prints some of them (``Custom allreduce is disabled because it's not
supported on more than two PCIe-only GPUs`` on any 4xL4 node), so the log classifier must not
take them for failures. ``logged_texts(root)`` walks a vLLM source tree with ``ast`` (nothing
is imported) and returns each such call's format string, its placeholders filled with sample
values; tests/data/vllm_logs/not_supported_warnings.txt keeps them per version, and the
test replays them inside a healthy log.

    python tests/vllm_warnings.py /path/to/site-packages/vllm 0.32.0   # prints the block
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

PHRASES = re.compile(r"not supported|does not support|doesn't support|not support|unsupported",
                     re.I)  # fmt: skip
LEVELS = {"warning", "warning_once", "warn", "info", "info_once"}
"""The logger methods of a record a healthy engine may print (vllm/logger.py adds the
``_once`` variants)."""
_PLACEHOLDER = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrifgx]|\{[^{}]*\}")


def _text(node: ast.expr) -> str | None:
    """The literal text of a message argument: a string, an f-string (its expressions become
    ``{}``), or an implicit concatenation of those; None for anything computed."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant):
                parts.append(str(value.value))
            else:
                parts.append("{}")
        return "".join(parts)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return left + right if left is not None and right is not None else None
    return None


def _sample(template: str) -> str:
    """The message as a log would show it: every placeholder becomes ``X``."""
    return " ".join(_PLACEHOLDER.sub("X", template).split())


def logged_texts(root: Path) -> list[str]:
    """Every WARNING/INFO message under ``root`` that says something is not supported."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr not in LEVELS or not node.args:
                continue
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else getattr(owner, "attr", "")
            if "log" not in name.lower():
                continue
            text = _text(node.args[0])
            if text and PHRASES.search(text):
                found.add(_sample(text))
    return sorted(found)


if __name__ == "__main__":
    root, version = Path(sys.argv[1]), sys.argv[2]
    print(f"## vllm {version}")
    for text in logged_texts(root):
        print(text)
