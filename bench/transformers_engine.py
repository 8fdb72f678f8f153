#!/usr/bin/env python3
"""oominfer's transformers-engine model against what the engine did on real GPUs.

Reads tests/data/calibration/device_transformers.jsonl (written by
bench/device_transformers.py on the lent H100 and H200) and prints, per measurement,
predicted / measured: the weights, the prefill peak, the KV cache and non-torch memory;
each decode step (runner), each prompt's prefill (runner) and each burst through the engine's
scheduler (mean TTFT, mean TPOT, output tokens/s); then the median and worst error of each.

    PYTHONPATH=. python3 bench/transformers_engine.py [--data FILE] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.estimate import estimate
from oominfer.memory.transformers import transformers_seq_kv_bytes
from oominfer.model.load import load_spec
from oominfer.rules.versions import CURRENT_VLLM
from oominfer.settings import EngineSettings
from oominfer.speed import transformers as tf
from oominfer.speed.performance import chip, stage

DATA = Path(__file__).resolve().parents[1] / "tests/data/calibration/device_transformers.jsonl"


@dataclass(frozen=True, slots=True)
class Ratio:
    """One measurement: what it is, predicted and measured."""

    id: str
    part: str
    predicted: float
    measured: float

    @property
    def ratio(self) -> float:
        return self.predicted / self.measured


def _breakdown(row: dict[str, Any], *, max_len: int, seqs: int) -> MemoryBreakdown:
    settings = EngineSettings(dtype="bfloat16", max_model_len=max_len, max_num_seqs=seqs)
    return estimate(
        load_spec(row["model"]),
        hardware=Hardware.from_gpu(row["gpu"]),
        settings=settings,
        engine="transformers",
        version=CURRENT_VLLM,
    )


def ratios(rows: list[dict[str, Any]]) -> list[Ratio]:
    """Every measurement of every model row, predicted beside measured."""
    out: list[Ratio] = []
    for row in rows:
        if row["kind"] != "model":
            continue
        name = f"run{row['run']}-{row['gpu']}-{row['model'].split('/')[-1]}"
        spec = load_spec(row["model"])
        gpu = Hardware.from_gpu(row["gpu"]).gpu
        b = _breakdown(row, max_len=32768, seqs=1)
        settings = EngineSettings(dtype="bfloat16", max_model_len=32768, max_num_seqs=32)
        c = chip(gpu, settings, spec)
        s = stage(spec, settings, b)
        assert c is not None
        tc = tf.transformers_chip(c, gpu)
        out.append(Ratio(name, "weights", b.weights_bytes, row["weights_bytes"]))
        if row.get("fresh_process"):
            out.append(Ratio(name, "non_torch", b.non_torch_bytes, row["non_torch_bytes"]))
        for p in row["prefill"]:
            n = p["tokens"]
            at = _breakdown(row, max_len=n, seqs=1)
            out.append(
                Ratio(f"{name}-{n}", "activation", at.activation_bytes, p["activation_bytes"])
            )
            kv = transformers_seq_kv_bytes(spec, length=n, per_token=at.kv_bytes_per_token)
            out.append(Ratio(f"{name}-{n}", "kv_cache", kv, p["kv_bytes"]))
            predicted = tf.prefill_seconds(spec, s, tc, tokens=n)
            out.append(Ratio(f"{name}-{n}", "prefill_s", predicted, p["seconds"]))
        for d in row["decode"]:
            step = tf.decode_step(spec, s, tc, running=d["batch"], context=d["context"])
            predicted = step.seconds
            out.append(
                Ratio(f"{name}-{d['batch']}x{d['context']}", "step_s", predicted, d["step_s"])
            )
        for e in row.get("engine", []):
            t = tf.burst(
                spec, gpu=gpu, stage=s, chip=c, requests=e["requests"], input_len=e["input_len"],
                output_len=e["output_len"], max_prefill_tokens=1 << 30,  # the bench's: unbounded
            )  # fmt: skip
            eid = f"{name}-burst{e['requests']}"
            out.append(Ratio(eid, "ttft_s", t.ttft_s, e["mean_ttft_s"]))
            out.append(Ratio(eid, "tpot_s", t.tpot_s, e["mean_tpot_s"]))
            tps = t.requests_per_s * e["output_len"]
            out.append(Ratio(eid, "output_tokens_per_s", tps, e["output_tokens_per_s"]))
    return out


def summary(rs: list[Ratio]) -> dict[str, dict[str, float]]:
    """Per part: points, median |error| and worst factor either way."""
    parts: dict[str, list[float]] = {}
    for r in rs:
        parts.setdefault(r.part, []).append(r.ratio)
    return {
        part: {
            "points": len(v),
            "median_error": statistics.median(abs(x - 1) for x in v),
            "worst_factor": max(max(x, 1 / x) for x in v),
        }
        for part, v in parts.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [json.loads(line) for line in args.data.read_text().splitlines() if line.strip()]
    rs = ratios(rows)
    if args.json:
        json.dump({"points": [r.__dict__ | {"ratio": r.ratio} for r in rs],
                   "summary": summary(rs)}, sys.stdout, indent=1)  # fmt: skip
        return 0
    for r in rs:
        print(f"{r.id:48s} {r.part:20s} {r.predicted:14.4g} {r.measured:14.4g} {r.ratio:6.2f}")
    print()
    for part, s in summary(rs).items():
        print(f"{part:20s} {s['points']:3d} points  median {s['median_error']:6.1%}  "
              f"worst {s['worst_factor']:.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
