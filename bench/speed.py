"""Replay the published serving measurements of throughput_points.jsonl through the speed
model: per point predicted vs measured output tokens/s, TPOT and TTFT, then the median and
worst error of each, beside the same figures of the previous model (PREVIOUS).

    python bench/speed.py [--points PATH] [--json | --predictions]

Each point's own facts go in (model, GPU, count, TP, weight format, lengths, concurrency or
request rate); the speed model's one set of constants (oominfer/speed/roofline.py) does the
rest. What a source did not state is filled from the tables below, the same for every point
that shares the gap: the lengths of a named dataset, and a catalog model standing in for a
checkpoint the catalog lacks (same architecture). A point whose model or GPU cannot be
placed is listed as skipped, with why.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Final

from oominfer.base.errors import OominferError
from oominfer.hardware.gpu import GpuSpec, find_gpu
from oominfer.hardware.hardware import Hardware
from oominfer.memory.estimate import estimate
from oominfer.model.catalog import catalog_entry
from oominfer.model.load import load_spec
from oominfer.model.spec import Checkpoint, QuantSpec
from oominfer.rules.versions import CURRENT_VLLM
from oominfer.settings import EngineSettings
from oominfer.speed import Performance, Workload, predict
from oominfer.speed.performance import predict_burst

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_POINTS = ROOT.parent / "shared" / "calibration" / "throughput_points.jsonl"
EXTRA_POINTS = ROOT / "tests" / "data" / "calibration" / "extra_throughput_points.jsonl"
"""Published measurements gathered here beside the shared set (gpustack's performance lab,
Qwen's speed benchmark, vLLM issues; each with its source): replayed the same way, reported
apart."""

# Mean prompt and output tokens of the datasets the sources name without stating lengths.
# ShareGPT: benchmark_serving's sample of 1000 prompts holds 215,196 prompt tokens (t12's
# own log) and about 200 output tokens a request (vLLM's published runs). Short chat regimes
# and MT-Bench: about 200 prompt tokens, and the point's stated output cap or ~128/256.
DATASET_LENGTHS: Final[dict[str, tuple[int, int]]] = {
    "sharegpt": (215, 200),
    "chatbot-short": (200, 128),
    "synthetic chat": (200, 128),
    "mt_bench": (100, 256),
    "mt-bench": (100, 256),
    "random": (1024, 128),
}
# A checkpoint the catalog lacks -> (a catalog model of the same architecture, the weight
# format to load it in: the checkpoint's own).
STAND_INS: Final[dict[str, tuple[str, str | None]]] = {
    "Qwen/Qwen2.5-7B-Instruct-AWQ": ("Qwen/Qwen2.5-7B-Instruct", "awq"),
    "neuralmagic/Llama-3.2-11B-Vision-Instruct-FP8-dynamic": (
        "meta-llama/Llama-3.2-11B-Vision",
        "fp8",
    ),
    "meta-llama/Meta-Llama-3-70B": ("meta-llama/Llama-3.1-70B", None),
    "Llama-3.3-70B-Instruct (FP8": ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", None),
    "meta-llama/Llama-3.3-70B-Instruct (NIM": ("RedHatAI/Llama-3.3-70B-Instruct-FP8-dynamic", None),
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8": (
        "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
        "fp8",
    ),
    "mistralai/Mixtral-8x7B": ("mistralai/Mixtral-8x7B-v0.1", None),
    "deepseek-ai/DeepSeek-R1-0528": ("deepseek-ai/DeepSeek-R1", None),
    "DeepSeek-R1-0528-AWQ": ("deepseek-ai/DeepSeek-R1", "awq"),
    # Same architecture and weight format as a catalog checkpoint: the 2507 FP8 refresh, the
    # Qwen3-Next Instruct beside its Thinking twin, a Japanese fine-tune of phi-4 (14B).
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": ("Qwen/Qwen3-235B-A22B-FP8", None),
    "Qwen/Qwen3-235B-A22B-Instruct-2507": ("Qwen/Qwen3-235B-A22B", None),
    "Qwen/Qwen3-Next-80B-A3B-Instruct": ("Qwen/Qwen3-Next-80B-A3B-Thinking", None),
    "shisa-ai/shisa-v2-unphi4-14b": ("microsoft/phi-4", None),
    # Qwen2 checkpoints with the same shapes as their Qwen2.5 successors, and a base model
    # beside its instruct twin.
    "Qwen/Qwen2-7B-Instruct": ("Qwen/Qwen2.5-7B-Instruct", None),
    "Qwen/Qwen2-72B": ("Qwen/Qwen2.5-72B-Instruct", None),
    "Qwen/Qwen2.5-32B": ("Qwen/Qwen2.5-32B-Instruct", None),
    # Qwen's own 4-bit checkpoints of catalog models (group 128).
    "Qwen/Qwen3-8B-AWQ": ("Qwen/Qwen3-8B", "awq"),
    "Qwen/Qwen3-14B-AWQ": ("Qwen/Qwen3-14B", "awq"),
    "Qwen/Qwen3-32B-AWQ": ("Qwen/Qwen3-32B", "awq"),
    # Qwen's block-FP8 checkpoint of a catalog model: 8-bit weights (W8A16 Marlin on an A100).
    "Qwen/Qwen3-14B-FP8": ("Qwen/Qwen3-14B", "fp8"),
    "Qwen/Qwen2.5-14B-Instruct-AWQ": ("Qwen/Qwen2.5-14B-Instruct", "awq"),
    "Qwen/Qwen2.5-14B-Instruct-GPTQ-Int4": ("Qwen/Qwen2.5-14B-Instruct", "gptq"),
    "Qwen/Qwen2.5-72B-Instruct-AWQ": ("Qwen/Qwen2.5-72B-Instruct", "awq"),
}
# vLLM's benchmark_serving sends every prompt at once when no rate is given; the scheduler
# then runs max_num_seqs of them (the default: 256 on these GPUs).
OFFLINE_PROMPTS: Final = 1000


def _model(point: dict[str, Any]) -> tuple[str, str | None] | None:
    text = point.get("model_id") or ""
    for prefix, (stand_in, fmt) in STAND_INS.items():
        if text.startswith(prefix):
            return stand_in, fmt
    for candidate in re.findall(r"[\w.-]+/[\w.-]+", text):
        entry = catalog_entry(candidate)
        if entry is not None:
            return entry.model_id, None
    return None


def _gpu(text: str) -> GpuSpec | None:
    """The GPU a source names: 'A100 80GB PCIe', 'H100 SXM 80GB (HBM3)', 'B200 (HGX)'."""
    t = text.upper()
    if re.search(r"\bGB10\b", t):
        return find_gpu("GB10")
    if "RTX PRO 6000" in t:
        return find_gpu("RTX-PRO-6000-Blackwell" + ("-Server" if "SERVER" in t else ""))
    if "RTX A6000" in t:
        return find_gpu("RTX-A6000")
    m = re.search(r"\b([ABHL]\d{1,3}S?G?|RTX \d{4})\b", t)
    if m is None:
        return None
    name = m.group(1)
    size = re.search(r"(\d{2,3})\s*GB", t)
    form = "PCIE" if "PCIE" in t else "NVL" if re.search(r"\bNVL\b", t) else "SXM"
    for attempt in (
        f"{name}-{form}-{size.group(1)}GB" if size else None,
        f"{name}-{size.group(1)}GB" if size else None,
        f"{name}-NVL" if form == "NVL" else None,
        f"{name}-{form}-80GB" if name in ("A100", "H100") else None,
        f"{name}-SXM-141GB" if name == "H200" else None,
        name,
    ):
        if attempt is None:
            continue
        try:
            return find_gpu(attempt)
        except OominferError:
            continue
    return None


def _stated(point: dict[str, Any], flag: str, short: str | None = None) -> str | None:
    """The value of a vLLM flag (or its ``short`` form: ``pp`` for -pp) the point's source
    states for its deployment (in its quote, or its notes where the source's own manifest
    gives it): "" for a switch, None if absent."""
    name = rf"(?:--{flag}|(?<![\w-])-{short})" if short else f"--{flag}"
    for text in (point.get("quote") or "", point.get("notes") or ""):
        m = re.search(rf"{name}(?![\w-])(?:[= ](\d+))?", text)
        if m:
            return m.group(1) or ""
    return None


def _int(value: Any) -> int | None:
    m = re.search(r"\d+", str(value)) if value is not None else None
    return int(m.group()) if m else None


def _lengths(point: dict[str, Any]) -> tuple[int, int, str]:
    """Prompt and output tokens: the point's own; else what its own figures imply (output
    tokens/s over requests/s is the mean output; total minus output tokens/s over
    requests/s the mean prompt); else its dataset's (said so)."""
    stated_in, stated_out = _int(point.get("input_len")), _int(point.get("output_len"))
    out_s, total_s, rps = (
        point.get("output_tokens_per_s"), point.get("total_tokens_per_s"),
        point.get("requests_per_s"),
    )  # fmt: skip
    if not (stated_in and stated_out) and out_s and rps:
        implied_out = round(out_s / rps)
        implied_in = round((total_s - out_s) / rps) if total_s else None
        stated_out = stated_out or implied_out
        stated_in = stated_in or implied_in
        if stated_in and stated_out:
            return stated_in, stated_out, "implied by its tokens/s and requests/s"
    dataset = (point.get("dataset") or "").lower()
    fill = next((v for k, v in DATASET_LENGTHS.items() if k in dataset), (200, 128))
    if stated_out and not stated_in:
        return fill[0], stated_out, f"output implied by tokens/s over requests/s, prompt {fill[0]}"
    how = "stated" if stated_in and stated_out else f"dataset default {fill}"
    return stated_in or fill[0], stated_out or fill[1], how


