"""The transformers backend: an OpenAI-compatible server for what vLLM cannot serve.

Run it as::

    python -m oominfer.backends.hf_server --model DIR --host 127.0.0.1 --port 8000 \\
        [--plan plan.json] [--dtype float32] [--quantization bitsandbytes|int8] \\
        [--max-model-len N] [--max-num-seqs N] [--max-queue N] [--api-key KEY] \\
        [--served-model-name NAME] [--grace-period S]

Endpoints: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (the tokenizer's chat
template; ``stream: true`` as server-sent events ending with ``data: [DONE]``), ``/health`` and
``/metrics`` (Prometheus text). Only ``/v1/*`` needs the bearer token when ``--api-key`` (or
``OOMINFER_API_KEY``) is set.

Batching: one worker thread owns the model. It keeps a *running batch* of at most
``max_num_seqs`` sequences, left-padded, with one ``DynamicCache`` and a 2-D attention mask
(positions come from the mask's cumulative sum). Each iteration it admits waiting requests
into the free slots (their prompts are prefilled together, then their caches are concatenated
onto the running batch's), runs one decode step for the whole batch, hands each sequence its
token, and drops finished rows (``batch_select_indices``) and all-padding columns. Concurrent
requests therefore share every decode forward pass (continuous batching). Requests beyond the
free slots wait in a bounded queue (``--max-queue``); past it the server answers 429 with
``Retry-After``, and 503 while shutting down.

Out of memory (``torch.OutOfMemoryError``; on the CPU a ``MemoryError`` or a ``RuntimeError``
from a failed allocation): the cache of the failed forward is dropped, garbage is collected
(``torch.cuda.empty_cache()`` on CUDA, ``malloc_trim`` on glibc), and the sequences go back to
the head of the queue with the batch size capped at half. A sequence keeps the tokens it has
produced: it is re-prefilled from prompt plus output, so its stream continues where it was. A
single sequence that fails on its own gets HTTP 507 (or an error event in its stream); the
others carry on. The cap doubles back after 64 clean decode steps.

Test-only fault hook: ``OOMINFER_TEST_OOM_AT=N`` makes the N-th forward pass with a batch size
above one raise ``torch.OutOfMemoryError`` (once). It exists for the recovery tests and must
not be set in production.

SIGTERM or SIGINT: new ``/v1`` requests get 503 and ``/health`` turns 503; requests in flight
finish (up to ``--grace-period`` seconds, after which they end with an error); then the process
exits 0. A second signal exits at once.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import dataclasses
import gc
import hmac
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Final, Literal

# Before torch loads libgomp: OpenMP threads that spin between parallel regions starve the
# event loop's thread of a core and of the GIL. Measured on 2 cores with the tiny test model,
# one 32-token request took 0.75-1.1 s with spinning threads and 0.09 s with passive ones.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import (
    JSONResponse,
    PlainTextResponse,
    Response,
    StreamingResponse,
)
from pydantic import BaseModel, ConfigDict, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oominfer.errors import InvalidSettingError, ModelNotFoundError, OominferError
from oominfer.plan import Plan, plan_from_json
from oominfer.settings import VllmSettings

log = logging.getLogger("oominfer.hf_server")

API_KEY_ENV: Final = "OOMINFER_API_KEY"
TEST_OOM_ENV: Final = "OOMINFER_TEST_OOM_AT"
"""Test-only: the N-th forward pass with batch size > 1 raises torch.OutOfMemoryError."""

DEFAULT_MAX_NUM_SEQS: Final = 8
DEFAULT_MAX_QUEUE: Final = 256
DEFAULT_GRACE_PERIOD_S: Final = 30.0
CAP_RECOVERY_STEPS: Final = 64
"""Clean decode steps after which an out-of-memory cap on the batch size doubles back."""
RETRY_AFTER_S: Final = 1

_ALLOC_FAILURE = re.compile(
    r"out of memory|can't allocate memory|DefaultCPUAllocator|bad_alloc|Cannot allocate memory",
    re.IGNORECASE,
)


def is_out_of_memory(err: BaseException) -> bool:
    """True for an allocation failure: CUDA OOM, or a failed host allocation on the CPU."""
    if isinstance(err, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(err, RuntimeError) and bool(_ALLOC_FAILURE.search(str(err)))


# Errors in the OpenAI shape


class ApiError(Exception):
    """An error answered in the OpenAI shape ``{"error": {message, type, param, code}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type_: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        """Create the error; ``status`` is the HTTP status code."""
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        """The HTTP response."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def _busy(message: str, status: int = 429) -> ApiError:
    kind = "rate_limit_exceeded" if status == 429 else "service_unavailable"
    return ApiError(
        status,
        message,
        type_=kind,
        code=kind,
        headers={"Retry-After": str(RETRY_AFTER_S)},
    )


# Settings


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """What one server process serves, resolved from the plan and the flags."""

    model: str
    served_model_name: str
    settings: VllmSettings
    device: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8000
    max_queue: int = DEFAULT_MAX_QUEUE
    api_key: str | None = None
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S

    @property
    def max_num_seqs(self) -> int:
        """Sequences in one batch."""
        return self.settings.max_num_seqs or DEFAULT_MAX_NUM_SEQS


# The model


def _torch_dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[name]


def _resolve_device(requested: str) -> str:
    if requested == "cpu":
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    if requested == "cuda":
        log.warning("The plan asks for CUDA but torch sees no GPU: serving on the CPU.")
    return "cpu"


def _release_memory(device: str, *, collect: bool = True) -> None:
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


@dataclass(slots=True)
class Batch:
    """The running batch: its cache, left-padded mask, last sampled tokens and sequences."""

    cache: Any
    mask: torch.Tensor
    last: torch.Tensor
    seqs: list[Seq]


class Engine:
    """A causal LM and its tokenizer; every forward pass runs under ``inference_mode``."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        device: str,
        fault: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        """Wrap a loaded model; ``fault`` is called before each forward (tests only)."""
        self.model = model
        self.tokenizer = tokenizer
        self.device = device
        self.fault = fault
        self.forward_passes = 0
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = tokenizer.eos_token_id if tokenizer.eos_token_id is not None else 0
        self.pad_id: int = int(pad)
        self.vocab_size: int = int(model.get_input_embeddings().weight.shape[0])
        eos: set[int] = set()
        for source in (getattr(model, "generation_config", None), tokenizer):
            value = getattr(source, "eos_token_id", None)
            if isinstance(value, int):
                eos.add(value)
            elif isinstance(value, (list, tuple)):
                eos.update(int(v) for v in value)
        self.eos_ids: frozenset[int] = frozenset(eos)
        self.weights_bytes: int = int(model.get_memory_footprint())

    @classmethod
    def load(cls, config: ServerConfig) -> Engine:
        """Load the model per the settings: dtype, bitsandbytes int8/nf4, sdpa attention.

        Raises:
            ModelNotFoundError: the folder or id cannot be loaded.
        """
        import transformers

        # transformers' own annotations are partial: keep its objects as Any at this edge.
        auto_model: Any = transformers.AutoModelForCausalLM
        auto_tokenizer: Any = transformers.AutoTokenizer
        bnb_config: Any = transformers.BitsAndBytesConfig

        s = config.settings
        device = _resolve_device(config.device)
        kwargs: dict[str, Any] = {"attn_implementation": "sdpa"}
        if s.dtype != "auto":
            dtype: Any = _torch_dtype(s.dtype)
        elif s.quantization == "int8":
            # LLM.int8 multiplies in float16: other dtypes are cast on every forward.
            dtype = torch.float16
        else:
            dtype = "auto"
        kwargs["dtype"] = dtype
        if s.quantization == "int8":
            kwargs["quantization_config"] = bnb_config(load_in_8bit=True)
        elif s.quantization == "bitsandbytes":
            compute = dtype if isinstance(dtype, torch.dtype) else torch.bfloat16
            kwargs["quantization_config"] = bnb_config(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=compute
            )
        elif s.quantization is not None:
            log.warning(
                "--quantization %s: the checkpoint's own quantization config is used as is.",
                s.quantization,
            )
        if "quantization_config" in kwargs:
            kwargs["device_map"] = {"": device}
            # Each LLM.int8 matmul logs a cast warning otherwise.
            logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)
        try:
            tokenizer = auto_tokenizer.from_pretrained(config.model)
            model = auto_model.from_pretrained(config.model, **kwargs)
        except (OSError, ValueError) as err:
            raise ModelNotFoundError(
                f"cannot load {config.model!r} with transformers: {err}",
                hint="Pass --model with a local folder holding config.json, weights and a "
                "tokenizer.",
            ) from None
        if "quantization_config" not in kwargs:
            model.to(device)
        model.eval()
        return cls(model, tokenizer, device=device, fault=FaultInjector.from_env())

    def _forward(self, **inputs: Any) -> Any:
        if self.fault is not None:
            self.fault(inputs["input_ids"])
        self.forward_passes += 1
        with torch.inference_mode():
            return self.model(**inputs, use_cache=True, logits_to_keep=1)

    def prefill(self, prompts: Sequence[Sequence[int]]) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """Run left-padded prompts; return (cache, mask, last-position logits as float32)."""
        from transformers import DynamicCache

        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.model.config)
        out = self._forward(
            input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache
        )
        return out.past_key_values, mask, out.logits[:, -1, :].float()

    def decode(self, batch: Batch) -> torch.Tensor:
        """One step for the whole batch; updates its cache and mask; returns float32 logits."""
        ones = torch.ones((batch.mask.shape[0], 1), dtype=batch.mask.dtype, device=self.device)
        mask = torch.cat([batch.mask, ones], dim=1)
        positions = mask.sum(-1, keepdim=True) - 1
        out = self._forward(
            input_ids=batch.last[:, None],
            attention_mask=mask,
            position_ids=positions,
            past_key_values=batch.cache,
        )
        batch.mask = mask
        batch.cache = out.past_key_values
        return out.logits[:, -1, :].float()  # type: ignore[no-any-return]


