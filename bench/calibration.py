"""Replay every usable point of shared/calibration/vllm_memory_logs.jsonl through the estimator.

Prints, per point and in summary: the relative error of the weights, of the KV-cache bytes
vLLM reported, of KV bytes per token (where vLLM printed both a token count and the KV
bytes), and whether the fits / does-not-fit verdict matched; then the median and worst
error of each memory part (weights %, KV cache %, CUDA graphs GiB, non-torch GiB,
activation peak GiB, wrong verdicts) beside the model of commit 18ec457, whose per-point
estimates are stored in bench/calibration_18ec457.json (made once with --predictions from a
``git archive 18ec457 oominfer`` copy on PYTHONPATH).

    PYTHONPATH=. python bench/calibration.py [--logs PATH] [--json | --predictions]

Nothing here is tuned per point: each point's own facts (model, GPU total, flags, vLLM
version) go in, the estimator's one set of constants does the rest.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Final, Literal, TypeVar

from oominfer.base.errors import OominferError
from oominfer.base.units import GiB
from oominfer.hardware.gpu import GpuSpec, find_gpu
from oominfer.hardware.hardware import Hardware
from oominfer.memory.estimate import estimate
from oominfer.model.catalog import catalog_entry
from oominfer.model.config import spec_from_config
from oominfer.model.load import load_spec
from oominfer.model.spec import Checkpoint, ModelSpec, QuantSpec
from oominfer.rules.overrides import with_overrides
from oominfer.rules.versions import EngineVersion
from oominfer.settings import EngineSettings

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_LOGS = ROOT.parent / "shared" / "calibration" / "vllm_memory_logs.jsonl"
EXTRA_LOGS = ROOT / "tests" / "data" / "calibration" / "extra_gpu_logs.jsonl"
"""Public GPU logs gathered here beside the shared set (gpt-oss on Hopper; each with its
source): replayed the same way, reported apart."""
# Lines of the log that only the V1 engine prints (a point without a version is V0-era).
V1_MARKERS = ("kv_cache_utils", "v1/worker", "GPU KV cache size", "Available KV cache memory")


T = TypeVar("T")

# Checkpoints a log names that the catalog holds under another name with the same
# architecture and weight format (same layers, widths, vocabulary, dtype or quantization).
# Only the model's identity is mapped: no figure of any log is.
SAME_ARCHITECTURE: dict[str, str] = {
    # The 2507 refresh of the FP8 MoE: same config.json shapes and FP8 block scheme.
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": "Qwen/Qwen3-235B-A22B-FP8",
    # The 2507 refresh of the 30B MoE in FP8: the same shapes and block scheme as Qwen3-30B-A3B-FP8.
    "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8": "Qwen/Qwen3-30B-A3B-FP8",
    # The coding fine-tune of the 30B MoE in FP8: the same 48 x 2048 shapes, 128 experts and
    # block scheme as Qwen3-30B-A3B-FP8 (its 256k context in CONFIG_DIFFERENCES).
    "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8": "Qwen/Qwen3-30B-A3B-FP8",
    # The coding fine-tune of the 30B MoE in 16 bits: the same shapes as Qwen3-30B-A3B (its
    # 256k context in CONFIG_DIFFERENCES). After the FP8 name, which it prefixes.
    "Qwen/Qwen3-Coder-30B-A3B-Instruct": "Qwen/Qwen3-30B-A3B",
    # Math fine-tune of Qwen2.5-1.5B: same 28 x 1536 shapes, tied embeddings, vocab 151936.
    "Qwen/Qwen2.5-Math-1.5B": "Qwen/Qwen2.5-1.5B-Instruct",
    # Qwen2-7B and Qwen2.5-7B share every shape (28 x 3584, 4 KV heads, vocab 152064).
    "Qwen/Qwen2-7B-Instruct": "Qwen/Qwen2.5-7B-Instruct",
    # A DPO fine-tune of Llama-3.1-8B (8,030,261,248 parameters: one token added).
    "Llama-3.1-8B fine-tune": "meta-llama/Llama-3.1-8B",
    # Mistral-Small-3.2 is an update of 3.1's weights in the same Mistral3 architecture (40
    # x 5120 text layers, Pixtral tower of 24 x 1024, vocab 131072).
    "mistralai/Mistral-Small-3.2-24B-Instruct-2506": (
        "mistralai/Mistral-Small-3.1-24B-Instruct-2503"
    ),
    # Qwen3-Next-80B-A3B's Instruct and Thinking checkpoints share every shape (48 hybrid
    # layers x 2048, 512 experts, vocab 151936) and the BF16 format.
    "Qwen3-Next-80B-A3B (variant not named": "Qwen/Qwen3-Next-80B-A3B-Thinking",
    "Qwen/Qwen3-Next-80B-A3B-Instruct": "Qwen/Qwen3-Next-80B-A3B-Thinking",
    # A fine-tune of Qwen3-VL-30B-A3B ('qwen-custom'): the log resolves the same
    # Qwen3VLMoeForConditionalGeneration in bf16 (48 x 2048 layers, 4 KV heads, 128 experts,
    # by its 98,304 B a token), the shapes of the Instruct checkpoint.
    "unnamed Qwen3-VL-30B-A3B derivative": "Qwen/Qwen3-VL-30B-A3B-Instruct",
    # The May 2025 update of DeepSeek-R1's weights: the same DeepseekV3 config.json shapes
    # (61 x 7168 MLA layers, 256 experts) and native block FP8.
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-ai/DeepSeek-R1",
}


# Where a renamed checkpoint's config.json differs from its stand-in's in a field that is
# not a shape: the published config.json's value (again no figure of any log).
CONFIG_DIFFERENCES: dict[str, dict[str, int]] = {
    # huggingface.co/Qwen/Qwen3-235B-A22B-Instruct-2507-FP8 config.json: native 256k context.
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": {"max_position_embeddings": 262144},
    # Llama-3-70B's config.json: 8,192 positions, no rope scaling.
    "TechxGenus/Meta-Llama-3-70B-Instruct-AWQ": {"max_position_embeddings": 8192},
    # huggingface.co/Qwen/Qwen3-30B-A3B-Instruct-2507-FP8 config.json: native 256k context.
    "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8": {"max_position_embeddings": 262144},
    # huggingface.co/Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8 config.json: native 256k context.
    "Qwen/Qwen3-Coder-30B-A3B-Instruct-FP8": {"max_position_embeddings": 262144},
    # huggingface.co/Qwen/Qwen3-Coder-30B-A3B-Instruct config.json: the same.
    "Qwen/Qwen3-Coder-30B-A3B-Instruct": {"max_position_embeddings": 262144},
}

# Pre-quantized checkpoints of a model the catalog holds in 16 bits: the base's shapes with
# the quantization_config the checkpoint publishes (its exact tensor sizes are unknown here,
# so the weights are counted from the parameters; the log's "Model loading took" checks it).
QUANTIZED_STAND_INS: dict[str, tuple[str, QuantSpec]] = {
    # huggingface.co/Qwen/Qwen3-8B-FP8: fp8 e4m3, weight_block_size [128, 128].
    "Qwen/Qwen3-8B-FP8": ("Qwen/Qwen3-8B", QuantSpec(method="fp8", bits=8)),
    # huggingface.co/Qwen/Qwen2.5-7B-Instruct-AWQ: awq, 4 bits, group 128, zero point.
    "Qwen/Qwen2.5-7B-Instruct-AWQ": (
        "Qwen/Qwen2.5-7B-Instruct",
        QuantSpec(method="awq", bits=4, group_size=128),
    ),
    # huggingface.co/Qwen/Qwen2.5-14B-Instruct-AWQ: awq, 4 bits, group 128, zero point.
    "Qwen/Qwen2.5-14B-Instruct-AWQ": (
        "Qwen/Qwen2.5-14B-Instruct",
        QuantSpec(method="awq", bits=4, group_size=128),
    ),
    # huggingface.co/RedHatAI/Qwen3-0.6B-quantized.w4a16: compressed-tensors, int4 weights in
    # groups of 128 (its embeddings, tied, stay 16-bit).
    "RedHatAI/Qwen3-0.6B-quantized.w4a16": (
        "Qwen/Qwen3-0.6B",
        QuantSpec(method="compressed-tensors", bits=4, group_size=128),
    ),
    # huggingface.co/TechxGenus/Meta-Llama-3-70B-Instruct-AWQ: awq, 4 bits, group 128, of
    # Llama-3-70B (the 3.1 shapes; its 8k context in CONFIG_DIFFERENCES).
    "TechxGenus/Meta-Llama-3-70B-Instruct-AWQ": (
        "meta-llama/Llama-3.1-70B-Instruct",
        QuantSpec(method="awq", bits=4, group_size=128),
    ),
}

# vLLM's warning that its tensor-parallel peers share no NVLink: the GPUs lack P2P, or the
# group spans nodes (custom all-reduce off; NCCL over PCIe or the network). The GPU is then
# given as a PCIe one, whatever its form factor.
NO_PEER_LINK = re.compile(
    r"Custom allreduce is disabled because (your platform lacks GPU P2P|this process group "
    r"spans across nodes)"
)
# Words of a GPU description that say vLLM saw only part of the named card (a vGPU or MIG
# slice): without a printed total, its memory is unknown and no KV or verdict is judged.
PARTITION_WORDS = ("vGPU", "MIG ", "slice of")


def _named(table: dict[str, T], text: str | None) -> T | None:
    """The entry of ``table`` whose checkpoint name the point's model field starts with."""
    return next((v for name, v in table.items() if (text or "").startswith(name)), None)


