"""Where an engine's start-up is, read from its log: the phase and the live progress bar. Pure.

vLLM prints no "phase" field: it logs one line as it enters each step (vLLM 0.5 to 0.33, GPU
and CPU builds; the lines below are quoted from real logs in tests/data/vllm_logs and
../shared/calibration), and tqdm bars for the long ones (downloads, checkpoint shards, CUDA
graph capture). The phase is the step whose line came *last* in the log, so a line that
recurs (a warning naming torch.compile) cannot pull it backwards, and a bar is shown only
while it is the newest thing the log says.
"""

from __future__ import annotations

import re
from typing import Final

PHASES: Final = (
    ("Resolved architecture", "reading the model's config"),
    ("Initializing a V1 LLM engine", "starting the engine"),
    ("Initializing a V0 LLM engine", "starting the engine"),
    ("Initializing an LLM engine", "starting the engine"),
    ("Fetching ", "downloading weights"),
    ("Downloading ", "downloading weights"),
    ("Starting to load model", "loading weights"),
    ("Loading safetensors checkpoint shards", "loading weights"),
    ("Loading weights took", "loading weights"),
    ("Model loading took", "profiling memory"),
    ("Loading model weights took", "profiling memory"),
    ("Memory profiling takes", "profiling memory"),
    ("Memory profiling results", "profiling memory"),
    ("Dynamo bytecode transform time", "compiling"),
    ("Compiling a graph", "compiling"),
    ("Warming up model for the compilation", "compiling"),
    ("Available KV cache memory", "allocating KV cache"),
    ("# GPU blocks", "allocating KV cache"),
    ("# CUDA blocks", "allocating KV cache"),
    ("for KV cache on node", "allocating KV cache"),
    ("KV cache size:", "allocating KV cache"),
    ("Capturing CUDA graph", "capturing CUDA graphs"),
    ("Capturing cudagraphs", "capturing CUDA graphs"),
    ("Graph capturing finished", "warming up"),
    ("init engine (profile, create kv cache", "starting server"),
    ("Starting vLLM API server", "starting server"),
    ("Starting vLLM server on", "starting server"),
    ("Application startup complete", "ready"),
)
"""(a substring of vLLM's line, the phase it starts), for every phase a user waits through."""

_BAR: Final = re.compile(
    r"(?P<label>[^\r\n|]*?):?\s*(?P<pct>\d{1,3})%(?:\s*Completed)?\s*\|[^|\r\n]*\|\s*"
    r"(?P<done>[\d.,]+\s*[kMGTP]?B?)/(?P<total>[\d.,]+\s*[kMGTP]?B?)\s*"
    r"\[(?P<elapsed>[\d:]+)<(?P<eta>[\d:?]+),\s*(?P<rate>[^\]]*?)\s*\]"
)
"""A tqdm bar, as huggingface_hub and vLLM print it:
``model-00001-of-00004.safetensors:  45%|####5     | 2.24G/4.98G [00:31<00:38, 71.2MB/s]``
or ``Capturing CUDA graphs (decode, FULL): 100%|██████████| 67/67 [00:01<00:00, 34.39it/s]``."""


def phase_of(text: str) -> str:
    """The phase the engine is in: the one whose line came last in ``text`` ("starting" before
    any)."""
    best, where = "starting", -1
    for needle, name in PHASES:
        at = text.rfind(needle)
        if at > where:
            best, where = name, at
    return best


def bar_of(text: str) -> str:
    """The newest progress bar of ``text``, shortened ("2.24G/4.98G 71.2MB/s, 00:38 left"),
    or "" when a log line came after it (the bar is done with) or there is none."""
    tail = text[-4000:]
    last_line = tail.rstrip("\n").rsplit("\n", 1)[-1]
    piece = last_line.rsplit("\r", 1)[-1].strip() or last_line.strip()
    m = _BAR.search(piece)
    if m is None:
        return ""
    label = m["label"].strip()
    said = f"{m['pct']}% {m['done'].strip()}/{m['total'].strip()}"
    if m["rate"] and "?" not in m["rate"]:
        said += f" {m['rate'].strip()}"
    if m["eta"] and "?" not in m["eta"] and m["pct"] != "100":
        said += f", {m['eta']} left"
    return f"{label}: {said}" if label else said


def status_of(text: str) -> str:
    """One line for a status display: the phase, and the live bar when there is one."""
    phase, bar = phase_of(text), bar_of(text)
    return f"{phase} ({bar})" if bar else phase
