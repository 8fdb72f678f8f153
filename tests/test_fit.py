"""The fit loop with a scripted prober: corrections from probe outcomes, the cache, the plan."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from oominfer.base.errors import DoesNotFitError, ExitStatus, PlanError, ProbeFailedError
from oominfer.base.units import GiB, MiB
from oominfer.hardware.gpu import find_gpu
from oominfer.hardware.hardware import Hardware
from oominfer.model.load import load_spec
from oominfer.planning.constraints import Constraints
from oominfer.planning.document import SCHEMA_VERSION, plan_from_dict, plan_from_json
from oominfer.runtime.status import LogFacts, ProbeStatus
from oominfer.settings import EngineSettings
from oominfer.verify.cache import cache_dir, cache_key
from oominfer.verify.fit import FitResult, fit
from oominfer.verify.prober import ProbeResult

LLAMA_8B = "meta-llama/Llama-3.1-8B-Instruct"
SMALL = "Qwen/Qwen2.5-0.5B-Instruct"
VERSION = "vllm 0.0-test"


@pytest.fixture(autouse=True)
def plan_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Every test gets its own, empty plan cache."""
    folder = tmp_path / "plans"
    monkeypatch.setenv("OOMINFER_CACHE_DIR", str(folder))
    yield folder


class FakeProber:
    """Replays scripted outcomes; records the settings of every launch."""

    def __init__(self, *outcomes: ProbeStatus | tuple[ProbeStatus, dict[str, Any]]) -> None:
        self.script = list(outcomes)
        self.calls: list[EngineSettings] = []
        self.kwargs: list[dict[str, Any]] = []
        self.log_dir = Path("/nonexistent/oominfer-fake")

    def __call__(
        self, model: str, settings: EngineSettings, *, engine: str, device: str
    ) -> ProbeResult:
        self.calls.append(settings)
        self.kwargs.append({"model": model, "engine": engine, "device": device})
        step = self.script[min(len(self.calls), len(self.script)) - 1]
        status, facts = step if isinstance(step, tuple) else (step, {})
        log = self.log_dir / f"probe-{len(self.calls)}.log"
        ready = status is ProbeStatus.READY
        return ProbeResult(
            status=status,
            settings=settings,
            log_path=log,
            facts=LogFacts(status=status, phase="ready" if ready else "starting", **facts),
            seconds=12.34,
            requests_ok=1 + (settings.max_num_seqs or 1) if ready else 0,
            peak_rss_bytes=3 * GiB if ready else None,
            detail=facts.get("detail", ""),
            engine_version=VERSION,
        )


def gpu(name: str = "L4", count: int = 1) -> Hardware:
    return Hardware(gpu=find_gpu(name), count=count)


def cpu(memory: int = 8 * GiB) -> Hardware:
    return Hardware.cpu(memory)


def run(
    prober: FakeProber | None,
    *,
    model: str = LLAMA_8B,
    hardware: Hardware | None = None,
    constraints: Constraints | None = None,
    device: str = "cuda",
    **kw: Any,
) -> FitResult:
    return fit(
        load_spec(model),
        hardware or (gpu() if device == "cuda" else cpu()),
        constraints or Constraints(),
        prober=prober,
        engine_version=VERSION,
        **kw,
    )


MEASURED = {
    "weights_bytes": 8 * GiB,
    "kv_cache_bytes": 9 * GiB,
    "kv_cache_tokens": 147_456,
}


def test_ready_first_is_verified_in_one_launch() -> None:
    prober = FakeProber((ProbeStatus.READY, MEASURED))
    result = run(prober)
    assert len(prober.calls) == 1
    assert prober.kwargs[0] == {"model": LLAMA_8B, "engine": "vllm", "device": "cuda"}
    p = result.plan
    assert p.verified and not result.cached
    assert p.settings == prober.calls[0]  # what ran is what the plan says
    v = p.verification
    assert v is not None
    assert v.status == "ready"
    assert v.launches == 1
    assert v.weights_bytes == 8 * GiB
    assert v.kv_cache_bytes == 9 * GiB
    assert v.kv_cache_tokens == 147_456
    assert v.peak_bytes == 3 * GiB
    assert v.requests_ok == 1 + (p.settings.max_num_seqs or 1)
    assert v.log_path == str(prober.log_dir / "probe-1.log")
    assert v.engine_version == VERSION
    assert v.load_seconds == 12.3
    assert p.engine_version == VERSION
    assert len(result.probes) == 1


def test_no_prober_plans_without_verifying() -> None:
    result = run(None)
    assert not result.plan.verified
    assert result.plan.verification is None
    assert result.probes == ()
    assert result.planned is not None
    assert result.plan.settings == result.planned.settings