def _model_id(text: str | None) -> str | None:
    """The first org/name in the point's model field that the catalog knows."""
    quantized = _named(QUANTIZED_STAND_INS, text)
    if quantized is not None:
        return quantized[0]
    stand_in = _named(SAME_ARCHITECTURE, text)
    if stand_in is not None:
        return stand_in
    for candidate in re.findall(r"[\w.-]+/[\w.-]+", text or ""):
        entry = catalog_entry(candidate)
        if entry is not None:
            return entry.model_id
    return None


def _gib(text: str | None) -> float | None:
    m = re.search(r"([\d.]+)\s*GiB", text or "")
    return float(m.group(1)) if m else None


def _named_gpu(point: dict[str, Any]) -> GpuSpec | None:
    """The catalog GPU the point's description names, if any."""
    named = None
    text = point.get("gpu_model") or ""
    # The whole name first, as the driver prints it ("NVIDIA RTX PRO 6000 Blackwell Server
    # Edition"), before any remark in brackets; then the product words within.
    tokens = [text.split(" (")[0].strip()] if text else []
    tokens += re.findall(r"\b(?:RTX \d{4}(?: Ada)?|[A-Z]\d{1,3}[A-Z]?(?:[- ]\w+)*)", text)
    # Then the bare product words ("L40S", "H100") when the longer runs name nothing.
    tokens += re.findall(r"\b[A-Z]+\d+[A-Z]*\b", text)
    for token in tokens:
        try:
            named = find_gpu(token)
            break
        except OominferError:
            continue
    if "Volta and Turing" in text:
        named = named or find_gpu("T4")
    return named


