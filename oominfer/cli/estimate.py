"""``oominfer estimate``: the memory split vLLM will make, offline, in a fraction of a second."""

from __future__ import annotations

import dataclasses
import json
import shlex
from typing import TYPE_CHECKING, Any

import click

from oominfer.base.errors import DoesNotFitError, InvalidSettingError
from oominfer.base.units import format_bytes
from oominfer.cli.options import (
    AUTO,
    JSON,
    REVISION,
    build_hardware,
    build_settings,
    build_workload,
    hardware_options,
    settings_options,
)
from oominfer.cli.weights import check_weights
from oominfer.hardware.hardware import Hardware
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import check_useful_context
from oominfer.rules.parallel import tensor_parallel_refusal
from oominfer.settings import Engine, EngineSettings, engine_args, flag

if TYPE_CHECKING:
    from oominfer.speed.workload import Workload
    from oominfer.verify.memory_store import MeasuredMemory


def parallel_note(spec: ModelSpec, hardware: Hardware, settings: EngineSettings) -> str | None:
    """A note when --gpus asks for more GPUs than the parallel flags use."""
    n = hardware.count
    if hardware.is_cpu or n <= settings.world_size:
        return None
    used = settings.world_size
    flag = (
        f"-tp {n} (--tensor-parallel-size)"
        if tensor_parallel_refusal(spec, n) is None
        else f"-pp {n} (--pipeline-parallel-size)"
    )
    return (
        f"Note: --gpus {n}, but the parallel flags split the model over {used} GPU"
        f"{'s' if used > 1 else ''}; pass {flag} to split it over all {n}."
    )


@click.command()
@click.argument("model")
@hardware_options
@settings_options
@REVISION
@JSON
def estimate(model: str, revision: str | None, as_json: bool, **opts: Any) -> None:
    """Estimate the memory MODEL needs on a GPU, offline, in well under a second.

    MODEL is a local folder, a Hugging Face id, or a catalog name (`oominfer models`).
    Exits 3 when it does not fit; with --json the one document printed then also holds
    "error": "does_not_fit", "exit_code", "message", "hint", "shortfall_bytes" and
    "ways_out" (the flag changes that would fit, each checked by estimating it).

    \b
    Examples:
      oominfer estimate meta-llama/Llama-3.1-8B-Instruct --gpu L4
      oominfer estimate Qwen/Qwen3-32B --gpu H100 --gpus 2 -tp 2 --max-model-len 32768
      oominfer estimate ./my-model --gpu-memory 24GiB --json
    """
    from oominfer.api import estimate as run_estimate
    from oominfer.api import load_model
    from oominfer.planning.document import Prediction
    from oominfer.report.breakdown import breakdown_table, memory_bar, verdict
    from oominfer.report.shapes import breakdown_json, error_json_of
    from oominfer.report.speed import performance_json, speed_lines
    from oominfer.report.ways_out import ways_out
    from oominfer.rules.installed import engine_version
    from oominfer.speed import calibrated
    from oominfer.speed import predict as predict_speed
    from oominfer.speed.performance import predict_run
    from oominfer.verify.memory_store import memory_layout, recall_memory
    from oominfer.verify.speed_store import recall

    settings = build_settings(opts)
    check_useful_context(settings.max_model_len, flag("max_model_len"))
    hardware = build_hardware(opts)
    if opts.get("gpus") is None and (opts.get("gpu") or opts.get("gpu_memory")):
        # A GPU kind named without a count: as many as the parallel flags split the model
        # over (-tp 4 means four of them).
        hardware = dataclasses.replace(hardware, count=max(hardware.count, settings.world_size))
    spec = load_model(model, revision=revision)
    check_weights(model, spec, loads=False)
    from oominfer.planning.context import engine_release
    from oominfer.rules.overrides import with_overrides
    from oominfer.rules.versions import EngineVersion

    release = engine_release(opts.get("engine_version"))
    spec = with_overrides(
        spec, settings.hf_overrides, EngineVersion.parse(release),
        max_model_len=settings.max_model_len,
    )  # fmt: skip
    source = click.get_current_context().get_parameter_source("gpu_memory_utilization")
    if source in (None, click.core.ParameterSource.DEFAULT):  # vLLM's default for that release
        settings = dataclasses.replace(
            settings,
            gpu_memory_utilization=EngineVersion.parse(release).default_gpu_memory_utilization,
        )
    if opts.get("max_model_len") == AUTO:
        settings = _auto_fit(spec, hardware, settings, opts["engine"], release)
    b = run_estimate(spec, hardware, settings, engine=opts["engine"], engine_version=release)
    memory = recall_memory(spec.model_id, hardware.gpu.name, release)
    if memory is not None and memory.layout == memory_layout(settings, b):
        # An engine ran this very setup here: what the model missed besides the KV cache.
        b = run_estimate(spec, hardware, settings, engine=opts["engine"], engine_version=release,
                         measured_offset_bytes=memory.offset_bytes)  # fmt: skip
    else:
        memory = None
    predicted = Prediction.of(b)
    fits, line = verdict(predicted)
    workload = build_workload(opts)
    if opts.get("num_prompts"):
        perf = predict_run(
            spec, gpu=hardware.gpu, settings=settings, breakdown=b, workload=workload,
            prompts=opts["num_prompts"], spread=False,
        )  # fmt: skip
    else:
        perf = predict_speed(
            spec, gpu=hardware.gpu, settings=settings, breakdown=b, workload=workload
        )
    # The transformers engine's measurements are kept under its own version (verify/jsonl.py).
    measured_as = engine_version("transformers") if opts["engine"] == "transformers" else release
    measured = recall(spec.model_id, hardware.gpu.name, measured_as) if perf else None
    if perf is not None and measured is not None and measured.ratio is not None:
        perf = calibrated(perf, measured.ratio)
    else:
        measured = None
    note = parallel_note(spec, hardware, settings)
    if note:
        click.echo(note, err=True)
    free = hardware.gpu.free_bytes
    if free is not None and free < b.budget_bytes:
        util = free / b.total_bytes - 0.01
        fix = (
            f"Try {flag('gpu_memory_utilization')} {util:.2f}."
            if util >= 0.05
            else "Free the GPU's memory first (nvidia-smi lists what holds it)."
        )
        click.secho(
            f"Warning: only {format_bytes(free)} of the GPU is free, less than the "
            f"{format_bytes(b.budget_bytes)} vLLM will ask for; it would refuse to start. {fix}",
            err=True, fg="yellow",
        )  # fmt: skip
    error = None
    if not fits:
        ways = ways_out(
            spec,
            hardware,
            settings,
            b,
            engine=opts["engine"],
            version=EngineVersion.parse(release),
        ) or _planned_ways(spec, hardware, opts["engine"], release)
        error = DoesNotFitError(line, shortfall_bytes=b.shortfall_bytes, ways_out=ways,
                                reported=True)  # fmt: skip
    if as_json:
        document = breakdown_json(spec, hardware, settings, b)
        document["performance"] = performance_json(perf, measured)
        document["memory_calibrated_from"] = memory_json(memory)
        if error is not None:  # one document: the error's keys first, then the estimate
            document = {**error_json_of(error), **document}
        click.echo(json.dumps(document, indent=2))
    else:
        for row in breakdown_table(spec, hardware, b):
            click.echo(row)
        click.echo("")
        bar = memory_bar(predicted)
        click.echo("".join(click.style(g, fg=c) for g, c, _ in bar))
        click.echo("  ".join(click.style(legend, fg=c) for _, c, legend in bar))
        if memory is not None:
            click.echo(memory_line(memory))
        if fits:
            why_not = None if perf else _why_no_speed(spec, hardware, settings, workload)
            for row in speed_lines(perf, measured, why_not=why_not):
                click.echo(row)
        click.secho(line, fg="green" if fits else "red", bold=True)
        if error is not None and error.hint:
            click.echo(error.hint)
    if error is not None:
        raise error


