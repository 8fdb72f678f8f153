"""Data types and weight formats: the closed sets and their sizes in bytes."""

from __future__ import annotations

from typing import Final, Literal, get_args

from oominfer.errors import InvalidSettingError

Dtype = Literal["auto", "bfloat16", "float16", "float32"]
"""The ``--dtype`` choices (vLLM also accepts ``half`` and ``float``: normalised by dtype_name)."""

KvCacheDtype = Literal["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]
"""The ``--kv-cache-dtype`` choices; ``auto`` stores the cache in the model's dtype."""

Quantization = Literal[
    "awq", "awq_marlin", "gptq", "gptq_marlin", "fp8", "fp8_per_tensor", "bitsandbytes",
    "int8", "mxfp4", "compressed-tensors", "modelopt",
]  # fmt: skip
"""The ``--quantization`` choices, under vLLM's names. ``fp8`` loads an FP8 checkpoint;
``fp8_per_tensor`` quantizes 16-bit weights to FP8 at load time (vLLM >= 0.30 spelling).
``bitsandbytes`` is 4-bit NF4 and ``int8`` is LLM.int8: vLLM 0.32 dropped bitsandbytes, so
both load in flight through the transformers engine."""

Engine = Literal["vllm", "transformers"]

DTYPES: Final = get_args(Dtype)
KV_CACHE_DTYPES: Final = get_args(KvCacheDtype)
QUANTIZATIONS: Final = get_args(Quantization)
ENGINES: Final = get_args(Engine)

_ALIASES: Final = {
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "float": "float32",
    "fp32": "float32",
    "f16": "float16",
    "f32": "float32",
}

# Bytes per element of each safetensors dtype (the header's "dtype" strings).
SAFETENSORS_BYTES: Final[dict[str, float]] = {
    "F64": 8, "I64": 8, "U64": 8,
    "F32": 4, "I32": 4, "U32": 4,
    "F16": 2, "BF16": 2, "I16": 2, "U16": 2,
    "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I8": 1, "U8": 1, "BOOL": 1,
    "F4": 0.5, "F6_E2M3": 0.75, "F6_E3M2": 0.75,
}  # fmt: skip

FLOAT_SAFETENSORS_DTYPES: Final = frozenset({"F64", "F32", "F16", "BF16"})


def dtype_name(text: str) -> str:
    """Normalise a dtype spelling (``half``, ``bf16``, ``torch.bfloat16``) to vLLM's name."""
    name = text.lower().removeprefix("torch.")
    return _ALIASES.get(name, name)


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
                hint=f"Use --kv-cache-dtype one of {', '.join(KV_CACHE_DTYPES)}.",
            )