def _gpu(point: dict[str, Any]) -> GpuSpec | None:
    """The GPU as vLLM saw it: its printed CUDA total, with the named GPU's capability."""
    named = _named_gpu(point)
    text = point.get("gpu_model") or ""
    total = _gib(point.get("gpu_total_memory_printed"))
    if total is None and any(word in text for word in PARTITION_WORDS):
        return None
    if total is not None:
        cc = named.compute_capability if named else (8, 0)
        return GpuSpec(
            name=named.name if named else "printed",
            memory_bytes=int(total * GiB),
            cuda_total_bytes=int(total * GiB),
            compute_capability=cc,
            architecture=named.architecture if named else None,
            interconnect=named.interconnect if named else "pcie",
        )
    return named


def _version(point: dict[str, Any]) -> EngineVersion:
    text = point.get("vllm_version") or ""
    if not re.search(r"\d+\.\d+", text):
        quote = point.get("quote") or ""
        text = "0.11 (V1)" if any(m in quote for m in V1_MARKERS) else "0.6 (V0)"
    released = re.search(r"v(\d+\.\d+)", text)
    if text.startswith("0.1.dev") and released:
        # A main-branch build ("0.1.dev8168+g475c1a0 (... between v0.10.0 and v0.10.1)").
        text = f"{released.group(1)} ({text})"
    return EngineVersion.parse(text)


