"""What the engine is told: each setting declared once, under vLLM's name.

``EngineSettings`` is the one declaration of every engine setting: its name (vLLM's engine
argument), type, default, help, the engines and vLLM releases that take it, and how it
renders on a command line. Everything else derives from it, as vLLM's ``EngineArgs`` fields
feed its ``get_kwargs``: the click options of ``estimate`` and ``fit``
(``oominfer.cli.options``), the engine's argv (``engine_args``), the transformers server's
flags, the plan JSON (the fields by name) and the Kubernetes args (rendered from the plan).
Messages name a flag with ``flag("max_num_seqs")``, never by spelling it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Final, Literal, get_args

from oominfer.base.errors import InvalidSettingError

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

DTYPES: Final = get_args(Dtype)
KV_CACHE_DTYPES: Final = get_args(KvCacheDtype)
QUANTIZATIONS: Final = get_args(Quantization)

_ALIASES: Final = {
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "float": "float32",
    "fp32": "float32",
    "f16": "float16",
    "f32": "float32",
}


def dtype_name(text: str) -> str:
    """Normalise a dtype spelling (``half``, ``bf16``, ``torch.bfloat16``) to vLLM's name."""
    name = text.lower().removeprefix("torch.")
    return _ALIASES.get(name, name)


ExecutorBackend = Literal["ray", "mp"]
"""vLLM's --distributed-executor-backend choices oominfer plans."""
Engine = Literal["vllm", "transformers"]
"""vLLM (paged KV cache, CUDA graphs) or oominfer's own transformers server."""
Device = Literal["cuda", "cpu"]
"""GPUs (CUDA), or the host's CPU and memory (vLLM's CPU backend, or transformers)."""

ENGINES: Final = get_args(Engine)
DEVICES: Final = get_args(Device)

TRANSFORMERS_ONLY: Final = frozenset({"bitsandbytes", "int8"})
"""In-flight bitsandbytes quantization: vLLM 0.32 has no loader for it (transformers only)."""

Unit = Literal["tokens", "bytes", "json"]
"""How a value is read from the command line: tokens take vLLM's ``32k``/``auto`` forms,
bytes take sizes such as ``4GiB``, json a JSON object as vLLM's ``json.loads`` takes it (held
as compact JSON text, so that settings stay hashable)."""

MaxLoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
"""vLLM's ``MaxLoRARanks`` (vllm/config/lora.py): the ranks ``--max-lora-rank`` accepts."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Declared:
    """One engine setting as declared on ``EngineSettings``: everything a command line, a
    plan or a manifest needs to know about it."""

    name: str
    """The field, and vLLM's engine-argument name (``max_num_seqs``)."""
    help: str
    default: Any
    kind: type
    """``int``, ``float``, ``bool`` or ``str`` (the value without ``None``)."""
    optional: bool
    """None is a value: the engine then derives the setting itself."""
    choices: tuple[Any, ...] = ()
    short: str | None = None
    """A short flag vLLM also takes (``-tp``)."""
    engines: tuple[Engine, ...] = ENGINES
    """The engines that take the setting on their command line."""
    since: tuple[int, int] | None = None
    """The first vLLM release with the flag (None: every release oominfer plans for)."""
    unit: Unit | None = None
    always: bool = False
    """Rendered even at its default (vLLM's default differs from oominfer's, or the reader
    of a pod spec should see it)."""
    above: float | None = None
    at_least: float | None = None
    at_most: float | None = None
    """Bounds of a number (``above`` excludes its bound)."""
    not_for_vllm: frozenset[str] = frozenset()
    """Values that vLLM has no flag value for (they load through another engine)."""
    on_command_line: bool = True
    """Offered as an option of ``estimate`` and ``fit``."""
    negatable: bool = False
    """A flag vLLM takes as ``--x/--no-x`` (argparse BooleanOptionalAction) whose default it
    decides itself (None): True renders ``--x``, False ``--no-x``."""

    @property
    def flag(self) -> str:
        """The long flag, as vLLM spells it."""
        return "--" + self.name.replace("_", "-")

    def rendered(self, value: Any, engine: Engine) -> list[str]:
        """This setting's tokens on ``engine``'s command line (none when left to the engine)."""
        if engine not in self.engines or value is None:
            return []
        if value is False:
            return ["--no-" + self.flag[2:]] if self.negatable else []
        if engine == "vllm" and value in self.not_for_vllm:
            return []
        if value == self.default and not self.always:
            return []
        if value is True:
            return [self.flag]
        return [self.flag, f"{value:g}" if isinstance(value, float) else str(value)]


