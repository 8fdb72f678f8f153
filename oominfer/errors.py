"""Expected failures, each with the fix in its message, and the process exit codes."""

from __future__ import annotations

import enum
from typing import ClassVar


class ExitStatus(enum.IntEnum):
    """Process exit codes of the ``oominfer`` command; documented in ``--help`` and README."""

    SUCCESS = 0
    ERROR = 1
    """An unexpected failure, or an expected one with no more specific code."""
    USAGE = 2
    """Bad flags: an impossible setting, an unknown GPU, a dtype the GPU cannot run."""
    DOES_NOT_FIT = 3
    """The model cannot fit the given hardware under the given constraints."""
    PROBE_FAILED = 4
    """The engine failed for a reason other than memory."""
    MODEL_ERROR = 5
    """The model cannot be read: unknown id, gated, offline, malformed config or weights."""
    INTERRUPTED = 130
    """Ctrl-C (128 + SIGINT)."""


class OominferError(Exception):
    """An expected failure the user can act on; shown without a traceback."""

    exit_status: ClassVar[ExitStatus] = ExitStatus.ERROR

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        """Create the error.

        Args:
            message: one or two sentences: what happened, with the numbers.
            hint: the flag or environment variable to change, if any.
        """
        super().__init__(message)
        self.message = message
        self.hint = hint


class InvalidSettingError(OominferError):
    """A flag or setting that cannot work (utilization 0, a negative length, ...)."""

    exit_status = ExitStatus.USAGE


class UnknownGpuError(OominferError):
    """A GPU name that is not in the catalog."""

    exit_status = ExitStatus.USAGE


class ModelError(OominferError):
    """A model that cannot be read."""

    exit_status = ExitStatus.MODEL_ERROR


class ModelNotFoundError(ModelError):
    """No such model: not a folder, not in the catalog, not on the Hub."""


class GatedModelError(ModelError):
    """A gated Hub repository the token has no access to."""


class UnsupportedConfigError(ModelError):
    """A config.json that is malformed or lacks the fields the estimator needs."""


class CorruptWeightsError(ModelError):
    """A safetensors file whose header cannot be read."""


class DoesNotFitError(OominferError):
    """No configuration fits the hardware; carries the shortfall in bytes."""

    exit_status = ExitStatus.DOES_NOT_FIT

    def __init__(self, message: str, *, shortfall_bytes: int = 0, hint: str | None = None) -> None:
        """Create the error with the number of bytes missing."""
        super().__init__(message, hint=hint)
        self.shortfall_bytes = shortfall_bytes


class ProbeFailedError(OominferError):
    """The engine failed for a reason other than memory."""

    exit_status = ExitStatus.PROBE_FAILED
