"""serve: run a plan behind the OpenAI API, exactly as the plan (and fit's probe) says.

vLLM is launched from the same argv builder the probe used; the transformers backend is
oominfer's own server. Either engine listens on a private port of 127.0.0.1, on a lifeline (it
dies with oominfer however oominfer dies), and reads the API key from its environment, never
its command line. oominfer owns the public port (``front``: a thin streaming proxy), passes
the engine's output through (keeping the last lines to explain a failure), and on SIGTERM,
SIGINT or SIGHUP drains: 503 to new requests and to ``/health``, the grace period for those in
flight, an error event for the streams still open after it, then the engine's whole process
group stopped and reaped, within the grace period plus about 7 seconds. A second signal cuts
the drain short.

How it ends is its exit code, ``ServeExit``: the codes of ``oominfer.base.errors.ExitStatus``,
whose meanings are written once, in ``EXIT_CODES``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import enum
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any, Final

from oominfer.base.errors import ExitStatus, InvalidSettingError
from oominfer.base.units import format_bytes
from oominfer.engines.command import engine_argv
from oominfer.planning.document import Plan
from oominfer.runtime.classify import read_log
from oominfer.runtime.environment import engine_env
from oominfer.runtime.process import STOP_SIGNALS, LiveEngine, free_port, start_engine, stop
from oominfer.runtime.status import LogFacts, ProbeStatus
from oominfer.serving.extra import merge_extra
from oominfer.settings import flag
from oominfer.verify.prober import ProbeResult, failure_of

if TYPE_CHECKING:
    from oominfer.edge.limits import ClientLimits
    from oominfer.serving.front import Front

_KEEP_LINES = 4000
ENGINE_STOP_S: Final = 4.0
"""Seconds the engine has to exit after SIGTERM, once the requests are done, before SIGKILL."""


class ServeExit(enum.IntEnum):
    """How ``oominfer serve`` ended: the exit codes it can give (meanings: ``EXIT_CODES``)."""

    DRAINED = ExitStatus.SUCCESS
    DOES_NOT_FIT = ExitStatus.DOES_NOT_FIT
    ENGINE_FAILED = ExitStatus.PROBE_FAILED
    CUT_SHORT = ExitStatus.CUT_SHORT


def server_argv(
    plan: Plan,
    *,
    host: str,
    port: int,
    extra: Sequence[str] = (),
    python: str | None = None,
    replicas: int = 1,
) -> list[str]:
    """The engine command for a plan: vLLM's OpenAI server or oominfer's transformers one.

    oominfer drains requests itself (``front``): the engine is stopped only once they are done,
    so the transformers server's own grace period is kept below the time it is given.
    ``replicas`` above one run the plan's layout that many times in one vLLM server
    (``--data-parallel-size``: each replica on its own GPUs, the memory per GPU unchanged).
    """
    argv = engine_argv(plan.model_id, plan.settings, engine=plan.engine, host=host, port=port,
                       python=python or sys.executable, revision=plan.revision)  # fmt: skip
    if plan.engine == "transformers":
        argv += ["--grace-period", f"{ENGINE_STOP_S / 2:g}"]
    extras = merge_extra(plan, extra)
    if plan.engine == "vllm" and replicas > 1 and "--data-parallel-size" not in extras:
        argv += ["--data-parallel-size", str(replicas)]
    return [*argv, *extras]


def local_replicas(plan: Plan, visible_gpus: int | None) -> int:
    """The replicas of ``plan`` this machine runs: the plan's, as many as its GPUs hold
    (all of them when the GPU count cannot be read)."""
    if plan.device != "cuda" or plan.engine != "vllm" or plan.replicas <= 1:
        return 1
    if visible_gpus is None:
        return plan.replicas
    return max(1, min(plan.replicas, visible_gpus // max(plan.gpu_count, 1)))


def explain_failure(plan: Plan, log_text: str) -> str | None:
    """Why the engine failed at start, next to what the plan predicted; None if unknown."""
    return _explain(plan, read_log(log_text))


def _explain(plan: Plan, facts: LogFacts) -> str | None:
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
    fix = (
        f"{flag('max_model_len')} {facts.estimated_max_model_len}"
        if facts.estimated_max_model_len
        else f"{flag('gpu_memory_utilization')} lower, or --prefer quality off"
    )
    said.append(
        f"The GPU differs from the one the plan was made for, or memory is held elsewhere: "
        f"run `oominfer fit {plan.model_id}` here again (e.g. with {fix})."
    )
    return " ".join(said)


def bind(host: str, port: int) -> socket.socket:
    """The public socket, bound before the engine starts (a taken port fails at once).

    Raises:
        InvalidSettingError: the address cannot be listened on.
    """
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as err:
        raise InvalidSettingError(
            f"cannot listen on {host}:{port}: {err}.",
            hint="Pass --host an address of this machine.",
        ) from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as err:
        sock.close()
        raise InvalidSettingError(
            f"cannot listen on {host}:{port}: {err.strerror}.",
            hint="Pass --port a free port, or stop what listens there.",
        ) from None
    sock.set_inheritable(False)
    return sock


def _pass_through(stream: Iterable[str], sink: IO[str], kept: collections.deque[str]) -> None:
    """Copy the engine's output to ``sink`` as it comes, keeping the last lines."""
    for line in stream:
        kept.append(line)
        with contextlib.suppress(OSError, ValueError):  # a closed terminal must not block it
            sink.write(line)
            sink.flush()


