"""What the speed model is asked about: how long requests are and how many run at once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from oominfer.base.errors import InvalidSettingError

INPUT_LEN: Final = 3072
"""Prompt tokens of a typical request (--input-len): with OUTPUT_LEN, the 4,096 tokens of
--typical-length that concurrency was counted in before the speed model."""
OUTPUT_LEN: Final = 1024
"""Generated tokens of a typical request (--output-len)."""
CONCURRENCY: Final = 16
"""Requests at once that ``estimate`` predicts for (--concurrency): a busy chat service."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A closed loop of ``concurrency`` clients, each sending a prompt of ``input_len`` tokens
    and reading ``output_len`` tokens back before sending the next (vLLM's
    benchmark_serving with --max-concurrency)."""

    input_len: int = INPUT_LEN
    output_len: int = OUTPUT_LEN
    concurrency: int = CONCURRENCY

    def __post_init__(self) -> None:
        """Reject lengths or a concurrency below one."""
        for flag, value in (
            ("--input-len", self.input_len),
            ("--output-len", self.output_len),
            ("--concurrency", self.concurrency),
        ):
            if value < 1:
                raise InvalidSettingError(f"{flag} must be at least 1, got {value}.")

    @property
    def total_len(self) -> int:
        """Tokens one request holds in the KV cache at its end: prompt and output."""
        return self.input_len + self.output_len