def can_merge(cache: Any) -> bool:
    """True when every layer is a plain ``DynamicLayer`` (no sliding window): rows can join."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in cache.layers)


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    """Pad dim -2 (a cache's sequence axis) on the left with zeros."""
    if width == 0:
        return t
    return torch.cat([t.new_zeros((*t.shape[:-2], width, t.shape[-1])), t], dim=-2)


def merge_batches(a: Batch, b: Batch) -> Batch:
    """Append ``b``'s rows to ``a``: caches and masks left-padded to the longer of the two."""
    la, lb = a.mask.shape[1], b.mask.shape[1]
    width = max(la, lb)
    for layer_a, layer_b in zip(a.cache.layers, b.cache.layers, strict=True):
        layer_a.keys = torch.cat(
            [_pad_left(layer_a.keys, width - la), _pad_left(layer_b.keys, width - lb)]
        )
        layer_a.values = torch.cat(
            [_pad_left(layer_a.values, width - la), _pad_left(layer_b.values, width - lb)]
        )
    mask = torch.cat(
        [
            torch.nn.functional.pad(a.mask, (width - la, 0)),
            torch.nn.functional.pad(b.mask, (width - lb, 0)),
        ]
    )
    return Batch(cache=a.cache, mask=mask, last=torch.cat([a.last, b.last]), seqs=a.seqs + b.seqs)


def select_rows(batch: Batch, keep: list[int], *, trim: bool) -> Batch:
    """Keep only rows ``keep``; with ``trim``, drop the left columns that are padding in all."""
    index = torch.tensor(keep, dtype=torch.long, device=batch.mask.device)
    batch.cache.batch_select_indices(index)
    mask, last = batch.mask[index], batch.last[index]
    if trim:
        used = (mask.sum(0) > 0).nonzero()
        first = int(used[0]) if used.numel() else 0
        if first > 0:
            mask = mask[:, first:]
            for layer in batch.cache.layers:
                layer.keys = layer.keys[:, :, first:, :]
                layer.values = layer.values[:, :, first:, :]
    return Batch(cache=batch.cache, mask=mask, last=last, seqs=[batch.seqs[i] for i in keep])


# Requests and their events


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """New text for the client (may be empty while a multi-byte character is incomplete)."""

    text: str


@dataclass(frozen=True, slots=True)
class FinishEvent:
    """The sequence ended."""

    reason: Literal["stop", "length"]
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class ErrorEvent:
    """The sequence failed; the others go on."""

    error: ApiError


Event = TokenEvent | FinishEvent | ErrorEvent


@dataclass(eq=False)
class Seq:
    """One request's generation state, owned by the scheduler's worker thread."""

    prompt: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    emit: Callable[[Event], None] = lambda event: None
    generated: list[int] = field(default_factory=list)
    completion_tokens: int = 0
    sent: str = ""
    done: bool = False
    cancelled: bool = False
    solo: bool = False
    """Failed for memory beside others: retried alone before it is failed."""
    generator: torch.Generator | None = None

    @property
    def ids(self) -> list[int]:
        """Prompt plus output: what a re-prefill after an out-of-memory error runs."""
        return self.prompt + self.generated


# Metrics


class Metrics:
    """Counters and gauges in the Prometheus text format, without a client library."""

    def __init__(self) -> None:
        """Start at zero."""
        self.requests: dict[tuple[str, int], int] = {}
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.oom_recoveries = 0
        self.oom_failures = 0
        self.lock = threading.Lock()

    def count_request(self, path: str, status: int) -> None:
        """One finished HTTP response."""
        with self.lock:
            key = (path, status)
            self.requests[key] = self.requests.get(key, 0) + 1

    def render(self, scheduler: Scheduler) -> str:
        """The exposition text."""
        lines: list[str] = []

        def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
            lines.append(f"# HELP {name} {help_}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)

        with self.lock:
            requests = sorted(self.requests.items())
        metric(
            "oominfer_requests_total",
            "counter",
            "HTTP responses by path and status code.",
            [(f'{{path="{p}",status="{s}"}}', n) for (p, s), n in requests],
        )
        counters = (
            ("oominfer_prompt_tokens_total", "Prompt tokens admitted.", self.prompt_tokens),
            ("oominfer_generation_tokens_total", "Tokens generated.", self.generation_tokens),
            (
                "oominfer_oom_recoveries_total",
                "Out-of-memory errors recovered by splitting the batch.",
                self.oom_recoveries,
            ),
            (
                "oominfer_oom_failures_total",
                "Requests failed because they alone did not fit in memory.",
                self.oom_failures,
            ),
            (
                "oominfer_forward_passes_total",
                "Model forward passes.",
                scheduler.engine.forward_passes,
            ),
        )
        for name, help_, value in counters:
            metric(name, "counter", help_, [("", value)])
        gauges = (
            ("oominfer_queue_depth", "Requests waiting for a batch slot.", scheduler.queue_depth),
            ("oominfer_batch_size", "Sequences in the running batch.", scheduler.batch_size),
            ("oominfer_max_num_seqs", "Batch size limit.", scheduler.max_num_seqs),
            ("oominfer_batch_cap", "Batch size limit after out-of-memory errors.", scheduler.cap),
            ("oominfer_kv_cache_bytes", "Bytes held by the running batch's KV cache.",
             scheduler.kv_cache_bytes()),
            ("oominfer_model_weights_bytes", "The model's memory footprint.",
             scheduler.engine.weights_bytes),
            ("process_resident_memory_bytes", "Resident set size of this process.", _rss_bytes()),
        )  # fmt: skip
        for name, help_, value in gauges:
            metric(name, "gauge", help_, [("", value)])
        if torch.cuda.is_available():
            metric(
                "oominfer_torch_cuda_allocated_bytes",
                "gauge",
                "Bytes allocated by torch on the GPU.",
                [("", torch.cuda.memory_allocated())],
            )
            metric(
                "oominfer_torch_cuda_reserved_bytes",
                "gauge",
                "Bytes reserved by torch's caching allocator.",
                [("", torch.cuda.memory_reserved())],
            )
        return "\n".join(lines) + "\n"


def _number(value: float) -> str:
    """Integers in full (byte counts), other numbers as Python writes them."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _rss_bytes() -> int:
    """The process's resident set size (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


# The scheduler


class Scheduler:
    """One worker thread that batches sequences and survives out-of-memory errors."""

    def __init__(
        self, engine: Engine, *, max_num_seqs: int, max_queue: int, metrics: Metrics
    ) -> None:
        """Create the scheduler; call ``start()`` to run its worker."""
        self.engine = engine
        self.max_num_seqs = max_num_seqs
        self.max_queue = max_queue
        self.metrics = metrics
        self.cap = max_num_seqs
        self._clean_steps = 0
        self._cond = threading.Condition()
        self._waiting: deque[Seq] = deque()
        self._resume: deque[Seq] = deque()
        self._batch: Batch | None = None
        self._merge: bool | None = None
        self._accepting = True
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="oominfer-scheduler", daemon=True)

    @property
    def queue_depth(self) -> int:
        """Sequences waiting for a slot (new ones and ones being retried)."""
        return len(self._waiting) + len(self._resume)

    @property
    def batch_size(self) -> int:
        """Sequences in the running batch."""
        batch = self._batch
        return len(batch.seqs) if batch is not None else 0

    def kv_cache_bytes(self) -> int:
        """Bytes of the running batch's keys and values."""
        batch = self._batch
        if batch is None:
            return 0
        total = 0
        for layer in list(batch.cache.layers):
            for t in (layer.keys, layer.values):
                if isinstance(t, torch.Tensor):
                    total += t.numel() * t.element_size()
        return total

    def start(self) -> None:
        """Start the worker thread."""
        self._thread.start()

    def submit(self, seq: Seq) -> None:
        """Queue a sequence.

        Raises:
            ApiError: 503 when shutting down, 429 when the queue is full.
        """
        with self._cond:
            if not self._accepting:
                raise _busy("The server is shutting down; retry on another replica.", 503)
            if len(self._waiting) >= self.max_queue:
                raise _busy(
                    f"The server is busy: {len(self._waiting)} requests are already waiting "
                    f"(--max-queue {self.max_queue}). Retry after {RETRY_AFTER_S} s."
                )
            self._waiting.append(seq)
            self.metrics.prompt_tokens += len(seq.prompt)
            self._cond.notify()

    def stop_accepting(self) -> None:
        """Refuse new sequences (503); those queued or running go on."""
        with self._cond:
            self._accepting = False

    def idle(self) -> bool:
        """True when nothing is queued or running."""
        return not self._waiting and not self._resume and self._batch is None

    def abort_all(self, message: str) -> None:
        """Fail every queued and running sequence with 503 (the grace period is over)."""
        with self._cond:
            self._accepting = False
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=30)
        error = _busy(message, 503)
        pending = list(self._waiting) + list(self._resume)
        if self._batch is not None:
            pending += self._batch.seqs
        for seq in pending:
            self._fail(seq, error)
        self._waiting.clear()
        self._resume.clear()
        self._batch = None

    def close(self) -> None:
        """Stop the worker (after ``abort_all`` or when idle)."""
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=30)

    # worker side

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and self.idle():
                    self._cond.wait()
                if self._stop:
                    return
                group = self._admit()
            try:
                if group:
                    self._prefill(group)
                if self._batch is not None:
                    self._step()
            except Exception:  # a bug must not kill the worker: fail what ran, keep serving
                log.exception("Unexpected error in the scheduler")
                involved = (self._batch.seqs if self._batch else []) + group
                self._batch = None
                for seq in involved:
                    self._fail(seq, ApiError(500, "Internal error while generating.",
                                             type_="internal_error"))  # fmt: skip

    def _admit(self) -> list[Seq]:
        """Take sequences for the free slots: retried ones first, then new ones."""
        running = self.batch_size
        if running and self._merge is False:
            return []  # a cache that cannot take new rows: wait for the batch to drain
        free = min(self.max_num_seqs, self.cap) - running
        group: list[Seq] = []
        for source in (self._resume, self._waiting):
            while source and len(group) < free:
                seq = source[0]
                if seq.cancelled or seq.done:
                    source.popleft()
                    continue
                if seq.solo and (running or group):
                    return group
                source.popleft()
                group.append(seq)
                if seq.solo:
                    return group
        return group

    def _prefill(self, group: list[Seq]) -> None:
        try:
            cache, mask, logits = self.engine.prefill([s.ids for s in group])
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            self._out_of_memory(group, err, batch_lost=False)
            return
        if self._merge is None:
            self._merge = can_merge(cache)
        tokens = self._sample(logits, group)
        for seq, token in zip(group, tokens, strict=True):
            self._accept(seq, token)
        new = Batch(cache=cache, mask=mask, last=torch.tensor(tokens, device=mask.device),
                    seqs=group)  # fmt: skip
        keep = [i for i, s in enumerate(group) if not s.done]
        if not keep:
            return
        if len(keep) < len(group):
            new = select_rows(new, keep, trim=bool(self._merge))
        if self._batch is None:
            self._batch = new
            return
        try:
            self._batch = merge_batches(self._batch, new)
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            self._out_of_memory(self._batch.seqs + new.seqs, err, batch_lost=True)

    def _step(self) -> None:
        batch = self._batch
        assert batch is not None
        if any(s.done or s.cancelled for s in batch.seqs):
            batch = self._prune(batch)
            if batch is None:
                return
        try:
            logits = self.engine.decode(batch)
        except Exception as err:
            if not is_out_of_memory(err):
                raise
            self._out_of_memory(batch.seqs, err, batch_lost=True)
            return
        tokens = self._sample(logits, batch.seqs)
        batch.last = torch.tensor(tokens, device=batch.mask.device)
        for seq, token in zip(batch.seqs, tokens, strict=True):
            self._accept(seq, token)
        self._prune(batch)
        self._clean_steps += 1
        if self.cap < self.max_num_seqs and self._clean_steps >= CAP_RECOVERY_STEPS:
            self.cap = min(self.max_num_seqs, self.cap * 2)
            self._clean_steps = 0
            log.info("Batch size cap raised to %d after %d clean steps.", self.cap,
                     CAP_RECOVERY_STEPS)  # fmt: skip

    def _prune(self, batch: Batch) -> Batch | None:
        keep = [i for i, s in enumerate(batch.seqs) if not (s.done or s.cancelled)]
        if len(keep) == len(batch.seqs):
            self._batch = batch
        elif not keep:
            self._batch = None
            if self.idle():
                _release_memory(self.engine.device, collect=False)
        else:
            self._batch = select_rows(batch, keep, trim=bool(self._merge))
        return self._batch

    def _out_of_memory(self, seqs: list[Seq], err: BaseException, *, batch_lost: bool) -> None:
        """Free memory, then retry ``seqs`` in halves; a lone sequence that failed fails."""
        if batch_lost:
            self._batch = None
        _release_memory(self.engine.device)
        alive = [s for s in seqs if not (s.done or s.cancelled)]
        if len(alive) > 1:
            self.cap = max(1, len(alive) // 2)
            self._clean_steps = 0
            self.metrics.oom_recoveries += 1
            log.warning(
                "Out of memory with %d sequences (%s); retrying them in batches of at most %d.",
                len(alive), err, self.cap,
            )  # fmt: skip
            self._resume.extendleft(reversed(alive))
            return
        if not alive:
            return
        seq = alive[0]
        if self._batch is not None and not seq.solo:
            log.warning("Out of memory on one sequence beside %d others: retrying it alone.",
                        len(self._batch.seqs))  # fmt: skip
            seq.solo = True
            self._resume.appendleft(seq)
            return
        self.metrics.oom_failures += 1
        log.warning("Out of memory on a single sequence of %d tokens: failing it (%s).",
                    len(seq.ids), err)  # fmt: skip
        self._fail(
            seq,
            ApiError(
                507,
                f"Out of memory: this request ({len(seq.prompt)} prompt tokens, max_tokens "
                f"{seq.max_tokens}) does not fit in the memory left on this server, even alone. "
                "Send a shorter prompt or a smaller max_tokens, or serve with a smaller "
                "--max-model-len.",
                type_="insufficient_storage",
                code="out_of_memory",
            ),
        )

    def _sample(self, logits: torch.Tensor, seqs: Sequence[Seq]) -> list[int]:
        tokens: list[int] = logits.argmax(-1).tolist()
        for row, seq in enumerate(seqs):
            if seq.temperature <= 1e-5:
                continue
            probs = torch.softmax(logits[row] / seq.temperature, dim=-1)
            if seq.top_p < 1.0:
                sorted_probs, order = probs.sort(descending=True)
                outside = sorted_probs.cumsum(-1) - sorted_probs > seq.top_p
                sorted_probs[outside] = 0
                probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
            if seq.seed is not None and seq.generator is None:
                seq.generator = torch.Generator(device=probs.device).manual_seed(seq.seed)
            tokens[row] = int(torch.multinomial(probs, 1, generator=seq.generator))
        return tokens

    def _accept(self, seq: Seq, token: int) -> None:
        """Hand one sampled token to its sequence: text, stop conditions, events."""
        if seq.done or seq.cancelled:
            return
        seq.completion_tokens += 1
        self.metrics.generation_tokens += 1
        if token in self.engine.eos_ids and not seq.ignore_eos:
            self._finish(seq, "stop")
            return
        seq.generated.append(token)
        text = self.engine.tokenizer.decode(seq.generated, skip_special_tokens=True)
        reason: Literal["stop", "length"] | None = None
        if seq.stop:
            start = max(0, len(seq.sent) - max(len(s) for s in seq.stop))
            hits = [i for i in (text.find(s, start) for s in seq.stop) if i >= 0]
            if hits:
                text, reason = text[: min(hits)], "stop"
        if reason is None and len(seq.generated) >= seq.max_tokens:
            reason = "length"
        if reason is None and text.endswith("\ufffd"):
            return  # an incomplete multi-byte character: wait for its other bytes
        if seq.stop and reason is None:
            # hold back a tail that could be the start of a stop string
            hold = max(len(s) for s in seq.stop) - 1
            text = text[: max(len(seq.sent), len(text) - hold)]
        if len(text) > len(seq.sent):
            seq.emit(TokenEvent(text[len(seq.sent) :]))
            seq.sent = text
        if reason is not None:
            self._finish(seq, reason)

    def _finish(self, seq: Seq, reason: Literal["stop", "length"]) -> None:
        seq.done = True
        seq.emit(FinishEvent(reason, len(seq.prompt), seq.completion_tokens))

    def _fail(self, seq: Seq, error: ApiError) -> None:
        if seq.done:
            return
        seq.done = True
        seq.emit(ErrorEvent(error))


# The HTTP API


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict):
    """``stream_options``."""

    include_usage: bool = False


