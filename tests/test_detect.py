"""GPU detection: a quiet fallback without NVML, and free memory used when a GPU is busy."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from oominfer import cli
from oominfer.base.units import GiB
from oominfer.hardware import nvml as detect
from oominfer.hardware.gpu import find_gpu


def test_no_gpu_no_driver_is_quiet(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    # Simulated, so that a GPU host passes too: nvidia-ml-py is installed but the driver is
    # not loaded. The NVMLError is caught and nothing is printed.
    import pynvml

    def no_driver() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    monkeypatch.setattr(pynvml, "nvmlInit", no_driver)
    assert detect.detect_gpus() == []
    assert capfd.readouterr() == ("", "")


def test_no_nvidia_ml_py_is_quiet(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError
    assert detect.detect_gpus() == []
    assert capfd.readouterr() == ("", "")


def test_a_driver_that_fails_midway_is_quiet(monkeypatch: pytest.MonkeyPatch) -> None:
    import pynvml

    def fails() -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", fails)
    assert detect.detect_gpus() == []


def test_a_gpu_without_an_nvml_memory_total_is_read_from_the_catalog(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The GB10 (DGX Spark) shares its memory with the CPU: NVML's device memory query
    answers "Not Supported" there (nvidia-smi prints it for memory). Simulated: the machine
    that runs the tests has no GB10."""
    import pynvml

    def not_supported(_handle: object) -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: 2)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda i: i)
    names = {0: "NVIDIA GB10", 1: "NVIDIA Unknown Part"}
    monkeypatch.setattr(pynvml, "nvmlDeviceGetName", lambda i: names[i])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetMemoryInfo", not_supported)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCudaComputeCapability", lambda i: (12, 1))
    # An unknown part without a memory total is left out rather than guessed at.
    (gpu,) = detect.detect_gpus()
    assert gpu.name == "GB10" and gpu.free_bytes is None
    assert gpu.cuda_total_bytes == find_gpu("GB10").cuda_total_bytes == 128_538_451_968
    assert gpu.compute_capability == (12, 1)


@pytest.fixture
def busy_l4(monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    gpu = dataclasses.replace(find_gpu("L4"), free_bytes=12 * GiB)
    monkeypatch.setattr(detect, "detect_gpus", lambda: [gpu])


@pytest.mark.usefixtures("busy_l4")
def test_estimate_warns_when_less_is_free_than_vllm_asks() -> None:
    result = CliRunner().invoke(
        cli.main, ["estimate", "Qwen/Qwen3-0.6B", "--max-model-len", "4096"]
    )
    assert result.exit_code == 0, result.output
    assert "only 12.00 GiB of the GPU is free" in result.stderr
    assert "--gpu-memory-utilization 0.54" in result.stderr  # 12 / 21.95 - 0.01


@pytest.mark.usefixtures("busy_l4")
def test_fit_plans_within_the_free_memory() -> None:
    result = CliRunner().invoke(cli.main, ["fit", "Qwen/Qwen3-0.6B", "--no-verify", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["settings"]["gpu_memory_utilization"] == 0.54
    assert plan["gpu"]["name"] == "L4-24GB"
