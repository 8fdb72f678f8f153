"""The command that serves a model with some settings, for either engine."""

from __future__ import annotations

from oominfer.engines.vllm import serve_argv
from oominfer.settings import Engine, EngineSettings, engine_args

TRANSFORMERS_MODULE = "oominfer.engines.transformers"
"""``python -m`` this to run oominfer's transformers server."""


def engine_argv(
    model: str,
    settings: EngineSettings,
    *,
    engine: Engine,
    port: int,
    python: str,
    host: str = "127.0.0.1",
    revision: str | None = None,
) -> list[str]:
    """The command that serves ``model`` (at the Hub ``revision``, if one) with ``settings``
    on ``host:port``."""
    if engine == "vllm":
        return serve_argv(model, settings, host=host, port=port, python=python, revision=revision)
    argv = [python, "-m", TRANSFORMERS_MODULE, "--model", model, "--host", host,
            "--port", str(port)]  # fmt: skip
    if revision:
        argv += ["--revision", revision]
    return [*argv, *engine_args(settings, "transformers")]