def test_kv_cache_too_small_uses_the_engines_length() -> None:
    prober = FakeProber(
        (ProbeStatus.KV_CACHE_TOO_SMALL, {"estimated_max_model_len": 23648}),
        ProbeStatus.READY,
    )
    result = run(prober, constraints=Constraints(prefer="context"))
    assert len(prober.calls) == 2
    assert prober.calls[0].max_model_len == 131072
    assert prober.calls[1].max_model_len is not None
    assert prober.calls[1].max_model_len <= 23648
    assert prober.calls[1].max_model_len >= 23648 * 0.97  # a correction, not a halving
    p = result.plan
    assert p.verified
    assert p.verification is not None and p.verification.launches == 2
    assert p.settings.max_model_len == prober.calls[1].max_model_len
    measured = [lever for lever in p.levers if "engine measured" in lever.reason]
    assert measured and measured[0].name == "max_model_len" and measured[0].value == 23648


def test_kv_cache_too_small_below_min_context_does_not_fit() -> None:
    prober = FakeProber((ProbeStatus.KV_CACHE_TOO_SMALL, {"estimated_max_model_len": 4000}))
    with pytest.raises(DoesNotFitError) as info:
        run(prober, constraints=Constraints(min_context=8192))
    assert info.value.exit_status == ExitStatus.DOES_NOT_FIT
    assert "4,000" in info.value.message
    assert len(prober.calls) == 1


def test_kv_cache_too_small_below_the_max_model_len_asked_does_not_fit() -> None:
    """--max-model-len is a requirement (issue 17): when the engine holds less, the fit
    stops and says so with that flag, rather than serving less."""
    prober = FakeProber((ProbeStatus.KV_CACHE_TOO_SMALL, {"estimated_max_model_len": 4000}))
    with pytest.raises(DoesNotFitError) as info:
        run(prober, constraints=Constraints(max_model_len=8192))
    assert "below --max-model-len 8,192" in info.value.message
    assert "--max-model-len 4000" in (info.value.hint or "")
    assert len(prober.calls) == 1
    assert prober.calls[0].max_model_len == 8192


def test_out_of_memory_on_gpu_lowers_utilization() -> None:
    prober = FakeProber(
        (ProbeStatus.OUT_OF_MEMORY, {"detail": "torch.OutOfMemoryError: CUDA out of memory."}),
        ProbeStatus.READY,
    )
    result = run(prober)
    first, second = prober.calls
    assert second.gpu_memory_utilization < first.gpu_memory_utilization
    assert result.plan.verified
    assert result.plan.verification is not None and result.plan.verification.launches == 2
    assert any(
        lever.name == "gpu_memory_utilization" and "out of memory" in lever.reason
        for lever in result.plan.levers
    )


def test_out_of_memory_uses_the_measured_weights() -> None:
    """The engine loaded 3 GiB more weights than estimated: at least that is set aside."""
    spec = load_spec(LLAMA_8B)
    planned = run(None).planned
    assert planned is not None
    heavier = planned.breakdown.weights_bytes + 3 * GiB
    prober = FakeProber((ProbeStatus.OUT_OF_MEMORY, {"weights_bytes": heavier}), ProbeStatus.READY)
    fit(spec, gpu(), Constraints(), prober=prober, engine_version=VERSION)
    first, second = prober.calls
    total = gpu().gpu.cuda_total_bytes
    assert (first.gpu_memory_utilization - second.gpu_memory_utilization) * total >= 3 * GiB * 0.99


def test_no_kv_memory_lowers_utilization() -> None:
    prober = FakeProber(ProbeStatus.NO_KV_MEMORY, ProbeStatus.READY)
    run(prober)
    assert prober.calls[1].gpu_memory_utilization < prober.calls[0].gpu_memory_utilization


def test_out_of_memory_on_cpu_lowers_the_kv_budget() -> None:
    prober = FakeProber(ProbeStatus.OUT_OF_MEMORY, ProbeStatus.READY)
    result = run(
        prober,
        model=SMALL,
        device="cpu",
        constraints=Constraints(kv_cache_memory_bytes=2 * GiB),
    )
    first, second = prober.calls
    assert first.kv_cache_memory_bytes == 2 * GiB
    assert second.kv_cache_memory_bytes is not None
    assert second.kv_cache_memory_bytes < first.kv_cache_memory_bytes
    assert result.plan.verified


def test_out_of_memory_on_cpu_with_a_pinned_budget_lowers_it() -> None:
    """The planner pinned the CPU cache itself (no --kv-cache-memory-bytes): still lower."""
    prober = FakeProber(ProbeStatus.OUT_OF_MEMORY, ProbeStatus.READY)
    run(prober, model=SMALL, device="cpu")
    first, second = prober.calls
    assert first.kv_cache_memory_bytes is not None and second.kv_cache_memory_bytes is not None
    assert second.kv_cache_memory_bytes < first.kv_cache_memory_bytes


