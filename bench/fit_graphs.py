"""Fit the CUDA-graph memory constants of oominfer/memory/profile.py on the calibration logs.

    PYTHONPATH=. python bench/fit_graphs.py [--logs PATH]

Every log with a "Graph capturing finished ... took X GiB" line whose model the catalog
holds (bench/calibration.py ``inputs``) is one equation:

    X = layers x (piecewise x PER_GRAPH[era] + full x FULL
                  + (piecewise + full) x NCCL [TP > 2 on PCIe-only GPUs]
                  + piecewise x SM80_EARLY_V1 | full x SM80_FULL [A100, unquantized, CUDA 12])

    era: V0 (whole-model graphs), EARLY_V1 (0.8-0.9), PIECEWISE (0.10+)

with the graph counts of ``rules.attention.graph_counts`` for the log's release and
flags. Least squares (non-negative: a graph cannot give memory back) over those rows; prints
the constants in KiB and each log's residual. Logs whose figure is not the graph pool alone
(a GPU shared with other engines, unified memory: see their notes) are listed and left out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from calibration import DEFAULT_LOGS, EXTRA_LOGS, inputs, load_points

from oominfer.base.units import GiB, KiB
from oominfer.memory.estimate import estimate
from oominfer.memory.profile import graph_era, pcie_only, sm80_graph_excess
from oominfer.memory.weights import weight_format
from oominfer.rules.attention import graph_counts, max_capture_size, pinned_capture_size

# Logs whose "took" line measures more than the graph pool, by their own notes: c16 ran
# four engines at once beside a foreign process (the free-memory delta counts theirs).
# dp54 captures LoRA's Punica buffers with the graphs. n13 prints a negative figure (-0.76
# GiB): more was freed during capture (a multimodal model, whose profiling run's buffers
# go then) than the pool took. c10, a vGPU slice of an A100 whose pool had looked three
# times too large, is in: the A100's own term explains it, as it does dp37 and g16-02.
NOT_THE_POOL_ALONE = {
    "c16": "four engines and a foreign process on the GPU (and the GPU not named)",
    "dp54": "LoRA buffers captured too",
    "n13": "a negative figure: the multimodal profiling's buffers freed during capture",
    "g19-12": "a negative figure (-0.41 GiB, vLLM 0.11.2's free-memory delta)",
    "g18-08": "a negative figure (-0.26 GiB, vLLM 0.12.0's free-memory delta)",
    "g18-11": "a negative figure (-0.22 GiB, vLLM 0.12.0's free-memory delta)",
    "g18-07": "a GB10: unified memory, whose free-memory readings move with the host's too",
    "g18-14": "a GB10: unified memory, whose free-memory readings move with the host's too",
    "x09": "a GB10: unified memory, whose free-memory readings move with the host's too",
    "x13": "a GB10: unified memory, whose free-memory readings move with the host's too",
}
# Logs of a release the model gives no constant of its own: vLLM 0.8.4's V1 runner (one
# machine's three logs, two RTX 3090s) held 2.9-4.3x what the 0.9 logs of the early-V1
# constant hold per layer and graph; fitted in, they would move that constant off every 0.9
# log (c08 0.51 GiB -> 1.44, c11 0.37 -> 1.24) for a release before the range it serves.
OTHER_RELEASE = {
    log: "vLLM 0.8.4: 2.9-4.3x the 0.9 runner's pool per layer and graph (one machine)"
    for log in ("g19-09", "g19-10", "g19-11")
}
NAMES = ("PIECEWISE", "FULL", "NCCL", "EARLY_V1", "V0", "SM80_EARLY_V1", "SM80_FULL")


def nnls(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Least squares with the negative coefficients dropped, one at a time, and refitted."""
    keep = list(range(a.shape[1]))
    while True:
        coef = np.zeros(a.shape[1])
        coef[keep] = np.linalg.lstsq(a[:, keep], y, rcond=None)[0]
        negative = [i for i in keep if coef[i] < 0]
        if not negative:
            return coef
        keep.remove(min(negative, key=lambda i: coef[i]))


def least_absolute(a: np.ndarray, y: np.ndarray, rounds: int = 50) -> np.ndarray:
    """Least absolute residuals (what a median error judges; one log far off pulls it no
    more than one a little off), non-negative: iteratively reweighted ``nnls``, each row
    weighted by 1 / its residual (floored at 10 MiB)."""
    coef = nnls(a, y)
    for _ in range(rounds):
        w = 1 / np.sqrt(np.maximum(np.abs(a @ coef - y), 10 * 2**20))
        coef = nnls(a * w[:, None], y * w)
    return coef


def rows(path: Path) -> list[tuple[str, list[float], float]]:
    """(id, features, measured bytes) for each usable log."""
    out = []
    for point in load_points(path):
        if point.get("cuda_graph_gib") is None or point.get("enforce_eager"):
            continue
        if point["id"] in NOT_THE_POOL_ALONE or point["id"] in OTHER_RELEASE:
            continue
        given = inputs(point)
        if given is None:
            continue
        spec, hw, settings, version = given
        if spec.state_layers:  # recurrent layers in FULL graphs: a term set by hand
            continue
        b = estimate(spec, hardware=hw, settings=settings, version=version)
        piecewise, full = graph_counts(
            version,
            b.max_num_seqs,
            b.max_num_batched_tokens,
            largest=max_capture_size(hw.gpu, spec),
            pinned=pinned_capture_size(spec),
        )
        layers = spec.num_layers // settings.pipeline_parallel_size
        nccl = settings.tensor_parallel_size > 2 and pcie_only(hw.gpu)
        era = graph_era(version)
        quantized = weight_format(spec, settings.quantization) is not None
        sm80 = sm80_graph_excess(hw.gpu, version, quantized=quantized)
        features = [
            layers * piecewise if era == "PIECEWISE" else 0,
            layers * full,
            layers * (piecewise + full) if nccl else 0,
            layers * piecewise if era == "EARLY_V1" else 0,
            layers * piecewise if era == "V0" else 0,
            layers * piecewise if sm80 == "EARLY_V1" else 0,
            layers * full if sm80 == "FULL" else 0,
        ]
        out.append((point["id"], [float(f) for f in features], point["cuda_graph_gib"] * GiB))
    return out


def main() -> int:
    """Fit and print the constants and residuals."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--logs", type=Path, action="append",
        help="a JSON Lines set of logs (repeatable; default: the shared calibration logs and "
        "tests/data/calibration/extra_gpu_logs.jsonl)",
    )  # fmt: skip
    args = parser.parse_args()
    data = [row for path in args.logs or [DEFAULT_LOGS, EXTRA_LOGS] for row in rows(path)]
    a = np.array([f for _, f, _ in data])
    y = np.array([m for _, _, m in data])
    coef = least_absolute(a, y)
    for name, c in zip(NAMES, coef, strict=True):
        print(f"GRAPH_BYTES_PER_LAYER_{name}: {c / KiB:.0f} KiB")
    residuals = a @ coef - y
    for (pid, _, measured), r in zip(data, residuals, strict=True):
        print(f"{pid:<5} measured {measured / GiB:5.2f} GiB  fitted {(measured + r) / GiB:5.2f}")
    print(f"{len(data)} logs; median |residual| {np.median(np.abs(residuals)) / GiB:.2f} GiB")
    left_out = {**NOT_THE_POOL_ALONE, **OTHER_RELEASE}
    print("left out:", ", ".join(f"{k} ({v})" for k, v in left_out.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
