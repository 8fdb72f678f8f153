"""The environment an engine process starts with."""

from __future__ import annotations

import os
from pathlib import Path

from oominfer.settings import Device, VllmSettings


def _amx_sitecustomize(folder: Path) -> Path:
    """vLLM's eager CPU path dies with SIGILL on AMX CPUs unless the process asks the OS for
    AMX first (ENVIRONMENT.md); a sitecustomize on the child's PYTHONPATH does it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "try:\n    import torch\n    torch.cpu._init_amx()\nexcept Exception:\n    pass\n"
    )
    return folder


def engine_env(settings: VllmSettings, *, device: Device, workdir: Path) -> dict[str, str]:
    """The engine's environment: this process's, minus VLLM_CPU_KVCACHE_SPACE when the KV
    size is pinned by flag (the variable would override it), plus the AMX workaround for
    eager mode on the CPU (its sitecustomize is written under ``workdir``)."""
    env = dict(os.environ)
    if settings.kv_cache_memory_bytes is not None:
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if device == "cpu" and settings.enforce_eager:
        site = _amx_sitecustomize(workdir / "amx")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return env
