"""The Python API: one test per function and its error, and the README's example, run."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture

import oominfer
from oominfer.base.errors import (
    DoesNotFitError,
    InvalidSettingError,
    ModelNotFoundError,
    UnknownGpuError,
)
from oominfer.base.units import GiB
from oominfer.hardware import nvml
from oominfer.hardware.gpu import find_gpu
from oominfer.memory.estimate import estimate as estimate_breakdown
from oominfer.planning.context import engine_release
from oominfer.rules.versions import EngineVersion
from oominfer.runtime.status import LogFacts, ProbeStatus
from oominfer.settings import EngineSettings
from oominfer.verify import prober as prober_module
from oominfer.verify.prober import ProbeResult

README = Path(__file__).resolve().parent.parent / "README.md"
LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(autouse=True)
def _own_plan_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OOMINFER_CACHE_DIR", str(tmp_path / "plans"))


def test_load_model_reads_the_catalog_offline() -> None:
    model = oominfer.load_model(LLAMA_8B)
    assert isinstance(model, oominfer.ModelSpec)
    assert (model.num_layers, model.num_kv_heads, model.source) == (32, 8, "catalog")


def test_load_model_unknown_offline_is_model_not_found() -> None:
    with pytest.raises(ModelNotFoundError, match="nobody/nothing-7b"):
        oominfer.load_model("nobody/nothing-7b")


def test_estimate_without_settings_is_vllms_defaults() -> None:
    model = oominfer.load_model(LLAMA_8B)
    l4 = oominfer.Hardware.from_gpu("L4")
    # The release is named on both sides: this test is about the settings.
    got = oominfer.estimate(model, l4, engine_version="0.33")
    assert got == estimate_breakdown(
        model, hardware=l4, settings=EngineSettings(), version=EngineVersion.parse("0.33")
    )
    assert not got.fits  # 131,072 tokens of bf16 KV do not fit next to 15 GiB of weights
    assert oominfer.estimate(LLAMA_8B, l4, engine_version="0.33") == got  # a name is loaded first


def test_estimate_follows_the_resolved_default_release() -> None:
    # No release named: the one the API resolves (the installed vLLM's, else the latest),
    # whichever vLLM this Python has.
    default = engine_release(None)
    assert oominfer.estimate(LLAMA_8B, oominfer.Hardware.from_gpu("L4")) == oominfer.estimate(
        LLAMA_8B, oominfer.Hardware.from_gpu("L4"), engine_version=default
    )


def test_estimate_rejects_an_impossible_layout() -> None:
    with pytest.raises(InvalidSettingError, match="--gpus"):
        oominfer.estimate(
            LLAMA_8B, oominfer.Hardware.from_gpu("L4"), EngineSettings(tensor_parallel_size=2)
        )


def test_plan_returns_a_plan_that_fits() -> None:
    plan = oominfer.plan(LLAMA_8B, oominfer.Hardware.from_gpu("H100"))
    assert isinstance(plan, oominfer.Plan)
    assert plan.predicted is not None and plan.predicted.fits
    assert not plan.verified
    assert plan.gpu["name"] == find_gpu("H100").name


def test_plan_that_cannot_fit_raises_with_the_shortfall() -> None:
    with pytest.raises(DoesNotFitError) as caught:
        oominfer.plan(
            "meta-llama/Llama-3.1-405B-Instruct",
            oominfer.Hardware.from_gpu("T4"),
            oominfer.Constraints(no_quantize=True),
        )
    assert caught.value.shortfall_bytes > GiB


def test_fit_without_verifying_is_the_plan() -> None:
    hardware = oominfer.Hardware.from_gpu("L4")
    fitted = oominfer.fit(LLAMA_8B, hardware, verify=False)
    planned = oominfer.plan(LLAMA_8B, hardware)
    assert fitted.settings == planned.settings
    assert fitted.verification is None


def test_fit_verify_without_the_engine_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from oominfer.rules import installed

    monkeypatch.setattr(installed, "engine_installed", lambda engine: False)
    with pytest.raises(InvalidSettingError, match="not installed"):
        oominfer.fit(LLAMA_8B, oominfer.Hardware.from_gpu("L4"), verify=True)


class _ReadyProber:
    """Stands in for the engine launcher: every launch is READY at once."""

    launched: ClassVar[list[Any]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs

    def __call__(self, model: str, settings: EngineSettings, **kw: Any) -> ProbeResult:
        _ReadyProber.launched.append((model, settings, kw))
        return ProbeResult(
            status=ProbeStatus.READY,
            settings=settings,
            log_path=Path("/nonexistent/probe.log"),
            facts=LogFacts(status=ProbeStatus.READY, phase="ready"),
            seconds=1.0,
            requests_ok=2,
            engine_version="vllm 0.0-test",
        )


def test_fit_verifies_through_the_prober_and_tells_the_listener(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from oominfer.rules import installed

    monkeypatch.setattr(installed, "engine_installed", lambda engine: True)
    monkeypatch.setattr(prober_module, "EngineProber", _ReadyProber)
    _ReadyProber.launched = []
    hits: list[oominfer.Plan] = []
    listener = oominfer.FitListener(on_cache_hit=hits.append)
    cpu = oominfer.Hardware.cpu(8 * GiB)
    plan = oominfer.fit("Qwen/Qwen2.5-0.5B-Instruct", cpu, listener=listener)
    assert plan.verified and len(_ReadyProber.launched) == 1
    assert _ReadyProber.launched[0][2] == {"engine": "vllm", "device": "cpu"}
    assert not hits
    again = oominfer.fit("Qwen/Qwen2.5-0.5B-Instruct", cpu, listener=listener)
    assert again == plan and hits == [plan] and len(_ReadyProber.launched) == 1


def test_hardware_from_gpu_and_its_error() -> None:
    two = oominfer.Hardware.from_gpu("h100", count=2)
    assert (two.gpu.name, two.count, two.device) == (find_gpu("H100").name, 2, "cuda")
    with pytest.raises(UnknownGpuError, match="H1000") as caught:
        oominfer.Hardware.from_gpu("H1000")
    assert caught.value.hint is not None and "Did you mean" in caught.value.hint


def test_hardware_detect_reads_nvml(monkeypatch: pytest.MonkeyPatch) -> None:
    gpu = dataclasses.replace(find_gpu("A10G"), free_bytes=20 * GiB)
    monkeypatch.setattr(nvml, "detect_gpus", lambda: [gpu, gpu])
    found = oominfer.Hardware.detect()
    assert (found.gpu, found.count) == (gpu, 2)
    assert oominfer.Hardware.detect(1).count == 1


def test_hardware_detect_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "detect_gpus", lambda: [])
    with pytest.raises(InvalidSettingError, match="no NVIDIA GPU"):
        oominfer.Hardware.detect()
    assert oominfer.Hardware.detect(default="L4").gpu == find_gpu("L4")


def test_the_readme_example_runs() -> None:
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Python") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code.group(1), "README.md", "exec"), {})
    lines = out.getvalue().splitlines()
    assert lines[0] == "False"
    length, quantization = lines[1].split()
    assert int(length) >= 8192 and quantization == "None"
    assert lines[2].startswith('{\n  "schema_version"') or lines[2].startswith("{")