def _auto_fit(
    spec: ModelSpec, hardware: Hardware, settings: EngineSettings, engine: Engine, release: str
) -> EngineSettings:
    """``--max-model-len auto``: the longest context that fits, found as vLLM's auto-fit
    finds it (v1/core/kv_cache_utils.py _auto_fit_max_model_len); the trained length when
    nothing fits (the estimate then says by how much)."""
    from oominfer.planning.constraints import SHORTEST_USEFUL, Constraints
    from oominfer.planning.search import settle

    # Down to the shortest context a prompt fits in, not below (Constraints refuses less).
    c = Constraints(engine=engine, engine_version=release, min_context=SHORTEST_USEFUL)
    trial = dataclasses.replace(settings, max_model_len=spec.max_position_embeddings)
    found = settle(spec, hardware, c, trial)
    return found.settings if found is not None else trial


def _planned_ways(spec: ModelSpec, hardware: Hardware, engine: Engine, release: str) -> list[str]:
    """Where no single flag change fits: what ``oominfer fit`` turns on this hardware (its
    plan's flags), or the ways out it names when nothing fits here at all."""
    from oominfer.planning.constraints import Constraints
    from oominfer.planning.planner import plan

    try:
        found = plan(spec, hardware, Constraints(engine=engine, engine_version=release))
    except DoesNotFitError as err:
        return [f"`oominfer fit` with {way}" for way in err.ways_out]
    except InvalidSettingError:
        return []
    flags = shlex.join(engine_args(found.settings, engine))
    return [f"`oominfer fit` plans it here with {flags}"]


def _why_no_speed(
    spec: ModelSpec, hardware: Hardware, settings: EngineSettings, workload: Workload
) -> str:
    """Why an estimate that fits has no predicted speed, in a few words."""
    from oominfer.speed.performance import chip

    gpu = hardware.gpu
    if hardware.is_cpu:
        return "the speed model is a GPU roofline; vLLM's CPU backend is not modelled"
    if chip(gpu, settings, spec) is None:
        return f"{gpu.name} has no bandwidth or FLOPs figures in the catalog; pass --gpu by name"
    return (
        f"the KV cache holds no request of {workload.total_len:,} tokens "
        "(--input-len + --output-len)"
    )


def memory_json(memory: MeasuredMemory | None) -> dict[str, Any] | None:
    """The measurement an estimate took its non-KV memory from (None: the model alone)."""
    if memory is None:
        return None
    return {
        "kv_cache_bytes": memory.kv_cache_bytes,
        "predicted_kv_cache_bytes": memory.predicted_kv_cache_bytes,
        "offset_bytes": memory.offset_bytes,
        "engine_version": memory.engine_version,
        "measured_at": memory.measured_at,
    }


def memory_line(memory: MeasuredMemory) -> str:
    """What the text report says when an estimate starts from a measurement."""
    more = "more" if memory.offset_bytes >= 0 else "less"
    return (
        f"Memory starts from a measurement on this machine ({memory.engine_version}, "
        f"{memory.measured_at}): the engine held {format_bytes(abs(memory.offset_bytes))} "
        f"{more} besides the KV cache than the model, and this estimate counts it."
    )
