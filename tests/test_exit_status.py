"""Exit codes are a public interface: pin every value and every error's code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from _scripts import REPO, load_script
from click.testing import CliRunner

import oominfer.api
from oominfer import cli
from oominfer.base.errors import (
    EXIT_CODES,
    CorruptWeightsError,
    DoesNotFitError,
    ExitStatus,
    GatedModelError,
    IncompleteCheckpointError,
    InvalidSettingError,
    ModelError,
    ModelNotFoundError,
    OominferError,
    OutputError,
    PlanError,
    ProbeFailedError,
    UnknownGpuError,
    UnsupportedConfigError,
)
from oominfer.serving.run import ServeExit

README = REPO / "README.md"
README_TOOL = load_script("tools/readme_exit_codes.py")


def test_exit_status_values() -> None:
    assert {s.name: int(s) for s in ExitStatus} == {
        "SUCCESS": 0,
        "ERROR": 1,
        "USAGE": 2,
        "DOES_NOT_FIT": 3,
        "PROBE_FAILED": 4,
        "MODEL_ERROR": 5,
        "CUT_SHORT": 6,
        "INTERRUPTED": 130,
    }


def test_every_code_has_its_meaning_written_once() -> None:
    assert list(EXIT_CODES) == sorted(ExitStatus)
    assert all(meaning and meaning == meaning.strip() for meaning in EXIT_CODES.values())


def test_serve_ends_with_codes_of_the_table() -> None:
    assert {int(code) for code in ServeExit} <= {int(code) for code in EXIT_CODES}
    assert ServeExit.DOES_NOT_FIT == ExitStatus.DOES_NOT_FIT
    assert ServeExit.ENGINE_FAILED == ExitStatus.PROBE_FAILED


def test_the_readme_table_is_rendered_from_the_code() -> None:
    readme = README.read_text()
    assert README_TOOL.rendered(readme) == readme, (
        "README.md's Exit codes table differs from EXIT_CODES in oominfer/base/errors.py: "
        "run `python tools/readme_exit_codes.py` to render it again."
    )
    assert "| 6 | `serve` only:" in readme and "| 130 | interrupted" in readme


def test_the_readme_tool_rewrites_a_drifted_table(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    drifted = README.read_text().replace("| 3 | does not fit", "| 3 | it did not fit")
    readme.write_text(drifted)
    assert README_TOOL.rendered(drifted) != drifted
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "readme_exit_codes.py"), "--readme", str(readme)],
        capture_output=True, text=True, check=False, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert readme.read_text() == README.read_text()
    with pytest.raises(ValueError, match="markers"):
        README_TOOL.rendered("# a README without the table\n")


ERROR_STATUS = [
    (OominferError, ExitStatus.ERROR),
    (InvalidSettingError, ExitStatus.USAGE),
    (UnknownGpuError, ExitStatus.USAGE),
    (ModelError, ExitStatus.MODEL_ERROR),
    (ModelNotFoundError, ExitStatus.MODEL_ERROR),
    (GatedModelError, ExitStatus.MODEL_ERROR),
    (UnsupportedConfigError, ExitStatus.MODEL_ERROR),
    (CorruptWeightsError, ExitStatus.MODEL_ERROR),
    (IncompleteCheckpointError, ExitStatus.MODEL_ERROR),
    (DoesNotFitError, ExitStatus.DOES_NOT_FIT),
    (ProbeFailedError, ExitStatus.PROBE_FAILED),
    (PlanError, ExitStatus.USAGE),
    (OutputError, ExitStatus.USAGE),
]

# The "error" field of the --json failure shape: a public interface, like the exit codes.
ERROR_KIND = {
    OominferError: "error",
    InvalidSettingError: "invalid_setting",
    UnknownGpuError: "unknown_gpu",
    ModelError: "model_error",
    ModelNotFoundError: "model_not_found",
    GatedModelError: "gated_model",
    UnsupportedConfigError: "unsupported_config",
    CorruptWeightsError: "corrupt_weights",
    IncompleteCheckpointError: "incomplete_checkpoint",
    DoesNotFitError: "does_not_fit",
    ProbeFailedError: "probe_failed",
    PlanError: "plan_error",
    OutputError: "output_error",
}


@pytest.mark.parametrize(("error", "status"), ERROR_STATUS)
def test_error_maps_to_status(error: type[OominferError], status: ExitStatus) -> None:
    assert error.exit_status is status
    assert issubclass(error, OominferError)
    err = error("something happened.", hint="Try --flag.")
    assert err.exit_status is status
    assert str(err) == err.message == "something happened."
    assert err.hint == "Try --flag."


def test_every_error_class_is_pinned() -> None:
    def subclasses(cls: type) -> set[type]:
        return {cls} | {s for c in cls.__subclasses__() for s in subclasses(c)}

    import oominfer.base.errors

    defined = {
        c for c in subclasses(OominferError) if c.__module__ == oominfer.base.errors.__name__
    }
    assert defined == {e for e, _ in ERROR_STATUS} == set(ERROR_KIND)


@pytest.mark.parametrize(("error", "kind"), ERROR_KIND.items())
def test_every_error_has_its_own_json_kind(error: type[OominferError], kind: str) -> None:
    assert error.kind == kind
    assert error("x.").data() == {} or error is DoesNotFitError
    assert len(set(ERROR_KIND.values())) == len(ERROR_KIND)  # no two classes share a kind


def test_does_not_fit_data_is_the_shortfall_and_the_ways_out() -> None:
    err = DoesNotFitError("short.", shortfall_bytes=5, ways_out=("--gpus 2", "-q fp8"))
    assert err.data() == {"shortfall_bytes": 5, "ways_out": ["--gpus 2", "-q fp8"]}
    assert err.hint == "Ways out: --gpus 2; -q fp8."


def test_does_not_fit_carries_the_shortfall() -> None:
    err = DoesNotFitError("needs 3 GiB more.", shortfall_bytes=3 * 1024**3)
    assert err.shortfall_bytes == 3 * 1024**3
    assert err.hint is None
    assert DoesNotFitError("x").shortfall_bytes == 0


@pytest.mark.parametrize("command", [[], ["serve"]])
def test_cli_help_documents_the_codes(command: list[str]) -> None:
    result = CliRunner().invoke(cli.main, [*command, "--help"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    for code, meaning in EXIT_CODES.items():
        assert f"{int(code)} {meaning}" in text


@pytest.mark.parametrize(("error", "status"), ERROR_STATUS)
def test_cli_exits_with_the_error_status(
    error: type[OominferError], status: ExitStatus, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(name: str, *, revision: str | None = None) -> None:
        raise error("it went wrong.", hint="Do this instead.")

    monkeypatch.setattr(oominfer.api, "load_spec", fail)
    result = CliRunner().invoke(cli.main, ["estimate", "some/model", "--gpu", "L4"])
    assert result.exit_code == int(status), result.output
    assert result.stdout == ""
    assert result.stderr.splitlines() == ["Error: it went wrong.", "Hint: Do this instead."]
    as_json = CliRunner().invoke(cli.main, ["estimate", "some/model", "--gpu", "L4", "--json"])
    assert as_json.exit_code == int(status), as_json.output
    assert as_json.stderr == ""
    assert json.loads(as_json.stdout) == {
        "error": error.kind,
        "exit_code": int(status),
        "message": "it went wrong.",
        "hint": "Do this instead.",
        **({"shortfall_bytes": 0, "ways_out": []} if error is DoesNotFitError else {}),
    }


def test_cli_interrupted(monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupt(name: str, *, revision: str | None = None) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(oominfer.api, "load_spec", interrupt)
    result = CliRunner().invoke(cli.main, ["estimate", "some/model", "--gpu", "L4"])
    assert result.exit_code == 130, result.output
    assert "Interrupted" in result.stderr
    result = CliRunner().invoke(cli.main, ["estimate", "some/model", "--gpu", "L4", "--json"])
    assert result.exit_code == 130, result.output
    assert json.loads(result.stdout)["error"] == "interrupted"


def test_cli_debug_reraises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OOMINFER_DEBUG", "1")
    result = CliRunner().invoke(cli.main, ["estimate", str(tmp_path), "--gpu", "L4"])
    assert isinstance(result.exception, ModelNotFoundError), result.output


def test_cli_unexpected_error_keeps_its_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str, *, revision: str | None = None) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(oominfer.api, "load_spec", broken)
    result = CliRunner().invoke(cli.main, ["estimate", "some/model", "--gpu", "L4"])
    assert result.exit_code == int(ExitStatus.ERROR), result.output
    assert isinstance(result.exception, RuntimeError)


def test_cli_unexpected_error_under_json_is_json_too(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str, *, revision: str | None = None) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(oominfer.api, "load_spec", broken)
    args = ["estimate", "some/model", "--gpu", "L4", "--json"]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == int(ExitStatus.ERROR), result.output
    data = json.loads(result.stdout)
    assert (data["error"], data["exit_code"], data["message"]) == (
        "unexpected",
        1,
        "RuntimeError: a bug",
    )
    assert "Traceback" in result.stderr and "a bug" in result.stderr  # kept, on stderr