class _SamplingRequest(_Strict):
    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    seed: int | None = None
    ignore_eos: bool = False
    """vLLM's extension: keep generating past end-of-sequence (benchmarks)."""
    logprobs: Any = None
    user: str | None = None


class CompletionRequest(_SamplingRequest):
    """``POST /v1/completions``."""

    prompt: str | list[int] | list[str] | list[list[int]]
    echo: bool = False


class ChatMessage(BaseModel):
    """One chat message; content is text or a list of text parts."""

    model_config = ConfigDict(strict=True, extra="allow")
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatRequest(_SamplingRequest):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    add_generation_prompt: bool = True


_UNION_TAG: Final = re.compile(r"^(str|int|float|bool|none|dict|list|tuple|[\w-]+\[.*\])$")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = list(exc.errors())
    if not errors:
        return "Invalid request.", None
    first = errors[0]
    if first.get("type") == "json_invalid":
        return f"The request body is not valid JSON: {first.get('msg', '')}.", None
    # pydantic names the member of a union that failed ("prompt.str"): not a parameter
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _UNION_TAG.match(str(p))]
    param = ".".join(loc) or None
    where = f"{param}: " if param else "body: "
    more = f" (and {len(errors) - 1} more errors)" if len(errors) > 1 else ""
    return f"Invalid request: {where}{first.get('msg', 'invalid value')}{more}.", param


