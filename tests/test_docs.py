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


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_readme_completion_commands_print_a_completion_script(shell: str) -> None:
    from click.testing import CliRunner

    from oominfer.cli import main

    readme = (REPO / "README.md").read_text()
    assert f"_OOMINFER_COMPLETE={shell}_source oominfer" in readme
    env = {"_OOMINFER_COMPLETE": f"{shell}_source"}
    result = CliRunner().invoke(main, [], prog_name="oominfer", env=env)
    assert result.exit_code == 0, result.output
    assert "_OOMINFER_COMPLETE" in result.output and "oominfer" in result.output


def test_the_readme_k8s_commands_use_the_real_flags() -> None:
    import shlex

    from oominfer.cli.k8s import k8s_command

    known = {o for p in k8s_command.params for o in getattr(p, "opts", [])}
    lines = [
        line.split("#")[0].strip()
        for line in (REPO / "README.md").read_text().splitlines()
        if line.strip().startswith("oominfer k8s ")
    ]
    assert any("--image" in line for line in lines)
    for line in lines:
        flags = {a.split("=")[0] for a in shlex.split(line) if a.startswith("--")}
        assert flags <= known, line


def test_make_image_tags_the_image_the_manifests_run() -> None:
    import shutil
    import subprocess

    from oominfer.k8s import DEFAULT_IMAGE

    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    dry = subprocess.run(
        ["make", "-s", "-n", "-C", str(REPO), "image"], capture_output=True, text=True, check=True
    )
    assert f"docker build -f serve/Dockerfile -t {DEFAULT_IMAGE} ." in dry.stdout