def _spread(point: dict[str, Any], how: str) -> bool:
    """Whether a burst's output lengths vary: a chat dataset's (ShareGPT: its stated lengths
    are means) or lengths the source does not state; a random dataset's are fixed."""
    dataset = (point.get("dataset") or "").lower()
    return how != "stated" or "sharegpt" in dataset


def _measured(point: dict[str, Any], output_len: int) -> dict[str, float | None]:
    tok_s = point.get("output_tokens_per_s")
    rps = point.get("requests_per_s")
    total_s = point.get("total_tokens_per_s")
    stated_in, stated_out = point.get("input_len"), point.get("output_len")
    if tok_s is None and rps is not None:
        tok_s = rps * output_len
    elif tok_s is None and total_s and stated_in and stated_out:
        # Only the total (prompt and output tokens over the run): the output's share of it
        # is the stated mean output over the stated mean request.
        tok_s = total_s * stated_out / (stated_in + stated_out)
    tpot_ms = point.get("tpot_ms_mean") or point.get("tpot_ms_median") or point.get("itl_ms_mean")
    ttft_ms = point.get("ttft_ms_mean") or point.get("ttft_ms_median")
    return {
        "output_tokens_per_s": tok_s,
        "tpot_s": tpot_ms / 1000 if tpot_ms else None,
        "ttft_s": ttft_ms / 1000 if ttft_ms else None,
    }


