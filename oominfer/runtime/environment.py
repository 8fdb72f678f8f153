"""The environment an engine process starts with: one builder for the probe, serve and tests."""

from __future__ import annotations

import os
from dataclasses import dataclass

from oominfer.runtime.amx import Amx, amx_status, site_folder, trap_note, workaround_env
from oominfer.settings import Device, Engine, EngineSettings

API_KEY_VARIABLES: dict[Engine, str] = {"vllm": "VLLM_API_KEY", "transformers": "OOMINFER_API_KEY"}
"""Where each engine reads its API key: never on the command line, which ``ps`` shows."""


@dataclass(frozen=True, slots=True)
class EngineEnv:
    """The variables, and the line to tell the user about them (empty when nothing to say)."""

    env: dict[str, str]
    note: str = ""


def engine_env(
    settings: EngineSettings,
    *,
    device: Device,
    engine: Engine = "vllm",
    api_key: str | None = None,
) -> EngineEnv:
    """The engine's environment: this process's, adjusted.

    - minus VLLM_CPU_KVCACHE_SPACE when the KV size is pinned by flag (it would override it);
    - the API key in the variable the engine reads;
    - on the CPU, what AMX needs here (``oominfer.runtime.amx``): where it traps, oneDNN capped
      below it and torch told it is absent (with a note saying so); where it works, the tile
      state requested before the first forward pass (eager mode dies without it). Both through
      a sitecustomize.py on the child's PYTHONPATH, kept in the oominfer cache folder.
    """
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")  # the log is read while the engine starts
    if settings.kv_cache_memory_bytes is not None:
        env.pop("VLLM_CPU_KVCACHE_SPACE", None)
    if api_key:
        env[API_KEY_VARIABLES[engine]] = api_key
    if device != "cpu":
        return EngineEnv(env)
    amx = amx_status()
    env.update(workaround_env(amx))
    site = site_folder(amx)
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    return EngineEnv(env, trap_note() if amx is Amx.TRAPS else "")
