#!/usr/bin/env python3
"""Measure oominfer's transformers engine on a real GPU: memory parts and speed, plus NVML.

Runs the engine's own ``ModelRunner`` (engines/transformers/runner.py: sdpa, inference_mode,
``logits_to_keep=1``, a ``DynamicCache``) over real-size architectures from the built-in
catalog, with random bf16 weights made on the GPU (nothing is downloaded). For each model
it records, one JSON line each:

- ``weights_bytes``: ``torch.cuda.memory_allocated()`` once the model is on the GPU;
- ``prefill``: for single prompts of several lengths (the engine prefills one sequence at a
  time), the time to the first token's logits, the peak allocated above the weights and the
  cache, and the cache's bytes (KV bytes per token);
- ``decode``: the time of one decode step for batches at a context, greedy (argmax);
- ``non_torch_bytes``: what NVML sees the GPU use beyond the caching allocator's reservation
  (the CUDA context, cuBLAS/cuDNN handles).

The first line is what ``oominfer.hardware.nvml.detect_gpus`` found next to what torch sees.
``tests/test_device_transformers.py`` holds oominfer's predictions to these figures.

Usage (on the GPU machine, from the repository root)::

    PYTHONPATH=. python3 bench/device_transformers.py --out results.jsonl [MODEL ...]
    PYTHONPATH=. python3 bench/device_transformers.py --engine --out r.jsonl MODEL  # + bursts
    PYTHONPATH=. python3 bench/device_transformers.py --tiny --device cpu   # a smoke run

The lent machines have torch, transformers, click and nvidia-ml-py but not the engine's HTTP
front (fastapi, pydantic, starlette, uvicorn), which importing the engine's package needs:
carry their wheels (``pip download --no-deps --only-binary=:all: --python-version 3.12
--platform manylinux_2_17_x86_64 -d .whl fastapi starlette pydantic pydantic_core
typing-inspection annotated-types uvicorn typing_extensions``) and install them with
``--target``. Runs of 2026-11-27: 1 (H200, 10 models, one process, ~140 s), 2 (H100, 4 models,
a process each, with ``--engine``, ~310 s), 3 (H200, held out, ~190 s); of 2026-11-28: 4 and 5
(H200, held out, 5 and 3 models, a process each, with ``--engine``, ~330 s and ~190 s).
Append new runs to tests/data/calibration/device_transformers.jsonl with their ``run`` and
``gpu`` (and ``fresh_process`` where each model had its own process).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from typing import Any

DEFAULT_MODELS = (
    "meta-llama/Llama-3.1-8B",
    "Qwen/Qwen3-8B",
    "google/gemma-2b-it",
    "meta-llama/Llama-3.2-3B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "mistralai/Mistral-Nemo-Instruct-2407",
    "Qwen/Qwen3-14B",
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-32B",
    "microsoft/phi-4",
)
PREFILL_LENS = (512, 2048, 8192, 32768)
DECODE_POINTS = ((1, 1024), (8, 1024), (32, 1024), (1, 8192))
ENGINE_RUNS = ((1, 512, 128), (8, 512, 128), (32, 512, 128))
WARM_STEPS, TIMED_STEPS = 3, 24
GiB = 1 << 30


def _nvml_used() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:
        return None


def nvml_facts(torch: Any) -> dict[str, Any]:
    """oominfer's NVML detection beside torch's own view of GPU 0."""
    from oominfer.hardware.nvml import detect_gpus

    found = detect_gpus()
    facts: dict[str, Any] = {"kind": "nvml", "detected": []}
    for g in found:
        facts["detected"].append(
            {
                "name": g.name,
                "marketing_name": g.marketing_name,
                "memory_bytes": g.memory_bytes,
                "cuda_total_bytes": g.cuda_total_bytes,
                "free_bytes": g.free_bytes,
                "compute_capability": list(g.compute_capability),
                "memory_bandwidth_gbps": g.memory_bandwidth_gbps,
                "tflops_16bit": g.tflops_16bit,
            }
        )
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info(0)
        facts["torch"] = {
            "name": props.name,
            "total_memory": int(props.total_memory),
            "mem_get_info_total": int(total),
            "mem_get_info_free": int(free),
            "multiprocessors": props.multi_processor_count,
            "capability": [props.major, props.minor],
        }
    return facts


def _sync(torch: Any, device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _build(model_id: str, torch: Any, device: str, tiny: bool) -> Any:
    import transformers

    from oominfer.model.catalog import catalog_entry

    entry = catalog_entry(model_id)
    if entry is None:
        raise SystemExit(f"{model_id}: not in the catalog")
    raw = {k: v for k, v in entry.config.items() if k != "quantization_config"}
    if tiny:
        raw.update(
            num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, vocab_size=512, moe_intermediate_size=32,
            num_experts=4, num_experts_per_tok=2,
        )  # fmt: skip
    model_type = raw.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **raw)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(
            config, dtype=torch.bfloat16, attn_implementation="sdpa"
        )
    return model.eval()


class _Tokenizer:
    """No vocabulary: one character per token, so the scheduler's text grows as it should."""

    pad_token_id = 0
    eos_token_id = None

    def decode(self, ids: list[int], **_: Any) -> str:
        return "a" * len(ids)


