"""What an engine measured beside what the speed model predicted for the same requests."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from oominfer.speed.performance import Performance


@dataclass(frozen=True, slots=True, kw_only=True)
class Measured:
    """Output tokens/s the engine served in verification's load test, and the prediction
    for exactly those requests (so the two compare, whatever the plan's own workload)."""

    output_tokens_per_s: float
    """Output tokens of all the concurrent requests over the wall time they took."""
    predicted_output_tokens_per_s: float | None
    concurrency: int
    input_len: int
    output_len: int
    engine_version: str = ""
    measured_at: str = ""

    @property
    def ratio(self) -> float | None:
        """Measured over predicted output tokens/s (None without a prediction)."""
        if not self.predicted_output_tokens_per_s:
            return None
        return self.output_tokens_per_s / self.predicted_output_tokens_per_s


def calibrated(perf: Performance, ratio: float) -> Performance:
    """The prediction scaled by what an engine measured against the model on the same
    setup: tokens/s and requests/s by ``ratio``, the per-token time by its inverse."""
    return dataclasses.replace(
        perf,
        output_tokens_per_s=perf.output_tokens_per_s * ratio,
        requests_per_s=perf.requests_per_s * ratio,
        tpot_s=perf.tpot_s / ratio,
    )
