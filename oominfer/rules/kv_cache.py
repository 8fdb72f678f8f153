"""KV-cache dtypes: what a GPU and a vLLM release store the cache in.

An FP8 KV cache (``fp8``, ``fp8_e4m3``, ``fp8_e5m2``) runs from compute capability 8.0
through the FlashInfer and Triton attention backends (FlashAttention 3 needs 9.0):
vllm/v1/attention/backends/flashinfer.py, triton_attn.py, flash_attn.py
``supports_kv_cache_dtype``. 0.33 refuses an explicit 16-bit ``kv_cache_dtype`` other than
the model's dtype (vllm/config/cache.py).
"""

from __future__ import annotations

from typing import Final

from oominfer.hardware.gpu import GpuSpec
from oominfer.rules.versions import EngineVersion
from oominfer.settings import flag

SOURCE: Final = (
    "vllm/v1/attention/backends/{flashinfer,triton_attn,flash_attn}.py "
    "supports_kv_cache_dtype; vllm/config/cache.py"
)
FP8_KV_MIN_CAPABILITY: Final = (8, 0)
FP8_KV_DTYPES: Final = frozenset({"fp8", "fp8_e4m3", "fp8_e5m2"})


def refusal(
    kv_cache_dtype: str, *, gpu: GpuSpec, model_dtype: str, device: str, version: EngineVersion
) -> str | None:
    """Why vLLM refuses this KV-cache dtype here, or None when it accepts it."""
    if kv_cache_dtype in FP8_KV_DTYPES:
        if device == "cuda" and gpu.compute_capability < FP8_KV_MIN_CAPABILITY:
            have = ".".join(map(str, gpu.compute_capability))
            return (
                f"an FP8 KV cache needs compute capability 8.0 (FlashInfer, Triton); "
                f"{gpu.name} has {have}"
            )
        if device == "cuda" and model_dtype == "float32":
            return "an FP8 KV cache needs a 16-bit model (FlashInfer runs fp16 and bf16 only)"
        return None
    if (
        kv_cache_dtype in ("bfloat16", "float16")
        and kv_cache_dtype != model_dtype
        and version.release >= (0, 33)
    ):
        return (
            f"vLLM 0.33 refuses a {kv_cache_dtype} KV cache for a {model_dtype} model; "
            f"{flag('kv_cache_dtype')} auto stores it in the model's dtype"
        )
    return None
