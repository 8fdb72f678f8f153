"""Engine processes: free ports, process groups, their memory, and killing them all.

Every engine runs in its own process group; the groups this process started are kept in
``_LIVE`` and killed at exit, on SIGTERM and on Ctrl-C, so no engine outlives oominfer.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

_LIVE: set[int] = set()
"""Process groups this process started and has not reaped yet."""


def track(pgid: int) -> None:
    """Remember a process group to kill on the way out."""
    _LIVE.add(pgid)


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
