"""The GPU catalog, name matching and hand-described GPUs."""

from __future__ import annotations

import re

import pytest
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture

from oominfer.base.errors import InvalidSettingError, UnknownGpuError
from oominfer.base.units import GiB
from oominfer.hardware.gpu import GpuSpec, catalog, find_gpu


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("h100", "H100-SXM-80GB"),
        ("H100", "H100-SXM-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-SXM-80GB"),  # what nvidia-smi prints
        ("NVIDIA-H100-80GB-HBM3", "H100-SXM-80GB"),  # the Kubernetes node label
        ("h100 pcie", "H100-PCIE-80GB"),
        ("a100-80gb", "A100-SXM-80GB"),
        ("A100_80GB", "A100-SXM-80GB"),
        ("a100-40gb", "A100-SXM-40GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-SXM-40GB"),
        ("L4", "L4-24GB"),
        ("l4", "L4-24GB"),
        ("NVIDIA L4", "L4-24GB"),
        ("l40s", "L40S-48GB"),
        ("T4", "T4-16GB"),
        ("Tesla T4", "T4-16GB"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("rtx4090", "RTX-4090"),
        ("  b200  ", "B200-180GB"),
        # The same words in another order.
        ("A100-80GB-SXM", "A100-SXM-80GB"),
        ("NVIDIA 80GB A100 PCIe", "A100-PCIE-80GB"),
        ("Blackwell RTX PRO 6000 Server Edition", "RTX-PRO-6000-Blackwell-Server"),
    ],
)
def test_find_gpu(name: str, expected: str) -> None:
    assert find_gpu(name).name == expected


def test_find_gpu_by_every_catalog_name_and_label() -> None:
    for gpu in catalog():
        assert find_gpu(gpu.name) == gpu
        assert find_gpu(gpu.name.lower().replace("-", " ")) == gpu


@pytest.mark.parametrize(
    ("name", "suggested"),
    [
        ("H1000", "H100-SXM-80GB"),
        ("rtx 4090 ti", "RTX-4090"),
        ("GB300", "GB200-185GB"),
        ("A100-96GB", "A100-SXM-80GB"),
    ],
)
def test_unknown_gpu_suggests_close_names(name: str, suggested: str) -> None:
    with pytest.raises(UnknownGpuError) as info:
        find_gpu(name)
    err = info.value
    assert repr(name) in str(err)
    assert err.hint is not None
    assert "Did you mean" in err.hint and suggested in err.hint
    assert "--gpu-memory" in err.hint


def test_unknown_gpu_without_close_names_still_hints() -> None:
    with pytest.raises(UnknownGpuError) as info:
        find_gpu("xyz")
    assert info.value.hint is not None
    assert "Did you mean" not in info.value.hint
    assert "oominfer gpus" in info.value.hint


def test_catalog_is_complete() -> None:
    gpus = catalog()
    assert len(gpus) >= 25
    assert len({g.name for g in gpus}) == len(gpus)
    for g in gpus:
        assert g.memory_bytes >= 8 * GiB, g.name
        # CUDA reports less than NVML: the driver keeps a few hundred MiB. The GB10 shares
        # its 128 GiB with the CPU (NVML reports none), and CUDA sees 119.7 of it.
        low = 0.93 if g.name == "GB10" else 0.95
        assert low * g.memory_bytes < g.cuda_total_bytes < g.memory_bytes, g.name
        major, minor = g.compute_capability
        assert (7, 0) <= (major, minor) <= (12, 9), g.name
        assert g.product_label, g.name  # e.g. NVIDIA-L4, Tesla-T4 (GPU feature discovery)
        assert " " not in g.product_label
        # The memory's technology sets the share of its bandwidth decode reaches.
        assert re.fullmatch(r"HBM(2e?|3e?)|GDDR6X?|GDDR7|LPDDR5X", g.memory_type or ""), g.name


def test_catalog_capabilities() -> None:
    assert not find_gpu("T4").supports_bf16
    assert not find_gpu("T4").supports_fp8
    assert find_gpu("A100").supports_bf16 and not find_gpu("A100").supports_fp8
    assert find_gpu("L4").supports_fp8 and find_gpu("H100").supports_fp8
    assert find_gpu("L4").compute_capability == (8, 9)
    assert find_gpu("H100").compute_capability == (9, 0)


def test_catalog_known_totals() -> None:
    # deviceQuery on an L4: 23570219008 bytes; nvidia-smi: 23034 MiB.
    l4 = find_gpu("L4")
    assert l4.cuda_total_bytes == 23_570_219_008
    assert l4.memory_bytes == 23034 * 1024**2
    assert l4.product_label == "NVIDIA-L4"


def test_custom_gpu() -> None:
    gpu = GpuSpec.custom(24 * GiB)
    assert gpu.memory_bytes == gpu.cuda_total_bytes == 24 * GiB
    assert gpu.name == "custom-24GiB"
    assert gpu.compute_capability == (8, 0)
    assert gpu.supports_bf16 and not gpu.supports_fp8
    assert gpu.product_label is None


def test_custom_gpu_with_capability() -> None:
    gpu = GpuSpec.custom(16 * GiB, compute_capability=(7, 5))
    assert not gpu.supports_bf16
    assert GpuSpec.custom(int(1.5 * GiB)).name == "custom-1.5GiB"


@pytest.mark.parametrize("size", [0, 1, 1024, GiB // 4 - 1])
def test_custom_gpu_too_small(size: int) -> None:
    with pytest.raises(InvalidSettingError, match="too small") as info:
        GpuSpec.custom(size)
    assert info.value.hint is not None and "--gpu-memory" in info.value.hint
