"""The compute dtype vLLM runs a model in, and the dtypes it refuses.

Read from vllm/config/model.py (``_FLOAT16_NOT_SUPPORTED_MODELS``, ``_resolve_auto_dtype``,
``_check_valid_dtype``) and vllm/platforms/cuda.py (``supported_dtypes``), 0.32 and 0.33.
"""

from __future__ import annotations

from typing import Final

from oominfer.base.errors import InvalidSettingError
from oominfer.hardware.gpu import GpuSpec
from oominfer.model.spec import ModelSpec
from oominfer.settings import dtype_name

SOURCE: Final = "vllm/config/model.py, vllm/platforms/cuda.py"

FLOAT16_REFUSED: Final = frozenset({"gemma2", "gemma3", "gemma3_text", "glm4"})
"""Model types vLLM refuses to run in float16 ("Numerical instability. Please use bfloat16
or float32 instead.": vllm/config/model.py _FLOAT16_NOT_SUPPORTED_MODELS)."""


def supported_dtypes(gpu: GpuSpec) -> tuple[str, ...]:
    """The dtypes a CUDA GPU runs, vLLM's preferred first (platforms/cuda.py): bf16 from
    compute capability 8.0, else fp16; float32 always."""
    if gpu.supports_bf16:
        return ("bfloat16", "float16", "float32")
    return ("float16", "float32")


def allowed_dtypes(spec: ModelSpec, gpu: GpuSpec) -> tuple[str, ...]:
    """The dtypes vLLM runs ``spec`` in on ``gpu``, its preferred first: the GPU's, less
    float16 for the model types that refuse it."""
    return tuple(
        d
        for d in supported_dtypes(gpu)
        if not (d == "float16" and spec.model_type in FLOAT16_REFUSED)
    )


def compute_dtype(spec: ModelSpec, gpu: GpuSpec, requested: str) -> str:
    """The dtype vLLM runs ``spec`` in on ``gpu`` for ``--dtype requested``.

    ``auto`` (vllm/config/model.py _resolve_auto_dtype): the GPU's dtypes without the ones
    the model refuses; a float32 checkpoint takes the first of them, a 16-bit one keeps its
    dtype when the GPU runs it and falls back to the first otherwise. So a Gemma 2/3 or
    GLM-4 bf16 checkpoint runs in float32 on a GPU below compute capability 8.0.

    Raises:
        InvalidSettingError: float16 for a model that refuses it, or bfloat16 on a GPU
            below compute capability 8.0.
    """
    allowed = allowed_dtypes(spec, gpu)
    if requested == "auto":
        config = dtype_name(spec.torch_dtype)
        if config not in ("bfloat16", "float16"):
            return allowed[0]  # float32 (or unknown) checkpoints are downcast
        return config if config in allowed else allowed[0]
    name = dtype_name(requested)
    if name == "float16" and spec.model_type in FLOAT16_REFUSED:
        raise InvalidSettingError(
            f"vLLM refuses float16 for {spec.model_type} models (numerical instability).",
            hint="Use --dtype bfloat16 (compute capability 8.0+) or --dtype float32.",
        )
    if name == "bfloat16" and "bfloat16" not in allowed:
        cc = ".".join(map(str, gpu.compute_capability))
        raise InvalidSettingError(
            f"{gpu.name} (compute capability {cc}) cannot run bfloat16; it needs 8.0 or newer.",
            hint="Use --dtype float16.",
        )
    return name
