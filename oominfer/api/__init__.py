"""The Python API: what the ``oominfer`` command does, for code (notebooks, CI, controllers).

    >>> import oominfer
    >>> model = oominfer.load_model("meta-llama/Llama-3.1-8B-Instruct")
    >>> l4 = oominfer.Hardware.from_gpu("L4")
    >>> oominfer.estimate(model, l4).fits
    False
    >>> plan = oominfer.plan(model, l4)
    >>> plan.settings.max_model_len <= 131072
    True

Every function raises an ``oominfer.base.errors.OominferError`` subclass for an expected failure
(unknown model, impossible setting, does not fit, engine failure), each with its exit code
and a hint; nothing here prints or exits.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from oominfer.base.errors import InvalidSettingError
from oominfer.hardware.hardware import Hardware
from oominfer.memory.breakdown import MemoryBreakdown
from oominfer.memory.estimate import estimate as _estimate
from oominfer.memory.weights import resolve_dtype
from oominfer.model.load import load_spec
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.planning.context import PlanningContext, engine_release, make_context
from oominfer.planning.document import Plan
from oominfer.planning.planner import plan as _plan
from oominfer.planning.record import make_plan
from oominfer.rules.overrides import with_overrides
from oominfer.rules.versions import EngineVersion
from oominfer.runtime.process import LiveEngine
from oominfer.settings import Engine, EngineSettings, flag

ModelLike = ModelSpec | str
"""A ModelSpec, or what ``load_model`` takes: a folder, a Hub id or a catalog name."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FitListener:
    """What ``fit`` reports while it works; every callback is optional."""

    on_note: Callable[[str], None] | None = None
    """A sentence worth telling the user (the budget shrunk to the free memory, ...)."""
    on_launch: Callable[[int, list[str], Path], None] | None = None
    """An engine launch: (launch number, its command, its log file)."""
    on_progress: Callable[[float, str], None] | None = None
    """Every second of a launch and at each new phase: (seconds elapsed, the phase read from
    its log, with its progress bar when it prints one: download, shards, graph capture)."""
    on_cache_hit: Callable[[Plan], None] | None = None
    """The answer is a plan verified earlier with the same inputs."""
    on_ready: Callable[[LiveEngine], None] | None = None
    """Given, the engine that proved the plan is not stopped but handed to this, running and
    warmed up by the verification's requests (``serve MODEL``: one launch from command to
    serving). The receiver owns it: ``oominfer.runtime.process.stop`` ends it."""


def load_model(name_or_path: str, revision: str | None = None) -> ModelSpec:
    """The architecture facts of a model: a local folder, a Hub id, or a catalog name.

    Looked up in order: a local folder (config.json and the safetensors headers, never the
    tensors), the local Hugging Face cache, the built-in catalog, then the Hub (``HF_TOKEN``
    honoured; a ``revision`` forces the Hub).

    Raises:
        ModelNotFoundError: nowhere to be found. GatedModelError: no access to it.
        UnsupportedConfigError, CorruptWeightsError: found, but unreadable.
    """
    return load_spec(name_or_path, revision=revision)


def _model(model: ModelLike) -> ModelSpec:
    return model if isinstance(model, ModelSpec) else load_spec(model)


def estimate(
    model: ModelLike,
    hardware: Hardware,
    settings: EngineSettings | None = None,
    *,
    engine: Engine = "vllm",
    engine_version: str | None = None,
    measured_offset_bytes: int = 0,
) -> MemoryBreakdown:
    """The memory ``model`` needs per GPU with ``settings`` (vLLM's defaults when None).

    Args:
        model: a ModelSpec, or a name for ``load_model``.
        hardware: the GPUs (``Hardware.from_gpu("L4", count=2)``) or the CPU.
        settings: the engine settings under vLLM's names; None fields take vLLM's defaults.
        engine: ``vllm`` or ``transformers``.
        engine_version: the vLLM release whose memory profile and rules to follow
            (default: the installed vLLM's, else the latest release).
        measured_offset_bytes: memory besides the KV cache an engine measured on this
            setup beyond the model's (``MeasuredMemory.offset_bytes``), taken from the KV cache.

    Raises:
        InvalidSettingError: settings that cannot work with this model or hardware.
    """
    version = EngineVersion.parse(engine_release(engine_version))
    settings = settings or EngineSettings(
        gpu_memory_utilization=version.default_gpu_memory_utilization
    )
    spec = with_overrides(
        _model(model), settings.hf_overrides, version, max_model_len=settings.max_model_len
    )
    spec.check_context(settings.max_model_len)
    return _estimate(
        spec,
        hardware=hardware,
        settings=settings,
        engine=engine,
        version=version,
        measured_offset_bytes=measured_offset_bytes,
    )