def engine_run(runner: Any, n: int, input_len: int, output_len: int, prompt: Any) -> dict:
    """A burst of ``n`` requests through the engine's own scheduler (continuous batching,
    greedy, ``ignore_eos``): time to each first token and to each last one."""
    import threading

    from oominfer.engines.transformers.metrics import Metrics
    from oominfer.engines.transformers.scheduler import Scheduler
    from oominfer.engines.transformers.sequence import FinishEvent, Seq, TokenEvent

    sched = Scheduler(runner, max_num_seqs=n, max_queue=10 * n, metrics=Metrics())
    sched.start()
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    done = threading.Event()

    def emitter(i: int) -> Any:
        def emit(event: Any) -> None:
            now = time.perf_counter()
            if isinstance(event, TokenEvent):
                first.setdefault(i, now)
            elif isinstance(event, FinishEvent):
                last[i] = now
                if len(last) == n:
                    done.set()
            else:
                last[i] = now
                done.set()

        return emit

    seqs = [
        Seq(prompt=prompt(input_len), max_tokens=output_len, temperature=0.0,
            ignore_eos=True, emit=emitter(i))
        for i in range(n)
    ]  # fmt: skip
    passes = runner.forward_passes
    t0 = time.perf_counter()
    for seq in seqs:
        sched.submit(seq)
    done.wait(timeout=600)
    sched.close()
    ttft = sorted(first[i] - t0 for i in first)
    tpot = [(last[i] - first[i]) / max(output_len - 1, 1) for i in first if i in last]
    elapsed = max(last.values()) - t0 if last else None
    return {
        "requests": n,
        "input_len": input_len,
        "output_len": output_len,
        "finished": len(last),
        "forward_passes": runner.forward_passes - passes,
        "mean_ttft_s": round(sum(ttft) / len(ttft), 5) if ttft else None,
        "mean_tpot_s": round(sum(tpot) / len(tpot), 6) if tpot else None,
        "elapsed_s": round(elapsed, 4) if elapsed else None,
        "output_tokens_per_s": round(n * output_len / elapsed, 2) if elapsed else None,
    }


