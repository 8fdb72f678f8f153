"""The speed model: its roofline pieces, the concurrency vLLM's scheduler allows, and the
published serving measurements of throughput_points.jsonl (copied into
tests/data/calibration/ from ../shared/calibration/).

Each published point is pinned to today's predicted/measured ratio with a stated drift
tolerance: a change to the speed model that moves a point more than DRIFT away from where it
stands fails that point's test, and the medians may not get worse than the target.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from _scripts import load_script

from oominfer.hardware.hardware import Hardware
from oominfer.memory.estimate import estimate
from oominfer.model.load import load_spec
from oominfer.settings import VllmSettings
from oominfer.speed import Workload, predict
from oominfer.speed.roofline import touched_expert_share

REPO = Path(__file__).resolve().parents[1]
POINTS = REPO / "tests" / "data" / "calibration" / "throughput_points.jsonl"
SHARED = REPO.parent / "shared" / "calibration" / "throughput_points.jsonl"

DRIFT = 0.15
"""How far (as a factor, either way) a point's predicted/measured ratio may move from
today's before its test fails."""
# predicted / measured per point today (bench/speed.py): output tokens/s and TPOT.
TODAY: dict[str, dict[str, float]] = {
    "t01": {"output_tokens_per_s": 1.057, "tpot_s": 1.181},
    "t02": {"output_tokens_per_s": 1.179, "tpot_s": 0.884},
    "t03": {"output_tokens_per_s": 0.979, "tpot_s": 1.022},
    "t04": {"output_tokens_per_s": 0.812, "tpot_s": 1.231},
    "t07": {"output_tokens_per_s": 0.63, "tpot_s": 1.579},
    "t08": {"output_tokens_per_s": 0.766, "tpot_s": 1.253},
    "t09": {"output_tokens_per_s": 1.174, "tpot_s": 0.852},
    "t10": {"output_tokens_per_s": 1.704, "tpot_s": 0.587},
    "t11": {"output_tokens_per_s": 4.609, "tpot_s": 1.686},
    "t12": {"output_tokens_per_s": 3.872},
    "t15": {"output_tokens_per_s": 0.956},
    "t16": {"output_tokens_per_s": 1.269},
    "t17": {"output_tokens_per_s": 2.761},
    "t18": {"output_tokens_per_s": 1.111, "tpot_s": 0.795},
    "t19": {"output_tokens_per_s": 1.502, "tpot_s": 1.191},
    "t20": {"output_tokens_per_s": 1.491},
    "t21": {"output_tokens_per_s": 1.191, "tpot_s": 1.073},
    "t22": {"output_tokens_per_s": 0.951, "tpot_s": 1.027},
    "t23": {"output_tokens_per_s": 2.839, "tpot_s": 0.352},
    "t31": {"output_tokens_per_s": 0.406, "tpot_s": 1.575},
    "t32": {"output_tokens_per_s": 1.038, "tpot_s": 1.186},
    "t33": {"output_tokens_per_s": 0.424, "tpot_s": 3.297},
    "t35": {"tpot_s": 1.204},
}


@pytest.fixture(scope="module")
def replayed() -> dict[str, dict[str, Any]]:
    bench = load_script("bench/speed.py")
    return {r["id"]: r for r in (bench.replay(p) for p in bench.load_points(POINTS))}


@pytest.mark.parametrize("point", sorted(TODAY))
def test_each_published_point_stays_where_it_is(
    replayed: dict[str, dict[str, Any]], point: str
) -> None:
    row = replayed[point]
    assert "errors" in row, row.get("skip")
    for key, ratio in TODAY[point].items():
        now = 1 + row["errors"][key]
        assert abs(math.log(now / ratio)) <= math.log(1 + DRIFT), (key, now, ratio)


def test_the_medians_meet_the_target(replayed: dict[str, dict[str, Any]]) -> None:
    bench = load_script("bench/speed.py")
    s = bench.summary(list(replayed.values()))
    assert s["output_tokens_per_s"]["median_abs_error"] <= 0.30  # today 26.9%
    assert s["tpot_s"]["median_abs_error"] <= 0.25  # today 21.8%


@pytest.mark.skipif(not SHARED.is_file(), reason="no ../shared/calibration beside the checkout")
def test_the_copy_matches_the_shared_points() -> None:
    assert POINTS.read_bytes() == SHARED.read_bytes(), f"copy {SHARED} to {POINTS}"


def test_touched_experts() -> None:
    # Mixtral, top-2 of 8: one token touches 2/8; eight touch 1 - (6/8)^8 = 0.8999.
    assert touched_expert_share(2 / 8, 1) == pytest.approx(0.25)
    assert touched_expert_share(2 / 8, 8) == pytest.approx(1 - 0.75**8)
    assert touched_expert_share(0.0, 64) == 0.0


def _predict(settings: VllmSettings, workload: Workload, gpu: str = "H100") -> Any:
    spec = load_spec("meta-llama/Llama-3.1-8B-Instruct")
    hw = Hardware.from_gpu(gpu)
    b = estimate(spec, hardware=hw, settings=settings)
    return predict(spec, gpu=hw.gpu, settings=settings, breakdown=b, workload=workload)


def test_concurrency_is_capped_by_max_num_seqs() -> None:
    s = VllmSettings(max_model_len=8192, max_num_seqs=8)
    perf = _predict(s, Workload(input_len=1000, output_len=200, concurrency=32))
    assert (perf.concurrency, perf.limited_by, perf.requested_concurrency) == (
        8,
        "max_num_seqs",
        32,
    )
    alone = _predict(s, Workload(input_len=1000, output_len=200, concurrency=8))
    # The 24 waiting requests add their queueing to the time to first token.
    assert perf.ttft_s > alone.ttft_s + 1.0
    assert perf.output_tokens_per_s == pytest.approx(alone.output_tokens_per_s)


def test_concurrency_is_capped_by_the_kv_cache() -> None:
    # An L4 holds ~ 4 GiB of KV for Llama-3.1-8B: 128 KiB a token, ~ 30k tokens, so about
    # 3 requests of 8,192 tokens.
    s = VllmSettings(max_model_len=8192)
    perf = _predict(s, Workload(input_len=7000, output_len=1000, concurrency=64), gpu="L4")
    assert perf.limited_by == "kv_cache"
    assert 1 <= perf.concurrency < 8


def test_more_requests_more_tokens_per_second_slower_each() -> None:
    s = VllmSettings(max_model_len=8192)
    one = _predict(s, Workload(input_len=500, output_len=500, concurrency=1))
    many = _predict(s, Workload(input_len=500, output_len=500, concurrency=32))
    assert one.bound == "memory"
    assert many.output_tokens_per_s > 5 * one.output_tokens_per_s
    assert many.tpot_s > one.tpot_s
    assert one.requests_per_s == pytest.approx(one.output_tokens_per_s / 500)