def setting(default: Any, help: str, **declared: Any) -> Any:
    """A field of ``EngineSettings`` with its declaration (see ``Declared``)."""
    return field(default=default, metadata={"help": help, **declared})


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSettings:
    """The settings an engine serves with, for vLLM and the transformers engine alike.
    Field names are vLLM's engine arguments; each field is the setting's one declaration."""

    dtype: Dtype = setting(
        "auto", "Compute dtype; auto: the checkpoint's 16-bit dtype the GPU can run (bf16 falls "
        "back to fp16 below compute capability 8.0).", always=True,
    )  # fmt: skip
    quantization: Quantization | None = setting(
        None, "Weight quantization (default: the checkpoint's own format); bitsandbytes (NF4) "
        "and int8 load through the transformers engine.", short="-q",
        not_for_vllm=TRANSFORMERS_ONLY,
    )  # fmt: skip
    kv_cache_dtype: KvCacheDtype = setting(
        "auto", "KV-cache element type; auto: the model's dtype (from vLLM 0.14, FP8 where a "
        "ModelOpt checkpoint names it), fp8: half the bytes per token.",
        engines=("vllm",),
    )  # fmt: skip
    gpu_memory_utilization: float = setting(
        0.92, "Fraction of the GPU's memory vLLM may claim, in (0, 1] (vLLM's default: 0.92; "
        "0.9 before vLLM 0.20).",
        engines=("vllm",), always=True, above=0, at_most=1,
    )  # fmt: skip
    max_model_len: int | None = setting(
        None, "Context (prompt + output) per request, in tokens (32k = 32,000, 32K = 32,768) or "
        "auto: the longest that fits. Default: from config.json.", unit="tokens",
    )  # fmt: skip
    max_num_seqs: int | None = setting(
        None, "Requests scheduled at once (default: vLLM's for the GPU).",
    )  # fmt: skip
    max_num_batched_tokens: int | None = setting(
        None, "Tokens per scheduler step, the prefill chunk (default: vLLM's for the GPU).",
        engines=("vllm",), unit="tokens",
    )  # fmt: skip
    enforce_eager: bool = setting(
        False, "No CUDA graphs: frees their memory, costs decode speed.", engines=("vllm",),
    )  # fmt: skip
    tensor_parallel_size: int = setting(
        1, "GPUs one layer is split over (inside a node).", short="-tp", engines=("vllm",),
    )  # fmt: skip
    pipeline_parallel_size: int = setting(
        1, "Pipeline stages, the layers split across GPUs or nodes.", short="-pp",
        engines=("vllm",),
    )  # fmt: skip
    cpu_offload_gb: float = setting(
        0, "GiB of weights per GPU kept in host memory and streamed in each forward pass.",
        engines=("vllm",), at_least=0,
    )  # fmt: skip
    kv_cache_memory_bytes: int | None = setting(
        None, "A fixed KV-cache size instead of one derived from the memory utilization "
        "(e.g. 4GiB).", engines=("vllm",), unit="bytes", since=(0, 11),
    )  # fmt: skip
    distributed_executor_backend: ExecutorBackend | None = setting(
        None, "ray for a replica spanning nodes (vLLM refuses a world size larger than the "
        "GPUs it sees otherwise); default: vLLM's choice inside a node.", engines=("vllm",),
        on_command_line=False,
    )  # fmt: skip
    speculative_config: str | None = setting(
        None, 'Speculative decoding, as vLLM takes it: a JSON object such as {"model": '
        '"meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 4} (method: draft_model, '
        "eagle, eagle3, mtp, ngram, ...); the draft's weights, KV cache and graphs are counted.",
        engines=("vllm",), unit="json", since=(0, 8),
    )  # fmt: skip
    enable_lora: bool = setting(
        False, "Serve LoRA adapters: max_loras slots of max_lora_rank are held on every GPU.",
        engines=("vllm",),
    )  # fmt: skip
    max_loras: int = setting(
        1, "LoRA adapters in one batch (GPU slots; vLLM's default 1).", engines=("vllm",),
    )  # fmt: skip
    max_lora_rank: MaxLoraRank = setting(
        16, "The largest LoRA rank served (vLLM's choices; default 16).", engines=("vllm",),
    )  # fmt: skip
    max_cpu_loras: int | None = setting(
        None, "LoRA adapters cached in host memory (default: max_loras; at least max_loras).",
        engines=("vllm",),
    )  # fmt: skip
    limit_mm_per_prompt: str | None = setting(
        None, 'Multimodal items per prompt, as vLLM takes it: a JSON object such as {"image": 2, '
        '"video": 0} (default: vLLM\'s 999 each); 0 everywhere skips the encoder cache.',
        engines=("vllm",), unit="json", since=(0, 9),
    )  # fmt: skip
    hf_overrides: str | None = setting(
        None, "Changes to the model's config.json, as vLLM takes them: a JSON object. "
        "Extend the context of a model made for RoPE scaling, as Qwen3's YaRN (the model "
        'card\'s values; rope_parameters replaces the whole section): {"rope_parameters": '
        '{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, '
        '"rope_theta": 1000000}, "max_position_embeddings": 131072}. oominfer models '
        "max_position_embeddings, rope_scaling and rope_parameters.",
        unit="json", since=(0, 7),
    )  # fmt: skip
    enable_prefix_caching: bool | None = setting(
        None, "Share the KV blocks of a common prompt prefix between requests (vLLM's default: "
        "on for most models). More requests fit when prompts share a prefix; off, a hybrid "
        "(Mamba) model keeps one state block per request instead of two or three.",
        engines=("vllm",), negatable=True,
    )  # fmt: skip
    enable_expert_parallel: bool = setting(
        False, "MoE: whole experts split across the tensor x data parallel GPUs instead of "
        "each expert sliced by tensor parallel.", engines=("vllm",), since=(0, 8),
    )  # fmt: skip
    data_parallel_size: int = setting(
        1, "Engine replicas inside one vLLM server (each its own KV cache and batch); GPUs = "
        "tensor x pipeline x data parallel.", short="-dp", engines=("vllm",), since=(0, 8),
    )  # fmt: skip
    allow_deprecated_quantization: bool = setting(
        False, "Load a checkpoint whose quantization method vLLM deprecated (fbgemm_fp8).",
        engines=("vllm",), on_command_line=False,
    )  # fmt: skip

    def __post_init__(self) -> None:
        """Reject settings vLLM would reject, with the flag to change."""
        for d in DECLARED:
            value = getattr(self, d.name)
            if d.choices and value is not None and value not in d.choices:
                raise InvalidSettingError(
                    f"unknown {d.flag} {value!r}.",
                    hint=f"Choose one of: {', '.join(map(str, d.choices))}.",
                )
            if d.kind is int and value is not None and value < 1:
                raise InvalidSettingError(f"{d.flag} must be a positive integer, got {value}.")
            if isinstance(value, float | int) and not isinstance(value, bool):
                _check_bounds(d, value)
        if self.max_cpu_loras is not None and self.max_cpu_loras < self.max_loras:
            raise InvalidSettingError(
                f"{flag('max_cpu_loras')} {self.max_cpu_loras} is below {flag('max_loras')} "
                f"{self.max_loras}: vLLM needs a host slot for every adapter on the GPU.",
                hint=f"Use {flag('max_cpu_loras')} {self.max_loras} or more.",
            )
        for name in ("speculative_config", "limit_mm_per_prompt", "hf_overrides"):
            json_object(name, getattr(self, name))
        if (
            self.max_num_seqs is not None
            and self.max_num_batched_tokens is not None
            and self.max_num_batched_tokens < self.max_num_seqs
        ):
            raise InvalidSettingError(
                f"{flag('max_num_batched_tokens')} {self.max_num_batched_tokens} is below "
                f"{flag('max_num_seqs')} {self.max_num_seqs}: vLLM needs a step to hold a token "
                "of every running sequence.",
                hint=f"Use {flag('max_num_batched_tokens')} {self.max_num_seqs} or more.",
            )

    @property
    def world_size(self) -> int:
        """GPUs one replica (one vLLM server) uses: tensor x pipeline x data parallel."""
        return self.tensor_parallel_size * self.pipeline_parallel_size * self.data_parallel_size

    @property
    def model_world_size(self) -> int:
        """GPUs one copy of the model spans (vLLM's ``ParallelConfig.world_size``)."""
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def speculative(self) -> dict[str, Any]:
        """``speculative_config`` as a dict (empty: no speculative decoding)."""
        return json_object("speculative_config", self.speculative_config)

    @property
    def mm_limits(self) -> dict[str, Any]:
        """``limit_mm_per_prompt`` as a dict (empty: vLLM's defaults)."""
        return json_object("limit_mm_per_prompt", self.limit_mm_per_prompt)