def _dtype(text: str | None) -> str:
    text = (text or "auto").lower()
    for name in ("bfloat16", "float16"):
        if text.startswith(name):
            return name
    return "auto"


def _quoted_flag(point: dict[str, Any], name: str) -> str | None:
    """The single-quoted value of a command-line flag in the point's quote, or None."""
    m = re.search(re.escape(name) + r"\s+'([^']*)'", point.get("quote") or "")
    return m.group(1) if m else None


def _args_dict(point: dict[str, Any], name: str) -> str | None:
    """A dict-valued setting of the log's "non-default args" line ({'method': 'mtp', ...}),
    as JSON, or None."""
    m = re.search(rf"'{name}': (\{{[^{{}}]*\}})", point.get("quote") or "")
    if m is None:
        return None
    try:
        return json.dumps(ast.literal_eval(m.group(1)))
    except (ValueError, SyntaxError):
        return None


def _in_flight_fp8(point: dict[str, Any]) -> Literal["fp8"] | None:
    """ "fp8" where the log's flags ask vLLM for FP8 weights (``--quantization fp8``: in flight
    on a 16-bit checkpoint, the checkpoint's own on an FP8 one), else None (the checkpoint's
    format, or a stand-in's)."""
    quote = point.get("quote") or ""
    asked = re.search(r"'quantization': 'fp8'|--quantization[ =]fp8\b", quote)
    return "fp8" if asked else None


def inputs(
    point: dict[str, Any],
) -> tuple[ModelSpec, Hardware, EngineSettings, EngineVersion] | None:
    """What the estimator is given for a point: its model, GPU, flags and vLLM release
    (None when the catalog lacks the model)."""
    inline = point.get("config_json")
    model_id = _model_id(point.get("model_id")) if inline is None else point["model_id"]
    if model_id is None:
        return None
    tp = point.get("tensor_parallel_size") or 1
    settings = EngineSettings(
        dtype=_dtype(point.get("dtype")),  # type: ignore[arg-type]
        gpu_memory_utilization=point.get("gpu_memory_utilization")
        or _version(point).default_gpu_memory_utilization,
        max_model_len=point.get("max_model_len") or point.get("max_concurrency_tokens_per_request"),
        max_num_seqs=point.get("max_num_seqs"),
        max_num_batched_tokens=point.get("max_num_batched_tokens"),
        enforce_eager=bool(point.get("enforce_eager")),
        tensor_parallel_size=tp,
        pipeline_parallel_size=point.get("pipeline_parallel_size") or 1,
        enable_expert_parallel=bool(
            re.search(
                r"--enable-expert-parallel|'enable_expert_parallel': True", point.get("quote") or ""
            )
        ),
        speculative_config=_quoted_flag(point, "--speculative-config")
        or _args_dict(point, "speculative_config"),
        enable_prefix_caching=point.get("enable_prefix_caching"),
        kv_cache_dtype=_kv_dtype(point.get("kv_cache_dtype")),  # type: ignore[arg-type]
        cpu_offload_gb=point.get("cpu_offload_gb") or 0,
        quantization=_in_flight_fp8(point),
    )
    gpu = _gpu(point)
    # A partition of a named GPU (no total printed) stands in as that GPU; one the point does
    # not name as an 80 GB A100 on PCIe (no NVLink is assumed) with no architecture: nothing
    # the A100 alone does (memory/profile.py sm80_graph_excess) is taken for it.
    pp = point.get("pipeline_parallel_size") or 1
    unnamed = dataclasses.replace(find_gpu("A100-PCIE-80GB"), architecture=None)
    gpu = gpu or _named_gpu(point) or unnamed
    if NO_PEER_LINK.search(point.get("quote") or ""):
        gpu = dataclasses.replace(gpu, interconnect="pcie")
    hw = Hardware(
        gpu=gpu,
        count=max(tp * pp, point.get("num_gpus") or 1),
    )
    # A gathered log may carry its checkpoint's verbatim config.json (with "config_source"):
    # the model is read from it, its parameters counted from the shapes.
    spec = (
        load_spec(model_id)
        if inline is None
        else spec_from_config(inline, model_id=model_id, source=point.get("config_source", ""))
    )
    changes = _named(CONFIG_DIFFERENCES, point.get("model_id"))
    if changes:
        spec = dataclasses.replace(spec, **changes)  # type: ignore[arg-type]
    quantized = _named(QUANTIZED_STAND_INS, point.get("model_id"))
    if quantized is not None:
        spec = dataclasses.replace(spec, quantization=quantized[1], checkpoint=Checkpoint())
    rope = _args_dict(point, "rope_scaling")
    if rope is not None:  # --rope-scaling, as vLLM then took it: an override of config.json
        overrides = json.dumps({"rope_scaling": json.loads(rope)})
        spec = with_overrides(spec, overrides, _version(point))
    return spec, hw, settings, _version(point)


