"""parse_size and format_bytes: what users type and what they read."""

from __future__ import annotations

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture

from oominfer.base.errors import InvalidSettingError
from oominfer.base.units import GB, MB, TB, GiB, KiB, MiB, TiB, format_bytes, parse_size


def test_unit_constants() -> None:
    assert (KiB, MiB, GiB, TiB) == (1024, 1024**2, 1024**3, 1024**4)
    assert (MB, GB, TB) == (1000**2, 1000**3, 1000**4)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1073741824", 1073741824),
        ("1", 1),
        ("512B", 512),
        ("512b", 512),
        ("1K", KiB),
        ("1KiB", KiB),
        ("1kb", 1000),
        ("512MiB", 512 * MiB),
        ("512M", 512 * MiB),
        ("512MB", 512 * 1000**2),
        ("24GiB", 24 * GiB),
        ("24G", 24 * GiB),  # vLLM: an upper-case letter is binary...
        ("24g", 24 * 1000**3),  # ...and a lower-case one decimal (4g = 4 x 10^9)
        ("4k", 4000),
        ("1.5g", 1_500_000_000),
        ("80GB", 80 * 1000**3),  # the label on the box: powers of 1000
        ("80gb", 80 * 1000**3),
        ("1.5GiB", 1610612736),  # 1.5 x 1024**3
        (".5GiB", 512 * MiB),
        ("1TiB", TiB),
        ("2TB", 2 * 1000**4),
        ("  24 GiB  ", 24 * GiB),
        ("24\tGiB", 24 * GiB),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "cannot read the size"),
        ("   ", "cannot read the size"),
        ("GiB", "cannot read the size"),
        ("24 gigs", "cannot read the size"),
        ("0.5G", "decimal with the binary suffix G"),  # vLLM refuses it too
        ("24PiB", "cannot read the size"),
        ("-1GiB", "cannot read the size"),
        ("1e9", "cannot read the size"),
        ("1,024", "cannot read the size"),
        ("24 GiB extra", "cannot read the size"),
        ("0", "must be positive"),
        ("0GiB", "must be positive"),
        ("0.0000000001B", "must be positive"),  # rounds down to 0 bytes
    ],
)
def test_parse_size_errors(text: str, message: str) -> None:
    with pytest.raises(InvalidSettingError, match=message) as info:
        parse_size(text)
    assert repr(text) in str(info.value)


def test_parse_size_error_has_hint() -> None:
    with pytest.raises(InvalidSettingError) as info:
        parse_size("twenty gigs")
    assert info.value.hint is not None
    assert "GiB" in info.value.hint


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (0, "0 B"),
        (1, "1 B"),
        (1023, "1023 B"),
        (1024, "1.00 KiB"),
        (1536, "1.50 KiB"),
        (MiB, "1.00 MiB"),
        (GiB, "1.00 GiB"),
        (1.5 * GiB, "1.50 GiB"),
        (23570219008, "21.95 GiB"),  # an L4 as CUDA reports it: 23570219008 / 1024**3
        (TiB, "1.00 TiB"),
        (2048 * TiB, "2048.00 TiB"),  # no unit above TiB
        (-1, "-1 B"),
        (-GiB, "-1.00 GiB"),  # a shortfall keeps its sign
        (-2.5 * MiB, "-2.50 MiB"),
        (512.7, "512 B"),  # fractions of a byte are dropped
    ],
)
def test_format_bytes(n: float, expected: str) -> None:
    assert format_bytes(n) == expected


@pytest.mark.parametrize("n", [1, 1000, 4096, 5 * MiB, 7 * GiB, 3 * TiB])
def test_format_then_parse_round_trips_whole_units(n: int) -> None:
    text = format_bytes(n).replace(" ", "")
    if text.endswith("B") and not text.endswith("iB"):
        text = text[:-1]
    assert parse_size(text) == n