def _check_request(spec: ModelSpec, hardware: Hardware, c: Constraints) -> None:
    """Refuse, as bad settings, what no lever can make fit: a context above the trained
    length, a dtype the GPU cannot run.

    Raises:
        InvalidSettingError: the flag to change, with the limit.
    """
    spec.check_context(c.max_model_len, flag("max_model_len"))
    spec.check_context(c.min_context, "--min-context")
    if c.dtype != "auto" and not hardware.is_cpu:
        resolve_dtype(spec, hardware.gpu, c.dtype)


def _within_free(
    hardware: Hardware, constraints: Constraints, note: Callable[[str], None] | None
) -> Constraints:
    """Plan within the memory that is free on a detected GPU, unless the user fixed it."""
    free = hardware.gpu.free_bytes
    if free is None or constraints.gpu_memory_utilization is not None:
        return constraints
    usable = round(free / hardware.gpu.cuda_total_bytes - 0.01, 2)
    if usable >= constraints.vllm_version.default_gpu_memory_utilization:
        return constraints
    if note:
        note(
            f"Only {free / 2**30:.1f} GiB of the GPU is free: planning with "
            f"{flag('gpu_memory_utilization')} {usable}."
        )
    return dataclasses.replace(constraints, gpu_memory_utilization=usable)


def plan(model: ModelLike, hardware: Hardware, constraints: Constraints | None = None) -> Plan:
    """The serving configuration that fits ``hardware`` best, without launching anything.

    Args:
        model: a ModelSpec, or a name for ``load_model``.
        hardware: the GPUs or the CPU to plan for.
        constraints: the engine, the objective (``prefer``), context floor and cap,
            concurrency; None takes the defaults.

    Raises:
        DoesNotFitError: nothing fits; the message gives the shortfall and the ways out.
        InvalidSettingError: constraints that cannot hold on this hardware.
    """
    ctx = _context(model, hardware, constraints, None)
    c = ctx.constraints
    return make_plan(ctx.spec, hardware, c, _plan(ctx.spec, hardware, c),
                     engine_version=_planned_for(c))  # fmt: skip


def _context(
    model: ModelLike,
    hardware: Hardware,
    constraints: Constraints | None,
    note: Callable[[str], None] | None,
) -> PlanningContext:
    """The planning context of a request, made once here at the boundary: the engine
    release resolved, the budget within what is free, the request checked."""
    ctx = make_context(
        _model(model), hardware, _within_free(hardware, constraints or Constraints(), note)
    )
    c = ctx.constraints
    spec = with_overrides(
        ctx.spec, c.requested.get("hf_overrides"), ctx.version, max_model_len=c.max_model_len
    )
    ctx = dataclasses.replace(ctx, spec=spec)
    _check_request(spec, hardware, c)
    return ctx


def _planned_for(c: Constraints) -> str | None:
    """What the plan records as its engine version before any engine ran it."""
    return f"vllm {c.engine_version}" if c.engine == "vllm" else None


def can_verify(hardware: Hardware, engine: Engine = "vllm") -> bool:
    """True when this machine can prove a plan: the engine is installed, and the plan is for
    the CPU or a GPU is present."""
    from oominfer.hardware.nvml import detect_gpus
    from oominfer.rules.installed import engine_installed

    return engine_installed(engine) and (hardware.is_cpu or bool(detect_gpus()))