def measure(
    model_id: str, torch: Any, device: str, tiny: bool, base_used: int | None, engine_runs: bool
) -> dict:
    from oominfer.engines.transformers.kv import Batch, cache_bytes
    from oominfer.engines.transformers.runner import ModelRunner

    cuda = device == "cuda"
    t0 = time.perf_counter()
    model = _build(model_id, torch, device, tiny)
    _sync(torch, device)
    row: dict[str, Any] = {"kind": "model", "model": model_id, "dtype": "bfloat16"}
    row["build_s"] = round(time.perf_counter() - t0, 2)
    row["weights_bytes"] = torch.cuda.memory_allocated() if cuda else None
    row["footprint_bytes"] = int(model.get_memory_footprint())
    runner = ModelRunner(model, _Tokenizer(), device=device)
    vocab = runner.vocab_size
    max_pos = int(getattr(model.config, "max_position_embeddings", 4096) or 4096)
    gen = torch.Generator().manual_seed(0)

    def prompt(n: int) -> list[int]:
        return torch.randint(1, vocab, (n,), generator=gen).tolist()

    runner.prefill([prompt(256)])  # warm-up: kernels picked, cuBLAS handles made
    _sync(torch, device)
    row["prefill"] = []
    for n in PREFILL_LENS if not tiny else (64, 256):
        if n > max_pos:
            continue
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        p = prompt(n)
        _sync(torch, device)
        t = time.perf_counter()
        cache, mask, logits = runner.prefill([p])
        _sync(torch, device)
        elapsed = time.perf_counter() - t
        kv = cache_bytes(Batch(cache=cache, mask=mask, last=logits, seqs=[]))
        point = {"tokens": n, "seconds": round(elapsed, 5), "kv_bytes": kv}
        if cuda:
            point["peak_above_weights"] = torch.cuda.max_memory_allocated() - before
            point["activation_bytes"] = point["peak_above_weights"] - kv
        row["prefill"].append(point)
        del cache, mask, logits
    if cuda:
        gc.collect()
        torch.cuda.empty_cache()
        used = _nvml_used()
        if used is not None and base_used is not None:
            row["non_torch_bytes"] = used - base_used - torch.cuda.memory_reserved()
    row["decode"] = []
    for batch_size, context in DECODE_POINTS if not tiny else ((1, 64), (4, 64)):
        if context > max_pos:
            continue
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
        cache, mask, logits = runner.prefill([prompt(context) for _ in range(batch_size)])
        batch = Batch(cache=cache, mask=mask, last=logits.argmax(-1), seqs=[])
        for _ in range(WARM_STEPS):
            batch.last = runner.decode(batch).argmax(-1)
        _sync(torch, device)
        t = time.perf_counter()
        for _ in range(TIMED_STEPS):
            batch.last = runner.decode(batch).argmax(-1)
        _sync(torch, device)
        step = (time.perf_counter() - t) / TIMED_STEPS
        row["decode"].append({"batch": batch_size, "context": context, "step_s": round(step, 6)})
        del batch, cache, mask, logits
    row["engine"] = [
        engine_run(runner, n, input_len, output_len, prompt)
        for n, input_len, output_len in (ENGINE_RUNS if engine_runs else ())
    ]
    del runner, model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    row["total_s"] = round(time.perf_counter() - t0, 1)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    parser.add_argument("--out", default="-")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--tiny", action="store_true", help="2-layer stand-ins (a smoke run)")
    parser.add_argument("--engine", action="store_true", help="also bursts through the scheduler")
    parser.add_argument("--budget-s", type=float, default=1e9, help="stop starting models after")
    args = parser.parse_args()
    base_used = _nvml_used()
    import torch
    import transformers

    out = sys.stdout if args.out == "-" else open(args.out, "a", encoding="utf-8")  # noqa: SIM115

    def emit(row: dict) -> None:
        out.write(json.dumps(row) + "\n")
        out.flush()

    start = time.perf_counter()
    head: dict[str, Any] = {
        "kind": "host",
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cpu": platform.processor() or platform.machine(),
        "nvml_used_before_torch": base_used,
    }
    if args.device == "cuda":
        torch.zeros(1, device="cuda")
        head["nvml_used_after_init"] = _nvml_used()
        emit(nvml_facts(torch))
    emit(head)
    for model_id in args.models:
        if time.perf_counter() - start > args.budget_s:
            emit({"kind": "skipped", "model": model_id, "why": "budget"})
            continue
        try:
            emit(measure(model_id, torch, args.device, args.tiny, base_used, args.engine))
        except Exception as err:  # one model's failure must not lose the others
            emit({"kind": "error", "model": model_id, "error": f"{type(err).__name__}: {err}"})
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
