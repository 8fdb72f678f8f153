"""`oominfer --help` is written for users, and every flag of every command says what it does."""

from __future__ import annotations

import ast
import dataclasses
import shlex
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from click.testing import CliRunner

from oominfer.cli import main
from oominfer.k8s.options import K8sOptions


def commands(command: click.Command, path: str = "oominfer") -> Iterator[tuple[str, click.Command]]:
    """``command`` and every command below it, each with its path (``oominfer k8s``)."""
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in sorted(command.commands.items()):
            yield from commands(sub, f"{path} {name}")


def flag(option: click.Option) -> str:
    """The option's long name (``--tensor-parallel-size`` rather than ``-tp``)."""
    return max([*option.opts, *option.secondary_opts], key=len)


def missing_help() -> dict[str, list[str]]:
    """Each visible option without help text, by command."""
    missing: dict[str, list[str]] = {}
    for path, command in commands(main):
        for param in command.params:
            visible = isinstance(param, click.Option) and not param.hidden
            if visible and not (param.help or "").strip():
                missing.setdefault(path, []).append(flag(param))
    return missing


def test_the_walk_reaches_every_command() -> None:
    paths = [path for path, _ in commands(main)]
    for name in ("estimate", "fit", "serve", "k8s", "gpus", "models"):
        assert f"oominfer {name}" in paths


def test_every_flag_has_help() -> None:
    """Engine settings take theirs from their one declaration (oominfer/settings)."""
    missing = missing_help()
    assert not missing, f"options without help= (say what each does): {missing}"


def test_a_flag_without_help_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    bare = click.Option(["--bare-flag"])
    monkeypatch.setattr(main.commands["gpus"], "params", [*main.commands["gpus"].params, bare])
    assert missing_help()["oominfer gpus"] == ["--bare-flag"]


# --- oominfer --help -----------------------------------------------------------------------


def top_help() -> str:
    result = CliRunner().invoke(main, ["--help"], prog_name="oominfer")
    assert result.exit_code == 0, result.output
    return result.stdout


def test_help_opens_with_what_oominfer_does() -> None:
    text = top_help()
    first = text.split("\n\n")[1].strip()
    assert first == "Make a large language model fit the GPU you have, prove it, serve it."
    for developer_text in ("``", "command group", "docstring"):
        assert developer_text not in text


def examples() -> list[list[str]]:
    """The example command lines of ``oominfer --help``, without their comments."""
    lines = top_help().split("Examples:", 1)[1].split("\n\n", 1)[0].strip().splitlines()
    return [shlex.split(line, comments=True) for line in lines]


def test_the_examples_show_every_main_command() -> None:
    shown = {argv[1] for argv in examples()}
    assert shown >= {"estimate", "fit", "serve", "k8s", "gpus", "models"}


@pytest.mark.parametrize("argv", examples(), ids=lambda argv: argv[1])
def test_each_example_uses_real_flags(argv: list[str]) -> None:
    assert argv[0] == "oominfer"
    command = main.commands[argv[1]]
    known = {o for p in command.params for o in [*p.opts, *p.secondary_opts]}
    flags = [a for a in argv[2:] if a.startswith("-")]
    assert set(flags) <= known, argv
    # Under the group's context, as the command line runs it (click keeps the help option of
    # the first context a command is parsed in).
    parent = click.Context(main, info_name="oominfer", **main.context_settings)
    context = command.make_context(argv[1], argv[2:], parent=parent, resilient_parsing=True)
    assert context.params  # parsed: arguments and flags in the right places


def test_the_offline_examples_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In order, as a user would: estimate, fit (not verified: no GPU here), then k8s on the
    # plan fit wrote; serve needs the engine and a GPU, its flags are checked above.
    monkeypatch.setenv("OOMINFER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    for argv in examples():
        if argv[1] == "serve":
            continue
        args = [*argv[1:], "--no-verify"] if argv[1] == "fit" else argv[1:]
        result = CliRunner().invoke(main, args, prog_name="oominfer")
        allowed = (0, 3) if argv[1] == "estimate" else (0,)  # "will it fit?": either answer
        assert result.exit_code in allowed, (argv, result.output)
    assert (tmp_path / "plan.json").is_file()
    assert (tmp_path / "deploy" / "qwen3-8b" / "kustomization.yaml").is_file()


def test_every_k8s_option_says_what_it_is() -> None:
    # K8sOptions is what `oominfer k8s` and the Python API take: each field has a docstring.
    source = (Path(__file__).resolve().parents[1] / "oominfer" / "k8s" / "options.py").read_text()
    (cls,) = [
        node
        for node in ast.parse(source).body
        if isinstance(node, ast.ClassDef) and node.name == "K8sOptions"
    ]
    body = cls.body
    fields = [(i, n) for i, n in enumerate(body) if isinstance(n, ast.AnnAssign)]
    assert len(fields) == len(dataclasses.fields(K8sOptions))
    bare = [
        ast.unparse(node.target)
        for i, node in fields
        if not (
            i + 1 < len(body)
            and isinstance(body[i + 1], ast.Expr)
            and isinstance(getattr(body[i + 1], "value", None), ast.Constant)
        )
    ]
    assert not bare, f"K8sOptions fields without a docstring: {bare}"
