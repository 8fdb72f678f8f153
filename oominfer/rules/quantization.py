"""Quantization methods: the GPUs, dtypes, flags and engine each one needs.

vLLM refuses a method on a GPU below its ``get_min_capability()`` and a compute dtype
outside its ``get_supported_act_dtypes()`` (vllm/config/vllm.py ``_get_quantization_config``:
"The quantization method X is not supported for the current GPU. Minimum capability: N."
and "X is not supported for quantization method Y"); a deprecated method needs
``--allow-deprecated-quantization`` (vllm/config/model.py ``_verify_quantization``); a method
vLLM does not have is "Unknown quantization method" (the same function).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from oominfer.hardware.gpu import GpuSpec
from oominfer.model.spec import QuantSpec
from oominfer.settings import Engine

_SIXTEEN: Final = frozenset({"bfloat16", "float16"})
_SIXTEEN_ORDER: Final = ("bfloat16", "float16")


@dataclass(frozen=True, slots=True, kw_only=True)
class QuantRule:
    """What one quantization method needs to run."""

    name: str
    """The method under oominfer's and vLLM's name."""
    min_capability: tuple[int, int]
    """The GPU's compute capability at least (vLLM's get_min_capability)."""
    dtypes: frozenset[str] = _SIXTEEN
    """Compute dtypes it runs with (vLLM's get_supported_act_dtypes)."""
    engines: frozenset[Engine] = frozenset({"vllm"})
    """Engines that load it (today's releases)."""
    vllm_until: tuple[int, int] | None = None
    """The vLLM release that removed it (older releases load it: calibration replays them)."""
    flags: tuple[str, ...] = ()
    """vLLM flags it needs (the settings field is set by the planner)."""
    source: str


RULES: Final = {
    rule.name: rule
    for rule in (
        QuantRule(
            name="awq",
            min_capability=(7, 5),
            source="vllm/model_executor/layers/quantization/auto_awq.py",
        ),
        QuantRule(
            name="gptq",
            min_capability=(7, 5),
            source="vllm/model_executor/layers/quantization/auto_gptq.py declares 6.0, but 4-bit "
            "GPTQ and AutoRound (inc/inc.py) run only through Marlin, which needs 7.5 "
            "(quantization/utils/marlin_utils.py)",
        ),
        QuantRule(
            name="fp8",
            min_capability=(7, 5),
            source="vllm/model_executor/layers/quantization/fp8.py (Marlin below 8.9)",
        ),
        QuantRule(
            name="fp8_per_tensor",
            min_capability=(7, 5),
            source="vllm/model_executor/layers/quantization/online/base.py (Marlin below 8.9)",
        ),
        QuantRule(
            name="fbgemm_fp8",
            min_capability=(8, 0),
            flags=("--allow-deprecated-quantization",),
            source="vllm/model_executor/layers/quantization/fbgemm_fp8.py; "
            "vllm/model_executor/layers/quantization/__init__.py DEPRECATED_QUANTIZATION_METHODS",
        ),
        QuantRule(
            name="compressed-tensors",
            min_capability=(7, 5),
            dtypes=frozenset({"bfloat16", "float16", "float32"}),
            source="vllm/model_executor/layers/quantization/compressed_tensors/"
            "compressed_tensors.py declares 7.0; its W8A8 FP8/INT8 and WNA16 schemes need 7.5 "
            "(_check_scheme_supported)",
        ),
        QuantRule(
            name="mxfp4",
            min_capability=(8, 0),
            dtypes=frozenset({"bfloat16"}),
            source="vllm/model_executor/layers/quantization/mxfp4.py",
        ),
        QuantRule(
            name="modelopt",
            min_capability=(8, 0),
            source="vllm/model_executor/layers/quantization/modelopt.py ModelOptFp8Config",
        ),
        QuantRule(
            name="modelopt_fp4",
            min_capability=(7, 5),
            source="vllm/model_executor/layers/quantization/modelopt.py ModelOptNvFp4Config",
        ),
        QuantRule(
            name="bitsandbytes",
            min_capability=(0, 0),
            dtypes=frozenset({"bfloat16", "float16", "float32"}),
            engines=frozenset({"transformers"}),
            vllm_until=(0, 32),
            source="vllm/model_executor/layers/quantization/__init__.py QUANTIZATION_METHODS "
            "(no bitsandbytes in 0.32/0.33)",
        ),
        QuantRule(
            name="int8",
            min_capability=(0, 0),
            dtypes=frozenset({"bfloat16", "float16", "float32"}),
            engines=frozenset({"transformers"}),
            source="bitsandbytes LLM.int8 through transformers (not a vLLM method)",
        ),
    )
}
"""Every method oominfer plans, by name."""


def rule_for(method: str) -> QuantRule | None:
    """The rule of ``method`` (None for a method oominfer does not know)."""
    return RULES.get(method)


def refusal(
    method: str,
    *,
    gpu: GpuSpec,
    dtype: str,
    engine: Engine,
    device: str,
    release: tuple[int, int],
) -> str | None:
    """Why the engine (vLLM: of ``release``) refuses ``method`` here, in one sentence, or
    None when it accepts it."""
    found = refusal_and_hint(
        method, gpu=gpu, dtype=dtype, engine=engine, device=device, release=release
    )
    return found[0] if found else None


def refusal_and_hint(
    method: str,
    *,
    gpu: GpuSpec,
    dtype: str,
    engine: Engine,
    device: str,
    release: tuple[int, int],
    runnable: tuple[str, ...] = _SIXTEEN_ORDER,
) -> tuple[str, str] | None:
    """(why the engine refuses ``method`` here, what to change), or None: the one way out
    that fits the reason (another engine, GPU or dtype; ``runnable``: the dtypes the GPU and
    the model allow, rules/dtypes.py allowed_dtypes)."""
    rule = rule_for(method)
    if rule is None:
        return f"{engine} has no {method} quantization method", "Pass another --quantization."
    loads_it = engine in rule.engines or (
        engine == "vllm" and rule.vllm_until is not None and release < rule.vllm_until
    )
    if not loads_it:
        if rule.vllm_until is not None:  # a method vLLM dropped: an older release loads it
            last = f"{rule.vllm_until[0]}.{rule.vllm_until[1] - 1}"
            return (
                f"vLLM {release[0]}.{release[1]} has no {method} quantization method (Unknown "
                f"quantization method; {last} was the last release with it); the "
                "transformers engine loads it",
                f"Pass --engine transformers, or --engine-version {last} to plan for a vLLM "
                "that has it.",
            )
        return (
            f"vLLM has no {method} quantization method (Unknown quantization method); "
            "the transformers engine loads it",
            "Pass --engine transformers.",
        )
    if device == "cuda" and gpu.compute_capability < rule.min_capability:
        need = ".".join(map(str, rule.min_capability))
        have = ".".join(map(str, gpu.compute_capability))
        return (
            f"{method} needs compute capability {need}; {gpu.name} has {have}",
            f"Use a GPU of compute capability {need} or newer (oominfer gpus), or a 16-bit "
            "checkpoint of the model.",
        )
    if dtype not in rule.dtypes:
        runs = " or ".join(sorted(rule.dtypes))
        usable = [d for d in runnable if d in rule.dtypes]
        hint = (
            f"Pass --dtype {usable[0]}."
            if usable
            else f"Use a GPU that runs the model in {runs} (bfloat16: compute capability 8.0 "
            "or newer), or a checkpoint in another format."
        )
        return f"{method} does not run in {dtype} (it needs {runs})", hint
    return None


def flags_for(method: str | None) -> tuple[str, ...]:
    """The vLLM flags ``method`` needs."""
    rule = rule_for(method) if method else None
    return rule.flags if rule else ()


def checkpoint_refusal(quant: QuantSpec) -> str | None:
    """What vLLM refuses in a checkpoint's own quantization config, whatever the GPU."""
    if quant.method == "gptq" and quant.desc_act:
        return (
            "GPTQ group activation ordering (desc_act=True) is no longer supported "
            "(quantization/utils/gptq_utils.py)"
        )
    if quant.method == "gptq" and quant.bits == 4 and not quant.symmetric:
        return "4-bit GPTQ runs symmetric only: sym=False is unsupported (auto_gptq.py TYPE_MAP)"
    return None