def _kv_dtype(text: str | None) -> str:
    """The log's --kv-cache-dtype ("fp8 (fp8_e4m3, scale 1.0)" -> "fp8_e4m3"), else auto."""
    for name in ("fp8_e4m3", "fp8_e5m2", "fp8", "bfloat16", "float16"):
        if name in (text or ""):
            return name
    return "auto"


def _as_printed(est: dict[str, Any], version: EngineVersion) -> float:
    """The estimated activation peak as vLLM prints it, in GiB: where graph memory is reserved
    before the KV cache, the printed peak holds that reserve (v1/worker/gpu_worker.py:
    peak_activation_memory = transient_peak_headroom + cudagraph_memory_estimate_applied)."""
    reserve = est["cuda_graph_gib"] if version.graphs_in_budget else 0.0
    return float(est["activation_peak_gib"]) + reserve


def judged(point: dict[str, Any]) -> bool:
    """Whether the point's fits / does-not-fit can be judged: its context is known, or it is a
    start-up failure at the model's own default context (no --max-model-len given)."""
    context = point.get("max_model_len") or point.get("max_concurrency_tokens_per_request")
    return bool(context or point.get("error"))


def replay(point: dict[str, Any]) -> dict[str, Any]:
    """Estimate one point; returns the comparisons it supports (None where it has no data)."""
    row: dict[str, Any] = {"id": point["id"], "model": point.get("model_id")}
    given = inputs(point)
    if given is None:
        row["skip"] = "model not in the catalog"
        return row
    spec, hw, settings, version = given
    model_id = spec.model_id
    gpu = _gpu(point)
    try:
        b = estimate(spec, hardware=hw, settings=settings, version=version)
    except OominferError as err:  # a draft model the catalog lacks, a refused flag
        row["skip"] = f"estimate refused: {err}"
        return row
    row.update(model=model_id, version=".".join(map(str, version.release)), v1=version.v1)

    measured_w = measured_weights_gib(point)
    if measured_w:
        row["weights_err"] = b.loaded_bytes / (measured_w * GiB) - 1

    tokens = point.get("kv_cache_tokens")
    if tokens is None and point.get("gpu_blocks") is not None:
        tokens = point["gpu_blocks"] * (point.get("block_size") or 16)
    kv_gib = point.get("kv_cache_gib")
    overridden = "num-gpu-blocks-override" in (point.get("quote") or "")
    # A hybrid's "GPU KV cache size" is num_blocks // groups x block_size (v1/core/
    # kv_cache_utils.py), a quarter of what Qwen3-Next's attention layers hold: its bytes per
    # printed token are not the bytes one token adds.
    hybrid = bool(spec.state_layers)
    # Newer releases print int(concurrency x max_model_len) (v1/core/kv_cache_utils.py
    # ``get_kv_cache_capacity``), not whole blocks: with sliding-window layers, which hold a
    # window a request, that is more tokens than the bytes one token adds would give.
    windowed = bool(spec.sliding_layers and tokens) and tokens % 16 != 0
    if (
        gpu is not None
        and kv_gib is not None
        and kv_gib > 0
        and tokens
        and not overridden
        and not hybrid
        and not windowed
    ):
        # (--num-gpu-blocks-override sets the token count whatever the KV bytes are.)
        # vLLM rounds the GiB it prints to 0.01: the per-token bytes are exact when the
        # estimate lies within that rounding.
        measured = kv_gib * GiB / tokens
        row["kv_per_token_err"] = b.kv_bytes_per_token / measured - 1
        row["kv_per_token_exact"] = abs(b.kv_bytes_per_token * tokens - kv_gib * GiB) <= (
            0.005 * GiB + 16 * b.kv_bytes_per_token
        )
    if gpu is not None:
        measured_kv = kv_gib * GiB if kv_gib is not None else None
        if measured_kv is None and tokens and point.get("kv_cache_tokens"):
            measured_kv = tokens * b.kv_bytes_per_token
        if measured_kv:
            row["kv_bytes_err"] = b.kv_cache_bytes / measured_kv - 1
        if judged(point) and (point.get("error") or measured_kv):
            row["verdict_ok"] = b.fits == (point.get("error") is None)
            row["fits"] = b.fits
    row["est"] = {
        # As "Model loading took" counts it: with a draft's weights and LoRA slots.
        "weights_gib": b.loaded_bytes / GiB,
        "kv_cache_gib": b.kv_cache_bytes / GiB,
        "cuda_graph_gib": b.cuda_graph_bytes / GiB,
        "non_torch_gib": b.non_torch_bytes / GiB,
        "activation_peak_gib": b.activation_bytes / GiB,
        "fits": b.fits,
    }
    compared = dict(row["est"], activation_peak_gib=_as_printed(row["est"], version))
    for part in ("cuda_graph_gib", "non_torch_gib", "activation_peak_gib"):
        if point.get(part) is not None and (part != "cuda_graph_gib" or not settings.enforce_eager):
            row[part.replace("_gib", "_err_gib")] = compared[part] - point[part]
    return row


