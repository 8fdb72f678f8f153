#!/usr/bin/env python3
"""Plans an operator would deploy: run every advice scenario and print the pass count.

Each scenario of ``scenarios.json`` (../shared/advice/, or the copy in tests/data/) runs as
``oominfer fit MODEL ARGS --no-verify --json`` in-process and passes when the outcome meets
its ``expect`` (or one entry of ``any_of``): the exit code, rules on the plan's settings, the
engine, and for a plan that does not fit, a way out named in the error.

Usage: python bench/advice.py [--scenarios FILE] [--engine-version X.Y ...]
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from oominfer.cli import main as cli

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared" / "advice" / "scenarios.json"
COPY = REPO / "tests" / "data" / "advice_scenarios.json"


@dataclass(frozen=True, slots=True)
class Outcome:
    """One scenario run: what came out and what failed."""

    id: str
    exit_code: int
    plan: dict[str, Any] | None
    error_text: str
    failures: tuple[str, ...]

    @property
    def passed(self) -> bool:
        """True when the outcome met the scenario's expectations."""
        return not self.failures


def load_scenarios(path: Path | None = None) -> list[dict[str, Any]]:
    """The scenarios: ``path``, else the shared file, else the copy kept with the tests."""
    source = path or (SHARED if SHARED.is_file() else COPY)
    scenarios: list[dict[str, Any]] = json.loads(source.read_text(encoding="utf-8"))["scenarios"]
    return scenarios


def _rule_failures(name: str, value: Any, rule: dict[str, Any]) -> list[str]:
    out = []
    if "eq" in rule and value != rule["eq"]:
        out.append(f"{name} = {value!r}, expected {rule['eq']!r}")
    if "in" in rule and value not in rule["in"]:
        out.append(f"{name} = {value!r}, expected one of {rule['in']!r}")
    if "min" in rule and (value is None or value < rule["min"]):
        out.append(f"{name} = {value!r}, expected >= {rule['min']}")
    if "max" in rule and (value is None or value > rule["max"]):
        out.append(f"{name} = {value!r}, expected <= {rule['max']}")
    return out


def _expect_failures(
    expect: dict[str, Any], code: int, plan: dict[str, Any] | None, error_text: str
) -> list[str]:
    failures = []
    if "exit" in expect and code != expect["exit"]:
        failures.append(f"exit {code}, expected {expect['exit']}")
    if plan is not None:
        settings = plan.get("settings", {})
        for name, rule in expect.get("settings", {}).items():
            failures += _rule_failures(name, settings.get(name), rule)
        if "engine" in expect and plan.get("engine") != expect["engine"]:
            failures.append(f"engine {plan.get('engine')!r}, expected {expect['engine']!r}")
    elif expect.get("settings"):
        failures.append("no plan to check the settings of")
    ways = expect.get("way_out_any")
    if ways and not any(w.lower() in error_text.lower() for w in ways):
        failures.append(f"the error names none of {ways}")
    return failures


def run_scenario(scenario: dict[str, Any], engine_version: str | None = None) -> Outcome:
    """Run one scenario through the CLI, as a user would, and judge it (planned for the
    installed vLLM, or for ``engine_version``)."""
    args = ["fit", scenario["model"], *shlex.split(scenario.get("args", ""))]
    if engine_version:
        args += ["--engine-version", engine_version]
    result = CliRunner().invoke(cli, [*args, "--no-verify", "--json"], prog_name="oominfer")
    plan = None
    if result.exit_code == 0:
        plan = json.loads(result.stdout)
    error_text = result.stderr + ("" if result.exit_code == 0 else result.stdout)
    options = scenario.get("any_of") or [scenario.get("expect", {})]
    per_option = [_expect_failures(o, result.exit_code, plan, error_text) for o in options]
    best = min(per_option, key=len)
    return Outcome(scenario["id"], result.exit_code, plan, error_text, tuple(best))


def describe(outcome: Outcome) -> str:
    """One line: the verdict, the scenario and what the plan was."""
    mark = "pass" if outcome.passed else "FAIL"
    if outcome.plan is not None:
        s = outcome.plan["settings"]
        what = (
            f"tp {s['tensor_parallel_size']} pp {s['pipeline_parallel_size']} "
            f"q {s['quantization']} kv {s['kv_cache_dtype']} len {s['max_model_len']} "
            f"seqs {s['max_num_seqs']} eager {s['enforce_eager']}"
        )
        replicas = outcome.plan.get("replicas")
        if replicas and replicas > 1:
            what += f" x{replicas} replicas"
    else:
        first = outcome.error_text.strip().splitlines()[:1]
        what = f"exit {outcome.exit_code}: {first[0][:110] if first else ''}"
    line = f"{mark}  {outcome.id:<26} {what}"
    if outcome.failures:
        line += "\n      " + "; ".join(outcome.failures)
    return line


def main() -> int:
    """Run the scenarios and print each outcome and the pass count."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=Path)
    parser.add_argument(
        "--engine-version",
        action="append",
        help="vLLM release to plan for (repeat for several; default: 0.32 and 0.33)",
    )
    args = parser.parse_args()
    failed = 0
    for version in args.engine_version or ["0.32", "0.33"]:
        outcomes = [run_scenario(s, version) for s in load_scenarios(args.scenarios)]
        print(f"vLLM {version}:")
        for outcome in outcomes:
            print(describe(outcome))
        passed = sum(o.passed for o in outcomes)
        failed += len(outcomes) - passed
        print(f"\n{passed}/{len(outcomes)} scenarios pass for vLLM {version}\n")
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