@contextlib.contextmanager
def _engines_die_with_us(sparing: set[int]) -> Iterator[None]:
    """SIGTERM kills the engines (main thread only: signals cannot be set elsewhere); those
    in ``sparing`` (handed over running) survive a fit that ends well."""
    from oominfer.runtime.process import interrupts_kill_engines, kill_all

    if threading.current_thread() is threading.main_thread():
        with interrupts_kill_engines(sparing):
            yield
    else:
        failed = True
        try:
            yield
            failed = False
        finally:
            kill_all(sparing=() if failed else sparing)


def fit(
    model: ModelLike,
    hardware: Hardware,
    constraints: Constraints | None = None,
    verify: bool = True,
    *,
    max_launches: int = 3,
    timeout: float = 900.0,
    use_estimate: bool = True,
    use_cache: bool = True,
    listener: FitListener | None = None,
    api_key: str | None = None,
    extra_args: tuple[str, ...] = (),
) -> Plan:
    """Plan a configuration and prove it with the real engine.

    With ``verify`` the engine is launched with exactly the plan's flags, loaded with one
    request at ``max_model_len`` and ``max_num_seqs`` concurrent ones, and corrected from
    what it measured; the plan returned carries the engine's report (``plan.verified``).

    Args:
        model: a ModelSpec, or a name for ``load_model``.
        hardware: the GPUs or the CPU to fit.
        constraints: what to ask of the plan; None takes the defaults.
        verify: prove the plan with the engine (it must be installed here).
        max_launches: the most engine launches to spend.
        timeout: seconds one launch may take to become ready.
        use_estimate: False starts at the requested context and lets the engine's own
            messages guide.
        use_cache: answer from a plan verified earlier with the same inputs.
        listener: callbacks for notes, launches and progress, and the receiver of the
            engine that proved the plan (``on_ready``).
        api_key: the key the engine requires (one handed over serves with it).
        extra_args: flags appended to the engine's command line (``serve MODEL -- ...``:
            the engine verified is the one served).

    Raises:
        DoesNotFitError: nothing fits, or the engine proved that the plan cannot.
        ProbeFailedError: the engine failed for a reason other than memory.
        InvalidSettingError: ``verify`` without the engine installed, or bad constraints.
    """
    from oominfer.hardware.nvml import detect_gpus
    from oominfer.rules.installed import engine_installed, engine_version
    from oominfer.verify.fit import fit as fit_model
    from oominfer.verify.prober import EngineProber

    listener = listener or FitListener()
    ctx = _context(model, hardware, constraints, listener.on_note)
    spec, c = ctx.spec, ctx.constraints
    installed = engine_installed(c.engine)
    if verify and not installed:
        raise InvalidSettingError(
            f"verifying needs the {c.engine} engine, which is not installed here.",
            hint="pip install 'oominfer[cpu]' (CPU) or 'oominfer[vllm]' (GPU), or --no-verify.",
        )
    if verify and not hardware.is_cpu and not detect_gpus():
        raise InvalidSettingError(
            f"verifying a plan for {hardware.describe()} needs that GPU here, and this machine "
            "has none (NVML sees no NVIDIA GPU).",
            hint="Pass --no-verify to plan only, or --device cpu --memory SIZE to fit this CPU.",
        )
    prober = None
    handed: list[LiveEngine] = []
    spared: set[int] = set()

    def ready(engine: LiveEngine) -> None:
        handed.append(engine)
        spared.add(engine.proc.pid)

    if verify:
        prober = EngineProber(
            deadline_seconds=timeout,
            on_progress=listener.on_progress,
            on_launch=listener.on_launch,
            on_note=listener.on_note,
            revision=spec.revision,
            api_key=api_key,
            extra_args=extra_args,
            on_ready=ready if listener.on_ready else None,
            progress_seconds=1.0,
        )
    with _engines_die_with_us(spared):
        result = fit_model(
            spec,
            hardware,
            c,
            prober=prober,
            engine_version=engine_version(c.engine) if installed else _planned_for(c),
            use_estimate=use_estimate,
            max_launches=max_launches,
            use_cache=use_cache,
        )
    if result.cached and listener.on_cache_hit:
        listener.on_cache_hit(result.plan)
    if handed and listener.on_ready:
        listener.on_ready(handed[-1])
    return result.plan
