"""Every command-line option, declared once, and the records built from them.

Commands take the groups they need (``hardware_options``, ``settings_options``,
``fit_options``); an option shared by several commands is one object here, so its name,
type, validation and help cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, TypeVar, get_args

import click

from oominfer.base.errors import InvalidSettingError
from oominfer.base.units import parse_size
from oominfer.hardware.hardware import Hardware
from oominfer.planning.constraints import PRACTICAL_CONTEXT, Constraints, Prefer
from oominfer.settings import (
    DEVICES,
    ENGINES,
    Device,
    Dtype,
    KvCacheDtype,
    Quantization,
    VllmSettings,
)
from oominfer.speed.workload import CONCURRENCY as CONCURRENCY_DEFAULT
from oominfer.speed.workload import INPUT_LEN as INPUT_LEN_DEFAULT
from oominfer.speed.workload import OUTPUT_LEN as OUTPUT_LEN_DEFAULT
from oominfer.speed.workload import Workload

F = TypeVar("F", bound=Callable[..., Any])
DEFAULTS = VllmSettings()
DEFAULT_CONSTRAINTS = Constraints()
POSITIVE = click.IntRange(min=1)


def _compose(*options: Callable[[F], F]) -> Callable[[F], F]:
    """One decorator applying ``options`` in the order written (first = first in --help)."""

    def apply(f: F) -> F:
        for option in reversed(options):
            f = option(f)
        return f

    return apply


# Shared by several commands.
JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
REVISION = click.option("--revision", help="Hub revision (forces a Hub lookup).")
ENGINE = click.option(
    "--engine", type=click.Choice(ENGINES), default="vllm", show_default=True,
    help="vllm, or oominfer's transformers server (int8/nf4, CPUs, what vLLM cannot run).",
)  # fmt: skip
DTYPE = click.option(
    "--dtype", type=click.Choice(get_args(Dtype)), default=DEFAULTS.dtype, show_default=True,
    help="auto: the checkpoint's 16-bit dtype the GPU can run.",
)  # fmt: skip
AUTO: Final = -1
"""``--max-model-len auto`` (vLLM's spelling, also ``-1``): the longest context that fits."""


class ContextLength(click.ParamType[int]):
    """A positive number of tokens, or ``auto`` / ``-1`` as vLLM accepts them
    (vllm/utils/argparse_utils.py human_readable_int_or_auto)."""

    name = "TOKENS|auto"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """The tokens, or AUTO."""
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text in ("auto", "-1"):
            return AUTO
        try:
            tokens = int(text)
        except ValueError:
            self.fail(f"{value!r} is not a number of tokens or 'auto'.", param, ctx)
        if tokens < 1:
            self.fail(f"{tokens} is not a positive number of tokens.", param, ctx)
        return tokens


MAX_MODEL_LEN = click.option(
    "--max-model-len", type=ContextLength(),
    help="Context (prompt + output) per request, or auto. estimate: the setting (default: "
    "from config.json; auto: the longest that fits); fit: a cap on the context (auto: none).",
)  # fmt: skip
GPU_MEMORY_UTILIZATION = click.option(
    "--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True),
    help=f"Fraction of the GPU vLLM may use (default: vLLM's {DEFAULTS.gpu_memory_utilization}).",
)  # fmt: skip
ENGINE_VERSION = click.option(
    "--engine-version", metavar="X.Y",
    help="The vLLM release to plan for: its memory profile and rules (default: the "
    "installed vLLM, else the latest release).",
)  # fmt: skip
INPUT_LEN = click.option(
    "--input-len", type=POSITIVE,
    help=f"Prompt tokens of a typical request, for the predicted speed (default: "
    f"{INPUT_LEN_DEFAULT:,}; fit: with --output-len, the --typical-length).",
)  # fmt: skip
OUTPUT_LEN = click.option(
    "--output-len", type=POSITIVE,
    help=f"Generated tokens of a typical request, for the predicted speed (default: "
    f"{OUTPUT_LEN_DEFAULT:,}).",
)  # fmt: skip
SPEED_CONCURRENCY = click.option(
    "--concurrency", type=POSITIVE, default=CONCURRENCY_DEFAULT, show_default=True,
    help="Requests sent at once, for the predicted speed; vLLM runs at most max_num_seqs "
    "and what the KV cache holds, the rest wait.",
)  # fmt: skip
KV_CACHE_MEMORY_BYTES = click.option(
    "--kv-cache-memory-bytes", metavar="SIZE",
    help="Fix the KV-cache size instead of deriving it (e.g. 4GiB).",
)  # fmt: skip

hardware_options = _compose(
    click.option(
        "--gpu", metavar="NAME",
        help="GPU kind (see `oominfer gpus`); default: the detected GPU, else L4.",
    ),
    click.option("--gpus", type=POSITIVE, help="GPUs of this kind (default: 1, or all detected)."),
    click.option(
        "--gpu-memory", metavar="SIZE", help="GPU memory for a GPU not in the catalog, e.g. 24GiB."
    ),
    click.option(
        "--device", type=click.Choice(DEVICES),
        help="cuda (GPUs) or cpu (vLLM's CPU backend). Default: cpu with --memory.",
    ),
    click.option("--memory", metavar="SIZE", help="CPU serving: memory the engine may use."),
)  # fmt: skip
"""--gpu, --gpus, --gpu-memory, --device, --memory."""

settings_options = _compose(
    ENGINE,
    DTYPE,
    click.option("--quantization", "-q", type=click.Choice(get_args(Quantization))),
    click.option(
        "--kv-cache-dtype", type=click.Choice(get_args(KvCacheDtype)),
        default=DEFAULTS.kv_cache_dtype, show_default=True,
    ),
    GPU_MEMORY_UTILIZATION,
    MAX_MODEL_LEN,
    click.option("--max-num-seqs", type=POSITIVE, help="Default: vLLM's for the GPU."),
    click.option("--max-num-batched-tokens", type=POSITIVE, help="Default: vLLM's for the GPU."),
    click.option("--enforce-eager", is_flag=True, default=DEFAULTS.enforce_eager),
    click.option(
        "--tensor-parallel-size", "-tp", type=POSITIVE,
        default=DEFAULTS.tensor_parallel_size, show_default=True,
    ),
    click.option(
        "--pipeline-parallel-size", "-pp", type=POSITIVE,
        default=DEFAULTS.pipeline_parallel_size, show_default=True,
    ),
    click.option(
        "--cpu-offload-gb", type=click.FloatRange(min=0),
        default=DEFAULTS.cpu_offload_gb, show_default=True,
    ),
    KV_CACHE_MEMORY_BYTES,
    ENGINE_VERSION,
    INPUT_LEN,
    OUTPUT_LEN,
    SPEED_CONCURRENCY,
)  # fmt: skip
"""The engine flags of `estimate`, under vLLM's names and with vLLM's defaults."""

fit_options = _compose(
    hardware_options,
    ENGINE,
    DTYPE,
    click.option(
        "--prefer", type=click.Choice(get_args(Prefer)), default=DEFAULT_CONSTRAINTS.prefer,
        show_default=True,
        help="balanced: vLLM's defaults when they fit, else a practical context before "
        "quality or speed; context: the longest context, any lever; throughput: the most "
        "predicted output tokens/s for --input-len/--output-len requests (at --concurrency, "
        "else as many as fit); quality: no quantization, a shorter context instead.",
    ),
    click.option(
        "--min-context", type=POSITIVE,
        help=f"The shortest context acceptable (default: {PRACTICAL_CONTEXT:,} tokens, given "
        "up only when nothing else fits).",
    ),
    click.option(
        "--typical-length", type=POSITIVE,
        help="Tokens (prompt + output) of a typical request: concurrency is counted in these "
        f"(default: --input-len + --output-len, {DEFAULT_CONSTRAINTS.typical_length:,}; given "
        "alone, it is split between them in their default ratio).",
    ),
    INPUT_LEN,
    OUTPUT_LEN,
    click.option(
        "--concurrency", type=POSITIVE,
        help="Requests of --typical-length that must run at once.",
    ),
    click.option(
        "--max-tpot", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
        help="Latency requirement: the fastest plan whose predicted time per output token "
        "is at most this (exit 3 when none is).",
    ),
    click.option(
        "--max-ttft", type=click.FloatRange(min=0, min_open=True), metavar="SECONDS",
        help="Latency requirement: the fastest plan whose predicted time to first token is "
        "at most this (exit 3 when none is).",
    ),
    MAX_MODEL_LEN,
    click.option("--no-quantize", is_flag=True, help="Never quantize the weights."),
    click.option("--allow-offload", is_flag=True, help="Allow CPU offload of weights (slow)."),
    GPU_MEMORY_UTILIZATION,
    KV_CACHE_MEMORY_BYTES,
    ENGINE_VERSION,
    click.option(
        "--verify/--no-verify", default=None,
        help="Prove the plan with the real engine (default: when one is installed).",
    ),
    click.option(
        "--no-estimate", is_flag=True,
        help="Launch at the requested context and let the engine's messages guide.",
    ),
    click.option("--no-cache", is_flag=True, help="Ignore verified plans cached earlier."),
    click.option("--max-launches", type=click.IntRange(1, 10), default=3, show_default=True),
    click.option(
        "--timeout", type=click.FloatRange(min=1), default=900.0, show_default=True,
        help="Seconds one launch may take to become ready.",
    ),
    click.option(
        "--gpus-per-node", type=POSITIVE, default=DEFAULT_CONSTRAINTS.gpus_per_node,
        show_default=True,
        help="Tensor parallel stays within a node; pipeline stages span nodes.",
    ),
    REVISION,
)  # fmt: skip
"""The flags of `oominfer fit` (also taken by `oominfer serve MODEL`)."""


def _size(text: str | None) -> int | None:
    return parse_size(text) if text else None


def _context(opts: dict[str, Any]) -> int | None:
    """--max-model-len as a number, None for none or auto."""
    value = opts.get("max_model_len")
    return None if value in (None, AUTO) else int(value)


def device_of(opts: dict[str, Any]) -> Device:
    """The device the flags ask for: --device, else cpu with --memory, else cuda."""
    device: Device = opts.get("device") or ("cpu" if opts.get("memory") else "cuda")
    return device


def build_hardware(opts: dict[str, Any]) -> Hardware:
    """Hardware from --gpu/--gpus/--gpu-memory or --device cpu/--memory; else the detected
    GPUs, else an L4."""
    gpu, gpus, gpu_memory = opts.get("gpu"), opts.get("gpus"), opts.get("gpu_memory")
    if device_of(opts) == "cpu":
        if gpu or gpu_memory:
            raise InvalidSettingError("--device cpu takes --memory, not --gpu/--gpu-memory.")
        return Hardware.cpu(_size(opts.get("memory")))
    if opts.get("memory"):
        raise InvalidSettingError("--memory is for --device cpu; GPUs take --gpu-memory.")
    if gpu and gpu_memory:
        raise InvalidSettingError("pass either --gpu or --gpu-memory, not both.")
    if gpu_memory:
        return Hardware.custom(parse_size(gpu_memory), gpus or 1)
    if gpu:
        return Hardware.from_gpu(gpu, gpus or 1)
    return Hardware.detect(gpus, default="L4")


def build_settings(opts: dict[str, Any]) -> VllmSettings:
    """VllmSettings from the engine flags (the dataclass validates them)."""
    return VllmSettings(
        dtype=opts["dtype"],
        quantization=opts.get("quantization"),
        kv_cache_dtype=opts["kv_cache_dtype"],
        gpu_memory_utilization=opts.get("gpu_memory_utilization")
        or DEFAULTS.gpu_memory_utilization,
        max_model_len=_context(opts),
        max_num_seqs=opts.get("max_num_seqs"),
        max_num_batched_tokens=opts.get("max_num_batched_tokens"),
        enforce_eager=opts["enforce_eager"],
        tensor_parallel_size=opts["tensor_parallel_size"],
        pipeline_parallel_size=opts["pipeline_parallel_size"],
        cpu_offload_gb=opts["cpu_offload_gb"],
        kv_cache_memory_bytes=_size(opts.get("kv_cache_memory_bytes")),
    )


def lengths(opts: dict[str, Any]) -> tuple[int, int]:
    """Prompt and output tokens from --input-len/--output-len, and on fit --typical-length
    (their sum: given alone, split in the defaults' ratio; given with both, it must agree)."""
    given_in, given_out = opts.get("input_len"), opts.get("output_len")
    typical = opts.get("typical_length")
    if (
        typical is not None
        and given_in is not None
        and given_out is not None
        and given_in + given_out != typical
    ):
        raise InvalidSettingError(
            f"--typical-length {typical} is not --input-len {given_in} + --output-len {given_out}.",
            hint="Pass --typical-length alone, or --input-len and --output-len.",
        )
    if typical is not None:
        if given_in is not None:
            return given_in, max(typical - given_in, 1)
        if given_out is not None:
            return max(typical - given_out, 1), given_out
        share = OUTPUT_LEN_DEFAULT / (INPUT_LEN_DEFAULT + OUTPUT_LEN_DEFAULT)
        out = max(round(typical * share), 1)
        return max(typical - out, 1), out
    return given_in or INPUT_LEN_DEFAULT, given_out or OUTPUT_LEN_DEFAULT


def build_workload(opts: dict[str, Any]) -> Workload:
    """The requests `estimate` predicts the speed of."""
    input_len, output_len = lengths(opts)
    return Workload(input_len=input_len, output_len=output_len, concurrency=opts["concurrency"])


def build_constraints(opts: dict[str, Any]) -> Constraints:
    """Constraints from the fit flags (the dataclass validates them)."""
    input_len, output_len = lengths(opts)
    typical = opts.get("typical_length") or input_len + output_len
    return Constraints(
        engine=opts["engine"],
        dtype=opts["dtype"],
        prefer=opts["prefer"],
        min_context=opts.get("min_context"),
        typical_length=typical,
        input_len=input_len,
        output_len=output_len,
        max_tpot=opts.get("max_tpot"),
        max_ttft=opts.get("max_ttft"),
        concurrency=opts.get("concurrency"),
        max_model_len=_context(opts),
        no_quantize=opts["no_quantize"],
        allow_offload=opts["allow_offload"],
        gpu_memory_utilization=opts.get("gpu_memory_utilization"),
        kv_cache_memory_bytes=_size(opts.get("kv_cache_memory_bytes")),
        gpus_per_node=opts["gpus_per_node"],
        engine_version=opts.get("engine_version"),
    )
