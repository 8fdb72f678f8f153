#!/usr/bin/env python3
"""Regenerate deploy/k8s: example plans built from the estimator, and their manifests.

Each example is a Plan made from ``oominfer.estimate`` (offline, from the built-in
catalog), written as ``plan.json`` and rendered with the code ``oominfer k8s`` runs. The
plans are unverified (``verification: null``): no engine ran them here. tests/test_k8s.py
regenerates everything into a temporary folder and fails when the committed files drift.

Usage: python tools/make_k8s_examples.py [--root DIR]   (default: the repo's deploy/k8s)
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

from oominfer.estimate import Hardware, MemoryBreakdown, estimate, weights_bytes
from oominfer.gpus import find_gpu
from oominfer.k8s import K8sOptions, manifest_files
from oominfer.k8s_cli import write_manifests
from oominfer.models import load_spec
from oominfer.plan import Lever, Plan
from oominfer.report import breakdown_json
from oominfer.settings import VllmSettings
from oominfer.spec import ModelSpec

ROOT = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
ENGINE_VERSION = "0.32.0"


@dataclass(frozen=True, kw_only=True)
class Example:
    """One example: where it goes, the model and hardware, the settings, the options."""

    folder: str
    model_id: str
    gpu: str
    gpus: int
    settings: VllmSettings
    baseline: VllmSettings
    """The settings before the levers, to record what each saved."""
    options: K8sOptions = field(default_factory=K8sOptions)


EXAMPLES = (
    Example(
        folder="base",
        model_id="Qwen/Qwen2.5-1.5B-Instruct",
        gpu="L4",
        gpus=1,
        settings=VllmSettings(dtype="bfloat16"),
        baseline=VllmSettings(dtype="bfloat16"),
    ),
    Example(
        folder="examples/llama-3.1-8b-l4",
        model_id="meta-llama/Llama-3.1-8B-Instruct",
        gpu="L4",
        gpus=1,
        settings=VllmSettings(dtype="bfloat16", quantization="fp8_per_tensor", max_model_len=32768),
        baseline=VllmSettings(dtype="bfloat16"),
        options=K8sOptions(namespace="llm", keda=True, service_monitor=True, max_replicas=4),
    ),
    Example(
        folder="examples/llama-3.3-70b-2xh100",
        model_id="meta-llama/Llama-3.3-70B-Instruct",
        gpu="H100",
        gpus=2,
        settings=VllmSettings(
            dtype="bfloat16", kv_cache_dtype="fp8", max_model_len=16384, tensor_parallel_size=2
        ),
        baseline=VllmSettings(dtype="bfloat16", tensor_parallel_size=2),
        options=K8sOptions(namespace="llm", pdb=True, service_monitor=True),
    ),
    Example(
        folder="examples/llama-3.1-405b-2x8xh100",
        model_id="meta-llama/Llama-3.1-405B-Instruct",
        gpu="H100",
        gpus=16,
        settings=VllmSettings(
            dtype="bfloat16",
            quantization="fp8_per_tensor",
            tensor_parallel_size=8,
            pipeline_parallel_size=2,
        ),
        baseline=VllmSettings(dtype="bfloat16", tensor_parallel_size=8, pipeline_parallel_size=2),
        options=K8sOptions(namespace="llm", pdb=True),
    ),
)


def _levers(spec: ModelSpec, example: Example, before: MemoryBreakdown) -> tuple[Lever, ...]:
    """The settings that differ from the baseline, each with what it saved on one GPU."""
    s, b0 = example.settings, example.baseline
    levers: list[Lever] = []
    if s.quantization != b0.quantization:
        levers.append(
            Lever(
                name="quantization",
                value=s.quantization,
                reason="16-bit weights leave too little of the GPU for the KV cache",
                saved_bytes=before.weights_bytes - _estimate(spec, example).weights_bytes,
                cost="FP8 weights: a small loss of accuracy",
            )
        )
    if s.kv_cache_dtype != b0.kv_cache_dtype:
        levers.append(
            Lever(
                name="kv_cache_dtype",
                value=s.kv_cache_dtype,
                reason="halves the KV cache per token, doubling the context that fits",
                saved_bytes=before.kv_bytes_per_token // 2 * (s.max_model_len or 0),
                cost="FP8 KV cache: a small loss of accuracy on long contexts",
            )
        )
    if s.max_model_len != b0.max_model_len and s.max_model_len is not None:
        levers.append(
            Lever(
                name="max_model_len",
                value=s.max_model_len,
                reason=f"{before.max_model_len:,} tokens of context do not fit the KV cache",
                saved_bytes=before.kv_bytes_per_token * (before.max_model_len - s.max_model_len),
                cost=f"requests longer than {s.max_model_len:,} tokens are refused",
            )
        )
    return tuple(levers)


def _hardware(example: Example) -> Hardware:
    return Hardware(gpu=find_gpu(example.gpu), count=example.gpus)


def _estimate(spec: ModelSpec, example: Example) -> MemoryBreakdown:
    return estimate(spec, hardware=_hardware(example), settings=example.settings)


def build_plan(example: Example) -> Plan:
    """The example's plan from the estimator; unverified (no engine ran it).

    Raises:
        SystemExit: the settings do not fit by the estimate (the example is wrong).
    """
    spec = load_spec(example.model_id)
    hardware = _hardware(example)
    b = _estimate(spec, example)
    if not b.fits:
        raise SystemExit(f"{example.folder}: {example.model_id} does not fit as configured.")
    before = estimate(spec, hardware=hardware, settings=example.baseline)
    gpu = hardware.gpu
    return Plan(
        model_id=spec.model_id,
        architecture={
            "architecture": spec.architecture,
            "model_type": spec.model_type,
            "num_layers": spec.num_layers,
            "hidden_size": spec.hidden_size,
            "num_attention_heads": spec.num_attention_heads,
            "num_kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim,
            "vocab_size": spec.vocab_size,
            "max_position_embeddings": spec.max_position_embeddings,
            "torch_dtype": spec.torch_dtype,
            "parameters": spec.checkpoint.float_params or spec.params.total,
            "checkpoint_bytes": weights_bytes(spec, dtype=b.dtype),
        },
        device="cuda",
        gpu={
            "name": gpu.name,
            "count": hardware.count,
            "memory_bytes": gpu.memory_bytes,
            "cuda_total_bytes": gpu.cuda_total_bytes,
            "compute_capability": list(gpu.compute_capability),
            "product_label": gpu.product_label,
        },
        engine="vllm",
        engine_version=ENGINE_VERSION,
        settings=example.settings,
        predicted=breakdown_json(spec, hardware, example.settings, b)["per_gpu"],
        levers=_levers(spec, example, before),
        verification=None,
    )


def write_examples(root: Path) -> list[Path]:
    """Write every example's plan.json and manifests under ``root``; the paths written."""
    written: list[Path] = []
    for example in EXAMPLES:
        plan = build_plan(example)
        folder = root / example.folder
        files = {"plan.json": plan.to_json(), **manifest_files(plan, example.options)}
        written += write_manifests(files, folder)
    return written


def main() -> None:
    """Regenerate deploy/k8s (or ``--root``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT)
    args = parser.parse_args()
    for path in write_examples(args.root):
        print(path)


if __name__ == "__main__":
    main()
