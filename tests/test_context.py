"""The planning context: the vLLM release is resolved once, the same way for the CLI, the
API and the estimator, so the same inputs give the same answer whichever vLLM is installed.

The installed release is the one unit seam (``planning.context.vllm_release``): these tests
pretend no vLLM, 0.32 and 0.33 are installed, whatever this machine has.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from click.testing import CliRunner

import oominfer
from oominfer.cli import main
from oominfer.planning import context
from oominfer.planning.constraints import Constraints
from oominfer.rules.versions import LATEST_VLLM, EngineVersion, resolve_release

MODELS = (
    "meta-llama/Llama-3.1-8B-Instruct",
    "Qwen/Qwen3-30B-A3B",
    "deepseek-ai/DeepSeek-V3",
    "google/gemma-3-27b-it",
    "openai/gpt-oss-20b",
)
LATEST = ".".join(map(str, LATEST_VLLM.release))


def installed(monkeypatch: pytest.MonkeyPatch, release: str | None) -> None:
    monkeypatch.setattr(context, "vllm_release", lambda: release)


def per_gpu(*args: str) -> dict[str, Any]:
    result = CliRunner().invoke(main, ["estimate", *args, "--json"], prog_name="oominfer")
    assert result.exit_code in (0, 3), result.output
    block: dict[str, Any] = json.loads(result.stdout)["per_gpu"]
    return block


def test_the_release_is_named_else_installed_else_latest() -> None:
    assert resolve_release("0.30", "0.32.0") == "0.30"
    assert resolve_release(None, "0.32.0") == "0.32.0"
    assert resolve_release(None, None) == LATEST


@pytest.mark.parametrize("model", MODELS)
def test_a_named_release_gives_the_same_estimate_whatever_is_installed(
    model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    args = (model, "--gpu", "H100", "--gpus", "2", "-tp", "2", "--engine-version", "0.32.0")
    answers = []
    for here in (None, "0.32.0", "0.33.0"):
        installed(monkeypatch, here)
        answers.append(per_gpu(*args))
    assert answers[0] == answers[1] == answers[2]


@pytest.mark.parametrize("here", [None, "0.32.0", "0.33.0"])
def test_the_default_release_is_the_installed_one_else_the_latest(
    here: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed(monkeypatch, here)
    model = "Qwen/Qwen3-30B-A3B"  # its 0.32 and 0.33 estimates differ (the sampler pass)
    default = per_gpu(model, "--gpu", "H100")
    assert default == per_gpu(model, "--gpu", "H100", "--engine-version", here or LATEST)
    other = "0.32.0" if (here or LATEST).startswith("0.33") else "0.33.0"
    assert default != per_gpu(model, "--gpu", "H100", "--engine-version", other)


def test_the_api_and_the_cli_resolve_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, "0.32.0")
    model = oominfer.load_model("Qwen/Qwen3-30B-A3B")
    h100 = oominfer.Hardware.from_gpu("H100")
    b = oominfer.estimate(model, h100)
    assert b.kv_cache_bytes == per_gpu("Qwen/Qwen3-30B-A3B", "--gpu", "H100")["kv_cache_bytes"]
    plan = oominfer.plan(model, h100, Constraints())
    assert plan.engine_version == "vllm 0.32.0"


def test_the_context_holds_the_resolved_release(monkeypatch: pytest.MonkeyPatch) -> None:
    installed(monkeypatch, None)
    spec = oominfer.load_model("meta-llama/Llama-3.1-8B-Instruct")
    ctx = context.make_context(spec, oominfer.Hardware.from_gpu("L4"), Constraints())
    assert ctx.constraints.engine_version == LATEST
    assert ctx.version == EngineVersion.parse(LATEST)
    assert ctx.context_cap == spec.max_position_embeddings
    capped = context.make_context(spec, ctx.hardware, Constraints(max_model_len=8192))
    assert capped.context_cap == 8192