def _pct(x: float | None) -> str:
    return "" if x is None else f"{x * 100:+.1f}%"


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of a replay: median |error| of the weights (every point) and of the
    KV-cache bytes (V1 points, and all), the per-token exactness and the verdicts."""
    weights = [abs(r["weights_err"]) for r in rows if "weights_err" in r]
    kv_v1 = [abs(r["kv_bytes_err"]) for r in rows if "kv_bytes_err" in r and r.get("v1")]
    kv_all = [abs(r["kv_bytes_err"]) for r in rows if "kv_bytes_err" in r]
    peaks = [abs(r["activation_peak_err_gib"]) for r in rows if "activation_peak_err_gib" in r]
    return {
        "weights_median": _median(weights),
        "weights_points": len(weights),
        "kv_per_token_exact": [r["kv_per_token_exact"] for r in rows if "kv_per_token_exact" in r],
        "kv_v1_median": _median(kv_v1),
        "kv_v1_points": len(kv_v1),
        "kv_all_median": _median(kv_all),
        "kv_all_points": len(kv_all),
        "verdicts": [r["verdict_ok"] for r in rows if "verdict_ok" in r],
        "activation_median_gib": _median(peaks),
    }


HELD_OUT_RELEASES: Final = ((0, 10), (0, 21))
"""The releases of the issue's held-out logs (vLLM 0.10-0.21): ``in_held_out_range``."""