def json_object(name: str, text: str | None) -> dict[str, Any]:
    """The JSON object a ``unit="json"`` setting holds (empty for None).

    Raises:
        InvalidSettingError: text that is not a JSON object, as vLLM's ``json.loads`` would.
    """
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as err:
        raise InvalidSettingError(
            f"{flag(name)} is not valid JSON: {err}.",
            hint=f"""Quote the object for the shell: {flag(name)} '{{"key": 1}}'.""",
        ) from None
    if not isinstance(value, dict):
        raise InvalidSettingError(f"{flag(name)} must be a JSON object, got {text}.")
    return value


def compact_json(value: Any) -> str:
    """A JSON value as the one-line text a setting holds and vLLM's command line takes."""
    return json.dumps(value, separators=(", ", ": "))


def _check_bounds(d: Declared, value: float) -> None:
    """Refuse a number outside its declared bounds, naming them."""
    low_ok = (d.above is None or value > d.above) and (d.at_least is None or value >= d.at_least)
    if low_ok and (d.at_most is None or value <= d.at_most):
        return
    low = f"({d.above:g}" if d.above is not None else f"[{d.at_least or 0:g}"
    high = f"{d.at_most:g}]" if d.at_most is not None else "inf)"
    raise InvalidSettingError(
        f"{d.flag} must be in {low}, {high}, got {value:g}.",
        hint=f"Try {d.flag} {d.default:g} (the default).",
    )


