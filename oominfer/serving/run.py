"""serve: run a plan behind the OpenAI API, exactly as the plan (and fit's probe) says.

vLLM is launched from the same argv builder the probe used; the transformers backend is
oominfer's own server. The engine's output is passed through while the first lines are kept,
so that a failure at start can be explained against what the plan predicted. SIGTERM and
SIGINT are forwarded (vLLM drains, then stops) and oominfer exits with the engine's status.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

from oominfer.engines.command import engine_argv
from oominfer.engines.environment import engine_env
from oominfer.planning.document import Plan
from oominfer.serving.extra import merge_extra
from oominfer.units import format_bytes
from oominfer.verify.classify import read_log
from oominfer.verify.process import kill_group

_KEEP_LINES = 4000


def server_argv(
    plan: Plan,
    *,
    host: str,
    port: int,
    extra: Sequence[str] = (),
    api_key: str | None = None,
    grace_period: int = 30,
    python: str | None = None,
) -> list[str]:
    """The engine command for a plan: vLLM's OpenAI server or oominfer's transformers one.

    ``grace_period``: seconds in-flight requests may take to finish after SIGTERM (vLLM's
    --shutdown-timeout drains instead of aborting them).
    """
    argv = engine_argv(
        plan.model_id,
        plan.settings,
        engine=plan.engine,
        host=host,
        port=port,
        python=python or sys.executable,
        revision=plan.revision,
    )
    if api_key:
        argv += ["--api-key", api_key]
    extras = merge_extra(plan, extra)
    if plan.engine == "vllm" and "--shutdown-timeout" not in extras:
        argv += ["--shutdown-timeout", str(grace_period)]
    elif plan.engine == "transformers":
        argv += ["--grace-period", str(grace_period)]
    return [*argv, *extras]


def explain_failure(plan: Plan, log_text: str) -> str | None:
    """Why the engine failed at start, next to what the plan predicted; None if unknown."""
    facts = read_log(log_text)
    if facts.status is None or not facts.status.is_memory:
        return None
    predicted = plan.predicted
    said = [f"The engine failed at start ({facts.status.value}): {facts.detail}"]
    if predicted is not None:
        said.append(
            f"The plan predicted {format_bytes(predicted.weights_bytes)} of weights and "
            f"{format_bytes(predicted.kv_cache_bytes)} of KV cache per GPU"
            + (
                f"; the engine reported {format_bytes(facts.weights_bytes)} of weights"
                if facts.weights_bytes
                else ""
            )
            + "."
        )
    fix = f"--max-model-len {facts.estimated_max_model_len}" if facts.estimated_max_model_len else (
        "--gpu-memory-utilization lower, or --prefer quality off"
    )  # fmt: skip
    said.append(
        f"The GPU differs from the one the plan was made for, or memory is held elsewhere: "
        f"run `oominfer fit {plan.model_id}` here again (e.g. with {fix})."
    )
    return " ".join(said)


def run(
    plan: Plan,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    extra: Sequence[str] = (),
    api_key: str | None = None,
    grace_period: int = 30,
    out: IO[str] | None = None,
    on_failure: Callable[[str], None] | None = None,
) -> int:
    """Serve ``plan`` in the foreground; returns the engine's exit status."""
    argv = server_argv(
        plan, host=host, port=port, extra=extra, api_key=api_key, grace_period=grace_period
    )
    workdir = Path(tempfile.mkdtemp(prefix="oominfer-serve-"))
    env = engine_env(plan.settings, device=plan.device, workdir=workdir)
    sink = out or sys.stdout
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
        start_new_session=True, bufsize=1,
    )  # fmt: skip

    def forward(signum: int, frame: object) -> None:
        # To the server process only: it drains in-flight requests and stops its own
        # engine processes; signalling the whole group would kill the engine under it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(proc.pid, signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    kept: collections.deque[str] = collections.deque(maxlen=_KEEP_LINES)
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            sink.write(line)
            sink.flush()
            kept.append(line)
        status = proc.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        kill_group(proc.pid, grace=grace_period + 10.0)
    if status not in (0, -signal.SIGTERM, -signal.SIGINT) and on_failure is not None:
        why = explain_failure(plan, "".join(kept))
        if why:
            on_failure(why)
    if status < 0:  # killed by a signal we forwarded: a clean stop
        return 0 if -status in (signal.SIGTERM, signal.SIGINT) else 128 - status
    return status
