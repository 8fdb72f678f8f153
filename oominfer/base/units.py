"""Byte units: parsing sizes the user types and formatting sizes for people."""

from __future__ import annotations

import re
from typing import Final

from oominfer.base.errors import InvalidSettingError

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
    "kb": KB,
    "kib": KiB,
    "mb": MB,
    "mib": MiB,
    "gb": GB,
    "gib": GiB,
    "tb": TB,
    "tib": TiB,
}
_LETTERS: Final = {"k": KB, "m": MB, "g": GB, "t": TB, "K": KiB, "M": MiB, "G": GiB, "T": TiB}
"""vLLM's single-letter suffixes (utils/argparse_utils.py human_readable_int): lower case
decimal (4g = 4 x 10^9), upper case binary (4G = 4 x 2^30), so a size means the same
to oominfer as to the vLLM flag it is passed to."""
_SIZE_RE: Final = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str) -> int:
    """Parse a size such as ``24GiB``, ``80GB``, ``512MiB``, ``4g`` or ``1073741824`` into bytes.

    ``GiB`` is a power of 1024 and ``GB`` of 1000, as on the labels people read; a single
    letter reads as vLLM reads it: ``4g`` is 4 x 10^9, ``4G`` is 4 x 2^30, and like vLLM a
    decimal with an upper-case letter is refused (``1.5G``: did you mean ``1.5g``?).

    Raises:
        InvalidSettingError: the text is not a positive size.
    """
    match = _SIZE_RE.match(text)
    suffix = match.group(2) if match else ""
    if match is not None and suffix in _LETTERS:
        if suffix.isupper() and "." in match.group(1):
            raise InvalidSettingError(
                f"vLLM refuses a decimal with the binary suffix {suffix} ({text!r}).",
                hint=f"Write {match.group(1)}{suffix.lower()} (decimal) or "
                f"{match.group(1)}{suffix}iB.",
            )
        scale = _LETTERS[suffix]
    elif match is not None and suffix.lower() in _UNITS:
        scale = _UNITS[suffix.lower()]
    else:
        raise InvalidSettingError(
            f"cannot read the size {text!r}.", hint="Write it like 24GiB, 80GB or 512MiB."
        )
    value = int(float(match.group(1)) * scale)
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


_HUMAN_INT_RE = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")
_DECIMAL_LETTERS: Final = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY_LETTERS: Final = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def human_readable_int(text: str) -> int:
    """A count as vLLM reads it (vllm/utils/argparse_utils.py ``human_readable_int``): a
    lower-case letter is decimal (``32k`` = 32,000, ``25.6k`` = 25,600), an upper-case one
    binary (``32K`` = 32,768, ``1M`` = 1,048,576, no decimals), else a plain integer.

    Raises:
        InvalidSettingError: not such a count.
    """
    value = text.strip()
    match = _HUMAN_INT_RE.fullmatch(value)
    if match:
        number, suffix = match.groups()
        if suffix in _DECIMAL_LETTERS:
            return int(float(number) * _DECIMAL_LETTERS[suffix])
        if "." in number:
            raise InvalidSettingError(
                f"vLLM refuses a decimal with the binary suffix {suffix} ({text!r}).",
                hint=f"Did you mean {number}{suffix.lower()}?",
            )
        return int(number) * _BINARY_LETTERS[suffix]
    try:
        return int(value)
    except ValueError:
        raise InvalidSettingError(
            f"{text!r} is not a count: write 8192, 32k (32,000) or 32K (32,768)."
        ) from None


def counted(n: float, noun: str) -> str:
    """``1 request``, ``2 requests``, ``1,024 tokens``: a count with its noun in the right
    number (nouns here take a plain -s)."""
    text = f"{n:,}" if isinstance(n, int) else f"{n:,g}"
    return f"{text} {noun}" if n == 1 else f"{text} {noun}s"
