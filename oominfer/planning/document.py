"""The plan ("fit certificate"): one JSON document that ``serve`` and ``k8s`` read.

Pure: dataclasses and their JSON shape. It records the model, the hardware, the engine,
the chosen settings under vLLM's names, the predicted memory, each lever turned and why,
and (once verified) what the engine itself reported.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from oominfer.base.errors import InvalidSettingError, PlanError
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.settings import DEVICES, ENGINES, Device, Engine, EngineSettings
from oominfer.speed import Measured, Performance

SCHEMA_VERSION: Final = 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """The estimator's per-GPU figures as a plan records them (``estimate --json``'s
    ``per_gpu``). All numbers in bytes; 0 where a hand-written plan leaves one out."""

    total_bytes: int = 0
    budget_bytes: int = 0
    weights_bytes: int = 0
    activation_bytes: int = 0
    non_torch_bytes: int = 0
    cuda_graph_bytes: int = 0
    kv_cache_bytes: int = 0
    kv_bytes_per_token: int = 0
    state_bytes_per_seq: int = 0
    block_size: int = 0
    kv_cache_tokens: int = 0
    max_model_len: int = 0
    max_model_len_that_fits: int = 0
    max_concurrency: float = 0.0
    fits: bool = False
    shortfall_bytes: int = 0
    overcommitted_bytes: int = 0
    post_capture_short_bytes: int = 0
    """What CUDA-graph capture and the sampler warm-up lack above the budget (V1 before
    0.20, which sizes the KV cache without the graphs)."""
    startup_short_bytes: int = 0
    """What the budget exceeds the memory free at vLLM's start-up snapshot by, on an empty
    GPU (vLLM refuses to start)."""
    speculative_bytes: int = 0
    """The speculative draft's weights and CUDA graphs (memory/additions.py)."""
    speculative_kv_bytes_per_token: int = 0
    """KV the draft adds to each token (within kv_bytes_per_token)."""
    lora_bytes: int = 0
    """LoRA slots: max_loras x max_lora_rank on every target module, plus punica's buffer."""
    lora_cpu_cache_bytes: int = 0
    """Host memory of the LoRA CPU cache (max_cpu_loras adapters; not counted per GPU)."""
    multimodal_bytes: int = 0
    """The multimodal encoder cache, and the vision tower where the weights lack it."""
    expert_weights_bytes: int = 0
    """Routed-expert weights on this GPU (within weights_bytes)."""
    experts_per_gpu: int = 0
    """Whole experts per GPU under expert parallel (0: experts sliced, or a dense model)."""

    @classmethod
    def of(cls, b: MemoryBreakdown) -> Prediction:
        """The recorded shape of one estimate."""
        a = b.additions
        return cls(
            total_bytes=b.total_bytes,
            budget_bytes=b.budget_bytes,
            weights_bytes=b.weights_bytes,
            activation_bytes=b.activation_bytes,
            non_torch_bytes=b.non_torch_bytes,
            cuda_graph_bytes=b.cuda_graph_bytes,
            kv_cache_bytes=b.kv_cache_bytes,
            kv_bytes_per_token=b.kv_bytes_per_token,
            state_bytes_per_seq=b.state_bytes_per_seq,
            block_size=b.block_size,
            kv_cache_tokens=b.kv_cache_tokens,
            max_model_len=b.max_model_len,
            max_model_len_that_fits=b.max_model_len_that_fits,
            max_concurrency=b.max_concurrency,
            fits=b.fits,
            shortfall_bytes=b.shortfall_bytes,
            overcommitted_bytes=b.overcommitted_bytes,
            post_capture_short_bytes=b.post_capture_short_bytes,
            startup_short_bytes=b.startup_short_bytes,
            speculative_bytes=a.speculative_weights_bytes + a.speculative_graph_bytes,
            speculative_kv_bytes_per_token=a.speculative_kv_bytes_per_token,
            lora_bytes=a.lora_bytes,
            lora_cpu_cache_bytes=a.lora_cpu_cache_bytes,
            multimodal_bytes=a.multimodal_bytes,
            expert_weights_bytes=a.expert_weights_bytes,
            experts_per_gpu=a.experts_per_gpu,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Prediction:
        """Read the recorded shape, ignoring keys this version does not know."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @property
    def non_kv_bytes(self) -> int:
        """Everything but the KV cache."""
        return (
            self.weights_bytes + self.activation_bytes + self.non_torch_bytes
            + self.cuda_graph_bytes + self.added_bytes
        )  # fmt: skip

    @property
    def added_bytes(self) -> int:
        """What operators add beside the model: draft, LoRA slots, encoder cache."""
        return self.speculative_bytes + self.lora_bytes + self.multimodal_bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Lever:
    """One step the planner took, and what it bought and cost."""

    name: str
    """vLLM's field name (``max_model_len``, ``enforce_eager``...) or ``engine``."""
    value: Any
    reason: str
    saved_bytes: int = 0
    cost: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Verification:
    """What the real engine reported when it ran the plan."""

    status: str
    """The probe's outcome (``ready`` when verified)."""
    engine_version: str
    verified_at: str
    launches: int = 1
    weights_bytes: int | None = None
    kv_cache_bytes: int | None = None
    kv_cache_tokens: int | None = None
    estimated_max_model_len: int | None = None
    peak_bytes: int | None = None
    load_seconds: float | None = None
    requests_ok: int = 0
    log_path: str | None = None
    detail: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Concurrency:
    """How many requests one replica runs at once, in the lengths users think in."""

    typical_length: int
    """Tokens (prompt + output) of a typical request (--typical-length)."""
    typical_requests: int
    """Requests of the typical length running at once: the KV pool, capped by max_num_seqs."""
    full_length_requests: float
    """Requests of max_model_len tokens the KV pool holds at once."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Alternative:
    """A plan the search set aside, what picking it would trade, and the flag that picks it."""

    name: str
    """What it is best at: "longest context", "most concurrency", "native precision"..."""
    flag: str
    """The flag that picks it (``--prefer context``)."""
    settings: EngineSettings
    replicas: int = 1
    concurrency: Concurrency | None = None
    performance: Performance | None = None
    """Its predicted speed, as the plan's."""
    turns: tuple[str, ...] = ()
    """Levers it turns that the plan does not (planning/costs.py names)."""
    spares: tuple[str, ...] = ()
    """Levers the plan turns that it does not."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """A serving configuration for one model on one kind of hardware."""

    model_id: str
    """What the engine loads: a Hub id or a local folder."""
    revision: str | None = None
    architecture: dict[str, Any] = field(default_factory=dict)
    """The architecture facts the estimate used (layers, heads, KV bytes per token...)."""
    device: Device = "cuda"
    gpu: dict[str, Any] = field(default_factory=dict)
    """name, count, memory_bytes, cuda_total_bytes, compute_capability, product_label."""
    engine: Engine = "vllm"
    engine_version: str | None = None
    settings: EngineSettings = field(default_factory=EngineSettings)
    predicted: Prediction | None = None
    """The estimator's per-GPU breakdown of this plan."""
    baseline: Prediction | None = None
    """What vLLM's defaults would do on the same hardware (None when not estimated)."""
    replicas: int = 1
    """Replicas of this layout the given GPUs serve (Deployment replicas in Kubernetes, vLLM's
    --data-parallel-size on one machine)."""
    idle_gpus: int = 0
    """GPUs given that neither the layout nor its replicas use (GPUs used = TP x PP x
    replicas; used + idle = the GPUs given)."""
    idle_reason: str = ""
    """Why those GPUs sit idle, and the ``--gpus`` that would use them all."""
    concurrency: Concurrency | None = None
    """Requests one replica runs at once."""
    performance: Performance | None = None
    """Predicted speed for the typical request (--input-len/--output-len) at --concurrency
    or the concurrency the plan runs, over all replicas (oominfer.speed); None in plans
    written before the speed model, and where it cannot be predicted."""
    measured: Measured | None = None
    """The output tokens/s the engine served in verification's load test, beside the
    prediction for those same requests."""
    levers: tuple[Lever, ...] = ()
    alternatives: tuple[Alternative, ...] = ()
    """The nearest plans the search set aside, each with what it would trade."""
    constraints: dict[str, Any] = field(default_factory=dict)
    verification: Verification | None = None
    created_at: str = ""
    schema_version: int = SCHEMA_VERSION

    @property
    def verified(self) -> bool:
        """True when the real engine ran this plan and served requests at its limits."""
        return self.verification is not None and self.verification.status == "ready"

    @property
    def gpu_count(self) -> int:
        """GPUs one replica uses: tensor x pipeline parallel."""
        return self.settings.world_size if self.device == "cuda" else 0

    def to_json(self) -> str:
        """The plan as a JSON document (stable key order, trailing newline)."""
        return json.dumps(plan_to_dict(self), indent=2) + "\n"

    def sha256(self) -> str:
        """A digest of the plan's JSON, to roll pods when the plan changes."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as plain data, ``schema_version`` first."""
    data = dataclasses.asdict(plan)
    return {"schema_version": data.pop("schema_version"), **data}


_REFIT = "Re-run `oominfer fit` with this version of oominfer to write a new plan."


def plan_from_dict(data: Any, *, source: str = "plan") -> Plan:
    """Read a plan document, refusing what no engine could run.

    Raises:
        PlanError: not an object, an unknown schema version, a missing or malformed field
            (no ``settings``, a section of the wrong type), an impossible setting, or a
            parallel layout the plan's GPUs and model cannot hold.
    """
    if not isinstance(data, dict):
        raise PlanError(f"{source} is not a plan: it must hold a JSON object.")
    version = data.get("schema_version")
    if type(version) is not int or version != SCHEMA_VERSION:
        raise PlanError(
            f"{source} has schema_version {version!r}; this oominfer reads version "
            f"{SCHEMA_VERSION}.",
            hint=_REFIT,
        )
    for key in ("model_id", "settings"):
        if key not in data:
            raise PlanError(f"{source} is malformed: it has no {key!r}.", hint=_REFIT)
    try:
        model_id = data["model_id"]
        if not isinstance(model_id, str) or not model_id:
            raise TypeError(f"'model_id' must be a non-empty string, got {model_id!r}")
        for key in ("engine", "device"):
            allowed = ENGINES if key == "engine" else DEVICES
            if data.get(key, allowed[0]) not in allowed:
                raise TypeError(f"{key!r} must be one of {', '.join(allowed)}")
        ver = _section(data, "verification")
        plan = Plan(
            model_id=model_id,
            revision=data.get("revision"),
            architecture=_section(data, "architecture"),
            device=data.get("device", "cuda"),
            gpu=_section(data, "gpu"),
            engine=data.get("engine", "vllm"),
            engine_version=data.get("engine_version"),
            settings=EngineSettings(**_section(data, "settings")),
            predicted=_prediction(data.get("predicted")),
            baseline=_prediction(data.get("baseline")),
            replicas=int(data.get("replicas", 1)),
            idle_gpus=int(data.get("idle_gpus", 0)),
            idle_reason=str(data.get("idle_reason", "")),
            concurrency=_concurrency(data.get("concurrency")),
            performance=_performance(data.get("performance")),
            measured=Measured(**_section(data, "measured")) if data.get("measured") else None,
            alternatives=tuple(_alternative(a) for a in _list(data, "alternatives")),
            levers=tuple(Lever(**_object(lever, "a lever")) for lever in _list(data, "levers")),
            constraints=_section(data, "constraints"),
            verification=Verification(**ver) if ver else None,
            created_at=str(data.get("created_at", "")),
        )
    except (KeyError, TypeError, ValueError) as err:
        raise PlanError(f"{source} is malformed: {err}.", hint=_REFIT) from None
    except InvalidSettingError as err:
        raise PlanError(f"{source} has an impossible setting: {err}", hint=err.hint) from None
    _check_layout(plan, source)
    return plan


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"{what} must be a JSON object, got {value!r}")
    return value


