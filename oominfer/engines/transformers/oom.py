"""Out of memory at run time: recognising an allocation failure and giving memory back.

(The estimate of how much memory the engine needs is ``oominfer.memory.transformers``.)
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import re

import torch

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
