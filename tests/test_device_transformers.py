"""The transformers engine measured on real GPUs, held to oominfer's predictions.

tests/data/calibration/device_transformers.jsonl was written by bench/device_transformers.py
on an H200 (run 1: ten architectures in one process), an H100 (run 2: four of them, each in
a fresh process, plus bursts through the engine's scheduler) and an H200 again (run 3, held
out: Mixtral-8x7B, DeepSeek-V2-Lite and phi-4, measured after the model was fitted; they
showed the experts' fused gate/up, the float32 router and the MoE layers' host cost, which
the model then took in), an H200 twice more (run 4, held out: Gemma-2-9B, Mistral-Small-24B,
Gemma-3-1B, Phi-3-mini and Granite-3.3-2B, which showed the sliding-window caches and masks;
run 5, held out for that model: Mistral-7B-v0.1, Gemma-2-27B and Gemma-2-2B): real-size
architectures from
the catalog with random bf16 weights, run through the engine's own ``ModelRunner``. Each
figure below is one measurement; a change to the memory model or the GPU catalog that moves
a prediction away from it fails that measurement's test.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from _scripts import load_script

from oominfer.base.units import MiB
from oominfer.hardware import nvml
from oominfer.hardware.gpu import find_gpu
from oominfer.hardware.hardware import Hardware
from oominfer.memory.estimate import estimate
from oominfer.memory.transformers import (
    TRANSFORMERS_OVERHEAD_BYTES,
    transformers_forward_bytes,
    transformers_seq_kv_bytes,
)
from oominfer.model.load import load_spec
from oominfer.rules.versions import CURRENT_VLLM
from oominfer.settings import EngineSettings

DATA = Path(__file__).parent / "data" / "calibration" / "device_transformers.jsonl"
ROWS: list[dict[str, Any]] = [json.loads(line) for line in DATA.read_text().splitlines()]
MODELS = [r for r in ROWS if r["kind"] == "model"]
PREFILLS = [(m, p) for m in MODELS for p in m["prefill"]]


def _id(row: dict[str, Any]) -> str:
    return f"run{row['run']}-{row['gpu']}-{row['model'].split('/')[-1]}"


PREFILL_IDS = [f"{_id(m)}-{p['tokens']}" for m, p in PREFILLS]


def _breakdown(row: dict[str, Any], tokens: int) -> Any:
    spec = load_spec(row["model"])
    settings = EngineSettings(dtype="bfloat16", max_model_len=tokens, max_num_seqs=1)
    hardware = Hardware.from_gpu(row["gpu"])
    return estimate(
        spec, hardware=hardware, settings=settings, engine="transformers", version=CURRENT_VLLM
    )


# Measurements the model does not meet, each with what was seen: a strict xfail, so that a
# change that meets one says so.
MISSES: dict[str, str] = {
    "run5-H200-SXM-141GB-gemma-2-27b-it-512": "9.7% light (14.5 MB) on a 512-token pass "
    "inside the window, unexplained; 2,048 and 8,192 tokens are within 0.2%",
    "run5-H200-SXM-141GB-gemma-2-2b-it-2048": "7.7% light (12.7 MB) inside the window, "
    "unexplained; 512 and 8,192 tokens are within 4% and 0.7%",
}


def _known(case_id: str) -> list[Any]:
    miss = MISSES.get(case_id)
    return [pytest.mark.xfail(reason=miss, strict=True)] if miss else []


MODEL_CASES = [pytest.param(r, id=_id(r), marks=_known(_id(r))) for r in MODELS]
PREFILL_CASES = [
    pytest.param(m, p, id=i, marks=_known(i))
    for (m, p), i in zip(PREFILLS, PREFILL_IDS, strict=True)
]


@pytest.mark.parametrize("row", MODEL_CASES)
def test_weights_match_what_torch_allocated(row: dict[str, Any]) -> None:
    """Within 1% of ``torch.cuda.memory_allocated()`` once the model is on the GPU (which
    also holds the rotary buffers and the allocator's rounding: the prediction is lighter)."""
    predicted = _breakdown(row, 4096).weights_bytes
    assert abs(predicted / row["weights_bytes"] - 1) <= 0.01


@pytest.mark.parametrize(("row", "point"), PREFILLS, ids=PREFILL_IDS)
def test_kv_bytes_per_token_are_exact(row: dict[str, Any], point: dict[str, Any]) -> None:
    """The ``DynamicCache`` after one prompt holds exactly the predicted bytes: every token
    in a full-attention layer, the window less one in a sliding-window layer (run 4: Gemma-2,
    Gemma-3 and Phi-3-mini, where counting every token was up to 6x high)."""
    spec = load_spec(row["model"])
    per_token = _breakdown(row, 4096).kv_bytes_per_token
    predicted = transformers_seq_kv_bytes(spec, length=point["tokens"], per_token=per_token)
    assert point["kv_bytes"] == predicted


@pytest.mark.parametrize(("row", "point"), PREFILL_CASES)
def test_prefill_peak_matches_the_forward_model(row: dict[str, Any], point: dict[str, Any]) -> None:
    """The peak above the weights and the cache during one prompt's prefill: within 5%
    (2,048 tokens and more: 3%; a 512-token pass is near the allocator's granularity).
    Before, vLLM's profiling formula (projections and MLP counted together, no routed-expert
    copies) was 9-12% high on dense models, 13-18% low on phi-4 and 57% low on Qwen3-30B-A3B;
    the first fit was 21% low on Mixtral-8x7B and 30% low on DeepSeek-V2-Lite (run 3)."""
    predicted = _breakdown(row, point["tokens"]).activation_bytes
    tolerance = 0.03 if point["tokens"] >= 2048 else 0.05
    assert abs(predicted / point["activation_bytes"] - 1) <= tolerance


def test_the_forward_model_is_the_breakdowns_activation() -> None:
    """The breakdown's activation is the forward model plus one sequence's fp32 logits."""
    spec = load_spec("Qwen/Qwen3-30B-A3B")
    b = _breakdown({"model": "Qwen/Qwen3-30B-A3B", "gpu": "H100"}, 8192)
    forward = transformers_forward_bytes(spec, tokens=8192, dtype_size=2, tp=1)
    assert b.activation_bytes == forward + spec.vocab_size * 8


FRESH = [r for r in MODELS if r.get("fresh_process")]


@pytest.mark.parametrize("row", FRESH, ids=_id)
def test_non_torch_memory_is_the_measured_overhead(row: dict[str, Any]) -> None:
    """NVML's used memory minus the caching allocator's reservation, in a process that
    loaded one model: the CUDA context and the cuBLAS/cuDNN handles (within 8 MiB)."""
    assert abs(row["non_torch_bytes"] - TRANSFORMERS_OVERHEAD_BYTES) <= 8 * MiB


def test_non_torch_memory_only_grows_when_one_process_loads_several_models() -> None:
    """Run 1 loaded ten models one after the other: its first measurement is the fresh
    figure, the later ones grow by a few MiB each (handles kept) and never fall below it."""
    run1 = [r["non_torch_bytes"] for r in MODELS if r["run"] == 1]
    assert abs(run1[0] - TRANSFORMERS_OVERHEAD_BYTES) <= 8 * MiB
    assert run1 == sorted(run1) and run1[-1] - run1[0] < 64 * MiB


NVML = [r for r in ROWS if r["kind"] == "nvml"]


@pytest.mark.parametrize("facts", NVML, ids=lambda r: r["gpu"])
def test_nvml_detection_names_the_catalogs_gpu(
    facts: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What NVML answered on the real machine (name, total, free, compute capability),
    replayed through ``detect_gpus``: the catalog's GPU, its NVML total, and a CUDA total
    within 0.05% of what torch reported there (the driver keeps a little more on some
    versions: gpus.json notes each)."""
    seen = facts["detected"][0]
    fake = types.SimpleNamespace(
        NVMLError=RuntimeError,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda i: seen["marketing_name"],
        nvmlDeviceGetCudaComputeCapability=lambda i: tuple(facts["torch"]["capability"]),
        nvmlDeviceGetMemoryInfo=lambda i: types.SimpleNamespace(
            total=seen["memory_bytes"], free=seen["free_bytes"]
        ),
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    (gpu,) = nvml.detect_gpus()
    assert gpu.name == facts["gpu"] == find_gpu(seen["marketing_name"]).name
    assert gpu.memory_bytes == find_gpu(gpu.name).memory_bytes
    assert gpu.free_bytes == facts["torch"]["mem_get_info_free"]
    assert abs(gpu.cuda_total_bytes / facts["torch"]["total_memory"] - 1) <= 0.0005


# The speed model of the transformers engine (speed/transformers.py) against each measured
# figure: its predicted/measured ratio today, per bench/transformers_engine.py. A change that
# moves a ratio more than SPEED_DRIFT away fails that measurement's test.
SPEED_DRIFT = 0.15
SPEED_TODAY: dict[str, float] = {
    "run1-H200-SXM-141GB-Llama-3.1-8B-512/prefill_s": 1.138,
    "run1-H200-SXM-141GB-Llama-3.1-8B-2048/prefill_s": 0.931,
    "run1-H200-SXM-141GB-Llama-3.1-8B-8192/prefill_s": 0.864,
    "run1-H200-SXM-141GB-Llama-3.1-8B-32768/prefill_s": 1.049,
    "run1-H200-SXM-141GB-Llama-3.1-8B-1x1024/step_s": 1.246,
    "run1-H200-SXM-141GB-Llama-3.1-8B-8x1024/step_s": 1.200,
    "run1-H200-SXM-141GB-Llama-3.1-8B-32x1024/step_s": 1.224,
    "run1-H200-SXM-141GB-Llama-3.1-8B-1x8192/step_s": 1.219,
    "run1-H200-SXM-141GB-Qwen3-8B-512/prefill_s": 2.807,
    "run1-H200-SXM-141GB-Qwen3-8B-2048/prefill_s": 1.468,
    "run1-H200-SXM-141GB-Qwen3-8B-8192/prefill_s": 0.993,
    "run1-H200-SXM-141GB-Qwen3-8B-32768/prefill_s": 1.041,
    "run1-H200-SXM-141GB-Qwen3-8B-1x1024/step_s": 1.635,
    "run1-H200-SXM-141GB-Qwen3-8B-8x1024/step_s": 2.451,
    "run1-H200-SXM-141GB-Qwen3-8B-32x1024/step_s": 2.154,
    "run1-H200-SXM-141GB-Qwen3-8B-1x8192/step_s": 2.213,
    "run1-H200-SXM-141GB-gemma-2b-it-512/prefill_s": 1.173,
    "run1-H200-SXM-141GB-gemma-2b-it-2048/prefill_s": 0.847,
    "run1-H200-SXM-141GB-gemma-2b-it-8192/prefill_s": 0.574,
    "run1-H200-SXM-141GB-gemma-2b-it-1x1024/step_s": 1.009,
    "run1-H200-SXM-141GB-gemma-2b-it-8x1024/step_s": 1.136,
    "run1-H200-SXM-141GB-gemma-2b-it-32x1024/step_s": 1.117,
    "run1-H200-SXM-141GB-gemma-2b-it-1x8192/step_s": 1.132,
    "run1-H200-SXM-141GB-Llama-3.2-3B-Instruct-512/prefill_s": 1.320,
    "run1-H200-SXM-141GB-Llama-3.2-3B-Instruct-2048/prefill_s": 1.245,
    "run1-H200-SXM-141GB-Llama-3.2-3B-Instruct-8192/prefill_s": 0.725,
    "run1-H200-SXM-141GB-Llama-3.2-3B-Instruct-32768/prefill_s": 0.980,
    "run1-H200-SXM-141GB-Llama-3.2-3B-Instruct-1x1024/step_s": 0.794,
    "run1-H200-SXM-141GB-Llama-3.2-3B-Instruct-8x1024/step_s": 1.138,
    "run1-H200-SXM-141GB-Llama-3.2-3B-Instruct-32x1024/step_s": 0.698,
    "run1-H200-SXM-141GB-Llama-3.2-3B-Instruct-1x8192/step_s": 0.721,
    "run1-H200-SXM-141GB-Qwen2.5-7B-Instruct-512/prefill_s": 0.795,
    "run1-H200-SXM-141GB-Qwen2.5-7B-Instruct-2048/prefill_s": 0.727,
    "run1-H200-SXM-141GB-Qwen2.5-7B-Instruct-8192/prefill_s": 0.873,
    "run1-H200-SXM-141GB-Qwen2.5-7B-Instruct-32768/prefill_s": 1.072,
    "run1-H200-SXM-141GB-Qwen2.5-7B-Instruct-1x1024/step_s": 1.206,
    "run1-H200-SXM-141GB-Qwen2.5-7B-Instruct-8x1024/step_s": 1.096,
    "run1-H200-SXM-141GB-Qwen2.5-7B-Instruct-32x1024/step_s": 1.097,
    "run1-H200-SXM-141GB-Qwen2.5-7B-Instruct-1x8192/step_s": 0.760,
    "run1-H200-SXM-141GB-Mistral-Nemo-Instruct-2407-512/prefill_s": 1.897,
    "run1-H200-SXM-141GB-Mistral-Nemo-Instruct-2407-2048/prefill_s": 1.182,
    "run1-H200-SXM-141GB-Mistral-Nemo-Instruct-2407-8192/prefill_s": 1.110,
    "run1-H200-SXM-141GB-Mistral-Nemo-Instruct-2407-32768/prefill_s": 1.111,
    "run1-H200-SXM-141GB-Mistral-Nemo-Instruct-2407-1x1024/step_s": 3.342,
    "run1-H200-SXM-141GB-Mistral-Nemo-Instruct-2407-8x1024/step_s": 2.310,
    "run1-H200-SXM-141GB-Mistral-Nemo-Instruct-2407-32x1024/step_s": 2.548,
    "run1-H200-SXM-141GB-Mistral-Nemo-Instruct-2407-1x8192/step_s": 3.063,
    "run1-H200-SXM-141GB-Qwen3-14B-512/prefill_s": 0.832,
    "run1-H200-SXM-141GB-Qwen3-14B-2048/prefill_s": 0.786,
    "run1-H200-SXM-141GB-Qwen3-14B-8192/prefill_s": 1.001,
    "run1-H200-SXM-141GB-Qwen3-14B-32768/prefill_s": 1.081,
    "run1-H200-SXM-141GB-Qwen3-14B-1x1024/step_s": 1.033,
    "run1-H200-SXM-141GB-Qwen3-14B-8x1024/step_s": 1.032,
    "run1-H200-SXM-141GB-Qwen3-14B-32x1024/step_s": 1.105,
    "run1-H200-SXM-141GB-Qwen3-14B-1x8192/step_s": 0.945,
    "run1-H200-SXM-141GB-Qwen3-30B-A3B-512/prefill_s": 1.309,
    "run1-H200-SXM-141GB-Qwen3-30B-A3B-2048/prefill_s": 1.097,
    "run1-H200-SXM-141GB-Qwen3-30B-A3B-8192/prefill_s": 0.567,
    "run1-H200-SXM-141GB-Qwen3-30B-A3B-32768/prefill_s": 0.857,
    "run1-H200-SXM-141GB-Qwen3-30B-A3B-1x1024/step_s": 1.076,
    "run1-H200-SXM-141GB-Qwen3-30B-A3B-8x1024/step_s": 0.952,
    "run1-H200-SXM-141GB-Qwen3-30B-A3B-32x1024/step_s": 1.007,
    "run1-H200-SXM-141GB-Qwen3-30B-A3B-1x8192/step_s": 1.030,
    "run1-H200-SXM-141GB-Qwen3-32B-512/prefill_s": 1.220,
    "run1-H200-SXM-141GB-Qwen3-32B-2048/prefill_s": 0.904,
    "run1-H200-SXM-141GB-Qwen3-32B-8192/prefill_s": 1.058,
    "run1-H200-SXM-141GB-Qwen3-32B-32768/prefill_s": 1.110,
    "run1-H200-SXM-141GB-Qwen3-32B-1x1024/step_s": 0.907,
    "run1-H200-SXM-141GB-Qwen3-32B-8x1024/step_s": 0.867,
    "run1-H200-SXM-141GB-Qwen3-32B-32x1024/step_s": 1.149,
    "run1-H200-SXM-141GB-Qwen3-32B-1x8192/step_s": 1.088,
    "run1-H200-SXM-141GB-phi-4-512/prefill_s": 1.368,
    "run1-H200-SXM-141GB-phi-4-2048/prefill_s": 0.791,
    "run1-H200-SXM-141GB-phi-4-8192/prefill_s": 0.993,
    "run1-H200-SXM-141GB-phi-4-1x1024/step_s": 1.187,
    "run1-H200-SXM-141GB-phi-4-8x1024/step_s": 1.074,
    "run1-H200-SXM-141GB-phi-4-32x1024/step_s": 1.201,
    "run1-H200-SXM-141GB-phi-4-1x8192/step_s": 1.205,
    "run2-H100-SXM-80GB-Llama-3.1-8B-512/prefill_s": 1.026,
    "run2-H100-SXM-80GB-Llama-3.1-8B-2048/prefill_s": 0.808,
    "run2-H100-SXM-80GB-Llama-3.1-8B-8192/prefill_s": 0.893,
    "run2-H100-SXM-80GB-Llama-3.1-8B-32768/prefill_s": 1.040,
    "run2-H100-SXM-80GB-Llama-3.1-8B-1x1024/step_s": 0.967,
    "run2-H100-SXM-80GB-Llama-3.1-8B-8x1024/step_s": 0.940,
    "run2-H100-SXM-80GB-Llama-3.1-8B-32x1024/step_s": 0.933,
    "run2-H100-SXM-80GB-Llama-3.1-8B-1x8192/step_s": 1.011,
    "run2-H100-SXM-80GB-Llama-3.1-8B-burst1/ttft_s": 0.782,
    "run2-H100-SXM-80GB-Llama-3.1-8B-burst1/tpot_s": 0.867,
    "run2-H100-SXM-80GB-Llama-3.1-8B-burst1/output_tokens_per_s": 1.154,
    "run2-H100-SXM-80GB-Llama-3.1-8B-burst8/ttft_s": 0.676,
    "run2-H100-SXM-80GB-Llama-3.1-8B-burst8/tpot_s": 1.060,
    "run2-H100-SXM-80GB-Llama-3.1-8B-burst8/output_tokens_per_s": 0.951,
    "run2-H100-SXM-80GB-Llama-3.1-8B-burst32/ttft_s": 1.200,
    "run2-H100-SXM-80GB-Llama-3.1-8B-burst32/tpot_s": 0.939,
    "run2-H100-SXM-80GB-Llama-3.1-8B-burst32/output_tokens_per_s": 1.051,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-512/prefill_s": 1.028,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-2048/prefill_s": 0.650,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-8192/prefill_s": 0.480,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-32768/prefill_s": 0.786,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-1x1024/step_s": 0.682,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-8x1024/step_s": 0.683,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-32x1024/step_s": 0.708,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-1x8192/step_s": 0.766,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-burst1/ttft_s": 0.939,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-burst1/tpot_s": 0.807,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-burst1/output_tokens_per_s": 1.239,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-burst8/ttft_s": 0.634,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-burst8/tpot_s": 0.602,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-burst8/output_tokens_per_s": 1.660,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-burst32/ttft_s": 0.790,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-burst32/tpot_s": 0.746,
    "run2-H100-SXM-80GB-Qwen3-30B-A3B-burst32/output_tokens_per_s": 1.338,
    "run2-H100-SXM-80GB-Qwen3-14B-512/prefill_s": 0.684,
    "run2-H100-SXM-80GB-Qwen3-14B-2048/prefill_s": 0.602,
    "run2-H100-SXM-80GB-Qwen3-14B-8192/prefill_s": 0.904,
    "run2-H100-SXM-80GB-Qwen3-14B-32768/prefill_s": 1.026,
    "run2-H100-SXM-80GB-Qwen3-14B-1x1024/step_s": 0.844,
    "run2-H100-SXM-80GB-Qwen3-14B-8x1024/step_s": 0.975,
    "run2-H100-SXM-80GB-Qwen3-14B-32x1024/step_s": 0.786,
    "run2-H100-SXM-80GB-Qwen3-14B-1x8192/step_s": 0.704,
    "run2-H100-SXM-80GB-Qwen3-14B-burst1/ttft_s": 0.687,
    "run2-H100-SXM-80GB-Qwen3-14B-burst1/tpot_s": 0.834,
    "run2-H100-SXM-80GB-Qwen3-14B-burst1/output_tokens_per_s": 1.201,
    "run2-H100-SXM-80GB-Qwen3-14B-burst8/ttft_s": 0.813,
    "run2-H100-SXM-80GB-Qwen3-14B-burst8/tpot_s": 0.831,
    "run2-H100-SXM-80GB-Qwen3-14B-burst8/output_tokens_per_s": 1.204,
    "run2-H100-SXM-80GB-Qwen3-14B-burst32/ttft_s": 1.198,
    "run2-H100-SXM-80GB-Qwen3-14B-burst32/tpot_s": 0.963,
    "run2-H100-SXM-80GB-Qwen3-14B-burst32/output_tokens_per_s": 1.020,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-512/prefill_s": 0.995,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-2048/prefill_s": 1.033,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-8192/prefill_s": 0.614,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-32768/prefill_s": 0.947,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-1x1024/step_s": 0.914,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-8x1024/step_s": 0.989,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-32x1024/step_s": 1.028,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-1x8192/step_s": 0.896,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-burst1/ttft_s": 0.780,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-burst1/tpot_s": 1.032,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-burst1/output_tokens_per_s": 0.972,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-burst8/ttft_s": 0.908,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-burst8/tpot_s": 0.997,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-burst8/output_tokens_per_s": 1.004,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-burst32/ttft_s": 0.970,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-burst32/tpot_s": 0.926,
    "run2-H100-SXM-80GB-Llama-3.2-3B-Instruct-burst32/output_tokens_per_s": 1.078,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-512/prefill_s": 0.706,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-2048/prefill_s": 0.698,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-8192/prefill_s": 0.997,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-32768/prefill_s": 1.117,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-1x1024/step_s": 0.745,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-8x1024/step_s": 1.062,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-32x1024/step_s": 0.704,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-1x8192/step_s": 0.642,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-burst1/ttft_s": 1.015,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-burst1/tpot_s": 0.983,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-burst1/output_tokens_per_s": 1.017,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-burst8/ttft_s": 0.994,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-burst8/tpot_s": 0.976,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-burst8/output_tokens_per_s": 1.024,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-burst32/ttft_s": 1.204,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-burst32/tpot_s": 0.810,
    "run3-H200-SXM-141GB-Mixtral-8x7B-v0.1-burst32/output_tokens_per_s": 1.196,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-512/prefill_s": 0.693,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-2048/prefill_s": 0.893,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-8192/prefill_s": 0.520,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-32768/prefill_s": 0.780,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-1x1024/step_s": 0.903,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-8x1024/step_s": 0.764,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-32x1024/step_s": 0.914,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-1x8192/step_s": 0.771,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-burst1/ttft_s": 0.915,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-burst1/tpot_s": 0.862,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-burst1/output_tokens_per_s": 1.159,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-burst8/ttft_s": 0.728,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-burst8/tpot_s": 0.943,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-burst8/output_tokens_per_s": 1.063,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-burst32/ttft_s": 0.808,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-burst32/tpot_s": 0.763,
    "run3-H200-SXM-141GB-DeepSeek-V2-Lite-burst32/output_tokens_per_s": 1.308,
    "run3-H200-SXM-141GB-phi-4-512/prefill_s": 1.238,
    "run3-H200-SXM-141GB-phi-4-2048/prefill_s": 0.678,
    "run3-H200-SXM-141GB-phi-4-8192/prefill_s": 0.982,
    "run3-H200-SXM-141GB-phi-4-1x1024/step_s": 0.934,
    "run3-H200-SXM-141GB-phi-4-8x1024/step_s": 1.082,
    "run3-H200-SXM-141GB-phi-4-32x1024/step_s": 0.875,
    "run3-H200-SXM-141GB-phi-4-1x8192/step_s": 0.774,
    "run3-H200-SXM-141GB-phi-4-burst1/ttft_s": 1.191,
    "run3-H200-SXM-141GB-phi-4-burst1/tpot_s": 1.069,
    "run3-H200-SXM-141GB-phi-4-burst1/output_tokens_per_s": 0.935,
    "run3-H200-SXM-141GB-phi-4-burst8/ttft_s": 0.893,
    "run3-H200-SXM-141GB-phi-4-burst8/tpot_s": 1.169,
    "run3-H200-SXM-141GB-phi-4-burst8/output_tokens_per_s": 0.862,
    "run3-H200-SXM-141GB-phi-4-burst32/ttft_s": 1.238,
    "run3-H200-SXM-141GB-phi-4-burst32/tpot_s": 1.211,
    "run3-H200-SXM-141GB-phi-4-burst32/output_tokens_per_s": 0.824,
    "run4-H200-SXM-141GB-gemma-2-9b-it-512/prefill_s": 0.797,
    "run4-H200-SXM-141GB-gemma-2-9b-it-2048/prefill_s": 0.694,
    "run4-H200-SXM-141GB-gemma-2-9b-it-8192/prefill_s": 0.171,
    "run4-H200-SXM-141GB-gemma-2-9b-it-1x1024/step_s": 0.774,
    "run4-H200-SXM-141GB-gemma-2-9b-it-8x1024/step_s": 1.063,
    "run4-H200-SXM-141GB-gemma-2-9b-it-32x1024/step_s": 1.081,
    "run4-H200-SXM-141GB-gemma-2-9b-it-1x8192/step_s": 1.051,
    "run4-H200-SXM-141GB-gemma-2-9b-it-burst1/ttft_s": 1.386,
    "run4-H200-SXM-141GB-gemma-2-9b-it-burst1/tpot_s": 1.017,
    "run4-H200-SXM-141GB-gemma-2-9b-it-burst1/output_tokens_per_s": 0.981,
    "run4-H200-SXM-141GB-gemma-2-9b-it-burst8/ttft_s": 0.760,
    "run4-H200-SXM-141GB-gemma-2-9b-it-burst8/tpot_s": 1.079,
    "run4-H200-SXM-141GB-gemma-2-9b-it-burst8/output_tokens_per_s": 0.933,
    "run4-H200-SXM-141GB-gemma-2-9b-it-burst32/ttft_s": 1.283,
    "run4-H200-SXM-141GB-gemma-2-9b-it-burst32/tpot_s": 0.883,
    "run4-H200-SXM-141GB-gemma-2-9b-it-burst32/output_tokens_per_s": 1.107,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-512/prefill_s": 0.696,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-2048/prefill_s": 0.837,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-8192/prefill_s": 1.093,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-32768/prefill_s": 1.154,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-1x1024/step_s": 1.193,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-8x1024/step_s": 1.158,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-32x1024/step_s": 1.213,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-1x8192/step_s": 1.146,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-burst1/ttft_s": 1.224,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-burst1/tpot_s": 1.219,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-burst1/output_tokens_per_s": 0.820,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-burst8/ttft_s": 1.099,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-burst8/tpot_s": 0.921,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-burst8/output_tokens_per_s": 1.080,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-burst32/ttft_s": 1.258,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-burst32/tpot_s": 0.953,
    "run4-H200-SXM-141GB-Mistral-Small-24B-Instruct-2501-burst32/output_tokens_per_s": 1.016,
    "run4-H200-SXM-141GB-gemma-3-1b-it-512/prefill_s": 0.330,
    "run4-H200-SXM-141GB-gemma-3-1b-it-2048/prefill_s": 0.415,
    "run4-H200-SXM-141GB-gemma-3-1b-it-8192/prefill_s": 0.386,
    "run4-H200-SXM-141GB-gemma-3-1b-it-32768/prefill_s": 0.413,
    "run4-H200-SXM-141GB-gemma-3-1b-it-1x1024/step_s": 0.753,
    "run4-H200-SXM-141GB-gemma-3-1b-it-8x1024/step_s": 0.644,
    "run4-H200-SXM-141GB-gemma-3-1b-it-32x1024/step_s": 0.614,
    "run4-H200-SXM-141GB-gemma-3-1b-it-1x8192/step_s": 0.733,
    "run4-H200-SXM-141GB-gemma-3-1b-it-burst1/ttft_s": 0.476,
    "run4-H200-SXM-141GB-gemma-3-1b-it-burst1/tpot_s": 0.858,
    "run4-H200-SXM-141GB-gemma-3-1b-it-burst1/output_tokens_per_s": 1.175,
    "run4-H200-SXM-141GB-gemma-3-1b-it-burst8/ttft_s": 0.480,
    "run4-H200-SXM-141GB-gemma-3-1b-it-burst8/tpot_s": 0.934,
    "run4-H200-SXM-141GB-gemma-3-1b-it-burst8/output_tokens_per_s": 1.081,
    "run4-H200-SXM-141GB-gemma-3-1b-it-burst32/ttft_s": 0.598,
    "run4-H200-SXM-141GB-gemma-3-1b-it-burst32/tpot_s": 0.949,
    "run4-H200-SXM-141GB-gemma-3-1b-it-burst32/output_tokens_per_s": 1.062,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-512/prefill_s": 1.158,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-2048/prefill_s": 0.120,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-1x1024/step_s": 1.106,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-8x1024/step_s": 0.910,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-32x1024/step_s": 0.780,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-burst1/ttft_s": 0.791,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-burst1/tpot_s": 0.776,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-burst1/output_tokens_per_s": 1.287,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-burst8/ttft_s": 0.640,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-burst8/tpot_s": 1.121,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-burst8/output_tokens_per_s": 0.899,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-burst32/ttft_s": 1.193,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-burst32/tpot_s": 1.001,
    "run4-H200-SXM-141GB-Phi-3-mini-4k-instruct-burst32/output_tokens_per_s": 0.991,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-512/prefill_s": 0.838,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-2048/prefill_s": 1.316,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-8192/prefill_s": 0.587,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-32768/prefill_s": 0.846,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-1x1024/step_s": 1.121,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-8x1024/step_s": 0.877,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-32x1024/step_s": 0.776,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-1x8192/step_s": 1.119,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-burst1/ttft_s": 1.327,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-burst1/tpot_s": 1.109,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-burst1/output_tokens_per_s": 0.900,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-burst8/ttft_s": 1.081,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-burst8/tpot_s": 1.028,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-burst8/output_tokens_per_s": 0.973,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-burst32/ttft_s": 1.040,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-burst32/tpot_s": 1.070,
    "run4-H200-SXM-141GB-granite-3.3-2b-instruct-burst32/output_tokens_per_s": 0.935,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-512/prefill_s": 0.775,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-2048/prefill_s": 0.734,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-8192/prefill_s": 0.215,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-32768/prefill_s": 0.713,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-1x1024/step_s": 0.966,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-8x1024/step_s": 1.032,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-32x1024/step_s": 1.083,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-1x8192/step_s": 2.197,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-burst1/ttft_s": 1.191,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-burst1/tpot_s": 0.898,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-burst1/output_tokens_per_s": 1.110,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-burst8/ttft_s": 0.784,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-burst8/tpot_s": 0.947,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-burst8/output_tokens_per_s": 1.059,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-burst32/ttft_s": 1.488,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-burst32/tpot_s": 0.967,
    "run5-H200-SXM-141GB-Mistral-7B-v0.1-burst32/output_tokens_per_s": 1.008,
    "run5-H200-SXM-141GB-gemma-2-27b-it-512/prefill_s": 0.912,
    "run5-H200-SXM-141GB-gemma-2-27b-it-2048/prefill_s": 0.825,
    "run5-H200-SXM-141GB-gemma-2-27b-it-8192/prefill_s": 0.909,
    "run5-H200-SXM-141GB-gemma-2-27b-it-1x1024/step_s": 0.892,
    "run5-H200-SXM-141GB-gemma-2-27b-it-8x1024/step_s": 0.887,
    "run5-H200-SXM-141GB-gemma-2-27b-it-32x1024/step_s": 0.949,
    "run5-H200-SXM-141GB-gemma-2-27b-it-1x8192/step_s": 0.759,
    "run5-H200-SXM-141GB-gemma-2-27b-it-burst1/ttft_s": 0.806,
    "run5-H200-SXM-141GB-gemma-2-27b-it-burst1/tpot_s": 0.735,
    "run5-H200-SXM-141GB-gemma-2-27b-it-burst1/output_tokens_per_s": 1.360,
    "run5-H200-SXM-141GB-gemma-2-27b-it-burst8/ttft_s": 1.062,
    "run5-H200-SXM-141GB-gemma-2-27b-it-burst8/tpot_s": 0.930,
    "run5-H200-SXM-141GB-gemma-2-27b-it-burst8/output_tokens_per_s": 1.071,
    "run5-H200-SXM-141GB-gemma-2-27b-it-burst32/ttft_s": 1.232,
    "run5-H200-SXM-141GB-gemma-2-27b-it-burst32/tpot_s": 0.973,
    "run5-H200-SXM-141GB-gemma-2-27b-it-burst32/output_tokens_per_s": 0.995,
    "run5-H200-SXM-141GB-gemma-2-2b-it-512/prefill_s": 0.808,
    "run5-H200-SXM-141GB-gemma-2-2b-it-2048/prefill_s": 0.818,
    "run5-H200-SXM-141GB-gemma-2-2b-it-8192/prefill_s": 0.282,
    "run5-H200-SXM-141GB-gemma-2-2b-it-1x1024/step_s": 0.807,
    "run5-H200-SXM-141GB-gemma-2-2b-it-8x1024/step_s": 0.667,
    "run5-H200-SXM-141GB-gemma-2-2b-it-32x1024/step_s": 0.714,
    "run5-H200-SXM-141GB-gemma-2-2b-it-1x8192/step_s": 0.717,
    "run5-H200-SXM-141GB-gemma-2-2b-it-burst1/ttft_s": 0.659,
    "run5-H200-SXM-141GB-gemma-2-2b-it-burst1/tpot_s": 0.614,
    "run5-H200-SXM-141GB-gemma-2-2b-it-burst1/output_tokens_per_s": 1.628,
    "run5-H200-SXM-141GB-gemma-2-2b-it-burst8/ttft_s": 0.648,
    "run5-H200-SXM-141GB-gemma-2-2b-it-burst8/tpot_s": 0.976,
    "run5-H200-SXM-141GB-gemma-2-2b-it-burst8/output_tokens_per_s": 1.030,
    "run5-H200-SXM-141GB-gemma-2-2b-it-burst32/ttft_s": 0.892,
    "run5-H200-SXM-141GB-gemma-2-2b-it-burst32/tpot_s": 0.750,
    "run5-H200-SXM-141GB-gemma-2-2b-it-burst32/output_tokens_per_s": 1.329,
}


@pytest.fixture(scope="module")
def speed_ratios() -> dict[str, Any]:
    bench = load_script("bench/transformers_engine.py")
    return {f"{r.id}/{r.part}": r for r in bench.ratios(ROWS)}


@pytest.mark.parametrize("key", sorted(SPEED_TODAY))
def test_speed_measurement_holds(key: str, speed_ratios: dict[str, Any]) -> None:
    """Each measured prefill, decode step and scheduler burst stays where the model puts it."""
    ratio = speed_ratios[key].ratio
    today = SPEED_TODAY[key]
    assert today / (1 + SPEED_DRIFT) <= ratio <= today * (1 + SPEED_DRIFT), (key, ratio)


def test_every_speed_measurement_is_pinned(speed_ratios: dict[str, Any]) -> None:
    timed = {k for k, r in speed_ratios.items() if r.part.endswith(("_s", "_per_s"))}
    assert timed == set(SPEED_TODAY)


# Held-out bursts whose TTFT the model misses by more than 2x: Gemma-3-1B's prompt pass
# costs its host about 0.2 s whatever the prompt's length (512-8,192 tokens), twice
# Gemma-2-2B's with the same 26 layers; the model gives it 0.095 s.
TTFT_MISSES = (
    "run4-H200-SXM-141GB-gemma-3-1b-it-burst1/ttft_s",
    "run4-H200-SXM-141GB-gemma-3-1b-it-burst8/ttft_s",
)


def test_what_the_engine_serves_is_predicted_within_the_bar(speed_ratios: dict[str, Any]) -> None:
    """The scheduler's bursts (what a client of ``oominfer serve`` sees): output tokens/s and
    TPOT within 15% median and 2x at worst; TTFT within 30% median and 2x at worst but for
    the named misses, which are still more than 2x off. The bare steps vary more (the host's
    speed), so they are held only to the median."""
    bench = load_script("bench/transformers_engine.py")
    s = bench.summary(list(speed_ratios.values()))
    for part in ("output_tokens_per_s", "tpot_s"):
        assert s[part]["median_error"] <= 0.15 and s[part]["worst_factor"] <= 2.0, (part, s[part])
    assert s["ttft_s"]["median_error"] <= 0.30
    for key, r in speed_ratios.items():
        if r.part == "ttft_s":
            within = 0.5 <= r.ratio <= 2.0
            assert within != (key in TTFT_MISSES), (key, r.ratio)
    assert s["step_s"]["median_error"] <= 0.25
    assert s["prefill_s"]["median_error"] <= 0.20


def test_a_transformers_estimate_predicts_its_speed() -> None:
    """``estimate --engine transformers`` carries a performance object: host-bound steps of
    35 ms and 32 layers x 1 ms plus the scheduler's 10 ms; a burst (``--num-prompts`` at its
    concurrency) is stepped group by group, and a run that queues takes the steady pace."""
    import json as json_

    from click.testing import CliRunner

    from oominfer.cli import app

    base = ["estimate", "meta-llama/Llama-3.1-8B", "--gpu", "H100", "--engine", "transformers",
            "--input-len", "512", "--output-len", "128", "--json"]  # fmt: skip
    steady = CliRunner().invoke(app.main, [*base, "--concurrency", "8"])
    assert steady.exit_code == 0, steady.output
    perf = json_.loads(steady.stdout)["performance"]
    assert perf["bound"] == "host" and perf["concurrency"] == 8
    assert perf["tpot_s"] > 0.035 + 32 * 1e-3 + 0.010  # the step plus the others' prompts
    burst = CliRunner().invoke(app.main, [*base, "--concurrency", "8", "--num-prompts", "8"])
    perf = json_.loads(burst.stdout)["performance"]
    assert perf["num_prompts"] == 8 and perf["tpot_s"] == pytest.approx(0.0770, abs=1e-4)
    # measured on the H100 for this burst: 108.6 output tokens/s (bench/transformers_engine.py)
    assert perf["output_tokens_per_s"] == pytest.approx(108.6, rel=0.1)
    queued = CliRunner().invoke(app.main, [*base, "--concurrency", "4", "--num-prompts", "16"])
    perf = json_.loads(queued.stdout)["performance"]
    assert perf["concurrency"] == 4 and perf["num_prompts"] is None
