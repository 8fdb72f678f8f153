"""The serve/ image's build context: .dockerignore is an allow-list that keeps it to what
`pip install .` reads, under 50 MB even with the venvs and caches `make test` leaves.

No Docker daemon runs here, so the context is computed with Docker's own rules for
.dockerignore (github.com/moby/patternmatcher): patterns are cleaned paths relative to the
context, `*` and `?` stay within a path element, `**` spans any number of them, a `!` line
re-includes, the last matching line wins, and a line that matches a folder matches
everything in it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LIMIT_BYTES = 50 * 1000**2
Rules = list[tuple[bool, re.Pattern[str], str]]


def _regex(pattern: str) -> re.Pattern[str]:
    """patternmatcher's translation of one pattern into an anchored regular expression."""
    out, i = "", 0
    while i < len(pattern):
        char = pattern[i]
        if pattern.startswith("**/", i):
            out, i = out + "(.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif char == "*":
            out, i = out + "[^/]*", i + 1
        elif char == "?":
            out, i = out + "[^/]", i + 1
        elif char == "[":
            end = pattern.index("]", i)
            out, i = out + pattern[i : end + 1], end + 1
        else:
            out, i = out + re.escape(char), i + 1
    return re.compile(f"^{out}$")


def parse(text: str) -> Rules:
    """(is an exception, regex, the pattern's literal prefix) per line of a .dockerignore."""
    rules: Rules = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = os.path.normpath(line.removeprefix("!").strip()).lstrip("/")
        prefix = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
        rules.append((negate, _regex(pattern), prefix))
    return rules


def excluded(rel: str, rules: Rules) -> bool:
    """Whether ``rel`` (a path relative to the context) stays out of the context."""
    parts = rel.split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    result = False
    for negate, regex, _ in rules:
        if any(regex.match(path) for path in candidates):
            result = not negate
    return result


def context_files(root: Path, rules: Rules) -> dict[str, int]:
    """Every file the context holds, with its size; excluded folders that no exception can
    reach into are not walked (as Docker does not)."""
    files: dict[str, int] = {}
    for folder, dirs, names in os.walk(root):
        rel_folder = os.path.relpath(folder, root)
        rel_folder = "" if rel_folder == "." else rel_folder + "/"
        kept = []
        for d in dirs:
            rel = rel_folder + d
            reachable = any(neg and prefix.startswith(rel + "/") for neg, _, prefix in rules)
            if not excluded(rel, rules) or reachable:
                kept.append(d)
        dirs[:] = kept
        for name in names:
            rel = rel_folder + name
            if not excluded(rel, rules):
                files[rel] = (Path(folder) / name).lstat().st_size
    return files


@pytest.mark.parametrize(
    ("patterns", "path", "out"),
    [
        # Docker's documented examples (docs.docker.com, "Build context: .dockerignore").
        (["*/temp*"], "somedir/temporary.txt", True),
        (["*/temp*"], "temp", False),
        (["*/*/temp*"], "somedir/subdir/temporary.txt", True),
        (["temp?"], "tempa", True),
        (["temp?"], "tempab", False),
        (["**/*.go"], "a/b/c.go", True),
        (["**/*.go"], "c.go", True),
        (["*.md", "!README*.md"], "README-secret.md", False),
        (["*.md", "!README*.md", "README-secret.md"], "README-secret.md", True),
        # A folder's line covers what is inside it; the last matching line wins.
        (["*"], ".venv/lib/python3.11/site-packages/torch/lib/libtorch.so", True),
        (["*", "!oominfer/"], "oominfer/k8s/render.py", False),
        (["*", "!oominfer/", "**/__pycache__"], "oominfer/__pycache__/x.pyc", True),
        (["/build"], "build/lib/x.py", True),
    ],
)
def test_the_rules_are_dockers(patterns: list[str], path: str, out: bool) -> None:
    assert excluded(path, parse("\n".join(patterns))) is out


def dockerfile_copy_sources() -> list[str]:
    """What serve/Dockerfile copies from the build context."""
    sources: list[str] = []
    for line in (REPO / "serve" / "Dockerfile").read_text().splitlines():
        if line.startswith("COPY ") and "--from" not in line:
            sources += line.split()[1:-1]
    return sources


def test_the_context_holds_what_the_image_copies_and_stays_small() -> None:
    """Measured on this checkout, with whatever `make test` left in it (.venv, caches)."""
    files = context_files(REPO, parse((REPO / ".dockerignore").read_text()))
    for source in dockerfile_copy_sources():
        assert source in files or any(f.startswith(source + "/") for f in files), source
    assert {f.split("/")[0] for f in files} == {
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "oominfer",
    }
    assert "oominfer/py.typed" in files and "oominfer/data/models.json" in files
    total = sum(files.values())
    assert total < LIMIT_BYTES, f"the build context is {total / 1e6:.1f} MB"


def test_the_venvs_and_caches_make_test_leaves_stay_out(tmp_path: Path) -> None:
    (tmp_path / ".dockerignore").write_text((REPO / ".dockerignore").read_text())
    left = {
        ".venv/lib/python3.11/site-packages/torch/lib/libtorch_cpu.so": 3 * 1000**3,
        ".venv-vllm033/lib/python3.11/site-packages/vllm/_C.abi3.so": 900 * 1000**2,
        ".pytest_cache/v/cache/nodeids": 10,
        ".mypy_cache/3.10/oominfer/k8s.data.json": 10,
        ".ruff_cache/0.6/x": 10,
        ".git/objects/pack/pack-1.pack": 80 * 1000**2,
        "oominfer.egg-info/PKG-INFO": 10,
        "oominfer/__pycache__/__init__.cpython-311.pyc": 10,
        "oominfer/k8s/__pycache__/render.cpython-311.pyc": 10,
        "build/lib/oominfer/__init__.py": 10,
        "plan.json": 10,
        "tests/test_k8s.py": 10,
        "deploy/k8s/base/plan.json": 10,
        "oominfer/__init__.py": 10,
        "oominfer/k8s/render.py": 10,
        "pyproject.toml": 10,
        "README.md": 10,
        "LICENSE": 10,
    }
    for rel, size in left.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("wb") as f:
            f.truncate(size)  # sparse: the size counts, no disk is used
    files = context_files(tmp_path, parse((REPO / ".dockerignore").read_text()))
    assert sorted(files) == [
        "LICENSE",
        "README.md",
        "oominfer/__init__.py",
        "oominfer/k8s/render.py",
        "pyproject.toml",
    ]