class _Gate:
    """ASGI middleware: API key, draining, in-flight count, per-status metrics."""

    def __init__(self, app: ASGIApp, *, server: Server) -> None:
        self.app = app
        self.server = server

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        guarded = path.startswith("/v1/") or path == "/v1"
        status = 500

        async def send_counting(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        error: ApiError | None = None
        if guarded and self.server.draining:
            error = _busy("The server is shutting down; retry on another replica.", 503)
        elif guarded and self.server.config.api_key and not self._authorized(scope):
            error = ApiError(
                401,
                "Missing or wrong API key: send the header 'Authorization: Bearer <key>'.",
                code="invalid_api_key",
            )
        if error is not None:
            await error.response()(scope, receive, send_counting)
        else:
            self.server.in_flight += guarded
            try:
                await self.app(scope, receive, send_counting)
            finally:
                self.server.in_flight -= guarded
        metric_path = path if path in _ROUTES else "other"
        self.server.metrics.count_request(metric_path, status)

    def _authorized(self, scope: Scope) -> bool:
        expected = f"Bearer {self.server.config.api_key}".encode()
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                return hmac.compare_digest(value, expected)
        return False


_ROUTES: Final = frozenset(
    {"/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics"}
)


def _sse(data: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class Server:
    """The FastAPI app around one engine and its scheduler."""

    def __init__(self, config: ServerConfig, engine: Engine) -> None:
        """Build the app; the scheduler starts with the app's lifespan."""
        self.config = config
        self.engine = engine
        self.metrics = Metrics()
        self.scheduler = Scheduler(
            engine,
            max_num_seqs=config.max_num_seqs,
            max_queue=config.max_queue,
            metrics=self.metrics,
        )
        config_len = getattr(engine.model.config, "max_position_embeddings", None)
        self.max_model_len: int = config.settings.max_model_len or int(config_len or 2048)
        self.draining = False
        self.in_flight = 0
        self.created = int(time.time())
        self.app = self._build_app()

    # request building

    def _check_model(self, model: str | None) -> None:
        if model is not None and model not in (self.config.served_model_name, self.config.model):
            raise ApiError(
                404,
                f"The model {model!r} does not exist; this server serves "
                f"{self.config.served_model_name!r}.",
                param="model",
                code="model_not_found",
            )

    def _new_seq(
        self, req: _SamplingRequest, prompt: list[int], max_tokens: int | None, what: str
    ) -> Seq:
        if req.n != 1:
            raise ApiError(400, "n > 1 is not supported by the transformers backend.", param="n")
        if req.logprobs not in (None, False, 0):
            raise ApiError(
                400, "logprobs are not supported by the transformers backend.", param="logprobs"
            )
        if not prompt:
            raise ApiError(400, f"The {what} is empty.", param=what)
        bad = [t for t in prompt if not 0 <= t < self.engine.vocab_size]
        if bad:
            raise ApiError(
                400,
                f"Token id {bad[0]} is out of range: the vocabulary has "
                f"{self.engine.vocab_size} tokens.",
                param=what,
            )
        limit = self.max_model_len
        if max_tokens is None:
            max_tokens = limit - len(prompt)
            if max_tokens < 1:
                raise ApiError(
                    400,
                    f"This model's maximum context length is {limit} tokens. However, your "
                    f"{what} has {len(prompt)} tokens, leaving no room for a completion. "
                    f"Please reduce the length of the {what}.",
                    param=what,
                    code="context_length_exceeded",
                )
        elif len(prompt) + max_tokens > limit:
            raise ApiError(
                400,
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt) + max_tokens} tokens ({len(prompt)} in the {what}, {max_tokens} "
                f"in the completion). Please reduce the length of the {what} or max_tokens.",
                param="max_tokens",
                code="context_length_exceeded",
            )
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        return Seq(
            prompt=prompt,
            max_tokens=max_tokens,
            temperature=req.temperature,
            top_p=req.top_p,
            stop=tuple(s for s in stop if s),
            ignore_eos=req.ignore_eos,
            seed=req.seed,
        )

    def _completion_prompt(self, req: CompletionRequest) -> list[int]:
        if req.echo:
            raise ApiError(400, "echo is not supported by the transformers backend.", param="echo")
        prompt = req.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(
                    400, "Send one prompt per request (batched prompts are not supported).",
                    param="prompt",
                )  # fmt: skip
            prompt = prompt[0]
        if isinstance(prompt, str):
            return list(self.engine.tokenizer(prompt)["input_ids"])
        if not all(isinstance(t, int) for t in prompt):
            raise ApiError(400, "prompt must be a string or a list of token ids.", param="prompt")
        return [t for t in prompt if isinstance(t, int)]

    def _chat_prompt(self, req: ChatRequest) -> list[int]:
        tokenizer = self.engine.tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise ApiError(400, "This model's tokenizer has no chat template: use /v1/completions.")
        messages: list[dict[str, Any]] = []
        for m in req.messages:
            message = m.model_dump(exclude_none=True)
            if isinstance(m.content, list):
                message["content"] = "".join(
                    str(part.get("text", "")) for part in m.content if part.get("type") == "text"
                )
            messages.append(message)
        try:
            text = tokenizer.apply_chat_template(
                messages, add_generation_prompt=req.add_generation_prompt, tokenize=False
            )
        except Exception as err:  # jinja2 errors from the template itself
            raise ApiError(
                400, f"The chat template rejected the messages: {err}", param="messages"
            ) from None
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    # generation

    def _submit(self, seq: Seq) -> AsyncIterator[Event]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[Event] = asyncio.Queue()

        def emit(event: Event) -> None:
            with contextlib.suppress(RuntimeError):  # the loop has closed
                loop.call_soon_threadsafe(queue.put_nowait, event)

        seq.emit = emit
        self.scheduler.submit(seq)

        async def events() -> AsyncIterator[Event]:
            try:
                while True:
                    event = await queue.get()
                    yield event
                    if not isinstance(event, TokenEvent):
                        return
            finally:
                if not seq.done:
                    seq.cancelled = True  # the client went away

        return events()

    async def _collect(self, seq: Seq) -> tuple[str, FinishEvent]:
        parts: list[str] = []
        async for event in self._submit(seq):
            if isinstance(event, TokenEvent):
                parts.append(event.text)
            elif isinstance(event, FinishEvent):
                return "".join(parts), event
            else:
                raise event.error
        raise ApiError(500, "The generation ended without a result.", type_="internal_error")

    def _usage(self, finish: FinishEvent) -> dict[str, int]:
        return {
            "prompt_tokens": finish.prompt_tokens,
            "completion_tokens": finish.completion_tokens,
            "total_tokens": finish.prompt_tokens + finish.completion_tokens,
        }

    def _stream(
        self,
        seq: Seq,
        *,
        object_: str,
        id_: str,
        choice: Callable[[str | None, str | None], dict[str, Any]],
        include_usage: bool,
    ) -> StreamingResponse:
        events = self._submit(seq)  # raises 429/503 before the stream starts
        name = self.config.served_model_name

        async def body() -> AsyncIterator[bytes]:
            head = {"id": id_, "object": object_, "created": int(time.time()), "model": name}
            if object_ == "chat.completion.chunk":
                yield _sse({**head, "choices": [choice(None, None) | {"delta": {
                    "role": "assistant", "content": ""}}]})  # fmt: skip
            async for event in events:
                if isinstance(event, TokenEvent):
                    if event.text:
                        yield _sse({**head, "choices": [choice(event.text, None)]})
                elif isinstance(event, FinishEvent):
                    yield _sse({**head, "choices": [choice(None, event.reason)]})
                    if include_usage:
                        yield _sse({**head, "choices": [], "usage": self._usage(event)})
                else:
                    yield _sse(event.error.body())
            yield b"data: [DONE]\n\n"

        return StreamingResponse(
            body(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
        )

    async def completions(self, req: CompletionRequest) -> Response:
        """``POST /v1/completions``."""
        self._check_model(req.model)
        max_tokens = req.max_tokens if req.max_tokens is not None else 16
        seq = self._new_seq(req, self._completion_prompt(req), max_tokens, "prompt")
        id_ = f"cmpl-{uuid.uuid4().hex}"
        if req.stream:

            def choice(text: str | None, reason: str | None) -> dict[str, Any]:
                return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}

            include = bool(req.stream_options and req.stream_options.include_usage)
            return self._stream(
                seq, object_="text_completion", id_=id_, choice=choice, include_usage=include
            )
        text, finish = await self._collect(seq)
        return JSONResponse(
            {
                "id": id_,
                "object": "text_completion",
                "created": int(time.time()),
                "model": self.config.served_model_name,
                "choices": [
                    {"index": 0, "text": text, "logprobs": None, "finish_reason": finish.reason}
                ],
                "usage": self._usage(finish),
            }
        )

    async def chat(self, req: ChatRequest) -> Response:
        """``POST /v1/chat/completions``."""
        self._check_model(req.model)
        max_tokens = req.max_completion_tokens or req.max_tokens
        seq = self._new_seq(req, self._chat_prompt(req), max_tokens, "messages")
        id_ = f"chatcmpl-{uuid.uuid4().hex}"
        if req.stream:

            def choice(text: str | None, reason: str | None) -> dict[str, Any]:
                delta = {"content": text} if text is not None else {}
                return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}

            include = bool(req.stream_options and req.stream_options.include_usage)
            return self._stream(
                seq, object_="chat.completion.chunk", id_=id_, choice=choice,
                include_usage=include,
            )  # fmt: skip
        text, finish = await self._collect(seq)
        return JSONResponse(
            {
                "id": id_,
                "object": "chat.completion",
                "created": int(time.time()),
                "model": self.config.served_model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text},
                        "logprobs": None,
                        "finish_reason": finish.reason,
                    }
                ],
                "usage": self._usage(finish),
            }
        )

    def models(self) -> dict[str, Any]:
        """``GET /v1/models``."""
        return {
            "object": "list",
            "data": [
                {
                    "id": self.config.served_model_name,
                    "object": "model",
                    "created": self.created,
                    "owned_by": "oominfer",
                    "root": self.config.model,
                    "max_model_len": self.max_model_len,
                }
            ],
        }

    # app

    def _build_app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(app: FastAPI) -> AsyncIterator[None]:
            self.scheduler.start()
            try:
                yield
            finally:
                self.scheduler.close()

        app = FastAPI(title="oominfer (transformers)", lifespan=lifespan, docs_url=None,
                      redoc_url=None, openapi_url=None)  # fmt: skip

        @app.exception_handler(ApiError)
        async def api_error(request: Request, exc: ApiError) -> Response:
            return exc.response()

        @app.exception_handler(RequestValidationError)
        async def invalid(request: Request, exc: RequestValidationError) -> Response:
            message, param = _validation_message(exc)
            return ApiError(400, message, param=param, code="invalid_request").response()

        @app.exception_handler(StarletteHTTPException)
        async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
            headers = dict(exc.headers) if exc.headers else None
            return ApiError(exc.status_code, str(exc.detail), headers=headers).response()

        @app.exception_handler(Exception)
        async def unexpected(request: Request, exc: Exception) -> Response:
            log.exception("Unexpected error on %s", request.url.path)
            return ApiError(500, "Internal server error.", type_="internal_error").response()

        app.post("/v1/completions", response_model=None)(self.completions)
        app.post("/v1/chat/completions", response_model=None)(self.chat)
        app.get("/v1/models")(self.models)

        @app.get("/health", response_model=None)
        async def health() -> Response:
            if self.draining:
                return JSONResponse({"status": "draining"}, status_code=503)
            return JSONResponse({"status": "ok"})

        @app.get("/metrics", response_model=None)
        async def metrics() -> Response:
            return PlainTextResponse(
                self.metrics.render(self.scheduler),
                media_type="text/plain; version=0.0.4; charset=utf-8",
            )

        app.add_middleware(_Gate, server=self)
        return app

    async def drain(self, uv: uvicorn.Server) -> None:
        """Stop accepting, let in-flight requests finish within the grace period, then stop."""
        grace = self.config.grace_period_s
        log.info("Shutting down: refusing new requests; waiting up to %g s for %d in flight.",
                 grace, self.in_flight)  # fmt: skip
        self.draining = True
        self.scheduler.stop_accepting()
        deadline = time.monotonic() + grace
        while (self.in_flight or not self.scheduler.idle()) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        if self.in_flight or not self.scheduler.idle():
            log.warning("Grace period of %g s is over: ending %d requests.", grace,
                        self.in_flight)  # fmt: skip
            await asyncio.to_thread(
                self.scheduler.abort_all, "The server stopped before this request finished."
            )
            await asyncio.sleep(0.2)  # let the aborted streams send their error and [DONE]
        uv.should_exit = True