def _rate(point: dict[str, Any]) -> float | None:
    """Requests per second sent, math.inf for 'all at once', None for a fixed concurrency."""
    raw = point.get("request_rate")
    if point.get("concurrency"):
        return None
    if raw is None or str(raw).startswith(("inf", "offline")):
        return math.inf
    return float(raw)


def at_rate(perf_at: Any, rate: float, cap: int, requests: int) -> Performance | None:
    """An open loop of ``requests`` requests sent at ``rate`` a second, as benchmark_serving
    reports it: tokens over the run's duration, from the first request sent to the last
    answered.

    The steady state is the smallest concurrency whose closed loop serves the rate (Little's
    law), or the cap when the rate is more than the plan serves (the queue then grows). The
    run then serves min(rate, capacity) requests a second while they arrive ((n - 1) / rate
    on average), and ends with the last request's own latency (TTFT + its output tokens'
    TPOT): with a few hundred prompts that drain is a good part of the duration."""
    steady = None
    for c in range(1, cap + 1):
        perf = perf_at(c)
        if perf is None:
            break
        steady = perf
        if perf.requests_per_s >= rate or perf.concurrency < c:
            break
    if steady is None:
        return None
    served = min(rate, steady.requests_per_s)
    latency = steady.ttft_s + (steady.output_len - 1) * steady.tpot_s
    per_s = requests / ((requests - 1) / served + latency)
    return dataclasses.replace(
        steady, requests_per_s=per_s, output_tokens_per_s=per_s * steady.output_len
    )


