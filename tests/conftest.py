"""Shared fixtures: offline isolation, tiny test models, and the vLLM availability check."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

# tests/ has no __init__.py: make its helpers (models.py, engine_util.py) importable.
_TESTS = str(Path(__file__).resolve().parent)
if _TESTS not in sys.path:
    sys.path.insert(0, _TESTS)

from extras import missing_extras  # noqa: E402
from fake_engine import fake_python  # noqa: E402
from kube import KubeApiServer  # noqa: E402
from kube import start as start_kube_apiserver  # noqa: E402
from models import build_model  # noqa: E402

from oominfer.runtime.amx import apply_in_process  # noqa: E402


@pytest.fixture(scope="session", autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Keep Hugging Face, vLLM and oominfer's caches away from the network and the home
    folder (the AMX probe's answer is then probed once per test session)."""
    root = tmp_path_factory.mktemp("env")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("OOMINFER_CACHE_DIR", str(root / "oominfer-cache"))
        mp.setenv("HF_HOME", str(root / "hf"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setenv("TRANSFORMERS_OFFLINE", "1")
        mp.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        mp.setenv("VLLM_CACHE_ROOT", str(root / "vllm-cache"))
        mp.setenv("VLLM_NO_USAGE_STATS", "1")
        mp.setenv("VLLM_DO_NOT_TRACK", "1")
        mp.setenv("DO_NOT_TRACK", "1")
        mp.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
        # Torch in this process (building test models) on a host whose CPU traps AMX: the
        # product's own workaround, probed once (engines get it from engine_env).
        apply_in_process()
        yield


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip, with the reason, each test marked ``needs(...)`` whose modules are absent."""
    for item in items:
        for marker in item.iter_markers("needs"):
            reason = missing_extras(tuple(marker.args))
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@functools.cache
def vllm_import_error(python: str = sys.executable) -> str | None:
    """None when ``import vllm`` works in a fresh interpreter (this one by default), else why
    it fails.

    Checked in a subprocess: importing vLLM in the test process is slow and changes torch's
    global state."""
    try:
        result = subprocess.run(
            [python, "-c", "import vllm"],
            capture_output=True,
            text=True,
            timeout=180,
            env={**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"import vllm failed: {exc}"
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["(no output)"])[-1]
        return f"import vllm failed: {last}"
    return None


@pytest.fixture(scope="session")
def vllm_python() -> str:
    """The interpreter to run vLLM with; skips the test when ``import vllm`` fails."""
    error = vllm_import_error()
    if error:
        pytest.skip(error)
    return sys.executable


# tiny_llama: GQA, 4 query heads over 2 KV heads of 32 -> 2*2*32*2 = 256 B per token per
# layer, 512 B per token over its 2 layers.
TINY_LLAMA = dict(
    family="llama", layers=2, hidden=128, heads=4, kv_heads=2, head_dim=32, intermediate=256,
    max_position_embeddings=131072,
)  # fmt: skip

# tiny_other: Qwen2 (qkv bias), MHA 4 heads of 128, 3 layers -> 2*4*128*2 = 2048 B per token
# per layer, 6144 B per token; 1 GiB holds 1365.33 blocks of 128 tokens (not a power of two).
# Trained context 262144, above what 1 GiB holds (174,592), for the "too long" launch.
TINY_OTHER = dict(
    family="qwen2", layers=3, hidden=512, heads=4, kv_heads=4, head_dim=128, intermediate=1024,
    max_position_embeddings=262144,
)  # fmt: skip


def _needs_model_building() -> None:
    """Skip the test, saying why, where torch, transformers or tokenizers are missing."""
    reason = missing_extras(("torch", "transformers", "tokenizers"))
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random-weight Llama (GQA 4/2, head_dim 32) with a tokenizer, built once."""
    _needs_model_building()
    return build_model(tmp_path_factory.mktemp("models") / "tiny-llama", **TINY_LLAMA)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def tiny_other(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-layer random-weight Qwen2 (MHA 4 heads, head_dim 128) with a tokenizer, built once."""
    _needs_model_building()
    return build_model(tmp_path_factory.mktemp("models") / "tiny-qwen2", **TINY_OTHER)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def fake_engine_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ``python`` that runs tests/fake_engine.py: give it as the engine's interpreter."""
    return fake_python(tmp_path_factory.mktemp("fake-engine"))


@pytest.fixture(scope="session")
def kube_apiserver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeApiServer]:
    """One real Kubernetes 1.20 API server for the whole run, with fake GPU nodes and the
    LeaderWorkerSet, ScaledObject and ServiceMonitor CRDs (tests/kube.py)."""
    yield from start_kube_apiserver(tmp_path_factory.mktemp("kube-apiserver"))
