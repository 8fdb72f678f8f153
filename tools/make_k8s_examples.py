#!/usr/bin/env python3
"""Regenerate deploy/k8s: example plans fitted by the planner, and their manifests.

Each example's ``plan.json`` is what ``oominfer fit --no-verify`` writes: ``oominfer.plan``,
offline from the built-in catalog. It is rendered with the code
``oominfer k8s`` runs. The plans are unverified (``verification: null``): no engine ran them
here. ``created_at`` is fixed so that the files only change when the plan does;
tests/test_k8s.py regenerates everything into a temporary folder and fails when the
committed files drift.

Usage: python tools/make_k8s_examples.py [--root DIR]   (default: the repo's deploy/k8s)
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import oominfer
from oominfer import Constraints, Hardware, Plan
from oominfer.k8s.options import K8sOptions
from oominfer.k8s.render import manifest_files
from oominfer.k8s.write import write_manifests

ROOT = Path(__file__).resolve().parent.parent / "deploy" / "k8s"
ENGINE_VERSION = "0.33.0"
"""The vLLM of serve/Dockerfile, recorded as ``fit`` records the installed engine's."""
CREATED_AT = "2026-01-01T00:00:00+00:00"


@dataclass(frozen=True, kw_only=True)
class Example:
    """One example: where it goes, the model and hardware, what to ask of the fit, the options."""

    folder: str
    model_id: str
    gpu: str
    gpus: int
    constraints: Constraints = field(default_factory=Constraints)
    options: K8sOptions = field(default_factory=K8sOptions)


EXAMPLES = (
    Example(folder="base", model_id="Qwen/Qwen2.5-1.5B-Instruct", gpu="L4", gpus=1),
    Example(
        folder="examples/llama-3.1-8b-l4",
        model_id="meta-llama/Llama-3.1-8B-Instruct",
        gpu="L4",
        gpus=1,
        options=K8sOptions(namespace="llm", keda=True, service_monitor=True, max_replicas=4),
    ),
    Example(
        folder="examples/llama-3.3-70b-2xh100",
        model_id="meta-llama/Llama-3.3-70B-Instruct",
        gpu="H100",
        gpus=2,
        options=K8sOptions(namespace="llm", pdb=True, service_monitor=True),
    ),
    Example(
        folder="examples/llama-3.1-405b-2x8xh100",
        model_id="meta-llama/Llama-3.1-405B-Instruct",
        gpu="H100",
        gpus=16,
        options=K8sOptions(namespace="llm", pdb=True),
    ),
)


def build_plan(example: Example) -> Plan:
    """The plan ``oominfer fit --no-verify`` writes for the example, created at CREATED_AT.

    Raises:
        DoesNotFitError: nothing fits the example's hardware (the example is wrong).
    """
    constraints = dataclasses.replace(example.constraints, engine_version=ENGINE_VERSION)
    plan = oominfer.plan(
        example.model_id, Hardware.from_gpu(example.gpu, example.gpus), constraints
    )
    return dataclasses.replace(plan, created_at=CREATED_AT)


def write_examples(root: Path) -> list[Path]:
    """Write every example's plan.json and manifests under ``root``; the paths written."""
    written: list[Path] = []
    for example in EXAMPLES:
        plan = build_plan(example)
        files = {"plan.json": plan.to_json(), **manifest_files(plan, example.options)}
        written += write_manifests(files, root / example.folder)
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
