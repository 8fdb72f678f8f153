"""Measured beside predicted: verification's load test speed goes into the plan and a
local store, and the next estimate of the same model x GPU x engine release starts from it."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from click.testing import CliRunner

from oominfer.base.units import GiB
from oominfer.cli import main
from oominfer.hardware.hardware import Hardware
from oominfer.model.load import load_spec
from oominfer.planning.constraints import Constraints
from oominfer.runtime.load_test import LoadResult
from oominfer.runtime.status import LogFacts, ProbeStatus
from oominfer.settings import EngineSettings
from oominfer.speed import Measured
from oominfer.verify.fit import fit
from oominfer.verify.prober import Prober, ProbeResult
from oominfer.verify.speed_store import recall, remember, store_path

LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
VERSION = "vllm 0.33.0"


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("OOMINFER_CACHE_DIR", str(tmp_path / "cache"))
    yield tmp_path / "cache"


def ready(tokens_per_s: float) -> Prober:
    def prober(model: str, settings: EngineSettings, *, engine: str, device: str) -> ProbeResult:
        seqs = min(settings.max_num_seqs or 1, 64)
        return ProbeResult(
            status=ProbeStatus.READY,
            settings=settings,
            log_path=Path("/nonexistent/probe.log"),
            facts=LogFacts(status=ProbeStatus.READY, phase="ready"),
            seconds=30.0,
            requests_ok=1 + (settings.max_num_seqs or 1),
            peak_rss_bytes=3 * GiB,
            engine_version=VERSION,
            load=LoadResult(
                requests_ok=1 + seqs,
                concurrency=seqs,
                output_tokens=seqs * 8,
                seconds=seqs * 8 / tokens_per_s,
            ),
        )

    return prober


def test_verification_records_the_measured_speed_beside_the_prediction() -> None:
    spec = load_spec(LLAMA)
    hw = Hardware.from_gpu("H100")
    result = fit(spec, hw, Constraints(max_model_len=8192), prober=ready(1500.0))
    m = result.plan.measured
    assert m is not None
    assert m.output_tokens_per_s == pytest.approx(1500.0)
    assert (m.input_len, m.output_len, m.concurrency) == (16, 8, 64)
    assert m.predicted_output_tokens_per_s is not None and m.predicted_output_tokens_per_s > 0
    assert m.engine_version == VERSION
    assert recall(LLAMA, hw.gpu.name, "0.33") == m
    # A second verification of the same setup replaces the line; it does not add one.
    fit(spec, hw, Constraints(max_model_len=8192), prober=ready(900.0), use_cache=False)
    lines = store_path().read_text().splitlines()
    assert len(lines) == 1 and json.loads(lines[0])["output_tokens_per_s"] == pytest.approx(900)


def test_the_store_keeps_one_line_per_model_gpu_and_release() -> None:
    m = Measured(output_tokens_per_s=100.0, predicted_output_tokens_per_s=200.0, concurrency=4,
                 input_len=16, output_len=8, engine_version="vllm 0.32.1")  # fmt: skip
    remember("a/b", "L4-24GB", m)
    remember("a/b", "H100-SXM-80GB", m)
    assert recall("a/b", "L4-24GB", "0.32") == m
    assert recall("a/b", "L4-24GB", "0.33") is None
    assert len(store_path().read_text().splitlines()) == 2
    store_path().write_text(store_path().read_text() + "not json\n")
    assert recall("a/b", "H100-SXM-80GB", "vllm 0.32.0") == m


def test_the_next_estimate_starts_from_what_was_measured() -> None:
    args = ["estimate", LLAMA, "--gpu", "H100", "--max-model-len", "8192",
            "--engine-version", "0.33", "--json"]  # fmt: skip
    before = json.loads(CliRunner().invoke(main, args).stdout)["performance"]
    assert before["calibrated_from"] is None
    m = Measured(output_tokens_per_s=500.0, predicted_output_tokens_per_s=1000.0,
                 concurrency=64, input_len=16, output_len=8, engine_version=VERSION)  # fmt: skip
    remember(LLAMA, "H100-SXM-80GB", m)
    after = json.loads(CliRunner().invoke(main, args).stdout)["performance"]
    assert after["calibrated_from"]["output_tokens_per_s"] == 500.0
    assert after["output_tokens_per_s"] == pytest.approx(before["output_tokens_per_s"] / 2, 0.01)
    text = CliRunner().invoke(main, args[:-1]).stdout
    assert "starts from" in text and "measurement on this machine" in text


def test_verification_keeps_the_measured_kv_cache_and_the_next_estimate_starts_from_it() -> None:
    """The engine's "Available KV cache memory" beside the model's: kept per model x GPU x
    release, and the next estimate of the same layout takes what the model missed besides
    the KV cache from it (and says so); another layout does not."""
    from oominfer.verify.memory_store import recall_memory
    from oominfer.verify.memory_store import store_path as memory_store

    spec = load_spec(LLAMA)
    hw = Hardware.from_gpu("H100")
    c = Constraints(max_model_len=8192, engine_version="0.33")
    planned = fit(spec, hw, c).planned.breakdown.kv_cache_bytes
    measured = planned - int(1.5 * GiB)  # the engine held 1.5 GiB more than the model

    def prober(model: str, settings: EngineSettings, *, engine: str, device: str) -> ProbeResult:
        outcome = ready(1500.0)(model, settings, engine=engine, device=device)
        facts = LogFacts(status=ProbeStatus.READY, phase="ready", kv_cache_bytes=measured)
        return dataclasses.replace(outcome, facts=facts)

    result = fit(spec, hw, c, prober=prober, use_cache=False)
    kept = recall_memory(LLAMA, hw.gpu.name, "0.33")
    assert kept is not None and kept.kv_cache_bytes == measured
    assert kept.offset_bytes == pytest.approx(1.5 * GiB, abs=1)
    assert len(memory_store().read_text().splitlines()) == 1

    s = result.plan.settings
    args = ["estimate", LLAMA, "--gpu", "H100", "--engine-version", "0.33",
            "--max-model-len", str(s.max_model_len), "--max-num-seqs", str(s.max_num_seqs),
            "--gpu-memory-utilization", "0.85", "--json"]  # fmt: skip
    if s.max_num_batched_tokens:
        args += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    if s.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", s.kv_cache_dtype]
    if s.quantization:
        args += ["-q", s.quantization]
    if s.enforce_eager:
        args += ["--enforce-eager"]
    doc = json.loads(CliRunner().invoke(main, args).stdout)
    assert doc["memory_calibrated_from"]["offset_bytes"] == kept.offset_bytes
    # Another budget, same layout: the correction holds; the KV cache is 1.5 GiB smaller.
    model_only = EngineSettings(**{**dataclasses.asdict(s), "gpu_memory_utilization": 0.85})
    from oominfer.api import estimate as api_estimate

    alone = api_estimate(spec, hw, model_only, engine_version="0.33").kv_cache_bytes
    assert doc["per_gpu"]["kv_cache_bytes"] == pytest.approx(alone - 1.5 * GiB, abs=2)
    text = CliRunner().invoke(main, args[:-1]).stdout
    assert "Memory starts from a measurement on this machine" in text
    # Another layout (eager here, or not): the model alone.
    other = [*args[:-1], "--json"]
    other = [a for a in other if a != "--enforce-eager"] + (
        [] if s.enforce_eager else ["--enforce-eager"]
    )
    assert json.loads(CliRunner().invoke(main, other).stdout)["memory_calibrated_from"] is None


def test_a_transformers_measurement_calibrates_transformers_estimates_only() -> None:
    """The transformers engine's speed is the host's (speed/transformers.py): a verification
    on this machine corrects the next transformers estimate, kept under the installed
    transformers release, and never a vLLM estimate of the same model and GPU."""
    from oominfer.rules.installed import engine_version

    installed = engine_version("transformers")
    assert installed.startswith("transformers ")  # the hf extra is installed for the tests
    base = ["estimate", LLAMA, "--gpu", "H100", "--max-model-len", "8192", "--json"]
    tf_args = [*base, "--engine", "transformers"]
    before = json.loads(CliRunner().invoke(main, tf_args).stdout)["performance"]
    vllm_before = json.loads(CliRunner().invoke(main, base).stdout)["performance"]
    m = Measured(output_tokens_per_s=50.0, predicted_output_tokens_per_s=100.0,
                 concurrency=16, input_len=16, output_len=8, engine_version=installed)  # fmt: skip
    remember(LLAMA, "H100-SXM-80GB", m)
    release = installed.split()[-1].rsplit(".", 1)[0]
    assert recall(LLAMA, "H100-SXM-80GB", release) is None  # not a vLLM release
    after = json.loads(CliRunner().invoke(main, tf_args).stdout)["performance"]
    assert after["calibrated_from"]["output_tokens_per_s"] == 50.0
    assert after["output_tokens_per_s"] == pytest.approx(before["output_tokens_per_s"] / 2, 0.01)
    vllm_after = json.loads(CliRunner().invoke(main, base).stdout)["performance"]
    assert vllm_after == vllm_before and vllm_after["calibrated_from"] is None
