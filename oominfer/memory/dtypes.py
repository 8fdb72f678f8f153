"""Bytes per element of the compute dtype and of the KV cache."""

from __future__ import annotations

from oominfer.base.errors import InvalidSettingError
from oominfer.settings import KV_CACHE_DTYPES, dtype_name, flag


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of a floating-point compute dtype.

    Raises:
        InvalidSettingError: the dtype is not one of bfloat16, float16 or float32.
    """
    match dtype_name(dtype):
        case "bfloat16" | "float16":
            return 2
        case "float32":
            return 4
        case _:
            raise InvalidSettingError(
                f"unknown dtype {dtype!r}.", hint="Use --dtype bfloat16, float16 or float32."
            )


def kv_dtype_bytes(kv_cache_dtype: str, model_dtype: str) -> int:
    """Bytes per element of the KV cache; ``auto`` follows the model's dtype."""
    match kv_cache_dtype:
        case "auto":
            return dtype_bytes(model_dtype)
        case "fp8" | "fp8_e4m3" | "fp8_e5m2":
            return 1
        case "bfloat16" | "float16":
            return 2
        case _:
            raise InvalidSettingError(
                f"unknown KV-cache dtype {kv_cache_dtype!r}.",
                hint=f"Use {flag('kv_cache_dtype')} one of {', '.join(KV_CACHE_DTYPES)}.",
            )
