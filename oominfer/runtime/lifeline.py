"""The lifeline: a tiny supervisor between oominfer and an engine, so the engine dies with it.

oominfer runs it as ``python -I -S lifeline.py FD ARGV...`` in a new session (standard library
only, no site: it starts in milliseconds and holds a few MiB), so it leads the engine's process
group. It starts the engine in that group, then:

- watches FD, the read end of a pipe whose write end only oominfer holds. However oominfer
  dies (``kill -9`` included) the pipe reads end-of-file; a Linux parent-death signal says the
  same. The supervisor then stops the engine's whole tree: SIGTERM, SIGKILL after ``GRACE_S``.
  vLLM's EngineCore and Worker are the engine's children, which no signal set in the engine
  itself would reach;
- is a child subreaper: engine processes orphaned inside the tree come to it, are reaped
  (never left ``<defunct>``) and killed with the rest;
- ignores SIGTERM, SIGINT and SIGHUP itself: oominfer signals the group and the engine decides
  how to stop; the supervisor follows;
- when the engine exits, kills what is left of its tree and exits with the engine's status,
  re-raising the signal that killed it (so oominfer sees -4 for an engine that died of SIGILL).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import select
import signal
import sys
import time
from pathlib import Path

GRACE_S = 4.0
"""Seconds the engine's tree has to stop after SIGTERM before SIGKILL."""
POLL_S = 0.2

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_parent_died = False


def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _on_parent_death(signum: int, frame: object) -> None:
    global _parent_died
    _parent_died = True


def _ignore(signum: int, frame: object) -> None:
    """A handler, not SIG_IGN: a caught signal is reset at exec, an ignored one is inherited."""


def _tree() -> list[int]:
    """Live processes of this group, and every descendant of this process, but itself."""
    me = os.getpid()
    group = os.getpgrp()
    parent_of: dict[int, int] = {}
    members: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[-1].split()
        except OSError:
            continue
        if fields[0] == "Z":
            continue
        pid = int(entry.name)
        parent_of[pid] = int(fields[1])
        if int(fields[2]) == group:
            members.add(pid)
    for pid in parent_of:
        seen = pid
        for _ in range(64):  # the ancestry chain, bounded
            seen = parent_of.get(seen, 0)
            if seen == me:
                members.add(pid)
                break
            if seen <= 1:
                break
    members.discard(me)
    return sorted(members)


def _signal_tree(sig: int) -> None:
    for pid in _tree():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _reap() -> list[tuple[int, int]]:
    """Reap every child that has exited: (pid, wait status)."""
    done: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done.append((pid, status))


def _stop_tree() -> None:
    """SIGTERM what is left, SIGKILL it after the grace period, reap it all."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _signal_tree(sig)
        deadline = time.monotonic() + GRACE_S
        while time.monotonic() < deadline and _tree():
            _reap()
            time.sleep(0.05)
    _reap()


def _exit_like(status: int) -> None:
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    sig = -code
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the engine's crash, not ours
    signal.signal(sig, signal.SIG_DFL)
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)


def main(argv: list[str]) -> None:
    """``lifeline.py FD ARGV...``: run ARGV until it exits or FD reads end-of-file."""
    lifeline = int(argv[0])
    os.set_inheritable(lifeline, False)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, _ignore)
    signal.signal(signal.SIGUSR1, _on_parent_death)
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    _prctl(_PR_SET_PDEATHSIG, signal.SIGUSR1)
    parent = os.getppid()
    try:
        engine = os.posix_spawnp(argv[1], argv[1:], dict(os.environ))
    except OSError as err:
        print(f"oominfer: cannot start {argv[1]}: {err.strerror}", file=sys.stderr, flush=True)
        os._exit(127)
    status: int | None = None
    while status is None:
        ready, _, _ = select.select([lifeline], [], [], POLL_S)
        if _parent_died or os.getppid() != parent or (ready and not os.read(lifeline, 64)):
            _stop_tree()
            os._exit(128 + signal.SIGKILL)
        for pid, st in _reap():
            if pid == engine:
                status = st
    _stop_tree()
    _exit_like(status)


if __name__ == "__main__":
    main(sys.argv[1:])
