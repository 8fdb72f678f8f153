"""Expected failures, each with the fix in its message, and the process exit codes."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, ClassVar, Final


class ExitStatus(enum.IntEnum):
    """Process exit codes of the ``oominfer`` command (what each means: ``EXIT_CODES``)."""

    SUCCESS = 0
    ERROR = 1
    USAGE = 2
    DOES_NOT_FIT = 3
    PROBE_FAILED = 4
    MODEL_ERROR = 5
    CUT_SHORT = 6
    INTERRUPTED = 130


EXIT_CODES: Final[Mapping[ExitStatus, str]] = MappingProxyType(
    {
        ExitStatus.SUCCESS: "success",
        ExitStatus.ERROR: "unexpected error",
        ExitStatus.USAGE: (
            "bad flags or input files: an impossible setting, a context above the model's "
            "trained length, an unknown GPU, a dtype the GPU cannot run, a plan file that is "
            "missing, empty, malformed, of another version or with an impossible layout, an "
            "output that cannot be written, an engine that is not installed"
        ),
        ExitStatus.DOES_NOT_FIT: (
            "does not fit (`serve`: the engine failed at start for lack of memory)"
        ),
        ExitStatus.PROBE_FAILED: (
            "the engine failed for a reason other than memory, at start or while serving (the "
            "message names its log)"
        ),
        ExitStatus.MODEL_ERROR: (
            "the model cannot be read: unknown, gated, offline, malformed config.json or "
            "safetensors, an incomplete download (shards or layers missing)"
        ),
        ExitStatus.CUT_SHORT: (
            "`serve` only: a signal stopped it and requests still in flight after the grace "
            "period were ended with an error (0 when all finished)"
        ),
        ExitStatus.INTERRUPTED: "interrupted (Ctrl-C: 128 + SIGINT)",
    }
)
"""What each exit code means: the one table that ``oominfer --help``, ``oominfer serve
--help`` and README's "Exit codes" are rendered from (tests/test_exit_status.py fails when the
README drifts; ``python tools/readme_exit_codes.py`` rewrites it)."""


def exit_codes_markdown() -> str:
    """``EXIT_CODES`` as README's Markdown table."""
    rows = [f"| {int(code)} | {meaning} |" for code, meaning in EXIT_CODES.items()]
    return "\n".join(["| code | meaning |", "|---|---|", *rows]) + "\n"


class OominferError(Exception):
    """An expected failure the user can act on; shown without a traceback."""

    exit_status: ClassVar[ExitStatus] = ExitStatus.ERROR
    kind: ClassVar[str] = "error"
    """The ``error`` field of the JSON shape printed under ``--json`` (stable, snake_case)."""

    def __init__(self, message: str, *, hint: str | None = None, reported: bool = False) -> None:
        """Create the error.

        Args:
            message: one or two sentences: what happened, with the numbers.
            hint: the flag or environment variable to change, if any.
            reported: the command has already shown it (a report that ends in a verdict);
                only the exit code is left to give.
        """
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.reported = reported

    def data(self) -> dict[str, Any]:
        """Machine-readable facts beyond the message (``--json``); empty unless a subclass
        carries some."""
        return {}


class InvalidSettingError(OominferError):
    """A flag or setting that cannot work (utilization 0, a negative length, ...)."""

    exit_status = ExitStatus.USAGE
    kind = "invalid_setting"


class UnknownGpuError(OominferError):
    """A GPU name that is not in the catalog."""

    exit_status = ExitStatus.USAGE
    kind = "unknown_gpu"


class ModelError(OominferError):
    """A model that cannot be read."""

    exit_status = ExitStatus.MODEL_ERROR
    kind = "model_error"


class ModelNotFoundError(ModelError):
    """No such model: not a folder, not in the catalog, not on the Hub."""

    kind = "model_not_found"


class GatedModelError(ModelError):
    """A gated Hub repository the token has no access to."""

    kind = "gated_model"


class UnsupportedConfigError(ModelError):
    """A config.json that is malformed or lacks the fields the estimator needs."""

    kind = "unsupported_config"


class CorruptWeightsError(ModelError):
    """A safetensors file whose header cannot be read."""

    kind = "corrupt_weights"


class IncompleteCheckpointError(ModelError):
    """A checkpoint that lacks weights config.json implies: shards named by the index but
    absent (a partial download), or tensors that do not cover the model's layers."""

    kind = "incomplete_checkpoint"


class DoesNotFitError(OominferError):
    """No configuration fits the hardware; carries the shortfall in bytes and the ways out
    (each a flag or a change that would fit, e.g. ``--gpus 2``)."""

    exit_status = ExitStatus.DOES_NOT_FIT
    kind = "does_not_fit"

    def __init__(
        self,
        message: str,
        *,
        shortfall_bytes: int = 0,
        ways_out: Sequence[str] = (),
        hint: str | None = None,
        reported: bool = False,
    ) -> None:
        """Create the error with the number of bytes missing and the ways out."""
        if hint is None and ways_out:
            hint = "Ways out: " + "; ".join(ways_out) + "."
        super().__init__(message, hint=hint, reported=reported)
        self.shortfall_bytes = shortfall_bytes
        self.ways_out = tuple(ways_out)

    def data(self) -> dict[str, Any]:
        """The bytes missing and the ways out, as data."""
        return {"shortfall_bytes": self.shortfall_bytes, "ways_out": list(self.ways_out)}


class ProbeFailedError(OominferError):
    """The engine failed for a reason other than memory."""

    exit_status = ExitStatus.PROBE_FAILED
    kind = "probe_failed"


class PlanError(OominferError):
    """A plan file that cannot be used: missing, malformed, of another schema version, with
    an impossible setting, or unverified where a verified one is required."""

    exit_status = ExitStatus.USAGE
    kind = "plan_error"


class OutputError(OominferError):
    """A file or folder oominfer was asked to write cannot be written."""

    exit_status = ExitStatus.USAGE
    kind = "output_error"