class _DrainingUvicorn(uvicorn.Server):
    """uvicorn whose first SIGTERM/SIGINT drains instead of closing the socket at once.

    uvicorn re-raises a captured signal after shutting down, which would end the process with
    -SIGTERM; the drain exits 0 instead, as a graceful stop should.
    """

    def __init__(self, config: uvicorn.Config, server: Server) -> None:
        super().__init__(config)
        self.oominfer = server
        self.loop: asyncio.AbstractEventLoop | None = None
        self.signalled = False
        self.drain_task: asyncio.Task[None] | None = None

    async def startup(self, sockets: list[Any] | None = None) -> None:
        self.loop = asyncio.get_running_loop()
        await super().startup(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        loop = self.loop
        if self.signalled or loop is None:
            log.warning("Signal %d: exiting now.", sig)
            self.should_exit = True
            self.force_exit = self.signalled
            return
        self.signalled = True

        def begin() -> None:
            self.drain_task = loop.create_task(self.oominfer.drain(self))

        loop.call_soon_threadsafe(begin)


# Command line


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m oominfer.backends.hf_server",
        description="Serve a causal LM with transformers behind an OpenAI-compatible API.",
        epilog=f"Test only: {TEST_OOM_ENV}=N makes the N-th batched forward pass raise "
        "torch.OutOfMemoryError.",
    )
    p.add_argument("--model", help="model folder or id (default: the plan's model_id)")
    p.add_argument("--plan", type=Path, help="a plan.json written by `oominfer fit`")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"])
    p.add_argument("--quantization", choices=["bitsandbytes", "int8"])
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULT_MAX_QUEUE,
        help="requests allowed to wait for a batch slot before 429 (default: %(default)s)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"bearer token required on /v1/* (default: ${API_KEY_ENV})")  # fmt: skip
    p.add_argument("--served-model-name")
    p.add_argument(
        "--grace-period",
        type=float,
        default=DEFAULT_GRACE_PERIOD_S,
        help="seconds to finish in-flight requests after SIGTERM (default: %(default)s)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p.parse_args(argv)


def resolve_config(args: argparse.Namespace) -> ServerConfig:
    """Merge the plan (if any) with the flags; flags win.

    Raises:
        PlanError: the plan cannot be read.
        InvalidSettingError: an impossible setting.
    """
    plan: Plan | None = None
    if args.plan is not None:
        try:
            text = args.plan.read_text()
        except OSError as err:
            raise InvalidSettingError(f"cannot read --plan {args.plan}: {err.strerror}.") from None
        plan = plan_from_json(text, source=str(args.plan))
    base = plan.settings if plan else VllmSettings()
    overrides = {
        "dtype": args.dtype,
        "quantization": args.quantization,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
    }
    settings = dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
    if settings.quantization not in (None, "bitsandbytes", "int8"):
        log.warning("quantization %r is left to the checkpoint's own config.",
                    settings.quantization)  # fmt: skip
    model = args.model or (plan.model_id if plan else None)
    if not model:
        raise InvalidSettingError(
            "no model to serve.", hint="Pass --model DIR or --plan plan.json."
        )
    if args.max_queue < 1:
        raise InvalidSettingError(f"--max-queue must be a positive integer, got {args.max_queue}.")
    if args.grace_period < 0:
        raise InvalidSettingError(f"--grace-period must be >= 0, got {args.grace_period}.")
    return ServerConfig(
        model=model,
        served_model_name=args.served_model_name or model,
        settings=settings,
        device=args.device or (plan.device if plan else "auto"),
        host=args.host,
        port=args.port,
        max_queue=args.max_queue,
        api_key=args.api_key or None,
        grace_period_s=args.grace_period,
    )


def _describe(config: ServerConfig, server: Server) -> str:
    s = config.settings
    return (
        f"Serving {config.model} as {config.served_model_name!r} on "
        f"http://{config.host}:{config.port} with transformers on {server.engine.device}: "
        f"dtype={s.dtype} quantization={s.quantization or 'none'} "
        f"max_model_len={server.max_model_len} max_num_seqs={config.max_num_seqs} "
        f"max_queue={config.max_queue} grace_period={config.grace_period_s:g}s "
        f"api_key={'set' if config.api_key else 'none'} "
        f"weights={server.engine.weights_bytes / 2**20:.1f} MiB"
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until a signal; returns the process exit status."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = resolve_config(args)
        engine = Engine.load(config)
        server = Server(config, engine)
    except OominferError as err:
        if os.environ.get("OOMINFER_DEBUG"):
            raise
        print(f"Error: {err}", file=sys.stderr)
        if err.hint:
            print(f"Hint: {err.hint}", file=sys.stderr)
        return int(err.exit_status)
    log.info("%s", _describe(config, server))
    uv_config = uvicorn.Config(
        server.app,
        host=config.host,
        port=config.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
        access_log=False,
    )
    _DrainingUvicorn(uv_config, server).run()
    log.info("Stopped.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
