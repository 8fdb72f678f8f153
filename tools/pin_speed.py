"""Re-pin tests/test_speed.py's points to what the speed model predicts now.

    python tools/pin_speed.py [--check]

Each point of TODAY (the shared measurements) and TODAY_EXTRA (the gathered ones) is pinned
to its predicted/measured ratios of output tokens/s and TPOT. After a deliberate change to
the speed model, run this to rewrite the pinned ratios in place (each ``"id": {...}`` line;
comments and order are kept), then read the diff: it is the change's effect, point by point.
``--check`` rewrites nothing and lists the points that moved past the tests' drift (their
DRIFT, read from the test file).
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

import speed  # noqa: E402  (bench/speed.py)

TESTS = ROOT / "tests" / "test_speed.py"
FILES = (
    ROOT / "tests" / "data" / "calibration" / "throughput_points.jsonl",
    speed.EXTRA_POINTS,
)
KEYS = ("output_tokens_per_s", "tpot_s")
LINE = re.compile(r'^(\s*)"([\w-]+)": \{(.*)\},$')


def ratios() -> dict[str, dict[str, float]]:
    """Every point's predicted/measured ratios, by id."""
    out: dict[str, dict[str, float]] = {}
    for path in FILES:
        for point in speed.load_points(path):
            row = speed.replay(point)
            errors = row.get("errors", {})
            out[row["id"]] = {k: round(1 + errors[k], 3) for k in KEYS if k in errors}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="list the moves, rewrite nothing")
    args = parser.parse_args()
    now = ratios()
    lines = TESTS.read_text(encoding="utf-8").splitlines(keepends=True)
    share = float(re.search(r"^DRIFT = ([\d.]+)$", "".join(lines), re.M).group(1))  # type: ignore[union-attr]
    drift = math.log(1 + share)
    moved = 0
    for i, line in enumerate(lines):
        m = LINE.match(line.rstrip("\n"))
        if not m or m.group(2) not in now:
            continue
        pinned = dict(re.findall(r'"(\w+)": ([\d.]+)', m.group(3)))
        new = now[m.group(2)]
        for key, value in pinned.items():
            if key in new and abs(math.log(new[key] / float(value))) > drift:
                moved += 1
                print(f"{m.group(2)} {key}: {value} -> {new[key]}")
        body = ", ".join(f'"{k}": {v}' for k, v in new.items())
        lines[i] = f'{m.group(1)}"{m.group(2)}": {{{body}}},\n'
    if not args.check:
        TESTS.write_text("".join(lines), encoding="utf-8")
    print(f"{moved} pinned ratio(s) moved past the drift of {share:.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
