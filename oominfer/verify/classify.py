"""What a vLLM log says: the outcome of a launch and the memory figures it printed. Pure."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Final

from oominfer.units import GiB
from oominfer.verify.status import LogFacts, ProbeStatus

_GIB: Final = r"(-?[\d.]+)\s*GiB"
_KV_TOO_SMALL: Final = re.compile(
    r"To serve at least one request with the model's max seq len \((\d+)\).*?"
    r"estimated maximum model length is (\d+)",
    re.S,
)
_KV_TOO_SMALL_OLD: Final = re.compile(
    r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored "
    r"in KV cache \((\d+)\)"
)
_FRAGMENTED: Final = re.compile(r"([\d.]+) (GiB|MiB) is reserved by PyTorch but unallocated")
# (pattern, status) in the order they are tried: the most specific first.
_FAILURES: Final = (
    (re.compile(r"No available memory for the cache blocks"), ProbeStatus.NO_KV_MEMORY),
    (re.compile(r"(?:CUDA|GPU) KV cache size: 0 tokens|# (?:cuda|GPU) blocks: 0"),
     ProbeStatus.NO_KV_MEMORY),
    (re.compile(r"(?:on startup is less than desired (?:GPU|CPU) memory utilization)"),
     ProbeStatus.INSUFFICIENT_FREE_MEMORY),
    (re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|std::bad_alloc|"
                r"DefaultCPUAllocator: can't allocate memory|Cannot allocate memory"),
     ProbeStatus.OUT_OF_MEMORY),
    (re.compile(r"are not supported for now|is not supported|not supported on|Unknown quantization"
                r"|Head size \d+ is not supported|does not support"),
     ProbeStatus.UNSUPPORTED),
)  # fmt: skip
_PHASES: Final = (
    ("Resolved architecture", "reading the model's config"),
    ("Initializing a V1 LLM engine", "starting the engine"),
    ("Starting to load model", "loading weights"),
    ("Loading weights took", "loading weights"),
    ("Model loading took", "profiling memory"),
    ("Loading model weights took", "profiling memory"),
    ("Memory profiling takes", "profiling memory"),
    ("torch.compile", "compiling"),
    ("Compiling a graph", "compiling"),
    ("Warming up model for the compilation", "compiling"),
    ("Available KV cache memory", "allocating KV cache"),
    ("# GPU blocks", "allocating KV cache"),
    ("# CUDA blocks", "allocating KV cache"),
    ("for KV cache on node", "allocating KV cache"),
    ("KV cache size:", "allocating KV cache"),
    ("Capturing CUDA graph", "capturing CUDA graphs"),
    ("Graph capturing finished", "warming up"),
    ("Starting vLLM API server", "starting server"),
    ("Starting vLLM server on", "starting server"),
    ("Application startup complete", "ready"),
)


def _gib(match: re.Match[str] | None) -> int | None:
    return int(float(match.group(1)) * GiB) if match else None


def read_log(text: str) -> LogFacts:
    """Classify a vLLM log and pull out the memory figures it printed.

    The status is READY once the server says its application started; a known failure
    line sets the failure status (the last known failure wins over an earlier one).
    """
    phase = "starting"
    for needle, name in _PHASES:
        if needle in text:
            phase = name
    weights = _gib(re.search(r"Model loading took " + _GIB, text)) or _gib(
        re.search(r"Loading (?:model )?weights took " + r"([\d.]+)\s*GB", text)
    )
    kv_bytes = _gib(re.search(r"Available KV cache memory: " + _GIB, text)) or _gib(
        re.search(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache", text)
    )
    tokens_m = re.search(r"KV cache size: ([\d,]+) tokens", text)
    tokens = int(tokens_m.group(1).replace(",", "")) if tokens_m else None
    frag = _FRAGMENTED.search(text)
    unallocated = 0.0
    if frag:
        unallocated = float(frag.group(1)) / (1024 if frag.group(2) == "MiB" else 1)
    base = LogFacts(
        status=None,
        phase=phase,
        weights_bytes=weights,
        kv_cache_bytes=kv_bytes,
        kv_cache_tokens=tokens,
        fragmented=unallocated >= 0.5,  # GiB reserved but unallocated: fragmentation
    )
    for pattern in (_KV_TOO_SMALL, _KV_TOO_SMALL_OLD):
        m = pattern.search(text)
        if m:
            return replace(
                base,
                status=ProbeStatus.KV_CACHE_TOO_SMALL,
                detail=_line_of(text, m.start()),
                estimated_max_model_len=int(m.group(2)),
            )
    for failure, status in _FAILURES:
        m = failure.search(text)
        if m:
            return replace(base, status=status, detail=_line_of(text, m.start()))
    if phase == "ready":
        return replace(base, status=ProbeStatus.READY)
    return base


def _line_of(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    line = text[start : end if end != -1 else len(text)].strip()
    return line[:400]