def in_held_out_range(rows: list[dict[str, Any]]) -> str:
    """One line of figures over the replayed logs of the held-out set's releases, whichever
    file they come from: medians of weights, KV-cache bytes and graph memory, and verdicts."""
    low, high = HELD_OUT_RELEASES
    picked = [
        r for r in rows
        if "version" in r and low <= tuple(map(int, r["version"].split(".")[:2])) <= high
    ]  # fmt: skip
    weights = [abs(r["weights_err"]) for r in picked if "weights_err" in r]
    kv = [abs(r["kv_bytes_err"]) for r in picked if "kv_bytes_err" in r]
    graphs = [abs(r["cuda_graph_err_gib"]) for r in picked if "cuda_graph_err_gib" in r]
    verdicts = [r["verdict_ok"] for r in picked if "verdict_ok" in r]
    return (
        f"vLLM 0.10-0.21, all files: weights {_median(weights) * 100:.2f}% over {len(weights)}, "
        f"KV cache {_median(kv) * 100:.2f}% over {len(kv)}, CUDA graphs "
        f"{_median(graphs):.2f} GiB over {len(graphs)}, verdicts right on "
        f"{sum(verdicts)}/{len(verdicts)}"
    )


def _median(values: list[float]) -> float:
    """The median, 0 for no values (a small set that prints no such part)."""
    return statistics.median(values) if values else 0.0


PREVIOUS = ROOT / "bench" / "calibration_18ec457.json"
"""Each point's estimate by the memory model of commit 18ec457 (before issue 16), made once
with ``PYTHONPATH=<git archive 18ec457 oominfer> python bench/calibration.py --predictions``:
the comparison stays fixed while the model moves."""

# (part, field of the log, relative error or GiB)
PARTS: tuple[tuple[str, str, bool], ...] = (
    ("weights", "weights_gib", True),
    ("KV cache", "kv_cache_gib", True),
    ("KV cache, V1", "kv_cache_gib", True),
    ("CUDA graphs", "cuda_graph_gib", False),
    ("non-torch", "non_torch_gib", False),
    ("activation peak", "activation_peak_gib", False),
)


def measured_weights_gib(point: dict[str, Any]) -> float | None:
    """The weights the log printed, in GiB."""
    measured = point.get("weights_gib") or point.get("weights_loading_GB")
    if measured is None and point.get("weights_loading_MB"):
        measured = point["weights_loading_MB"] / 1024
    return float(measured) if measured else None


def part_errors(
    points: list[dict[str, Any]], estimates: dict[str, dict[str, Any]]
) -> dict[str, list[float]]:
    """|error| of each part over the points that print it and have an estimate: relative for
    weights and KV cache (KV only where vLLM sized it, i.e. a known GPU), GiB otherwise."""
    out: dict[str, list[float]] = {part: [] for part, _, _ in PARTS}
    out["verdict wrong"] = []
    for point in points:
        est = estimates.get(point["id"])
        if est is None:
            continue
        for part, key, relative in PARTS:
            measured = measured_weights_gib(point) if key == "weights_gib" else point.get(key)
            if measured is None or (relative and measured <= 0):
                continue
            if key == "kv_cache_gib" and _gpu(point) is None:
                continue
            if part.endswith("V1") and not _version(point).v1:
                continue
            if key == "cuda_graph_gib" and point.get("enforce_eager"):
                continue
            estimated = est[key]
            if key == "activation_peak_gib":
                estimated = _as_printed(est, _version(point))
            error = estimated - measured
            out[part].append(abs(error / measured) if relative else abs(error))
        known = judged(point) and _gpu(point) is not None
        if known and (point.get("error") or point.get("kv_cache_gib")):
            out["verdict wrong"].append(float(est["fits"] != (point.get("error") is None)))
    return out