def test_insufficient_free_memory_shrinks_to_what_is_free() -> None:
    detail = (
        "ValueError: Free memory on device (14.00/22.05 GiB) on startup is less than desired "
        "GPU memory utilization (0.92, 20.29 GiB)."
    )
    prober = FakeProber(
        (ProbeStatus.INSUFFICIENT_FREE_MEMORY, {"detail": detail}), ProbeStatus.READY
    )
    result = run(prober)
    second = prober.calls[1]
    assert second.gpu_memory_utilization == pytest.approx(14.00 / 22.05, abs=0.03)
    assert second.gpu_memory_utilization < 14.00 / 22.05  # never more than is free
    assert result.plan.verified
    assert result.plan.settings.gpu_memory_utilization == second.gpu_memory_utilization


@pytest.mark.parametrize(
    ("status", "detail"),
    [
        (
            ProbeStatus.UNSUPPORTED,
            "ValueError: Model architectures ['MiniCPMV'] are not supported for now.",
        ),
        (ProbeStatus.CRASHED, "the engine exited with status 1"),
        (ProbeStatus.TIMEOUT, "not ready after 900 s (last phase: loading weights)"),
    ],
)
def test_non_memory_failures_stop_with_the_log(status: ProbeStatus, detail: str) -> None:
    prober = FakeProber((status, {"detail": detail}))
    with pytest.raises(ProbeFailedError) as info:
        run(prober)
    err = info.value
    assert err.exit_status == ExitStatus.PROBE_FAILED
    assert int(err.exit_status) == 4
    assert len(prober.calls) == 1  # no smaller configuration helps
    assert detail in err.message
    assert status.value in err.message
    assert str(prober.log_dir / "probe-1.log") in f"{err.message} {err.hint}"


def test_three_memory_failures_do_not_fit() -> None:
    prober = FakeProber(
        ProbeStatus.OUT_OF_MEMORY,
        (ProbeStatus.KV_CACHE_TOO_SMALL, {"estimated_max_model_len": 20000}),
        ProbeStatus.NO_KV_MEMORY,
        ProbeStatus.READY,  # never reached
    )
    with pytest.raises(DoesNotFitError) as info:
        run(prober)
    assert len(prober.calls) == 3
    assert info.value.exit_status == 3
    assert "3 launches" in info.value.message
    assert str(prober.log_dir / "probe-3.log") in f"{info.value.message} {info.value.hint}"


@pytest.mark.parametrize("limit", [1, 2, 3, 5])
def test_never_more_than_max_launches(limit: int) -> None:
    # Every launch runs out of memory and each correction leaves room for another: the
    # loop spends exactly its budget, then says how many launches it made.
    prober = FakeProber(ProbeStatus.OUT_OF_MEMORY)
    with pytest.raises(DoesNotFitError) as info:
        run(prober, max_launches=limit)
    assert len(prober.calls) == limit
    assert info.value.message.startswith(f"{limit} launches did not find")


def test_each_launch_differs_from_the_last() -> None:
    """A failed configuration is never launched again as is."""
    prober = FakeProber(ProbeStatus.OUT_OF_MEMORY)
    with pytest.raises(DoesNotFitError):
        run(prober)
    assert len({repr(s) for s in prober.calls}) == len(prober.calls)


def test_no_estimate_starts_at_the_requested_length() -> None:
    prober = FakeProber(
        (ProbeStatus.KV_CACHE_TOO_SMALL, {"estimated_max_model_len": 65408}), ProbeStatus.READY
    )
    result = run(
        prober,
        model=SMALL,
        device="cpu",
        constraints=Constraints(kv_cache_memory_bytes=32 * MiB, max_model_len=32768),
        use_estimate=False,
    )
    assert prober.calls[0].max_model_len == 32768
    assert result.plan.verified


# ---- the cache -----------------------------------------------------------------------


def test_second_fit_answers_from_the_cache(plan_cache: Path) -> None:
    first = FakeProber((ProbeStatus.READY, MEASURED))
    one = run(first)
    assert list(plan_cache.glob("*.json"))
    second = FakeProber(ProbeStatus.CRASHED)
    two = run(second)
    assert two.cached
    assert second.calls == []
    assert two.plan == one.plan
    assert two.plan.verified


def test_cache_misses_on_other_inputs() -> None:
    run(FakeProber(ProbeStatus.READY))
    other = FakeProber(ProbeStatus.READY)
    assert not run(other, constraints=Constraints(prefer="quality")).cached
    assert len(other.calls) == 1
    gpu_other = FakeProber(ProbeStatus.READY)
    assert not run(gpu_other, hardware=gpu("H100")).cached
    fresh = FakeProber(ProbeStatus.READY)
    assert not run(fresh, use_cache=False).cached
    assert len(fresh.calls) == 1


