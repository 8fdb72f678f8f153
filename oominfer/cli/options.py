"""Every command-line option, declared once, and the records built from them.

Commands take the groups they need (``hardware_options``, ``settings_options``,
``fit_options``); an option shared by several commands is one object here, so its name,
type, validation and help cannot drift apart.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final, TypeVar, get_args

import click

from oominfer.base.errors import InvalidSettingError
from oominfer.base.units import human_readable_int, parse_size
from oominfer.edge.limits import (
    DEFAULT_MAX_BODY,
    DEFAULT_TIMEOUT_KEEP_ALIVE_S,
    DEFAULT_TIMEOUT_REQUEST_S,
    MAX_CONNECTIONS_CEILING,
    ClientLimits,
    default_max_connections,
)
from oominfer.hardware.hardware import Hardware
from oominfer.planning.constraints import PRACTICAL_CONTEXT, Constraints, Prefer
from oominfer.settings import (
    DECLARED,
    DEVICES,
    ENGINES,
    Declared,
    Device,
    EngineSettings,
    compact_json,
)
from oominfer.speed.workload import CONCURRENCY as CONCURRENCY_DEFAULT
from oominfer.speed.workload import INPUT_LEN as INPUT_LEN_DEFAULT
from oominfer.speed.workload import OUTPUT_LEN as OUTPUT_LEN_DEFAULT
from oominfer.speed.workload import Workload

F = TypeVar("F", bound=Callable[..., Any])
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
QUIET = click.option(
    "--quiet", is_flag=True, help="No progress (launches, engine phases, download bars)."
)
REVISION = click.option("--revision", help="Hub revision (forces a Hub lookup).")
ENGINE = click.option(
    "--engine", type=click.Choice(ENGINES), default="vllm", show_default=True,
    help="vllm, or oominfer's transformers server (int8/nf4, CPUs, what vLLM cannot run).",
)  # fmt: skip


def _engine_version(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """``--engine-version``: read as a release now (a clear error for what is none); a
    release newer than oominfer knows is planned by the newest one's rules, and says so."""
    if value is None:
        return None
    from oominfer.rules.versions import LATEST_VLLM, EngineVersion

    release = EngineVersion.parse(value).release
    if release > LATEST_VLLM.release:
        known = LATEST_VLLM.number
        click.echo(
            f"Warning: vLLM {value} is newer than the releases oominfer knows (up to {known}): "
            f"its memory profile and rules are taken as {known}'s.",
            err=True,
        )
    return value


ENGINE_VERSION = click.option(
    "--engine-version", metavar="X.Y", callback=_engine_version,
    help="The vLLM release to plan for: its memory profile and rules (default: the "
    "installed vLLM, else the latest release). Before 0.12 the Docker image holds less than "
    "a pip install (FlashInfer, triton_kernels): a bare number means pip; name the image, "
    "e.g. '0.10.2 docker'.",
)  # fmt: skip
AUTO: Final = -1
"""``--max-model-len auto`` (vLLM's spelling, also ``-1``): the longest context that fits."""


class Tokens(click.ParamType[int]):
    """A positive number of tokens in vLLM's forms (``8192``, ``32k`` = 32,000, ``32K`` =
    32,768: vllm/utils/argparse_utils.py human_readable_int); with ``auto`` also ``auto`` or
    ``-1`` (human_readable_int_or_auto)."""

    def __init__(self, *, auto: bool = False) -> None:
        self.auto = auto
        self.name = "TOKENS|auto" if auto else "TOKENS"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """The tokens, or AUTO."""
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if self.auto and text.lower() in ("auto", "-1"):
            return AUTO
        try:
            tokens = human_readable_int(text)
        except InvalidSettingError as err:
            self.fail(str(err), param, ctx)
        if tokens < 1:
            self.fail(f"{tokens} is not a positive number of tokens.", param, ctx)
        return tokens


