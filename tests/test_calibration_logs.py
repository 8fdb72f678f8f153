"""One test per calibration log and memory part: the estimate stays near what vLLM printed.

Each log of tests/data/calibration/vllm_memory_logs.jsonl (the shared set) and
extra_gpu_logs.jsonl (public logs gathered here: gpt-oss on Hopper) is replayed through the
estimator (bench/calibration.py ``replay``: the log's model, GPU, flags and vLLM release in,
nothing tuned per log) and each part it printed is held to a stated tolerance:

- weights: within 3% of "Model loading took" (the set's median is 0.3%);
- KV cache: within 10% of "Available KV cache memory" where the GPU is known;
- CUDA graphs: within 0.25 GiB of "Graph capturing finished ... took", or where the log
  has no capture line, of the "Estimated CUDA graph memory" 0.20+ prints before sizing the
  KV cache (1.0-1.2x the capture, memory/profile.py GRAPH_ESTIMATE_RATIO);
- the profiling peak: within 0.35 GiB of the "peak activation" / "torch peak memory
  increase" vLLM printed (as it prints it: with 0.20's graph reserve);
- the verdict: FITS exactly when vLLM started.

A log the model does not match is an xfail (strict) with the reason, so a fix shows up as
an XPASS to turn into a pass, and a drift on any other log fails.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from _scripts import load_script

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / "tests" / "data" / "calibration" / "vllm_memory_logs.jsonl"
EXTRA = REPO / "tests" / "data" / "calibration" / "extra_gpu_logs.jsonl"
BENCH = load_script("bench/calibration.py")
POINTS = BENCH.load_points(LOGS) + BENCH.load_points(EXTRA)

WEIGHTS_TOLERANCE = 0.03
KV_TOLERANCE = 0.10
GRAPH_TOLERANCE_GIB = 0.25
ACTIVATION_TOLERANCE_GIB = 0.35

# (log, part) -> why the model does not match it today.
_V0 = "V0 engine (0.6-0.7): its profiling peak and non-torch memory are modelled on V1's"
XFAIL: dict[tuple[str, str], str] = {
    ("dp04", "kv_cache"): f"{_V0}: 2.57 GiB estimated vs 2.89 logged",
    ("dp54", "kv_cache"): f"{_V0}; bitsandbytes weights dequantized in the forward and "
    "LoRA's Punica buffers (Unsloth) are in its profiling peak: 3.05 GiB estimated vs 2.64",
    ("c19", "kv_cache"): "the author's 'approximate' transcription adds up with no graph "
    "reserve and a logits-only sampler: Model Runner V2, the default for dense models from "
    "0.25.1, whose profile_cudagraph_memory returned 0 then (vllm issue #49224); the model "
    "follows the V1 runner until 0.32: 6.52 GiB estimated vs 7.48",
    ("dp13", "activation"): f"{_V0}: it peaks 0.51 GiB below the estimate",
    ("dp14", "activation"): f"{_V0}: it peaks 0.51 GiB below the estimate",
    ("dp16", "activation"): f"{_V0}; bitsandbytes dequantizes each 4-bit weight in the "
    "forward: 0.84 GiB more than estimated",
    ("dp54", "activation"): f"{_V0}; bitsandbytes weights dequantized in the forward and "
    "LoRA's Punica buffers: 0.46 GiB more than estimated",
    ("n13", "activation"): "llm-d's harness runs the vllm-openai image, whose FlashInfer "
    "samples in 12 B a logit, but the log's version text is a bare 0.11.0, taken as a pip "
    "install that sorts (rules/versions.py DEFAULT_INSTALL): 2.46 GiB more than profiled",
    ("c19", "activation"): "Model Runner V2 (0.25.1+ for dense models), which the model "
    "follows only from 0.32, and a GPU shared with Ollama",
    ("dp54", "cuda_graphs"): "LoRA's Punica buffers are captured with the graphs",
    ("x09", "kv_cache"): "Qwen3-30B-A3B-FP8 on a GB10 (unified memory, 0.13): 1.3 GiB "
    "more held beside the weights than estimated, where the dense FP8 x13 on the same "
    "machine is within 0.6 GiB: 5.37 GiB estimated vs 4.04",
    ("x09", "cuda_graphs"): "the same MoE's 51 + 35 graphs took 1.28 GiB on the GB10, where "
    "the per-layer terms fitted on discrete GPUs give 0.73",
    ("y01", "cuda_graphs"): "eight PCIe GPUs: NCCL's all-reduces captured into every graph "
    "hold more at 8 ranks than the per-layer term fitted at TP 4 (c05): 3.16 GiB estimated "
    "vs 3.45",
    ("n13", "cuda_graphs"): "the capacity planner's table prints -0.76 GiB of CUDAGraph "
    "memory (vLLM 0.11's free-memory delta, which memory freed during the capture can turn "
    "negative), not a pool size: 0.85 GiB estimated",
    ("c16", "cuda_graphs"): "an unnamed 80 GB card (79.33 GiB, likely an A100) shared with a "
    "foreign process: 3.49 GiB captured where the fit gives 0.56 for a GPU it cannot take for "
    "an A100, about 2.9 with the A100's cuBLAS term (memory/profile.py) that this log fits",
    ("g17-05", "cuda_graphs"): "Qwen2-7B at TP 2 across two nodes over Ray: NCCL's network "
    "transport, captured into each of the 67 graphs, took 0.44 GiB beyond the PIECEWISE term "
    "(1.00 GiB against 0.56); the NCCL term is fitted at TP > 2 on PCIe, and the same model at "
    "TP 2 within one node (g17-03/04) took 0.65",
    ("g17-06", "cuda_graphs"): "gpt-oss-120b at TP 4 on four nodes over Ray: its 83 graphs took "
    "1.88 GiB where the PIECEWISE and NCCL terms (fitted on PCIe peers within a node) give "
    "1.46: NCCL's network transport holds more per graph",
    ("g17-07", "activation"): "vLLM 0.31's start-up summary prints 1.44 GiB of peak activation "
    "where 0.98 is estimated (with the graph reserve), and 0.24 GiB less of graphs than the "
    "fit: the two nearly cancel (KV cache +1.1%)",
    ("g16-04", "verdict"): "a desktop RTX 3060 whose display held 2.6 GiB before vLLM "
    "started: the startup check (9.02 GiB free of 11.63, 10.47 asked) fails on memory other "
    "processes hold, which no estimate of the engine sees",
    ("c16", "verdict"): "0.11 captures its graphs above the budget, which the model checks "
    "(memory/profile.py post_capture_short), but this unnamed GPU's capture took 3.49 GiB "
    "(likely an A100's, and a foreign 494 MiB process beside it) against the 0.56 GiB fitted "
    "for a GPU not known to be one",
    ("g3-13", "kv_cache"): "the same flags gave 0.49 GiB here (a start) and 0.41 GiB "
    "(g3-14, a failed start) on the same RTX 3090 minutes apart: run-to-run noise at the edge "
    "of the budget, where 0.44 is estimated",
    ("g3-13", "verdict"): "the same flags started here and failed in g3-14 (0.44 GiB needed, "
    "0.49 and 0.41 available): the estimate, 3 MiB short of 0.44, follows the failure",
    ("g7-01", "weights"): "Llama-4-Scout at TP 8 holds 1.4 GiB a GPU above its tensors and the "
    "2.5 GiB rotary cache over its 10,485,760 positions (without the cache it was 14% light): "
    "26.38 GiB estimated vs 27.81",
    ("g6-06", "weights"): "a 0.5 GiB int4 checkpoint, where 28 MiB more than the tensors "
    "(the rotary cos/sin cache, 10 MiB at Qwen3's 40,960 positions, and Marlin's repacking) "
    "is 5%: 0.503 GiB estimated vs 0.53",
    **{
        (log, "cuda_graphs"): "a desktop RTX 3090 running the old AWQ kernels (--quantization "
        "awq): the capture took 0.41-0.43 GiB where 48 layers x 7-9 graphs give 0.07; the "
        "two logs differ by 0.02 GiB for two graphs, as the per-graph term says, so the rest "
        "is a fixed part no other log shows"
        for log in ("g9-01", "g9-02")
    },
    ("g25-01", "verdict"): "gpt-oss-120b at TP 8 on B200s (a 0.13-era main build) sized its KV "
    "cache (140.97 GiB a GPU, within 0.5% of the estimate), then failed on a kernel: the "
    "FlashInfer MXFP4/MXFP8 MoE path it was asked for does not support attention sinks",
    ("g26-01", "cuda_graphs"): "DeepSeek-R1-0528 at TP 8 (0.11.2): its capture took 0.51 "
    "GiB where 1.17 is estimated; the graph terms were fitted on grouped-query attention, and "
    "this is the one latent-attention (FlashMLA) capture line the sets hold",
    ("g24-02", "cuda_graphs"): "the one Gemma 4 log (0.20.2, H200): its capture took 0.88 GiB "
    "(vLLM's own estimate 0.88) where 0.45 is estimated; its heterogeneous head sizes force "
    "TRITON_ATTN, and the graph terms were fitted on logs of other backends",
    ("g8-01", "cuda_graphs"): "Qwen3-Coder-30B-A3B-FP8 through Marlin's MoE on an A100: the "
    "capture took 1.02 GiB (vLLM estimated 1.21) where 48 layers x 51 + 35 graphs give 0.73, "
    "without the A100's cuBLAS term (its weights run through Marlin); the one log of a "
    "Marlin MoE's graphs, too few to say what the fused kernels keep per graph",
    ("g12-06", "kv_cache"): "Qwen2.5-VL-3B's one-image profile on an L4 (vLLM 0.11.0) left "
    "3.34 GiB beside the weights and the KV cache where the tower's 65,536 patches count 2.23: "
    "10.44 GiB estimated vs 9.26. The same tower and image under 0.9.0.1 (c08, the 7B) peak "
    "where the count does, so a change of the release's vision path, not the count, is likely",
    ("g12-06", "cuda_graphs"): "0.11's 35 + 19 graphs of the 36-layer language model took "
    "0.44 GiB where the fit gives 0.72; x01 (0.11 too) comes out 0.25 GiB over as well, so "
    "0.11's pool may be smaller than the fit, which the 0.10-0.26 logs set together",
    **{
        (log, part): "Qwen3-235B-2507-FP8 at TP 4 on H100s under vLLM 0.19.0 (a report's summary "
        "of its start): 10.89 GiB for the KV cache where 14.83 is estimated, and the start at "
        "262,144 tokens failed (11.75 needed). The same deployment's 0.15.1 run had 14.03. The "
        "report names the FLASHINFER_CUTLASS MoE backend, whose own workspaces the model does "
        "not count, where 0.19.1 picks TRITON for block FP8 at TP without EP (fused_moe/oracle/"
        "fp8.py), as c01/c02 (the same deployment on 0.20, TRITON forced) ran, within 10%"
        for log, part in (("g11-06", "kv_cache"), ("g11-07", "kv_cache"), ("g11-07", "verdict"))
    },
    **{
        (log, "cuda_graphs"): "vLLM 0.8.4's V1 runner on two RTX 3090s (one machine): 1.44 GiB "
        "at TP 1 and 2.13 at TP 2 for 67 graphs of 28 layers, 2.9-4.3x what the 0.9 logs of "
        "the early-V1 constant hold (c08, c11, dp37); left out of bench/fit_graphs.py, where "
        "they would move that constant off every 0.9 log, for a release no other log shows"
        for log in ("g19-09", "g19-10", "g19-11")
    },
    ("g19-12", "cuda_graphs"): "vLLM 0.11.2 printed 'took -0.41 GiB' (its free-memory delta, "
    "which memory freed during the capture can turn negative), not a pool size",
    ("g20-02", "cuda_graphs"): "Qwen2.5-14B-AWQ through the old AWQ kernels (--quantization "
    "awq) on an RTX A5000: 1.18 GiB where the per-layer term gives 0.73; the same checkpoint "
    "and kernels on an RTX 3090 (g9-01/02) hold 0.35 GiB more than the term too",
    ("g20-04", "cuda_graphs"): "Qwen3-VL-30B-A3B at TP 2 (vLLM 0.12): 0.15 GiB for 35 + 19 "
    "graphs where the fit gives 0.73; the multimodal logs of 0.11-0.12 all come out under "
    "the fit (g12-06 0.44 for 0.72, n13 negative): the video profiling's buffers, freed "
    "during the capture, offset the pool in the free-memory delta",
    ("g20-08", "cuda_graphs"): "Qwen3-235B-A22B-FP8 at TP 8 with expert parallelism (vLLM "
    "0.10.0, H100s): 2.60 GiB where the fit gives 1.87; no other log with a graph line runs "
    "expert parallelism, whose all-to-all dispatch is captured into every graph",
    ("g19-02", "kv_cache"): "Qwen3-32B at TP 2 on two RTX PRO 6000s (vLLM 0.27.1, gmu 0.426, "
    "a blog's abridged log): 8.22 GiB where 6.20 is estimated, while the same post's TP 1 "
    "failure (-24.42 vs -23.91) and PP 2 start (6.92 vs 7.16) are within 4%; nvidia-smi "
    "then showed 44.1 GiB used per card, 3.6 GiB above the 40.5 GiB budget: vLLM's TP 2 "
    "profile missed memory the cards held, which no estimate of the budget follows",
    **{
        (log, "cuda_graphs"): "vLLM 0.12.0 printed a negative 'took' (-0.26 and -0.22 GiB: "
        "its free-memory delta, which memory freed during the capture can turn negative), "
        "not a pool size"
        for log in ("g18-08", "g18-11")
    },
    **{
        (log, part): "a GB10 (unified memory, as x09 and x13): its free-memory readings move "
        "with the host's, so neither the graph pool nor what the profile leaves for the KV "
        "cache follows the discrete GPUs' terms"
        for log, part in (
            ("g18-07", "kv_cache"),
            ("g18-07", "cuda_graphs"),
            ("g18-14", "cuda_graphs"),
        )
    },
    ("g18-13", "cuda_graphs"): "gpt-oss-120b at TP 2 on H200s (vLLM 0.15.1): 0.33 GiB for its "
    "graphs where the per-layer terms give 0.85; gpt-oss's pools come out under the fit on "
    "Hopper (x01, one H100 under 0.11: 0.64 for 0.89), where its attention sinks and MXFP4 "
    "MoE run kernels of their own, but two logs do not make a term",
    ("g23-02", "activation"): "Qwen3-235B-2507-FP8 at TP 4 on RTX PRO 6000s (vLLM 0.27.1): "
    "its summary prints 0.76 GiB of peak activation beside 0.32 of CUDA-graph memory, where "
    "1.44 is estimated before the graph reserve: the block-FP8 fused-MoE step of 8,192 tokens "
    "comes out 0.7 GiB high on this one log of it past 0.21; the KV cache is within 3.1%",
    ("g22-01", "verdict"): "gpt-oss-120b on one H100 under 0.14.1 (gmu 0.97, -O3, "
    "max_num_seqs 1): the issue says it ran out of memory where 0.11.2 had served the same "
    "flags, but its log ends before the error: where 0.14.1 failed, and on what, is not "
    "known (12.1 GiB of KV cache and a 0.85 GiB graph pool within 2.4 GiB above the budget "
    "are estimated)",
    ("g3-08", "verdict"): "a desktop RTX 3090: the same flags started in April (g3-06), then "
    "the sampler's warm-up after the KV cache ran out with 1.46 GiB of the card held by "
    "other processes its OOM message does not list",
}


@pytest.fixture(scope="module")
def replayed() -> dict[str, dict[str, Any]]:
    return {p["id"]: BENCH.replay(p) for p in POINTS}


def _cases(part: str) -> list[Any]:
    cases = []
    for point in POINTS:
        reason = XFAIL.get((point["id"], part))
        marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
        cases.append(pytest.param(point, id=point["id"], marks=marks))
    return cases


def _estimate(replayed: dict[str, dict[str, Any]], point: dict[str, Any]) -> dict[str, Any]:
    row = replayed[point["id"]]
    if "est" not in row:
        # The log has the figure but the model cannot be estimated here (multimodal or
        # unnamed checkpoints the catalog lacks): a miss to see, not a skip.
        pytest.xfail(f"{point['model_id']!r}: {row['skip']}")
    est: dict[str, Any] = row["est"]
    return est


@pytest.mark.parametrize("point", _cases("weights"))
def test_weights(replayed: dict[str, dict[str, Any]], point: dict[str, Any]) -> None:
    measured = BENCH.measured_weights_gib(point)
    if measured is None:
        pytest.skip("the log prints no weights")
    est = _estimate(replayed, point)["weights_gib"]
    assert abs(est / measured - 1) <= WEIGHTS_TOLERANCE, (est, measured)


@pytest.mark.parametrize("point", _cases("kv_cache"))
def test_kv_cache(replayed: dict[str, dict[str, Any]], point: dict[str, Any]) -> None:
    measured = point.get("kv_cache_gib")
    if not measured or measured <= 0 or BENCH._gpu(point) is None:
        pytest.skip("the log prints no KV cache on a known GPU")
    est = _estimate(replayed, point)["kv_cache_gib"]
    assert abs(est / measured - 1) <= KV_TOLERANCE, (est, measured)


@pytest.mark.parametrize("point", _cases("cuda_graphs"))
def test_cuda_graphs(replayed: dict[str, dict[str, Any]], point: dict[str, Any]) -> None:
    measured = point.get("cuda_graph_gib")
    if measured is None or point.get("enforce_eager"):
        pytest.skip("the log prints no graph capture")
    est = _estimate(replayed, point)["cuda_graph_gib"]
    assert abs(est - measured) <= GRAPH_TOLERANCE_GIB, (est, measured)


def _printed_graph_estimate(point: dict[str, Any]) -> float | None:
    """vLLM's "Estimated CUDA graph memory: X GiB", as the log's quote or notes carry it."""
    for field in ("quote", "notes"):
        found = re.search(r"Estimated CUDA graph memory:? ([0-9.]+) GiB", point.get(field) or "")
        if found:
            return float(found.group(1))
    return None


@pytest.mark.parametrize("point", _cases("graph_estimate"))
def test_graph_estimate(replayed: dict[str, dict[str, Any]], point: dict[str, Any]) -> None:
    printed = _printed_graph_estimate(point)
    if printed is None or point.get("cuda_graph_gib") is not None:
        pytest.skip("no graph estimate, or a capture line test_cuda_graphs holds")
    est = _estimate(replayed, point)["cuda_graph_gib"]
    assert abs(est - printed) <= GRAPH_TOLERANCE_GIB, (est, printed)


@pytest.mark.parametrize("point", _cases("activation"))
def test_activation_peak(replayed: dict[str, dict[str, Any]], point: dict[str, Any]) -> None:
    if point.get("activation_peak_gib") is None:
        pytest.skip("the log prints no profiling peak")
    err = replayed[point["id"]].get("activation_peak_err_gib")
    if err is None:
        _estimate(replayed, point)
        pytest.skip("the log's GPU budget is not replayed")
    assert abs(err) <= ACTIVATION_TOLERANCE_GIB, err


@pytest.mark.parametrize("point", _cases("verdict"))
def test_verdict(replayed: dict[str, dict[str, Any]], point: dict[str, Any]) -> None:
    if not BENCH.judged(point) or BENCH._gpu(point) is None:
        pytest.skip("the log lacks max_model_len or a known GPU")
    if not (point.get("error") or point.get("kv_cache_gib")):
        pytest.skip("the log shows neither a failure nor a KV cache")
    fits = _estimate(replayed, point)["fits"]
    assert fits == (point.get("error") is None)


def test_graph_constants_are_the_fit_of_bench_fit_graphs() -> None:
    """The per-layer graph constants in memory/profile.py are what bench/fit_graphs.py's
    least-absolute fit gives on these logs (within 10%, or 5 KiB of a nil term): a log added
    to the set, or a change to the graph counts, that moves the fit shows here rather than
    leaving the code on an older one."""
    import numpy as np

    from oominfer.memory import profile

    fit = load_script("bench/fit_graphs.py")
    data = fit.rows(LOGS) + fit.rows(EXTRA)
    coef = fit.least_absolute(np.array([f for _, f, _ in data]), np.array([m for _, _, m in data]))
    code = {
        "PIECEWISE": profile.GRAPH_BYTES_PER_LAYER_PIECEWISE,
        "FULL": profile.GRAPH_BYTES_PER_LAYER_FULL,
        "NCCL": profile.GRAPH_BYTES_PER_LAYER_NCCL,
        "EARLY_V1": profile.GRAPH_BYTES_PER_LAYER_EARLY_V1,
        "V0": profile.GRAPH_BYTES_PER_LAYER_V0,
        "SM80_EARLY_V1": profile.GRAPH_BYTES_PER_LAYER_SM80_EARLY_V1,
        "SM80_FULL": profile.GRAPH_BYTES_PER_LAYER_SM80_FULL,
    }
    assert len(data) >= 19
    for name, fitted in zip(fit.NAMES, coef, strict=True):
        assert code[name] == pytest.approx(fitted, rel=0.10, abs=5 * 1024), (name, fitted)