def replay(point: dict[str, Any]) -> dict[str, Any]:
    """One point through the speed model: predicted and measured, or why it was skipped."""
    # Secondary: another engine, or a run its source reports as an anomaly (said in notes).
    flagged = "ANOMALY" in (point.get("notes") or "")
    row: dict[str, Any] = {
        "id": point["id"],
        "secondary": "vLLM" not in point["engine"] or flagged,
    }
    model = _model(point)
    gpu = _gpu(point.get("gpu") or "")
    if model is None or gpu is None:
        return {**row, "skip": "model not in the catalog" if model is None else "GPU unknown"}
    spec = load_spec(model[0])
    if model[1] in ("awq", "gptq") and (
        spec.quantization is None or spec.quantization.method != model[1]
    ):
        # The 4-bit checkpoint of this architecture (in place of the stand-in's own format,
        # DeepSeek-R1's FP8): group-wise int4 (AWQ/GPTQ defaults).
        fmt = QuantSpec(method=model[1], bits=4, group_size=128)
        spec = dataclasses.replace(spec, quantization=fmt, checkpoint=Checkpoint())
    count = point.get("num_gpus") or 1
    tp = point.get("tensor_parallel_size") or count
    pp = (
        point.get("pipeline_parallel_size")
        or _int(_stated(point, "pipeline-parallel-size", short="pp"))
        or 1
    )
    input_len, output_len, how = _lengths(point)
    quant = model[1] if model[1] not in ("awq", "gptq") else None
    if "--quantization awq" in (point.get("quantization") or ""):
        quant = "awq"  # named on the command line: vLLM's older AWQ kernel, not Marlin
    stated_len = _int(_stated(point, "max-model-len"))
    settings = EngineSettings(
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        quantization=quant,  # type: ignore[arg-type]
        kv_cache_dtype="fp8" if (point.get("kv_cache_dtype") or "").startswith("fp8") else "auto",
        max_model_len=point.get("max_model_len")
        or stated_len
        or min(max(4096, input_len + output_len), spec.max_position_embeddings),
        max_num_seqs=point.get("max_num_seqs") or _int(_stated(point, "max-num-seqs")),
        enforce_eager=_stated(point, "enforce-eager") is not None,
    )
    try:
        b = estimate(
            spec,
            hardware=Hardware(gpu=gpu, count=tp * pp),
            settings=settings,
            version=CURRENT_VLLM,
        )
    except OominferError as err:
        return {**row, "skip": f"estimate refused: {err}"}

    def perf_at(c: int) -> Performance | None:
        w = Workload(input_len=input_len, output_len=output_len, concurrency=c)
        return predict(spec, gpu=gpu, settings=settings, breakdown=b, workload=w)

    rate = _rate(point)
    prompts = _int(point.get("num_prompts")) or OFFLINE_PROMPTS
    if rate is None:
        perf = perf_at(int(point["concurrency"]))
    elif math.isinf(rate):
        perf = predict_burst(spec, gpu=gpu, settings=settings, breakdown=b, requests=prompts,
                             input_len=input_len, output_len=output_len,
                             spread=_spread(point, how))  # fmt: skip
    else:
        perf = at_rate(perf_at, rate, b.max_num_seqs, prompts)
    if perf is None:
        return {**row, "skip": "nothing to predict (does not fit or no GPU figures)"}
    measured = _measured(point, output_len)
    predicted = {
        "output_tokens_per_s": perf.output_tokens_per_s,
        "tpot_s": perf.tpot_s,
        "ttft_s": perf.ttft_s,
    }
    if measured["tpot_s"] is None and perf.concurrency == 1 and measured["output_tokens_per_s"]:
        # A single stream's tokens/s is 1 / (time per token, prefill spread over it).
        measured["tpot_s"] = 1 / measured["output_tokens_per_s"]
        predicted["tpot_s"] = output_len / (perf.ttft_s + (output_len - 1) * perf.tpot_s)
        predicted["tpot_s"] = 1 / predicted["tpot_s"]
    errors = _errors(predicted, measured)
    return {
        **row,
        "model": model[0] + (f" ({model[1]})" if model[1] else ""),
        "gpu": f"{gpu.name} x{tp * pp}" + (f" (PP {pp})" if pp > 1 else ""),
        "lengths": f"{input_len}/{output_len} ({how})",
        "concurrency": perf.concurrency,
        "bound": perf.bound,
        "predicted": predicted,
        "measured": measured,
        "errors": errors,
    }


PREVIOUS: Final = ROOT / "bench" / "speed_97d33aa.json"
"""Each point's prediction by the speed model of commit 97d33aa (the stop before the KV cache
of a burst filled and preempted), made once with --predictions from a ``git archive 97d33aa
oominfer`` copy on PYTHONPATH: the summaries print it beside today's."""


def _errors(predicted: dict[str, Any], measured: dict[str, Any]) -> dict[str, float]:
    """Each figure's relative error, predicted / measured - 1, where both are given."""
    return {
        k: predicted[k] / v - 1
        for k, v in measured.items()
        if v is not None and v > 0 and predicted.get(k) is not None
    }


