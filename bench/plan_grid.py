"""The planner's regression grid: every catalog model x 7 hardware setups x 4 ``--prefer``
values, planned offline, one JSON line each (the settings, replicas and concurrency, or the
error). Run it before and after a change and diff the two files: a plan that moves must move
for a reason.

    python bench/plan_grid.py > after.jsonl    # and at the old commit: > before.jsonl
    python bench/plan_grid.py --compare before.jsonl after.jsonl

Only the public API is used (``oominfer.plan``), with the release named, so that any commit
and any installed vLLM give comparable lines.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import Any

import oominfer
from oominfer.model.catalog import catalog_ids

HARDWARE = (("T4", 1), ("A10G", 1), ("L4", 1), ("A100-80GB", 1), ("H100", 1), ("H100", 2),
            ("H100", 8))  # fmt: skip
PREFER = ("balanced", "context", "throughput", "quality")
RELEASE = "0.33.0"


def line(model: str, gpu: str, count: int, prefer: str) -> dict[str, Any]:
    """One plan of the grid, as comparable data."""
    key = {"model": model, "gpu": gpu, "count": count, "prefer": prefer}
    try:
        constraints = oominfer.Constraints(prefer=prefer, engine_version=RELEASE)  # type: ignore[arg-type]
        plan = oominfer.plan(model, oominfer.Hardware.from_gpu(gpu, count), constraints)
    except Exception as err:
        return {**key, "error": type(err).__name__, "message": str(err)}
    return {
        **key,
        "engine": plan.engine,
        "settings": dataclasses.asdict(plan.settings),
        "replicas": plan.replicas,
    }


def compare(before: str, after: str) -> int:
    """Print the lines that differ; the count of them."""

    def load(path: str) -> dict[tuple[str, ...], dict[str, Any]]:
        with open(path, encoding="utf-8") as f:
            rows = [json.loads(text) for text in f]
        return {(r["model"], r["gpu"], str(r["count"]), r["prefer"]): r for r in rows}

    old, new = load(before), load(after)
    moved = [k for k in old if old[k] != new.get(k)]
    for k in moved:
        print(" ".join(k))
        print("  before:", json.dumps(old[k], sort_keys=True))
        print("  after: ", json.dumps(new.get(k), sort_keys=True))
    print(f"{len(moved)} of {len(old)} plans differ")
    return len(moved)


def main() -> None:
    """Print the grid, or compare two."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
        return
    start, n = time.perf_counter(), 0
    for model in catalog_ids():
        for gpu, count in HARDWARE:
            for prefer in PREFER:
                print(json.dumps(line(model, gpu, count, prefer), sort_keys=True))
                n += 1
    elapsed = time.perf_counter() - start
    print(f"{n} plans in {elapsed:.1f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
