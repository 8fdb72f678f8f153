#!/usr/bin/env python3
"""Rewrite README's "Exit codes" table from the one table in the code (``EXIT_CODES`` in
oominfer/base/errors.py), between its two ``exit-codes`` markers.

tests/test_exit_status.py fails when the README's copy drifts from the code; this fixes it.

Usage: python tools/readme_exit_codes.py [--readme PATH]   (default: the repo's README.md)
"""

from __future__ import annotations

import argparse
from pathlib import Path

from oominfer.base.errors import exit_codes_markdown

README = Path(__file__).resolve().parent.parent / "README.md"
BEGIN = "<!-- exit-codes: rendered from EXIT_CODES (oominfer/base/errors.py) by tools/readme_exit_codes.py -->\n"  # noqa: E501
END = "<!-- /exit-codes -->\n"


def rendered(text: str) -> str:
    """``text`` (a README) with the table between the markers rendered from the code.

    Raises:
        ValueError: the README lacks the markers.
    """
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"the README has no {BEGIN.strip()} ... {END.strip()} markers")
    return text[: start + len(BEGIN)] + exit_codes_markdown() + text[end:]


def main() -> None:
    """Rewrite the README in place (only the table changes)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--readme", type=Path, default=README)
    path = parser.parse_args().readme
    text = path.read_text()
    new = rendered(text)
    if new != text:
        path.write_text(new)
        print(f"rewrote the exit codes in {path}")


if __name__ == "__main__":
    main()