def previous_errors(rows: list[dict[str, Any]], path: Path = PREVIOUS) -> list[dict[str, Any]]:
    """``rows`` with each point's errors as the previous model predicted it (the measured
    figures are the same); points it did not predict are left out."""
    if not path.exists():
        return []
    before = json.loads(path.read_text())
    out = []
    for r in rows:
        p = before.get(r["id"])
        if p is None or "errors" not in r:
            continue
        out.append({**r, "predicted": p, "errors": _errors(p, r["measured"])})
    return out


def summary(rows: list[dict[str, Any]], *, secondary: bool = False) -> dict[str, Any]:
    """Median and worst |error| of each figure over the vLLM points (or all points)."""
    out: dict[str, Any] = {}
    for key in ("output_tokens_per_s", "tpot_s", "ttft_s"):
        errs = [
            r["errors"][key]
            for r in rows
            if "errors" in r and key in r["errors"] and (secondary or not r["secondary"])
        ]
        if not errs:
            continue
        # Worst as a factor: 0.5x and 2x are equally far off.
        factors = [max(1 + e, 1 / (1 + e)) for e in errs]
        out[key] = {
            "points": len(errs),
            "median_abs_error": statistics.median(abs(e) for e in errs),
            "worst_factor": max(factors),
        }
    return out


def load_points(path: Path) -> list[dict[str, Any]]:
    """The points of a throughput_points.jsonl file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _cell(value: float | None, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:,.1f}"


def main() -> int:
    """Print the table and the summary of each set of points (or --json)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--points", type=Path, action="append",
        help="a JSON Lines set of measurements (repeatable; default: the shared set, then "
        "tests/data/calibration/extra_throughput_points.jsonl)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--predictions",
        action="store_true",
        help="print only each point's predicted figures, as PREVIOUS holds them",
    )
    args = parser.parse_args()
    paths = args.points or [DEFAULT_POINTS, EXTRA_POINTS]
    if args.predictions:
        rows = [replay(p) for path in paths for p in load_points(path)]
        print(json.dumps({r["id"]: r["predicted"] for r in rows if "predicted" in r}, indent=1))
        return 0
    if args.json:
        rows = [replay(p) for path in paths for p in load_points(path)]
        print(json.dumps({"rows": rows, "summary": summary(rows)}, indent=2))
        return 0
    for path in paths:
        print(f"# {path.name}")
        report([replay(p) for p in load_points(path)])
        print()
    return 0


def report(rows: list[dict[str, Any]]) -> None:
    """The table of one set of points and its summaries."""
    print(f"{'id':4} {'tok/s pred/meas':>20} {'TPOT ms pred/meas':>20} {'TTFT ms pred/meas':>22}"
          "  bound   conc  model, GPU, lengths")  # fmt: skip
    for r in rows:
        if "skip" in r:
            print(f"{r['id']:4} skipped: {r['skip']}")
            continue
        p, m = r["predicted"], r["measured"]
        cells = [
            f"{_cell(p['output_tokens_per_s'])}/{_cell(m['output_tokens_per_s'])}",
            f"{_cell(p['tpot_s'], 1000)}/{_cell(m['tpot_s'], 1000)}",
            f"{_cell(p['ttft_s'], 1000)}/{_cell(m['ttft_s'], 1000)}",
        ]
        mark = " (secondary: not vLLM, or flagged an anomaly)" if r["secondary"] else ""
        print(f"{r['id']:4} {cells[0]:>20} {cells[1]:>20} {cells[2]:>22}  {r['bound']:7} "
              f"{r['concurrency']:5}  {r['model']}, {r['gpu']}, {r['lengths']}{mark}")  # fmt: skip
    before = previous_errors(rows)
    for label, secondary in (("vLLM points (not flagged)", False), ("all points", True)):
        print(f"\n{label}:")
        was = summary(before, secondary=secondary)
        for key, v in summary(rows, secondary=secondary).items():
            line = (f"  {key:20} {v['points']:3} points  median |error| "
                    f"{v['median_abs_error']:5.1%}  worst {v['worst_factor']:5.2f}x")  # fmt: skip
            if key in was:
                w, name = was[key], PREVIOUS.stem.removeprefix("speed_")
                line += (f"   {name}: {w['points']:3} points {w['median_abs_error']:5.1%}  "
                         f"worst {w['worst_factor']:5.2f}x")  # fmt: skip
            print(line)


if __name__ == "__main__":
    sys.exit(main())