def comparison(points: list[dict[str, Any]], rows: list[dict[str, Any]]) -> str:
    """Median and worst |error| of each part, this model beside 18ec457's."""
    now = part_errors(points, {r["id"]: r["est"] for r in rows if "est" in r})
    before = part_errors(points, json.loads(PREVIOUS.read_text()))
    lines = [
        f"{'part':<16} {'unit':<5} {'n':>3}  {'median':>7} {'worst':>7}   18ec457: "
        f"{'n':>3} {'median':>7} {'worst':>7}"
    ]
    for part, _, relative in (*PARTS, ("verdict wrong", "", False)):
        unit = "%" if relative else ("count" if part == "verdict wrong" else "GiB")

        def cells(values: list[float], unit: str = unit, relative: bool = relative) -> str:
            if not values:
                return f"{0:>3} {'':>7} {'':>7}"
            if unit == "count":
                return f"{len(values):>3} {int(sum(values)):>7} {'':>7}"
            k = 100 if relative else 1
            return f"{len(values):>3} {statistics.median(values) * k:>7.2f} {max(values) * k:>7.2f}"

        lines.append(f"{part:<16} {unit:<5} {cells(now[part])}   18ec457: {cells(before[part])}")
    return "\n".join(lines)


def load_points(path: Path) -> list[dict[str, Any]]:
    """The points of a calibration log file, one JSON object a line."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def report(path: Path, points: list[dict[str, Any]], rows: list[dict[str, Any]]) -> bool:
    """Print one set's table and summary from its ``points`` and their replayed ``rows``;
    whether it meets the bars."""
    print(f"# {path.name}: {len(rows)} logs")
    print(
        f"{'id':<5} {'ver':<5} {'model':<46} {'weights':>8} {'KV/tok':>8} {'KV bytes':>9} verdict"
    )
    for r in rows:
        if "skip" in r:
            print(f"{r['id']:<5} {'':<5} {str(r['model'])[:46]:<46} skipped: {r['skip']}")
            continue
        verdict = {True: "ok", False: "WRONG", None: ""}[r.get("verdict_ok")]
        print(
            f"{r['id']:<5} {r['version']:<5} {r['model'][:46]:<46} {_pct(r.get('weights_err')):>8} "
            f"{_pct(r.get('kv_per_token_err')):>8} {_pct(r.get('kv_bytes_err')):>9} {verdict}"
        )
    print()
    print(comparison(points, rows))
    s = summary(rows)
    exact, verdicts = s["kv_per_token_exact"], s["verdicts"]
    print()
    print(
        f"weights:        median |error| {s['weights_median'] * 100:.2f}% over "
        f"{s['weights_points']} points (bar <= 1%)"
    )
    print(
        f"KV per token:   exact within vLLM's printed rounding on {sum(exact)}/{len(exact)} points"
    )
    print(
        f"KV-cache bytes: median |error| {s['kv_v1_median'] * 100:.1f}% over {s['kv_v1_points']} "
        f"V1 points (bar <= 2%); {s['kv_all_median'] * 100:.1f}% over all {s['kv_all_points']}"
    )
    print(f"verdict:        right on {sum(verdicts)}/{len(verdicts)} points that have the inputs")
    ok = s["weights_median"] <= 0.01 and all(exact) and s["kv_v1_median"] <= 0.02 and all(verdicts)
    print("ALL BARS MET" if ok else "SOME BARS MISSED")
    print()
    return ok


def main() -> int:
    """Replay the points and print the tables and the summaries."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--logs", type=Path, action="append",
        help="a JSON Lines set of logs (repeatable; default: the shared calibration logs, "
        "then tests/data/calibration/extra_gpu_logs.jsonl)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--predictions",
        action="store_true",
        help="print only each point's estimated parts, as PREVIOUS holds them",
    )
    args = parser.parse_args()
    paths = args.logs or [DEFAULT_LOGS, EXTRA_LOGS]
    if args.predictions or args.json:
        rows = [replay(p) for path in paths for p in load_points(path)]
        if args.predictions:
            print(json.dumps({r["id"]: r["est"] for r in rows if "est" in r}, indent=1))
        else:
            print(json.dumps(rows, indent=2))
        return 0
    sets = {path: load_points(path) for path in paths}
    replayed = {path: [replay(p) for p in points] for path, points in sets.items()}
    results = [report(path, sets[path], rows) for path, rows in replayed.items()]
    print(in_held_out_range([r for rows in replayed.values() for r in rows]))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