def _section(data: dict[str, Any], key: str) -> dict[str, Any]:
    """``data[key]`` as an object; empty when absent or null."""
    value = data.get(key)
    return {} if value is None else dict(_object(value, repr(key)))


def _list(data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"{key!r} must be a JSON list, got {value!r}")
    return value


def _count(section: dict[str, Any], key: str) -> int | None:
    """A positive count recorded in the plan (``gpu.count``), None when absent."""
    value = section.get(key)
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise TypeError(f"{key!r} must be a positive integer, got {value!r}")
    return value


def _check_layout(plan: Plan, source: str) -> None:
    """Refuse a parallel layout the plan's own facts rule out: more GPUs than it records,
    a tensor-parallel size that does not divide the attention heads, more pipeline stages
    than layers.

    Raises:
        PlanError: the layout, and why it cannot run.
    """
    s = plan.settings
    tp, pp = s.tensor_parallel_size, s.pipeline_parallel_size
    try:
        gpus = _count(plan.gpu, "count")
        heads = _count(plan.architecture, "num_attention_heads")
        layers = _count(plan.architecture, "num_layers")
    except TypeError as err:
        raise PlanError(f"{source} is malformed: {err}.", hint=_REFIT) from None
    why = None
    if plan.device == "cuda" and gpus is not None and s.world_size > gpus:
        dp = s.data_parallel_size
        layout = f"tensor {tp} x pipeline {pp}" + (f" x data {dp}" if dp > 1 else "")
        why = f"needs {s.world_size} GPUs ({layout}) but records {gpus}"
    elif heads is not None and heads % tp:
        why = f"tensor_parallel_size {tp} does not divide the model's {heads} attention heads"
    elif layers is not None and pp > layers:
        why = f"pipeline_parallel_size {pp} exceeds the model's {layers} layers"
    if why:
        raise PlanError(
            f"{source} has an impossible layout: it {why}.",
            hint="Re-run `oominfer fit` for the GPUs you have instead of editing the plan.",
        )