def test_cache_key_includes_the_dtype() -> None:
    run(FakeProber(ProbeStatus.READY))
    prober = FakeProber(ProbeStatus.READY)
    result = run(prober, constraints=Constraints(dtype="float16"))
    assert not result.cached
    assert result.plan.settings.dtype == "float16"


def test_failed_fits_are_not_cached(plan_cache: Path) -> None:
    with pytest.raises(ProbeFailedError):
        run(FakeProber(ProbeStatus.CRASHED))
    assert not list(plan_cache.glob("*.json"))
    prober = FakeProber(ProbeStatus.READY)
    assert not run(prober).cached
    assert len(prober.calls) == 1


def test_a_corrupt_cache_entry_is_a_miss(plan_cache: Path) -> None:
    run(FakeProber(ProbeStatus.READY))
    (entry,) = plan_cache.glob("*.json")
    entry.write_text("{not json")
    prober = FakeProber(ProbeStatus.READY)
    assert not run(prober).cached
    assert len(prober.calls) == 1
    assert plan_from_json(entry.read_text()).verified  # rewritten


def test_cache_dir_follows_the_environment(
    plan_cache: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert cache_dir() == plan_cache
    monkeypatch.delenv("OOMINFER_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "oominfer" / "plans"


def test_cache_key_is_stable_and_specific() -> None:
    spec = load_spec(LLAMA_8B)
    a = cache_key(spec, gpu(), Constraints(), engine="vllm", version=VERSION)
    assert a == cache_key(spec, gpu(), Constraints(), engine="vllm", version=VERSION)
    assert a != cache_key(spec, gpu(), Constraints(), engine="vllm", version="vllm 9.9")
    assert a != cache_key(spec, gpu(), Constraints(), engine="transformers", version=VERSION)
    assert a != cache_key(spec, gpu("L4", 2), Constraints(), engine="vllm", version=VERSION)
    assert a != cache_key(
        spec, gpu(), Constraints(min_context=8192), engine="vllm", version=VERSION
    )
    assert a != cache_key(load_spec(SMALL), gpu(), Constraints(), engine="vllm", version=VERSION)


# ---- the plan document -----------------------------------------------------------------


def verified_plan() -> Any:
    return run(
        FakeProber(
            (ProbeStatus.KV_CACHE_TOO_SMALL, {"estimated_max_model_len": 23648}),
            (ProbeStatus.READY, MEASURED),
        )
    ).plan


def test_plan_json_round_trips() -> None:
    p = verified_plan()
    assert plan_from_json(p.to_json()) == p
    unverified = run(None).plan
    assert plan_from_json(unverified.to_json()) == unverified
    cpu_plan = run(None, model=SMALL, device="cpu").plan
    assert plan_from_json(cpu_plan.to_json()) == cpu_plan
    assert cpu_plan.gpu_count == 0


def test_plan_json_shape() -> None:
    p = verified_plan()
    data = json.loads(p.to_json())
    assert next(iter(data)) == "schema_version"
    assert data["schema_version"] == SCHEMA_VERSION
    assert data["settings"]["max_model_len"] <= 23648
    assert data["verification"]["status"] == "ready"
    assert data["architecture"]["num_layers"] == 32
    assert data["gpu"]["name"].startswith("L4")
    assert data["device"] == "cuda"
    assert data["engine"] == "vllm"
    assert p.to_json().endswith("\n")
    assert p.sha256() == plan_from_json(p.to_json()).sha256()


@pytest.mark.parametrize("version", [None, 0, 2, "1"])
def test_wrong_schema_version(version: object) -> None:
    data = json.loads(verified_plan().to_json())
    if version is None:
        del data["schema_version"]
    else:
        data["schema_version"] = version
    with pytest.raises(PlanError) as info:
        plan_from_json(json.dumps(data), source="plan.json")
    assert "schema_version" in info.value.message
    assert "plan.json" in info.value.message
    assert info.value.hint and "oominfer fit" in info.value.hint


@pytest.mark.parametrize(
    "text",
    [
        "",
        "{",
        "not json at all",
        "[1, 2, 3]",
        '"a string"',
        "null",
        json.dumps({"schema_version": SCHEMA_VERSION}),  # no model_id
        json.dumps({"schema_version": SCHEMA_VERSION, "model_id": "m", "settings": {"x": 1}}),
        json.dumps({"schema_version": SCHEMA_VERSION, "model_id": "m", "levers": [{"name": "x"}]}),
        json.dumps(
            {
                "schema_version": SCHEMA_VERSION,
                "model_id": "m",
                "settings": {"gpu_memory_utilization": 1.5},
            }
        ),
    ],
)
def test_malformed_plans(text: str) -> None:
    with pytest.raises(PlanError):
        plan_from_json(text, source="bad.json")


def test_plan_from_dict_rejects_non_objects() -> None:
    with pytest.raises(PlanError):
        plan_from_dict([], source="x")
