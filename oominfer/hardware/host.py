"""The host machine: the memory the CPU backend may use."""

from __future__ import annotations

from oominfer.base.errors import InvalidSettingError


def available_memory_bytes() -> int:
    """MemAvailable of this machine (Linux /proc/meminfo): the default CPU serving budget.

    Raises:
        InvalidSettingError: the figure cannot be read; the user must name one.
    """
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    raise InvalidSettingError("cannot read this machine's memory.", hint="Pass --memory 6GiB.")