class Size(click.ParamType[int]):
    """A size in bytes: ``4GiB``, ``80GB``, ``4g`` (``oominfer.base.units.parse_size``)."""

    name = "SIZE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """The bytes."""
        # parse_size's own error (with its hint) is the message, as for any bad setting.
        return value if isinstance(value, int) else parse_size(str(value))


class JsonObject(click.ParamType[str]):
    """A JSON object, as vLLM's ``json.loads`` option type reads it (``--speculative-config``,
    ``--limit-mm-per-prompt``); held as compact JSON text."""

    name = "JSON"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        """The object, re-dumped on one line."""
        try:
            parsed = json.loads(value) if isinstance(value, str) else value
        except ValueError as err:
            self.fail(f"{value!r} is not valid JSON ({err}).", param, ctx)
        if not isinstance(parsed, dict):
            self.fail(f"{value!r} is not a JSON object.", param, ctx)
        return compact_json(parsed)


class NumberChoice(click.ParamType[int]):
    """One of a closed set of integers (``--max-lora-rank``: vLLM's ``MaxLoRARanks``)."""

    def __init__(self, choices: tuple[int, ...]) -> None:
        self.choices = choices
        self.name = "[" + "|".join(map(str, choices)) + "]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        """The number, if it is one of the choices."""
        try:
            number = int(value)
        except (TypeError, ValueError):
            number = None
        if number not in self.choices:
            self.fail(f"{value!r} is not one of {', '.join(map(str, self.choices))}.", param, ctx)
        return number


def _param_type(d: Declared) -> click.ParamType[Any]:
    if d.choices and d.kind is int:
        return NumberChoice(d.choices)
    if d.choices:
        return click.Choice(d.choices)
    if d.unit == "json":
        return JsonObject()
    if d.unit == "tokens":
        return Tokens(auto=d.name == "max_model_len")
    if d.unit == "bytes":
        return Size()
    if d.kind is int:
        return POSITIVE
    low = d.above if d.above is not None else d.at_least
    return click.FloatRange(low, d.at_most, min_open=d.above is not None)


def setting_option(d: Declared, *, requirement: bool) -> Callable[[F], F]:
    """The click option of one engine setting, from its declaration.

    ``requirement`` (fit, serve MODEL): no default, so that a flag given is told from one
    left out, and the one given is a requirement; the help says the default instead.
    Otherwise (estimate) the option takes the setting's default.
    """
    names = [d.flag, *([d.short] if d.short else [])]
    if d.negatable:
        # vLLM's BooleanOptionalAction: --x / --no-x, None (vLLM decides) when neither.
        both = f"{d.flag}/--no-{d.flag[2:]}"
        return click.option(both, d.name, default=None, help=d.help)
    if d.kind is bool:
        default = None if requirement else d.default
        return click.option(*names, d.name, is_flag=True, default=default, help=d.help)
    if requirement or d.default is None:
        return click.option(*names, d.name, type=_param_type(d), help=d.help)
    return click.option(*names, d.name, type=_param_type(d), default=d.default,
                        show_default=True, help=d.help)  # fmt: skip


def engine_setting_options(*, requirement: bool) -> Callable[[F], F]:
    """Every engine setting offered on the command line, in declaration order."""
    chosen = [setting_option(d, requirement=requirement) for d in DECLARED if d.on_command_line]
    return _compose(*chosen)


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
NUM_PROMPTS = click.option(
    "--num-prompts", type=POSITIVE,
    help="Predict a benchmark run of this many requests, --concurrency of them in flight at "
    "most (vllm bench serve --num-prompts/--max-concurrency; all at once when --concurrency "
    "is at least this): tokens/s over the whole run, its start and its drain included. "
    "Default: the steady state of --concurrency clients.",
)  # fmt: skip
SPEED_CONCURRENCY = click.option(
    "--concurrency", type=POSITIVE, default=CONCURRENCY_DEFAULT, show_default=True,
    help="Requests sent at once, for the predicted speed; vLLM runs at most max_num_seqs "
    "and what the KV cache holds, the rest wait.",
)  # fmt: skip

hardware_options = _compose(
    click.option(
        "--gpu", metavar="NAME",
        help="GPU kind (see `oominfer gpus`); default: the detected GPU, else L4.",
    ),
    click.option(
        "--gpus", type=POSITIVE,
        help="GPUs of this kind (default: 1, or all detected; on estimate with --gpu, as many "
        "as -tp x -pp x -dp use).",
    ),
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
    engine_setting_options(requirement=False),
    ENGINE_VERSION,
    INPUT_LEN,
    OUTPUT_LEN,
    SPEED_CONCURRENCY,
    NUM_PROMPTS,
)
"""The engine flags of `estimate`, under vLLM's names and with vLLM's defaults."""

fit_options = _compose(
    hardware_options,
    ENGINE,
    engine_setting_options(requirement=True),
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
    click.option("--no-quantize", is_flag=True, help="Never quantize the weights."),
    click.option("--allow-offload", is_flag=True, help="Allow CPU offload of weights (slow)."),
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
    click.option(
        "--max-launches", type=click.IntRange(1, 10), default=3, show_default=True,
        help="The most engine launches verification may spend correcting the plan.",
    ),
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


edge_options = _compose(
    click.option("--max-connections", type=POSITIVE,
                 help="Open connections at most: a new one closes the longest-idle one, or gets "
                 "503 when every connection has a request in progress [default: what the "
                 f"open-file limit leaves, at most {MAX_CONNECTIONS_CEILING}]."),
    click.option("--timeout-request", type=click.FloatRange(min=0, min_open=True),
                 default=DEFAULT_TIMEOUT_REQUEST_S, show_default=True,
                 help="Seconds a client has to send a whole request once it starts; a slower "
                 "one gets 408."),
    click.option("--timeout-keep-alive", type=POSITIVE, default=DEFAULT_TIMEOUT_KEEP_ALIVE_S,
                 show_default=True,
                 help="Close a connection with no request in progress after this many seconds."),
    click.option("--max-body-size", default=DEFAULT_MAX_BODY, show_default=True,
                 help="Largest request body; a larger one gets 413."),
)  # fmt: skip
"""What clients of the public port may hold and send (``oominfer.edge``)."""


def pop_client_limits(opts: dict[str, Any]) -> ClientLimits:
    """The edge's limits from ``edge_options``, taken out of ``opts``.

    Raises:
        InvalidSettingError: --max-body-size is not a size.
    """
    return ClientLimits(
        max_connections=opts.pop("max_connections") or default_max_connections(),
        timeout_request_s=opts.pop("timeout_request"),
        timeout_keep_alive_s=opts.pop("timeout_keep_alive"),
        max_body_bytes=parse_size(opts.pop("max_body_size")),
    )


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
        memory = opts.get("memory")
        return Hardware.cpu(parse_size(memory) if memory else None)
    if opts.get("memory"):
        raise InvalidSettingError("--memory is for --device cpu; GPUs take --gpu-memory.")
    if gpu and gpu_memory:
        raise InvalidSettingError("pass either --gpu or --gpu-memory, not both.")
    if gpu_memory:
        return Hardware.custom(parse_size(gpu_memory), gpus or 1)
    if gpu:
        return Hardware.from_gpu(gpu, gpus or 1)
    return Hardware.detect(gpus, default="L4")


SIZE_ANY_ENGINE: Final = ("gpu_memory_utilization",)
"""vLLM settings that still size a plan on the other engine: the share of the GPU it may use
(oominfer's budget for the transformers server, which takes no such flag itself)."""


def refuse_other_engine_flags(opts: dict[str, Any]) -> None:
    """Refuse the settings the user typed that the chosen engine does not take: a plan
    that silently dropped them would not be the one asked for.

    Raises:
        InvalidSettingError: the transformers engine with tensor parallelism, an FP8 KV
            cache, eager mode or another setting only vLLM takes.
    """
    ctx = click.get_current_context(silent=True)
    engine = opts.get("engine") or "vllm"
    if ctx is None:
        return
    typed = [
        d.flag
        for d in DECLARED
        if d.on_command_line
        and engine not in d.engines
        and d.name not in SIZE_ANY_ENGINE
        and ctx.get_parameter_source(d.name)
        in (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    ]
    if typed:
        named = ", ".join(typed)
        which = "is a vLLM setting" if len(typed) == 1 else "are vLLM settings"
        raise InvalidSettingError(
            f"{named} {which} that the {engine} engine does not take (one GPU per replica, "
            "its cache in the model's dtype, no CUDA graphs, LoRA or drafts).",
            hint=f"Drop {named}, or pass --engine vllm.",
        )


def build_settings(opts: dict[str, Any]) -> EngineSettings:
    """EngineSettings from the engine flags (the dataclass validates them); ``auto`` leaves
    the context to the caller."""
    refuse_other_engine_flags(opts)
    given = {d.name: opts.get(d.name) for d in DECLARED if d.on_command_line}
    if given.get("max_model_len") == AUTO:
        given["max_model_len"] = None
    return EngineSettings(**{name: value for name, value in given.items() if value is not None})


REQUIREMENT_FIELDS: Final = ("dtype", "max_model_len", "gpu_memory_utilization",
                             "kv_cache_memory_bytes")  # fmt: skip
"""Engine settings that Constraints holds as fields of their own; the others given go to
``Constraints.requested``."""


def requested_settings(opts: dict[str, Any]) -> dict[str, Any]:
    """The engine settings the user named on fit's command line (each a requirement)."""
    return {
        d.name: opts[d.name]
        for d in DECLARED
        if d.on_command_line and opts.get(d.name) is not None and d.name not in REQUIREMENT_FIELDS
    }


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


def _check_asked_lengths(opts: dict[str, Any]) -> None:
    """Refuse a typical request the user named longer than the --max-model-len they named:
    vLLM refuses such a request, so no plan could serve the concurrency counted in it.
    Defaults alone are not refused (the speed model cuts the default prompt to fit)."""
    context = _context(opts)
    given_in, given_out = opts.get("input_len"), opts.get("output_len")
    asked = opts.get("typical_length") or (given_in or 0) + (given_out or 0)
    if context is not None and asked > context:
        named = (
            f"--typical-length {asked:,}"
            if opts.get("typical_length")
            else " + ".join(
                f"{flag} {value:,}"
                for flag, value in (("--input-len", given_in), ("--output-len", given_out))
                if value is not None
            )
        )
        raise InvalidSettingError(
            f"{named} asks for requests of {asked:,} tokens, longer than --max-model-len "
            f"{context:,}: vLLM refuses them.",
            hint=f"Pass --max-model-len {asked} or more (or auto), or shorter lengths.",
        )


def build_constraints(opts: dict[str, Any]) -> Constraints:
    """Constraints from the fit flags (the dataclass validates them)."""
    refuse_other_engine_flags(opts)
    _check_asked_lengths(opts)
    input_len, output_len = lengths(opts)
    typical = opts.get("typical_length") or input_len + output_len
    return Constraints(
        engine=opts["engine"],
        dtype=opts.get("dtype") or "auto",
        prefer=opts["prefer"],
        min_context=opts.get("min_context"),
        typical_length=typical,
        input_len=input_len,
        output_len=output_len,
        max_tpot=opts.get("max_tpot"),
        max_ttft=opts.get("max_ttft"),
        concurrency=opts.get("concurrency"),
        max_model_len=_context(opts),
        requested=requested_settings(opts),
        no_quantize=opts["no_quantize"],
        allow_offload=opts["allow_offload"],
        gpu_memory_utilization=opts.get("gpu_memory_utilization"),
        kv_cache_memory_bytes=opts.get("kv_cache_memory_bytes"),
        gpus_per_node=opts["gpus_per_node"],
        engine_version=opts.get("engine_version"),
    )
