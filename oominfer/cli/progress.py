"""Progress of the long steps (engine launches, downloads) on stderr, one piece for fit and serve.

On a terminal it is one live status line, rewritten in place (``\\r``, then erase to the end of
the line) every second; elsewhere (a log file, CI) plain lines, one per phase, so a log reads
as a history instead of thousands of rewrites. ``--quiet`` and ``--json`` print none of it, and
turn huggingface_hub's own download bars off too.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

_ERASE = "\x1b[K"
"""Erase from the cursor to the end of the line (a shorter status leaves no tail behind)."""


def _phase(status: str) -> str:
    """The phase part of a status line ("loading weights (45% 2.2G/5.0G)" -> its phase)."""
    return status.split(" (", 1)[0]


@dataclass
class Progress:
    """Where fit and serve report launches, notes and the engine's phase."""

    quiet: bool = False
    stream: IO[str] | None = None
    """Default: stderr (data goes to stdout, diagnostics to stderr)."""
    live: bool | None = None
    """Rewrite one line in place; default: when the stream is a terminal."""
    _open: bool = field(default=False, init=False)
    _last_phase: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if self.live is None:
            self.live = (self.stream or sys.stderr).isatty()
        if self.quiet:
            _hub_bars_off()

    def _write(self, text: str) -> None:
        stream = self.stream or sys.stderr
        stream.write(text)
        stream.flush()

    def _close_line(self) -> None:
        if self._open:
            self._write("\n")
            self._open = False

    def note(self, text: str) -> None:
        """A sentence for the user (a workaround applied, a budget shrunk): shown even when
        quiet, as a warning is; it ends the live line first."""
        self._close_line()
        self._write(text + "\n")

    def launch(self, number: int, argv: list[str], log: Path, version: str) -> None:
        """An engine launch: its command and log file."""
        if self.quiet:
            return
        self._close_line()
        self._last_phase = ""
        self._write(f"Launch {number} ({version}, log {log}):\n  {shlex.join(argv[1:])}\n")

    def update(self, elapsed: float, status: str) -> None:
        """The engine's phase (and bar) after ``elapsed`` seconds of its launch."""
        if self.quiet:
            return
        line = f"  [{elapsed:5.0f} s] {status}"
        if self.live:
            self._write("\r" + line + _ERASE)
            self._open = True
        elif _phase(status) != self._last_phase:
            self._write(line + "\n")
        self._last_phase = _phase(status)

    def done(self) -> None:
        """The long step is over: end the live line."""
        self._close_line()


def _hub_bars_off() -> None:
    """huggingface_hub prints its own tqdm bars while it downloads: none under --quiet."""
    from huggingface_hub.utils.tqdm import disable_progress_bars

    disable_progress_bars()
