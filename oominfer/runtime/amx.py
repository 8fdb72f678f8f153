"""AMX on the CPU: whether it really executes here, probed once per host in a child process.

Some x86 hosts advertise AMX (``amx_tile``, ``amx_bf16`` in /proc/cpuinfo) but trap it as an
illegal instruction: a plain torch bf16 matmul dies with SIGILL, and so do vLLM's CPU kernels
(../shared/ENVIRONMENT.md measured it). A child process running a bf16 matmul tells the two
kinds apart in seconds; its answer is kept per host and boot under the oominfer cache folder.
Where AMX traps, engines start with oneDNN capped below AMX and torch told AMX is absent (the
environment builder does that); ``OOMINFER_AMX=off`` forces that, ``OOMINFER_AMX=on`` trusts
the CPU's flags.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

ENV: Final = "OOMINFER_AMX"
"""``auto`` (the default: probe), ``off`` (never use AMX), ``on`` (trust the CPU's flags)."""

SAFE_ISA: Final = "AVX512_CORE_BF16"
"""oneDNN's ISA cap where AMX traps: the best level below AMX (ONEDNN_MAX_CPU_ISA)."""

PROBE_SECONDS: Final = 120.0
"""Importing torch on a busy two-core machine can take tens of seconds."""

# The probe asks the OS for the AMX tile state first (the eager path's fix), then runs the bf16
# matmul that oneDNN runs on AMX: on a host that traps it, the child dies with SIGILL.
PROBE_CODE: Final = """\
import torch
if hasattr(torch.cpu, "_init_amx"):
    torch.cpu._init_amx()
layer = torch.nn.Linear(512, 512, dtype=torch.bfloat16)
with torch.inference_mode():
    layer(torch.randn(128, 512, dtype=torch.bfloat16)).sum().item()
"""


class Amx(enum.Enum):
    """What AMX does on this host."""

    ABSENT = "absent"
    """The CPU does not advertise it: nothing uses it."""
    WORKS = "works"
    TRAPS = "traps"
    """Advertised, but executing it raises SIGILL."""
    UNKNOWN = "unknown"
    """Advertised, and the probe could not tell (no torch here, or it timed out)."""


def trap_note() -> str:
    """The line that tells the user the engine starts without AMX, and why."""
    without = f"the engine starts without AMX (ONEDNN_MAX_CPU_ISA={SAFE_ISA}, torch told so)"
    if os.environ.get(ENV, "").strip().lower() == "off":
        return f"{ENV}=off: {without}."
    return f"This CPU advertises AMX but traps it (SIGILL): {without}."


def sigill_explanation(engine_line: str = "") -> str:
    """The one-line explanation of an engine process that died with SIGILL."""
    said = (
        "an engine process died with SIGILL (illegal instruction): this CPU advertises an "
        "instruction set it traps, most often AMX. Set OOMINFER_AMX=off to start the engine "
        f"without AMX, or remove the cached probe in {cache_folder()}."
    )
    return f"{said} The engine said: {engine_line}" if engine_line else said


def cache_folder() -> Path:
    """Where the probe's answers are kept (under OOMINFER_CACHE_DIR or the user's cache)."""
    if os.environ.get("OOMINFER_CACHE_DIR"):
        root = Path(os.environ["OOMINFER_CACHE_DIR"])
    else:
        root = Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"))
        root = root / "oominfer"
    return root / "cpu"


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return ""


def _field(cpuinfo: str, name: str) -> str:
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return ""


def advertised(cpuinfo: str) -> bool:
    """True when /proc/cpuinfo's flags name AMX tiles."""
    return "amx_tile" in _field(cpuinfo, "flags").split()


def host_key(cpuinfo: str) -> str:
    """Names this host as it runs now: its CPU's model and flags, kernel, name and boot.

    Hosts of one kind differ (a hypervisor may or may not pass the tile state through), and a
    reboot may move a virtual machine: each boot probes again, once.
    """
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    facts = [_field(cpuinfo, "model name"), _field(cpuinfo, "flags"), platform.release(),
             socket.gethostname(), boot]  # fmt: skip
    return hashlib.sha256("\n".join(facts).encode()).hexdigest()[:20]


def probe(argv: Sequence[str] | None = None, *, timeout: float = PROBE_SECONDS) -> Amx:
    """Run the bf16 matmul in a child process: SIGILL means AMX traps."""
    argv = list(argv) if argv else [sys.executable, "-c", PROBE_CODE]
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_MAX_CPU_ISA"}
    try:
        quiet = subprocess.DEVNULL
        done = subprocess.run(argv, stdin=quiet, stdout=quiet, stderr=quiet, env=env,
                              timeout=timeout, check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return Amx.UNKNOWN
    if done.returncode == -signal.SIGILL:
        return Amx.TRAPS
    return Amx.WORKS if done.returncode == 0 else Amx.UNKNOWN


def amx_status(*, cpuinfo: str | None = None, probe_argv: Sequence[str] | None = None) -> Amx:
    """What AMX does here: from OOMINFER_AMX, the CPU's flags, the cache, or a probe."""
    wanted = os.environ.get(ENV, "auto").strip().lower()
    if wanted == "off":
        return Amx.TRAPS
    info = _cpuinfo() if cpuinfo is None else cpuinfo
    if wanted == "on" or not advertised(info):
        return Amx.WORKS if advertised(info) else Amx.ABSENT
    path = cache_folder() / f"amx-{host_key(info)}.json"
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return Amx(json.loads(path.read_text())["amx"])
    found = probe(probe_argv)
    if found is not Amx.UNKNOWN:
        _write(path, json.dumps({"amx": found.value, "cpu": _field(info, "model name")}) + "\n")
    return found


def _write(path: Path, text: str) -> bool:
    """Write a file atomically (concurrent oominfers may race); False if it cannot be."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError:
        return False
    return True


def _sitecustomize(amx: Amx) -> str | None:
    """The code each engine process runs at start, before vLLM picks its kernels."""
    if amx is Amx.TRAPS:
        # vLLM chooses its AMX attention and linear kernels from this function.
        body = "torch.cpu._is_amx_tile_supported = lambda: False"
    elif amx is Amx.WORKS:
        # Only torch.compile's path asks the OS for the AMX tile state; eager mode would die
        # with SIGILL without this.
        body = "torch.cpu._init_amx()"
    else:
        return None
    return (
        '"""Written by oominfer (oominfer/runtime/amx.py) for the engines it starts."""\n'
        f"try:\n    import torch\n\n    {body}\nexcept Exception:\n    pass\n"
    )


def site_folder(amx: Amx) -> Path | None:
    """A folder holding the sitecustomize.py for ``amx`` (None when none is needed).

    It lives in the oominfer cache folder, named by its content, so every launch reuses it and
    nothing is left in the temporary folder; a temporary one if the cache cannot be written.
    """
    code = _sitecustomize(amx)
    if code is None:
        return None
    name = f"site-{hashlib.sha256(code.encode()).hexdigest()[:12]}"
    folder = cache_folder() / name
    target = folder / "sitecustomize.py"
    with contextlib.suppress(OSError):
        if target.read_text() == code:
            return folder
    if _write(target, code):
        return folder
    folder = Path(tempfile.mkdtemp(prefix="oominfer-site-"))
    (folder / "sitecustomize.py").write_text(code)
    return folder


def workaround_env(amx: Amx) -> dict[str, str]:
    """Variables an engine on the CPU needs for ``amx``, beside the sitecustomize."""
    return {"ONEDNN_MAX_CPU_ISA": SAFE_ISA} if amx is Amx.TRAPS else {}


def apply_in_process() -> str | None:
    """For a server started by hand (``python -m oominfer.engines.transformers``): apply the
    workaround to this process before torch loads; returns the note to log, if any.

    Nothing to do when oominfer's environment builder already set the process up.
    """
    if "ONEDNN_MAX_CPU_ISA" in os.environ:
        return None
    amx = amx_status()
    if amx is not Amx.TRAPS:
        return None
    os.environ.update(workaround_env(amx))
    import torch

    setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)  # noqa: B010 (torch's own name)
    return trap_note()
