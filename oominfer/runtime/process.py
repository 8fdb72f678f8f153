"""Engine processes: starting them on a lifeline, their memory, and killing them all.

Every engine runs in its own process group under the lifeline supervisor
(``oominfer/runtime/lifeline.py``), which stops the group when this process dies, however it
dies. The groups this process started are also kept in ``_LIVE`` and killed at exit, on
SIGTERM, SIGHUP and Ctrl-C, so no engine outlives oominfer.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

LIFELINE = Path(__file__).with_name("lifeline.py")

_LIVE: set[int] = set()
"""Process groups this process started and has not reaped yet."""
_LIFELINES: dict[int, int] = {}
"""Process group -> the write end of its lifeline pipe (closing it stops the group)."""

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""Signals that stop oominfer as Ctrl-C does (SIGHUP: the terminal closed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveEngine:
    """An engine that a probe started and proved, handed over running instead of stopped
    (``serve`` puts its front on it: one launch from command to serving).

    It stays on its lifeline and in ``_LIVE``: whoever holds it stops it with ``stop``, and
    it dies with this process all the same."""

    proc: subprocess.Popen[bytes]
    port: int
    """Its port on 127.0.0.1."""
    log_path: Path
    """The file its output goes to (it keeps writing there)."""
    argv: list[str]


def track(pgid: int) -> None:
    """Remember a process group to kill on the way out."""
    _LIVE.add(pgid)


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_engine(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    stdout: int | IO[Any] | None,
    text: bool = False,
    cwd: str | None = None,
) -> subprocess.Popen[Any]:
    """Start ``argv`` in its own process group, on a lifeline to this process.

    The process returned is the lifeline supervisor: it leads the group, exits with the
    engine's status (a signal that killed the engine is re-raised), and stops the engine's
    whole tree when the engine exits or when this process dies. Standard error goes with
    standard output; standard input is /dev/null.
    """
    read_end, write_end = os.pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(LIFELINE), str(read_end), *argv],
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=subprocess.STDOUT, env=dict(env),
            pass_fds=(read_end,), start_new_session=True, text=text, cwd=cwd,
            bufsize=1 if text else -1,
        )  # fmt: skip
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    _LIFELINES[proc.pid] = write_end
    track(proc.pid)
    return proc


def kill_group(pgid: int, *, grace: float = 10.0) -> None:
    """SIGTERM a process group, then SIGKILL what is left after ``grace`` seconds, and wait
    (a few seconds at most) until the kernel has ended them."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and _group_alive(pgid):
            time.sleep(0.05)
    _LIVE.discard(pgid)
    write_end = _LIFELINES.pop(pgid, None)
    if write_end is not None:
        os.close(write_end)


def stop(proc: subprocess.Popen[Any], *, grace: float = 10.0) -> int:
    """Stop an engine started by ``start_engine`` and reap it; returns its exit status."""
    kill_group(proc.pid, grace=grace)
    return proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return bool(group_pids(pgid))


def group_pids(pgid: int) -> list[int]:
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
    """Resident memory of the engine's processes in a group, summed (its leader, the lifeline
    supervisor, is not the engine's)."""
    total = 0
    page = os.sysconf("SC_PAGE_SIZE")
    for pid in group_pids(pgid):
        if pid == pgid:
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * page
    return total


def kill_all(*, sparing: Collection[int] = ()) -> None:
    """Kill every engine this process started (atexit and signal handlers call this), except
    the process groups in ``sparing`` (an engine handed over to serve)."""
    for pgid in list(_LIVE):
        if pgid not in sparing:
            kill_group(pgid, grace=5.0)


atexit.register(kill_all)


@contextlib.contextmanager
def interrupts_kill_engines(sparing: Collection[int] = ()) -> Iterator[None]:
    """Turn SIGTERM and SIGHUP into KeyboardInterrupt so the probes' finally blocks run, and
    kill the engines started inside on the way out: all of them on an error or a signal,
    all but the groups in ``sparing`` (a live collection, read at the end) otherwise."""

    def _raise(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, _raise) for sig in STOP_SIGNALS}
    failed = True
    try:
        yield
        failed = False
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        kill_all(sparing=() if failed else sparing)
