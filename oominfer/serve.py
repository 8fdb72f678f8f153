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

from oominfer.backends.vllm import read_log
from oominfer.errors import InvalidSettingError
from oominfer.plan import Plan
from oominfer.probe import engine_argv, engine_env, kill_group
from oominfer.settings import to_vllm_args
from oominfer.units import format_bytes

_KEEP_LINES = 4000


def _flag_values(args: Sequence[str]) -> dict[str, str | None]:
    """--flag value pairs (and bare --flags) of an argv tail."""
    values: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            if eq:
                values[name] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                values[name] = args[i + 1]
                i += 1
            else:
                values[name] = None
        i += 1
    return values


def merge_extra(plan: Plan, extra: Sequence[str]) -> list[str]:
    """Extra vLLM flags given after ``--``, checked against the plan.

    A flag the plan sets may be repeated with the same value (the Kubernetes manifests do, so
    the pod spec shows every flag) and is then dropped; a different value is refused, since
    what runs must be what was verified.

    Raises:
        InvalidSettingError: an extra flag contradicts the plan.
    """
    planned = _flag_values(to_vllm_args(plan.settings))
    given = _flag_values(extra)
    for flag, value in given.items():
        if flag in planned and planned[flag] != value:
            raise InvalidSettingError(
                f"{flag} {value} contradicts the plan's {flag} {planned[flag]}.",
                hint="Re-run `oominfer fit` with the new constraint to write a verified plan.",
            )
    out: list[str] = []
    i = 0
    while i < len(extra):
        token = extra[i]
        name = token.partition("=")[0]
        takes_value = "=" not in token and i + 1 < len(extra) and not extra[i + 1].startswith("--")
        if name in planned:
            i += 2 if takes_value else 1
            continue
        out.append(token)
        if takes_value:
            out.append(extra[i + 1])
            i += 1
        i += 1
    return out


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
    predicted = plan.predicted or {}
    said = [f"The engine failed at start ({facts.status.value}): {facts.detail}"]
    if predicted:
        said.append(
            f"The plan predicted {format_bytes(predicted.get('weights_bytes', 0))} of weights and "
            f"{format_bytes(predicted.get('kv_cache_bytes', 0))} of KV cache per GPU"
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
