"""The predicted speed in the report and under ``--json``. Pure."""

from __future__ import annotations

from typing import Any

from oominfer.base.units import counted
from oominfer.speed import Measured, Performance


def performance_json(
    perf: Performance | None, measured: Measured | None = None
) -> dict[str, Any] | None:
    """The stable ``performance`` object: seconds, tokens/s of all requests together, and
    ``calibrated_from`` (the measurement it was scaled by) when one was used."""
    if perf is None:
        return None
    calibration = None
    if measured is not None:
        calibration = {
            "output_tokens_per_s": measured.output_tokens_per_s,
            "predicted_output_tokens_per_s": measured.predicted_output_tokens_per_s,
            "engine_version": measured.engine_version,
            "measured_at": measured.measured_at,
        }
    return {
        "ttft_s": round(perf.ttft_s, 4),
        "tpot_s": round(perf.tpot_s, 5),
        "output_tokens_per_s": round(perf.output_tokens_per_s, 1),
        "requests_per_s": round(perf.requests_per_s, 3),
        "concurrency": perf.concurrency,
        "input_len": perf.input_len,
        "output_len": perf.output_len,
        "bound": perf.bound,
        "requested_concurrency": perf.requested_concurrency,
        "limited_by": perf.limited_by,
        "asked_input_len": perf.asked_input_len,
        "asked_output_len": perf.asked_output_len,
        "num_prompts": perf.num_prompts,
        "calibrated_from": calibration,
    }


def _ms(seconds: float) -> str:
    """A latency in the unit that reads best: 7.2 ms, 841 ms, 12.4 s, 28 min, 148 h."""
    if seconds >= 3 * 3600:
        return f"{seconds / 3600:,.0f} h"
    if seconds >= 600:
        return f"{seconds / 60:,.0f} min"
    if seconds >= 10:
        return f"{seconds:,.1f} s"
    return f"{seconds * 1000:,.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.1f} ms"


def speed_phrase(perf: Performance) -> str:
    """One line: tokens/s, TPOT and TTFT, e.g. '2,210 tok/s, TPOT 7.2 ms, TTFT 19 ms'."""
    return (
        f"{perf.output_tokens_per_s:,.0f} output tok/s, TPOT {_ms(perf.tpot_s)}, "
        f"TTFT {_ms(perf.ttft_s)}"
    )


def speed_lines(
    perf: Performance | None, measured: Measured | None = None, *, why_not: str | None = None
) -> list[str]:
    """The human report's speed rows (predicted; scaled by ``measured`` when given),
    uncoloured; ``why_not`` says why there is no prediction, where ``perf`` is None."""
    if perf is None:
        return [f"speed             not predicted ({why_not or 'no figures to predict from'})"]
    capped = ""
    if perf.limited_by is not None:
        why = "max_num_seqs" if perf.limited_by == "max_num_seqs" else "the KV cache"
        capped = f" ({perf.requested_concurrency} asked; {why} caps it, the rest wait)"
    run = (
        f" over a run of {perf.num_prompts:,} requests (its start and drain included)"
        if perf.num_prompts is not None
        else ""
    )
    rows = [
        ("speed", f"predicted for {counted(perf.concurrency, 'request')} at once{capped} of "
                  f"{perf.input_len:,} prompt + {perf.output_len:,} output tokens{run}"),
        ("  output tok/s", f"{perf.output_tokens_per_s:,.0f} (all requests together), "
                           f"{perf.requests_per_s:,.2f} requests/s"),
        ("  TPOT", f"{_ms(perf.tpot_s)} per output token ({perf.bound}-bound)"),
        ("  TTFT", _ms(perf.ttft_s)),
    ]  # fmt: skip
    if perf.asked_input_len is not None and perf.asked_output_len is not None:
        asked = perf.asked_input_len + perf.asked_output_len
        rows.insert(
            1,
            ("  cut to fit", f"{perf.asked_input_len:,} prompt + {perf.asked_output_len:,} output "
                      f"tokens asked, {asked:,} in all, exceed the context "
                      f"({perf.input_len + perf.output_len:,}): vLLM refuses such requests; "
                      f"raise --max-model-len to predict them")
        )  # fmt: skip
    if measured is not None and measured.ratio is not None:
        rows.append(
            ("  starts from", f"a measurement on this machine ({measured.engine_version}, "
                             f"{measured.measured_at}): {measured.output_tokens_per_s:,.0f} tok/s "
                             f"served where {measured.predicted_output_tokens_per_s:,.0f} were "
                             f"predicted; scaled x{measured.ratio:.2f}")
        )  # fmt: skip
    width = 17
    return [f"{k:<{width}} {v}" for k, v in rows]