def _declare(f: dataclasses.Field[Any], hint: Any) -> Declared:
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    args = [a for a in get_args(hint) if a is not type(None)] if union else [hint]
    optional = union and len(args) < len(get_args(hint))
    inner = args[0]
    choices = tuple(get_args(inner)) if typing.get_origin(inner) is Literal else ()
    kind = type(choices[0]) if choices else inner
    return Declared(
        name=f.name, default=f.default, kind=kind, optional=optional, choices=choices, **f.metadata
    )


DECLARED: Final[tuple[Declared, ...]] = tuple(
    _declare(f, typing.get_type_hints(EngineSettings)[f.name])
    for f in dataclasses.fields(EngineSettings)
)
"""Every engine setting, in the order vLLM's help lists them."""


@functools.cache
def declared(name: str) -> Declared:
    """The declaration of one setting, by field name."""
    for d in DECLARED:
        if d.name == name:
            return d
    raise KeyError(name)


def flag(name: str) -> str:
    """The flag of a setting, for messages: ``flag("max_num_seqs")`` -> ``--max-num-seqs``."""
    return declared(name).flag


def engine_args(settings: EngineSettings, engine: Engine = "vllm") -> list[str]:
    """The flags ``engine`` serves ``settings`` with, one token per item, in declaration
    order: what the probe, ``serve`` and the Kubernetes manifests all run."""
    return [tok for d in DECLARED for tok in d.rendered(getattr(settings, d.name), engine)]


def too_new(settings: EngineSettings, release: tuple[int, int]) -> list[str]:
    """The flags ``settings`` use that vLLM ``release`` does not have yet."""
    return [
        d.flag
        for d in DECLARED
        if d.since and release < d.since and d.rendered(getattr(settings, d.name), "vllm")
    ]
