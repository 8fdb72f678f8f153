"""Every file the docs, the build files and the code's comments cite exists: a path into the
repository (`oominfer/rules/versions.py`), into shared/ beside it (`../shared/ENVIRONMENT.md`,
which CI's clone has too), or a bare document name (`README.md`) next to the citing file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
TOP_DIRS = ("oominfer", "tests", "bench", "tools", "deploy", "serve", ".ci")
CITED = re.compile(
    r"(?<![\w./-])((?:\.\./shared/)?[\w.-]+(?:/[\w.-]+)*\.(?:py|md|toml|ya?ml|jsonl?|txt|sh))\b"
)
SOURCES = [
    REPO / "README.md",
    REPO / "Makefile",
    REPO / "pyproject.toml",
    REPO / ".ci" / "run",
    REPO / ".dockerignore",
    *sorted((REPO / "deploy").rglob("README.md")),
    *sorted((REPO / "serve").iterdir()),
    *sorted((REPO / "oominfer").rglob("*.py")),
    *sorted((REPO / "tests").glob("*.py")),
    *sorted((REPO / "bench").glob("*.py")),
    *sorted((REPO / "tools").glob("*.py")),
]


def dead_citations(source: Path) -> list[str]:
    dead = []
    for cited in dict.fromkeys(CITED.findall(source.read_text(encoding="utf-8"))):
        if cited.startswith("../shared/"):
            if SHARED.is_dir() and not (REPO / cited).exists():
                dead.append(cited)
        elif cited.split("/")[0] in TOP_DIRS:
            if not (REPO / cited).exists() and not (source.parent / cited).exists():
                dead.append(cited)
        elif (
            re.fullmatch(r"[A-Z][A-Z_]*\.md", cited)
            and not (source.parent / cited).exists()
            and not (REPO / cited).exists()
        ):
            dead.append(cited)
    return dead


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_file_exists(source: Path) -> None:
    assert not dead_citations(source), f"{source.relative_to(REPO)} cites missing files"
