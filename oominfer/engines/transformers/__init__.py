"""The transformers backend: an OpenAI-compatible server for what vLLM cannot serve.

Run it as::

    python -m oominfer.engines.transformers --model DIR --host 127.0.0.1 --port 8000 \\
        [--plan plan.json] [SETTINGS...] [--max-queue N] [--api-key KEY] \\
        [--served-model-name NAME] [--grace-period S] [--default-max-tokens N] \\
        [--max-body-size 10MiB] [--timeout-keep-alive S] [--timeout-request S] \\
        [--max-connections N]

SETTINGS are the engine settings this engine takes (dtype, quantization, context, sequences),
under vLLM's flag names as ``oominfer.settings`` declares them; ``--help`` lists them.

Endpoints: ``/v1/models``, ``/v1/completions``, ``/v1/chat/completions`` (the tokenizer's chat
template; ``stream: true`` as server-sent events ending with ``data: [DONE]``), ``/health``,
``/metrics`` (Prometheus text) and ``/openapi.json``. Only ``/v1/*`` needs the bearer token
(scheme in any case) when ``--api-key`` (or ``OOMINFER_API_KEY``) is set; a non-loopback
``--host`` without one logs a warning.

At the edges: a bad or unsupported field (``tools``, ``response_format``, ``logit_bias``...) is
a 400 naming it, and never reaches the batch; a body over ``--max-body-size`` is a 413; prompts
are tokenized on a worker thread; a client that disconnects has its request cancelled and its
batch slot freed; a chat without ``max_tokens`` stops at ``--default-max-tokens`` (see
``prompts.default_max_tokens``); idle, slow and surplus connections are closed (``connections``).

Modules, one concept each:

- ``config``: the flags and the plan, resolved to a ``ServerConfig``.
- ``runner``: loading the model; its prefill and decode forward passes.
- ``kv``: the running batch and its KV cache (merge, select rows, size).
- ``sequence``: one request's generation state, its events, token sampling.
- ``scheduler``: continuous batching on one worker thread; out-of-memory split-and-retry.
- ``oom``: recognising an allocation failure at run time and giving memory back.
- ``metrics``: ``/metrics`` through ``prometheus_client``: requests, tokens, the batch.
- ``protocol``: the OpenAI wire format (requests, errors, replies, SSE chunks).
- ``prompts``: a validated request checked against the model and turned into a sequence.
- ``server``: the FastAPI app and its routes; a request whose client leaves is cancelled.
- ``openapi``: ``/openapi.json``, with the errors as they are answered.
- ``shutdown``: SIGTERM drain.

The edge it stands behind (API key, body size, connection cap, idle and request timeouts) is
``oominfer.edge``, shared with the front of ``oominfer serve``.
- ``cli``: ``main``, behind ``python -m oominfer.engines.transformers``.

Importing this package loads torch and FastAPI (transformers once a model loads): the pure
core never imports it.
"""

from __future__ import annotations

import os

# Before torch loads libgomp: OpenMP threads that spin between parallel regions starve the
# event loop's thread of a core and of the GIL. Measured on 2 cores with the tiny test model,
# one 32-token request took 0.75-1.1 s with spinning threads and 0.09 s with passive ones.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from oominfer.engines.transformers.cli import main
from oominfer.engines.transformers.config import ServerConfig, parse_args, resolve_config
from oominfer.engines.transformers.metrics import Metrics
from oominfer.engines.transformers.protocol import ApiError
from oominfer.engines.transformers.runner import ModelRunner
from oominfer.engines.transformers.scheduler import Scheduler
from oominfer.engines.transformers.sequence import ErrorEvent, Event, FinishEvent, Seq, TokenEvent
from oominfer.engines.transformers.server import Server

__all__ = [
    "ApiError",
    "ErrorEvent",
    "Event",
    "FinishEvent",
    "Metrics",
    "ModelRunner",
    "Scheduler",
    "Seq",
    "Server",
    "ServerConfig",
    "TokenEvent",
    "main",
    "parse_args",
    "resolve_config",
]
