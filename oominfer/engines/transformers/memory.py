"""Out of memory: recognising an allocation failure, giving memory back, and the test fault hook.

Test-only fault hook: ``OOMINFER_TEST_OOM_AT=N`` makes the N-th forward pass with a batch size
above one raise ``torch.OutOfMemoryError`` (once). It exists for the recovery tests and must
not be set in production.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import logging
import os
import re
from typing import Final

import torch

from oominfer.base.errors import InvalidSettingError

log = logging.getLogger("oominfer.transformers")

TEST_OOM_ENV: Final = "OOMINFER_TEST_OOM_AT"
"""Test-only: the N-th forward pass with batch size > 1 raises torch.OutOfMemoryError."""

_ALLOC_FAILURE = re.compile(
    r"out of memory|can't allocate memory|DefaultCPUAllocator|bad_alloc|Cannot allocate memory",
    re.IGNORECASE,
)


def is_out_of_memory(err: BaseException) -> bool:
    """True for an allocation failure: CUDA OOM, or a failed host allocation on the CPU."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(err, RuntimeError) and bool(_ALLOC_FAILURE.search(str(err)))


def release_memory(device: str, *, collect: bool = True) -> None:
    """Give freed memory back: the garbage, CUDA's cached blocks, glibc's free lists.

    ``gc.collect()`` takes about 0.4 s with torch and transformers loaded: only after an
    out-of-memory error, never on the serving path.
    """
    if collect:
        gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class FaultInjector:
    """Test-only: raise ``torch.OutOfMemoryError`` on the N-th forward with batch size > 1."""

    def __init__(self, at: int | None) -> None:
        """Fire once at the ``at``-th multi-sequence forward pass; None never fires."""
        self.at = at
        self.count = 0

    @classmethod
    def from_env(cls) -> FaultInjector:
        """Read ``OOMINFER_TEST_OOM_AT``."""
        raw = os.environ.get(TEST_OOM_ENV, "").strip()
        if not raw:
            return cls(None)
        if not raw.isdigit() or int(raw) < 1:
            raise InvalidSettingError(f"{TEST_OOM_ENV} must be a positive integer, got {raw!r}.")
        log.warning("%s=%s: out-of-memory fault injection is on (tests only).", TEST_OOM_ENV, raw)
        return cls(int(raw))

    def __call__(self, input_ids: torch.Tensor) -> None:
        """Called before each forward pass."""
        if self.at is None or input_ids.shape[0] < 2:
            return
        self.count += 1
        if self.count == self.at:
            raise torch.OutOfMemoryError(
                f"injected out-of-memory error at forward pass {self.at} with batch size "
                f"{input_ids.shape[0]} ({TEST_OOM_ENV})"
            )