def _prediction(data: Any) -> Prediction | None:
    if data is None or data == {}:
        return None
    return Prediction.from_dict(_object(data, "'predicted'"))


def _concurrency(data: Any) -> Concurrency | None:
    return Concurrency(**data) if data else None


def _performance(data: Any) -> Performance | None:
    return Performance(**_object(data, "'performance'")) if data else None


def _alternative(data: Any) -> Alternative:
    return Alternative(
        name=str(data["name"]),
        flag=str(data["flag"]),
        settings=EngineSettings(**data["settings"]),
        replicas=int(data.get("replicas", 1)),
        concurrency=_concurrency(data.get("concurrency")),
        performance=_performance(data.get("performance")),
        turns=tuple(data.get("turns") or ()),
        spares=tuple(data.get("spares") or ()),
    )


def plan_from_json(text: str, *, source: str = "plan") -> Plan:
    """Parse a plan file's text.

    Raises:
        PlanError: not JSON, or not a valid plan.
    """
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise PlanError(f"{source} is not valid JSON (line {err.lineno}: {err.msg}).") from None
    return plan_from_dict(data, source=source)


def read_plan(path: Path) -> Plan:
    """Read a plan file written by ``oominfer fit -o``.

    Raises:
        PlanError: no such file, unreadable, not JSON, or not a valid plan.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PlanError(
            f"no plan file at {path}.", hint="Write one with `oominfer fit MODEL -o plan.json`."
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise PlanError(f"cannot read the plan {path}: {err}.") from None
    return plan_from_json(text, source=str(path))