def _follow(engine: LiveEngine) -> Iterator[str]:
    """The lines a handed-over engine writes to its log from now on, until it exits (its
    start-up, read by the probe already, is kept for a failure's explanation, not shown)."""
    with engine.log_path.open(encoding="utf-8", errors="replace") as log:
        log.seek(0, 2)
        partial = ""
        while True:
            chunk = log.readline()
            if chunk:
                partial += chunk
                if partial.endswith("\n"):
                    yield partial
                    partial = ""
                continue
            if engine.proc.poll() is not None:
                rest = partial + log.read()
                if rest:
                    yield rest
                return
            time.sleep(0.1)


@dataclass
class _Session:
    """One ``serve``: the front, the engine under it, and how it is asked to stop."""

    front: Front
    proc: subprocess.Popen[Any]
    grace: float
    note: Callable[[str], None]
    address: str
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    hurry: asyncio.Event = field(default_factory=asyncio.Event)
    signal_name: str = ""
    engine_failed: bool = False

    def on_signal(self, sig: int) -> None:
        if self.stopping.is_set():
            self.hurry.set()
            return
        self.signal_name = signal.Signals(sig).name
        self.stopping.set()

    async def serve(self, sock: socket.socket) -> ServeExit:
        from oominfer.serving.front import listener

        loop = asyncio.get_running_loop()
        for sig in (*STOP_SIGNALS, signal.SIGINT):
            loop.add_signal_handler(sig, self.on_signal, sig)
        server = listener(self.front)
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        try:
            outcome = await self._watch(serving)
        finally:
            server.should_exit = True
            stopped = asyncio.to_thread(stop, self.proc, grace=ENGINE_STOP_S)
            await asyncio.gather(serving, stopped, return_exceptions=True)
            await self.front.client.aclose()
        return outcome

    async def _watch(self, serving: asyncio.Future[None]) -> ServeExit:
        while not self.stopping.is_set():
            if serving.done():  # the front could not serve: nothing to drain
                serving.result()
                raise RuntimeError("the HTTP front stopped on its own")
            if self.proc.poll() is not None:
                self.engine_failed = True
                self.front.draining = True
                self.front.cut("The engine stopped before this request finished.")
                await self.front.wait_idle()
                return ServeExit.ENGINE_FAILED
            if not self.front.ready and await self._engine_healthy():
                self.front.ready = True
                self.note(f"Ready: {self.address}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), 0.25)
        return await self._drain()

    async def _engine_healthy(self) -> bool:
        try:
            return (await self.front.client.get("/health", timeout=2.0)).status_code == 200
        except Exception:  # not up yet: refused, reset, timed out
            return False

    async def _drain(self) -> ServeExit:
        front = self.front
        front.draining = True
        self.note(f"Stopping ({self.signal_name}): refusing new requests; waiting up to "
                  f"{self.grace:g} s for {front.in_flight} in flight.")  # fmt: skip
        await front.wait_idle(self.grace, until=self.hurry)
        if not front.in_flight:
            return ServeExit.DRAINED
        why = "a second signal came" if self.hurry.is_set() else (
            f"the grace period of {self.grace:g} s ran out")  # fmt: skip
        cut = front.cut(f"The server stopped before this request finished: {why}.")
        self.note(f"Ended {cut} request(s) in flight with an error: {why}.")
        await front.wait_idle()
        return ServeExit.CUT_SHORT


def run(
    plan: Plan,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    extra: Sequence[str] = (),
    api_key: str | None = None,
    grace_period: float = 30,
    out: IO[str] | None = None,
    on_failure: Callable[[str], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    python: str | None = None,
    replicas: int = 1,
    limits: ClientLimits | None = None,
    engine: LiveEngine | None = None,
    sock: socket.socket | None = None,
) -> int:
    """Serve ``plan`` in the foreground until a signal or the engine's end; returns the exit
    code (``ServeExit``). ``python`` runs the engine (default: this interpreter); ``limits``
    bound what clients of the public port hold and send (default: the edge's).

    ``engine``: the engine the probe verified this plan on, running (it was started with the
    plan's argv, ``extra`` and ``api_key``): served as it is, without a second launch, and
    stopped at the end as one started here is. ``sock``: the public socket, bound already
    (``bind``: before a fit that takes minutes, so a taken port fails at once); it is closed
    at the end.

    Raises:
        InvalidSettingError: the public address cannot be listened on, or extra flags
            contradict the plan.
    """
    from oominfer.serving.front import Front

    sink = out or sys.stdout

    def note(line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            sink.write(line + "\n")
            sink.flush()

    say = on_note or note
    kept: collections.deque[str] = collections.deque(maxlen=_KEEP_LINES)
    shown = f"[{host}]" if ":" in host else host
    if sock is None:
        try:
            sock = bind(host, port)
        except BaseException:
            if engine is not None:
                stop(engine.proc, grace=ENGINE_STOP_S)
            raise
    with contextlib.closing(sock):
        proc: subprocess.Popen[Any]
        if engine is None:
            private = free_port()
            argv = server_argv(plan, host="127.0.0.1", port=private, extra=extra, python=python,
                               replicas=replicas)  # fmt: skip
            built = engine_env(
                plan.settings, device=plan.device, engine=plan.engine, api_key=api_key
            )
            if built.note:
                say(built.note)
            proc = start_engine(argv, env=built.env, stdout=subprocess.PIPE, text=True)
            assert proc.stdout is not None
            lines: Iterable[str] = proc.stdout
        else:
            proc, private = engine.proc, engine.port
            kept.extend(engine.log_path.read_text(errors="replace").splitlines(keepends=True))
            lines = _follow(engine)
        reader = threading.Thread(target=_pass_through, args=(lines, sink, kept), daemon=True)
        reader.start()
        front = Front(private, api_key=api_key, limits=limits)
        session = _Session(front=front, proc=proc, grace=grace_period, note=say,
                           address=f"http://{shown}:{port}")  # fmt: skip
        try:
            outcome = asyncio.run(session.serve(sock))
        finally:  # serve() stops the engine; this is for when it could not run to its end
            status = proc.returncode if proc.returncode is not None else (
                stop(proc, grace=ENGINE_STOP_S))  # fmt: skip
            reader.join(timeout=5)
    if not session.engine_failed:
        return int(outcome)
    return int(_engine_failure(plan, status, "".join(kept), on_failure))


def failed_verification(
    plan: Plan, result: ProbeResult, on_failure: Callable[[str], None] | None
) -> int:
    """The exit code (``ServeExit``) for a plan whose verifying launch failed, and why, told
    to ``on_failure``: 3 when the engine ran short of memory, 4 otherwise."""
    code = ServeExit.ENGINE_FAILED
    why = None
    if result.status.is_memory:
        code = ServeExit.DOES_NOT_FIT
        why = _explain(plan, result.facts)
    if why is None:
        why = f"The engine failed at start ({result.status.value}): {result.detail}"
    if on_failure is not None:
        on_failure(f"{why.rstrip('.')}. Its log is {result.log_path}.")
    return int(code)


def _engine_failure(
    plan: Plan, status: int, log_text: str, on_failure: Callable[[str], None] | None
) -> ServeExit:
    """The exit code for an engine that stopped on its own, and why, told to ``on_failure``."""
    facts = read_log(log_text)
    code = ServeExit.ENGINE_FAILED
    kind, said = failure_of(facts, status, "")
    if kind is ProbeStatus.ILLEGAL_INSTRUCTION:
        why: str | None = said[:1].upper() + said[1:]
    else:
        why = _explain(plan, facts)
        if why is not None:
            code = ServeExit.DOES_NOT_FIT
        else:
            why = f"The engine exited with status {status}; its output is above."
    if on_failure is not None and why:
        on_failure(why)
    return code
