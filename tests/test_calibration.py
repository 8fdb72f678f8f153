"""The estimator against real vLLM start-up logs, with bounds that can fail.

``bench/calibration.py`` replays every point of the calibration logs (model, GPU, flags,
vLLM version, and the memory split vLLM printed) through the estimator. The logs are
copied into tests/data/calibration/ (from ../shared/calibration/vllm_memory_logs.jsonl) so
this test always runs. The bounds sit a little above today's figures (weights: median
|error| 0.33% over 27 points; KV-cache bytes: 1.7% over the 11 V1 points with a known
GPU, 2.4% over all 19; activation peak 0.34 GiB over the 12 points that print it): a change to
the memory model that makes them worse fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from _scripts import load_script

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "tests" / "data" / "calibration" / "vllm_memory_logs.jsonl"
SHARED = REPO.parent / "shared" / "calibration" / "vllm_memory_logs.jsonl"


@pytest.fixture(scope="module")
def replayed() -> tuple[list[dict[str, Any]], dict[str, Any]]:
    bench = load_script("bench/calibration.py")
    rows = [bench.replay(point) for point in bench.load_points(LOGS)]
    return rows, bench.summary(rows)


def test_every_point_is_replayed(replayed: tuple[list[dict[str, Any]], dict[str, Any]]) -> None:
    rows, s = replayed
    assert len(rows) == 46
    # 10 of the 26 points added with the 46-log set name models the catalog lacks
    # (multimodal, unnamed checkpoints) under any name of the same architecture; two more
    # are pre-quantized checkpoints of catalog models (QUANTIZED_STAND_INS). Qwen2.5-VL-7B
    # (c08, c09) is in the catalog; c21 runs as Qwen3-Next-80B-A3B-Thinking
    # (SAME_ARCHITECTURE), its MTP drafter's weights in "Model loading took"; n13
    # (Mistral-Small-3.2) as Mistral-Small-3.1, the same Mistral3 architecture; c14's
    # granite-3.3-2b-instruct is in the catalog (reconstructed from its public shapes); n15
    # names Qwen3-VL-30B-A3B-Instruct, in the catalog, and n16 runs as it (SAME_ARCHITECTURE,
    # a fine-tune of the same Qwen3VLMoeForConditionalGeneration).
    assert len([r for r in rows if "skip" in r]) == 6
    # A point that stops producing a comparison would loosen the medians unseen. (c10 ran
    # on a vGPU slice of an A100 whose total vLLM did not print: no KV or verdict there.)
    assert (s["weights_points"], s["kv_v1_points"], s["kv_all_points"]) == (33, 17, 25)
    assert len(s["kv_per_token_exact"]) == 18
    assert len(s["verdicts"]) == 25


def test_weights_within_half_a_percent(
    replayed: tuple[list[dict[str, Any]], dict[str, Any]],
) -> None:
    _, s = replayed
    assert s["weights_median"] <= 0.004, s["weights_median"]  # today 0.33%


def test_kv_cache_bytes_within_two_percent_on_v1(
    replayed: tuple[list[dict[str, Any]], dict[str, Any]],
) -> None:
    _, s = replayed
    assert s["kv_v1_median"] <= 0.02, s["kv_v1_median"]  # today 1.6%
    # Today 4.7% with the V0-era points too: a bare 0.11.0 is taken as a pip install, which
    # holds more than the image n13 and c16 ran (rules/versions.py DEFAULT_INSTALL).
    assert s["kv_all_median"] <= 0.05, s["kv_all_median"]


def test_activation_peak_within_a_quarter_gib(
    replayed: tuple[list[dict[str, Any]], dict[str, Any]],
) -> None:
    _, s = replayed
    # The profiling run's peak beside what the logs print (0.46 GiB over 10 points before
    # the sampler's top-k/top-p path per release and the forward/sampler maximum). The
    # misses left: V0 bitsandbytes (dp16, dp54), V0's Llama-3 at 0.6 (dp13/dp14) and a
    # 0.10 main-branch build with FlashInfer installed (c12; a pip install had none). Two
    # points since: c21 (Qwen3-Next with its MTP drafter, 0.10.2, +0.54 GiB), n13
    # (Mistral-Small-3.2, 0.11, -0.21 GiB) and c14 (granite-3.3-2b, 0.10.2, +0.20 GiB).
    assert s["activation_median_gib"] <= 0.36, s["activation_median_gib"]  # today 0.22


def test_kv_bytes_per_token_exact_and_every_verdict_right(
    replayed: tuple[list[dict[str, Any]], dict[str, Any]],
) -> None:
    rows, s = replayed
    assert all(s["kv_per_token_exact"]), [
        r["id"] for r in rows if r.get("kv_per_token_exact") is False
    ]
    # c16 is an xfail of test_calibration_logs (a GPU shared with a foreign process and a
    # graph pool six times the fitted one).
    wrong = [r["id"] for r in rows if r.get("verdict_ok") is False]
    assert wrong == ["c16"], wrong


@pytest.mark.skipif(not SHARED.is_file(), reason="no ../shared/calibration beside the checkout")
def test_the_copy_matches_the_shared_logs() -> None:
    assert LOGS.read_bytes() == SHARED.read_bytes(), f"copy {SHARED} to {LOGS}"
