"""Corrections from a failed launch when the engine's message lacks the numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture

from oominfer.base.errors import DoesNotFitError
from oominfer.hardware.hardware import Hardware
from oominfer.model.load import load_spec
from oominfer.planning.constraints import Constraints
from oominfer.planning.planner import plan
from oominfer.runtime.status import LogFacts, ProbeStatus
from oominfer.settings import EngineSettings
from oominfer.verify.correct import correct
from oominfer.verify.prober import ProbeResult

QWEN = "Qwen/Qwen3-0.6B"


def outcome(detail: str, settings: EngineSettings) -> ProbeResult:
    return ProbeResult(
        status=ProbeStatus.INSUFFICIENT_FREE_MEMORY,
        settings=settings,
        log_path=Path("/nonexistent/probe.log"),
        facts=LogFacts(status=ProbeStatus.INSUFFICIENT_FREE_MEMORY, detail=detail),
        seconds=1.0,
    )


@pytest.mark.parametrize(
    ("detail", "said"),
    [
        # vLLM's usual message carries the free and total GiB: the fraction is named.
        ("Free memory on device (0.5/22.0 GiB) on startup is less than desired", "only 2% "),
        # A message without the numbers: no percentage of None, a sentence instead.
        ("ValueError: Free memory on device is less than desired", "too little of the GPU"),
        ("", "the engine did not say how much"),
    ],
)
def test_too_little_free_memory_is_said_with_or_without_numbers(detail: str, said: str) -> None:
    spec, l4 = load_spec(QWEN), Hardware.from_gpu("L4")
    c = Constraints(gpu_memory_utilization=0.06)
    result = plan(spec, l4, c)
    settings = result.settings
    with pytest.raises(DoesNotFitError) as info:
        correct(spec, l4, c, settings, result, outcome(detail, settings))
    assert said in info.value.message
    assert "None" not in info.value.message
    assert info.value.hint and "nvidia-smi" in info.value.hint
