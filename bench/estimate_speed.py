"""Speed of the estimator: a cold `oominfer estimate` and configurations per second.

    python bench/estimate_speed.py

Targets (issue #2): a cold-start `oominfer estimate` of a catalog model under 0.5 s; the
pure estimator at least 10,000 configurations a second (the planner searches grids).
"""

from __future__ import annotations

import itertools
import statistics
import subprocess
import sys
import time

from oominfer.hardware.gpu import find_gpu
from oominfer.hardware.hardware import Hardware
from oominfer.memory.estimate import estimate
from oominfer.model.load import load_spec
from oominfer.rules.versions import LATEST_VLLM
from oominfer.settings import EngineSettings

MODEL = "meta-llama/Llama-3.1-8B-Instruct"


def cold_start_seconds(runs: int = 7) -> list[float]:
    """Wall time of a fresh interpreter running `oominfer estimate MODEL --json`."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "oominfer",
                "estimate",
                MODEL,
                "--gpu",
                "L4",
                "--max-model-len",
                "8192",
                "--json",
            ],
            check=True,
            capture_output=True,
        )
        times.append(time.perf_counter() - start)
    return times


def configs_per_second(seconds: float = 2.0) -> tuple[int, float]:
    """Estimates per second over a grid like the planner's."""
    spec = load_spec(MODEL)
    hw = Hardware(gpu=find_gpu("L4"), count=2)
    grid = itertools.cycle(
        EngineSettings(
            max_model_len=length,
            max_num_seqs=seqs,
            enforce_eager=eager,
            kv_cache_dtype=kv,
            tensor_parallel_size=tp,
        )
        for length in (4096, 8192, 16384, 32768, 65536, 131072)
        for seqs in (1, 16, 64, 256)
        for eager in (False, True)
        for kv in ("auto", "fp8")
        for tp in (1, 2)
    )
    n, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        for _ in range(200):
            estimate(spec, hardware=hw, settings=next(grid), version=LATEST_VLLM)
        n += 200
    return n, n / elapsed


def main() -> None:
    """Print both figures."""
    times = cold_start_seconds()
    print(
        f"cold `oominfer estimate {MODEL}`: median {statistics.median(times):.3f} s, "
        f"min {min(times):.3f} s over {len(times)} runs (target < 0.5 s)"
    )
    n, rate = configs_per_second()
    print(f"pure estimator: {rate:,.0f} configurations/s ({n:,} evaluated; target >= 10,000/s)")


if __name__ == "__main__":
    main()
