"""The pure core imports no engine: `oominfer estimate` must start in a fraction of a second
on a machine without torch, vLLM or transformers. Each import runs in a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "vllm", "transformers")
HUB = ("huggingface_hub",)

PURE = [
    "oominfer.base.errors",
    "oominfer.base.units",
    "oominfer.memory.dtypes",
    "oominfer.settings",
    "oominfer.model.load",
    "oominfer.hardware.hardware",
    "oominfer.memory.estimate",
    "oominfer.planning.planner",
    "oominfer.planning.record",
    "oominfer.report.breakdown",
    "oominfer.report.fit",
    "oominfer.k8s",
]


def loaded_after(code: str, cwd: Path) -> list[str]:
    """Top-level modules of HEAVY + HUB that are in sys.modules after running ``code``."""
    script = (
        f"{code}\n"
        "import json, sys\n"
        f"names = {list(HEAVY + HUB)!r}\n"
        "print(json.dumps(sorted(n for n in names if n in sys.modules)))\n"
    )
    # The checkout under test, not whichever oominfer this Python has installed (a worktree's
    # tests run in another checkout's venv).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": path}
    # Run from an empty folder so that nothing there shadows a module.
    out = subprocess.run(
        [sys.executable, "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.parametrize("module", PURE)
def test_pure_module_imports_no_engine_and_no_hub(module: str, tmp_path: Path) -> None:
    assert loaded_after(f"import {module}", tmp_path) == []


def test_models_imports_the_hub_lazily(tmp_path: Path) -> None:
    assert loaded_after("import oominfer.model.load", tmp_path) == []


def test_catalog_lookup_imports_no_hub(tmp_path: Path) -> None:
    code = (
        "from oominfer.model.load import load_spec\n"
        "from oominfer.memory.estimate import estimate, Hardware\n"
        "from oominfer.hardware.gpu import find_gpu\n"
        "from oominfer.settings import EngineSettings\n"
        "from oominfer.rules.versions import LATEST_VLLM\n"
        "spec = load_spec('meta-llama/Llama-3.1-8B-Instruct')\n"
        "estimate(spec, hardware=Hardware(gpu=find_gpu('L4')), settings=EngineSettings(),\n"
        "         version=LATEST_VLLM)\n"
    )
    assert loaded_after(code, tmp_path) == []


def test_cli_imports_no_engine(tmp_path: Path) -> None:
    assert [m for m in loaded_after("import oominfer.cli", tmp_path) if m in HEAVY] == []


def test_cli_imports_no_hub(tmp_path: Path) -> None:
    assert loaded_after("import oominfer.cli", tmp_path) == []


def test_package_imports_nothing_heavy(tmp_path: Path) -> None:
    assert loaded_after("import oominfer", tmp_path) == []
