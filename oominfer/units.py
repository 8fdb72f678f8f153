"""Byte units: parsing sizes the user types and formatting sizes for people."""

from __future__ import annotations

import re
from typing import Final

from oominfer.errors import InvalidSettingError

KiB: Final = 1024
MiB: Final = 1024**2
GiB: Final = 1024**3
TiB: Final = 1024**4
KB: Final = 1000
MB: Final = 1000**2
GB: Final = 1000**3
TB: Final = 1000**4

_UNITS: Final = {
    "": 1,
    "b": 1,
    "k": KiB,
    "kb": KB,
    "kib": KiB,
    "m": MiB,
    "mb": MB,
    "mib": MiB,
    "g": GiB,
    "gb": GB,
    "gib": GiB,
    "t": TiB,
    "tb": TB,
    "tib": TiB,
}
_SIZE_RE: Final = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse a size such as ``24GiB``, ``80GB``, ``512MiB`` or ``1073741824`` into bytes.

    ``G``/``GiB`` are powers of 1024, ``GB`` powers of 1000, as on the labels people read.

    Raises:
        InvalidSettingError: the text is not a positive size.
    """
    match = _SIZE_RE.match(text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise InvalidSettingError(
            f"cannot read the size {text!r}.", hint="Write it like 24GiB, 80GB or 512MiB."
        )
    value = int(float(match.group(1)) * _UNITS[unit])
    if value <= 0:
        raise InvalidSettingError(f"the size {text!r} must be positive.")
    return value


def format_bytes(n: float) -> str:
    """Format bytes for people in binary units: ``1.50 GiB``; negative numbers keep their sign."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, size in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= size:
            return f"{sign}{n / size:.2f} {unit}"
    return f"{sign}{int(n)} B"
