"""The ``oominfer`` command. Each command parses flags, calls one library function, prints.

\b
Exit codes: 0 success; 1 unexpected error; 2 bad flags (impossible setting, unknown GPU,
dtype the GPU cannot run); 3 does not fit; 4 the engine failed for a reason other than
memory; 5 the model cannot be read (unknown, gated, offline, malformed); 130 interrupted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, TypeVar, get_args

import click

from oominfer import __version__
from oominfer.dtypes import Dtype, Engine, KvCacheDtype, Quantization
from oominfer.errors import ExitStatus, InvalidSettingError, OominferError
from oominfer.settings import VllmSettings

F = TypeVar("F", bound=Callable[..., Any])
DEFAULTS = VllmSettings()


class OominferGroup(click.Group):
    """Shows expected failures as one or two lines and the documented exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        """Run the command, translating OominferError into a message and an exit code."""
        try:
            return super().invoke(ctx)
        except OominferError as err:
            if os.environ.get("OOMINFER_DEBUG"):
                raise
            click.secho(f"Error: {err}", err=True, fg="red")
            if err.hint:
                click.echo(f"Hint: {err.hint}", err=True)
            ctx.exit(int(err.exit_status))
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            ctx.exit(int(ExitStatus.INTERRUPTED))


@click.group(
    cls=OominferGroup, context_settings={"help_option_names": ["-h", "--help"]}, help=__doc__
)
@click.version_option(__version__, prog_name="oominfer")
def main() -> None:
    """Make a large language model fit the GPU you have."""


def hardware_options(f: F) -> F:
    """--gpu, --gpus, --gpu-memory."""
    f = click.option(
        "--gpu-memory", metavar="SIZE", help="GPU memory for a GPU not in the catalog, e.g. 24GiB."
    )(f)
    f = click.option(
        "--gpus",
        type=click.IntRange(min=1),
        default=1,
        show_default=True,
        help="GPUs of this kind.",
    )(f)
    f = click.option(
        "--gpu",
        metavar="NAME",
        help="GPU kind (see `oominfer gpus`); default: the detected GPU, else L4.",
    )(f)
    return f


def settings_options(f: F) -> F:
    """The engine flags, under vLLM's names and with vLLM's defaults."""
    options = [
        click.option(
            "--dtype", type=click.Choice(get_args(Dtype)), default=DEFAULTS.dtype, show_default=True
        ),
        click.option("--quantization", "-q", type=click.Choice(get_args(Quantization))),
        click.option(
            "--kv-cache-dtype",
            type=click.Choice(get_args(KvCacheDtype)),
            default=DEFAULTS.kv_cache_dtype,
            show_default=True,
        ),
        click.option(
            "--gpu-memory-utilization",
            type=float,
            default=DEFAULTS.gpu_memory_utilization,
            show_default=True,
        ),
        click.option("--max-model-len", type=int, help="Default: from config.json."),
        click.option("--max-num-seqs", type=int, help="Default: vLLM's for the GPU."),
        click.option("--max-num-batched-tokens", type=int, help="Default: vLLM's for the GPU."),
        click.option("--enforce-eager", is_flag=True, default=DEFAULTS.enforce_eager),
        click.option(
            "--tensor-parallel-size",
            "-tp",
            type=int,
            default=DEFAULTS.tensor_parallel_size,
            show_default=True,
        ),
        click.option(
            "--pipeline-parallel-size",
            "-pp",
            type=int,
            default=DEFAULTS.pipeline_parallel_size,
            show_default=True,
        ),
        click.option(
            "--cpu-offload-gb", type=float, default=DEFAULTS.cpu_offload_gb, show_default=True
        ),
        click.option(
            "--kv-cache-memory-bytes",
            type=str,
            metavar="SIZE",
            help="Fix the KV cache size instead of deriving it (e.g. 4GiB).",
        ),
        click.option(
            "--engine", type=click.Choice(get_args(Engine)), default="vllm", show_default=True
        ),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def build_settings(opts: dict[str, Any]) -> VllmSettings:
    """VllmSettings from the parsed flags (the dataclass validates them)."""
    from oominfer.units import parse_size

    kv_bytes = opts.get("kv_cache_memory_bytes")
    return VllmSettings(
        dtype=opts["dtype"],
        quantization=opts.get("quantization"),
        kv_cache_dtype=opts["kv_cache_dtype"],
        gpu_memory_utilization=opts["gpu_memory_utilization"],
        max_model_len=opts.get("max_model_len"),
        max_num_seqs=opts.get("max_num_seqs"),
        max_num_batched_tokens=opts.get("max_num_batched_tokens"),
        enforce_eager=opts["enforce_eager"],
        tensor_parallel_size=opts["tensor_parallel_size"],
        pipeline_parallel_size=opts["pipeline_parallel_size"],
        cpu_offload_gb=opts["cpu_offload_gb"],
        kv_cache_memory_bytes=parse_size(kv_bytes) if kv_bytes else None,
    )


def build_hardware(gpu: str | None, gpus: int, gpu_memory: str | None) -> Any:
    """Hardware from --gpu / --gpus / --gpu-memory, else the detected GPU, else an L4."""
    from oominfer.estimate import Hardware
    from oominfer.gpus import GpuSpec, find_gpu
    from oominfer.units import parse_size

    if gpu and gpu_memory:
        raise InvalidSettingError("pass either --gpu or --gpu-memory, not both.")
    if gpu_memory:
        return Hardware(gpu=GpuSpec.custom(parse_size(gpu_memory)), count=gpus)
    if gpu:
        return Hardware(gpu=find_gpu(gpu), count=gpus)
    from oominfer.detect import detect_gpus

    found = detect_gpus()
    if found:
        return Hardware(gpu=found[0], count=gpus if gpus > 1 else len(found))
    return Hardware(gpu=find_gpu("L4"), count=gpus)


@main.command()
@click.argument("model")
@hardware_options
@settings_options
@click.option("--revision", help="Hub revision (forces a Hub lookup).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON on stdout.")
def estimate(
    model: str,
    gpu: str | None,
    gpus: int,
    gpu_memory: str | None,
    revision: str | None,
    as_json: bool,
    engine: str,
    **opts: Any,
) -> None:
    """Estimate the memory MODEL needs on a GPU, offline, in well under a second.

    MODEL is a local folder, a Hugging Face id, or a catalog name (`oominfer models`).
    Exits 3 when it does not fit.

    \b
    Examples:
      oominfer estimate meta-llama/Llama-3.1-8B-Instruct --gpu L4
      oominfer estimate Qwen/Qwen3-32B --gpu H100 --gpus 2 -tp 2 --max-model-len 32768
      oominfer estimate ./my-model --gpu-memory 24GiB --json
    """
    from oominfer.estimate import estimate as run_estimate
    from oominfer.models import load_spec
    from oominfer.report import breakdown_json, breakdown_table, memory_bar, verdict
    from oominfer.units import format_bytes

    settings = build_settings(opts)
    hardware = build_hardware(gpu, gpus, gpu_memory)
    spec = load_spec(model, revision=revision)
    b = run_estimate(spec, hardware=hardware, settings=settings, engine=engine)  # type: ignore[arg-type]
    fits, line = verdict(b)
    free = hardware.gpu.free_bytes
    if free is not None and free < b.budget_bytes:
        click.secho(
            f"Warning: only {format_bytes(free)} of the GPU is free, less than the "
            f"{format_bytes(b.budget_bytes)} vLLM will ask for; it would refuse to start. "
            f"Try --gpu-memory-utilization {free / b.total_bytes - 0.01:.2f}.",
            err=True, fg="yellow",
        )  # fmt: skip
    if as_json:
        click.echo(json.dumps(breakdown_json(spec, hardware, settings, b), indent=2))
    else:
        for row in breakdown_table(spec, hardware, b):
            click.echo(row)
        click.echo("")
        click.echo("".join(click.style(g, fg=c) for g, c, _ in memory_bar(b)))
        click.echo("  ".join(click.style(legend, fg=c) for g, c, legend in memory_bar(b) if g))
        click.secho(line, fg="green" if fits else "red", bold=True)
    if not fits:
        if as_json:
            click.echo(line, err=True)
        raise SystemExit(int(ExitStatus.DOES_NOT_FIT))


@main.command("gpus")
@click.option("--json", "as_json", is_flag=True)
def list_gpus(as_json: bool) -> None:
    """List the GPUs oominfer knows (`--gpu` takes any of these names)."""
    from oominfer.gpus import catalog
    from oominfer.units import GiB

    rows = catalog()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "name": g.name,
                        "memory_bytes": g.memory_bytes,
                        "cuda_total_bytes": g.cuda_total_bytes,
                        "compute_capability": list(g.compute_capability),
                        "product_label": g.product_label,
                    }
                    for g in rows
                ],
                indent=2,
            )
        )
        return
    for g in rows:
        cc = ".".join(map(str, g.compute_capability))
        click.echo(
            f"{g.name:<32} {g.cuda_total_bytes / GiB:7.2f} GiB  cc {cc:<5} {g.product_label}"
        )


@main.command("models")
def list_models() -> None:
    """List the models of the built-in catalog (planned offline, exact sizes)."""
    from oominfer.models import catalog_ids

    for model_id in catalog_ids():
        click.echo(model_id)


def _cpu_memory_bytes() -> int:
    """MemAvailable of this machine (the default budget of CPU serving)."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise InvalidSettingError("cannot read this machine's memory.", hint="Pass --memory 6GiB.")


def fit_options(f: F) -> F:
    """The flags of `oominfer fit` (also taken by `oominfer serve MODEL`)."""
    options = [
        hardware_options,
        click.option("--device", type=click.Choice(["cuda", "cpu"]),
                     help="cuda (GPUs) or cpu (vLLM's CPU backend). Default: cpu with --memory."),
        click.option("--memory", metavar="SIZE", help="CPU serving: memory the engine may use."),
        click.option("--engine", type=click.Choice(get_args(Engine)), default="vllm",
                     show_default=True),
        click.option("--dtype", type=click.Choice(get_args(Dtype)), default="auto",
                     show_default=True),
        click.option("--prefer", type=click.Choice(["context", "throughput", "quality"]),
                     default="context", show_default=True,
                     help="context: the longest context, then concurrency; throughput: the most "
                     "sequences at --min-context; quality: no weight quantization unless needed."),
        click.option("--min-context", type=click.IntRange(min=1), default=1, show_default=True,
                     help="The shortest context acceptable."),
        click.option("--concurrency", type=click.IntRange(min=1),
                     help="Sequences that must run at once at the chosen context."),
        click.option("--max-model-len", type=click.IntRange(min=1), help="A cap on the context."),
        click.option("--no-quantize", is_flag=True, help="Never quantize the weights."),
        click.option("--allow-offload", is_flag=True, help="Allow CPU offload of weights (slow)."),
        click.option("--gpu-memory-utilization", type=click.FloatRange(0, 1, min_open=True),
                     help="Fix the fraction vLLM may use (default: vLLM's 0.92)."),
        click.option("--kv-cache-memory-bytes", metavar="SIZE", help="Fix the KV-cache size."),
        click.option("--verify/--no-verify", default=None,
                     help="Prove the plan with the real engine (default: when one is installed)."),
        click.option("--no-estimate", is_flag=True,
                     help="Launch at the requested context and let the engine's messages guide."),
        click.option("--no-cache", is_flag=True, help="Ignore verified plans cached earlier."),
        click.option("--max-launches", type=click.IntRange(1, 10), default=3, show_default=True),
        click.option("--timeout", type=float, default=900.0, show_default=True,
                     help="Seconds one launch may take to become ready."),
        click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True,
                     help="Tensor parallel stays within a node; pipeline stages span nodes."),
        click.option("--revision", help="Hub revision (forces a Hub lookup)."),
    ]  # fmt: skip
    for option in reversed(options):
        f = option(f)
    return f


def run_fit(model: str, opts: dict[str, Any]) -> tuple[Any, Any, Any, str]:
    """Fit MODEL with the parsed fit flags: (spec, hardware, FitResult, device)."""
    import shlex
    from pathlib import Path

    from oominfer.estimate import Hardware
    from oominfer.fit import fit as fit_model
    from oominfer.gpus import GpuSpec
    from oominfer.models import load_spec
    from oominfer.planner import Constraints
    from oominfer.probe import (
        EngineProber,
        engine_installed,
        engine_version,
        interrupts_kill_engines,
    )
    from oominfer.units import parse_size

    engine = opts["engine"]
    device = opts["device"] or ("cpu" if opts["memory"] else "cuda")
    if device == "cpu":
        if opts["gpu"] or opts["gpu_memory"]:
            raise InvalidSettingError("--device cpu takes --memory, not --gpu/--gpu-memory.")
        budget = parse_size(opts["memory"]) if opts["memory"] else _cpu_memory_bytes()
        hardware = Hardware(gpu=GpuSpec.custom(budget), count=1)
    else:
        hardware = build_hardware(opts["gpu"], opts["gpus"], opts["gpu_memory"])
    kv_bytes = opts["kv_cache_memory_bytes"]
    utilization = opts["gpu_memory_utilization"]
    free = hardware.gpu.free_bytes
    if free is not None and utilization is None:
        usable = free / hardware.gpu.cuda_total_bytes - 0.01
        if usable < VllmSettings().gpu_memory_utilization:
            utilization = round(usable, 2)
            click.echo(f"Only {free / 2**30:.1f} GiB of the GPU is free: planning with "
                       f"--gpu-memory-utilization {utilization}.", err=True)  # fmt: skip
    constraints = Constraints(
        prefer=opts["prefer"],
        min_context=opts["min_context"],
        concurrency=opts["concurrency"],
        max_model_len=opts["max_model_len"],
        no_quantize=opts["no_quantize"],
        allow_offload=opts["allow_offload"],
        gpu_memory_utilization=utilization,
        kv_cache_memory_bytes=parse_size(kv_bytes) if kv_bytes else None,
        gpus_per_node=opts["gpus_per_node"],
    )
    spec = load_spec(model, revision=opts["revision"])
    installed = engine_installed(engine)
    verify = opts["verify"]
    if verify is None:
        from oominfer.detect import detect_gpus

        verify = installed and (device == "cpu" or bool(detect_gpus()))
    elif verify and not installed:
        raise InvalidSettingError(
            f"--verify needs the {engine} engine, which is not installed here.",
            hint="pip install 'oominfer[cpu]' (CPU) or 'oominfer[vllm]' (GPU), or --no-verify.",
        )

    def progress(elapsed: float, phase: str) -> None:
        click.echo(f"  [{elapsed:5.0f} s] {phase}", err=True)

    def launch(n: int, argv: list[str], log: Path) -> None:
        click.echo(f"Launch {n} ({engine_version(engine)}, log {log}):", err=True)
        click.echo("  " + shlex.join(argv[1:]), err=True)

    prober = None
    if verify:
        prober = EngineProber(
            deadline_seconds=opts["timeout"], on_progress=progress, on_launch=launch
        )
    with interrupts_kill_engines():
        result = fit_model(
            spec, hardware, constraints, engine=engine, device=device, dtype=opts["dtype"],
            prober=prober, engine_version=engine_version(engine) if installed else None,
            use_estimate=not opts["no_estimate"], max_launches=opts["max_launches"],
            use_cache=not opts["no_cache"],
        )  # fmt: skip
    return spec, hardware, result, device


@main.command()
@click.argument("model")
@fit_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True),
              help="Write the plan here.")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON on stdout.")
def fit(model: str, output: str | None, as_json: bool, **opts: Any) -> None:
    """Plan the serving configuration that fits, prove it with the real engine, write it.

    MODEL is a local folder, a Hugging Face id, or a catalog name. Exits 3 when nothing
    fits (with the shortfall and the ways out), 4 when the engine fails otherwise.

    \b
    Examples:
      oominfer fit meta-llama/Llama-3.1-8B-Instruct --gpu L4 -o plan.json
      oominfer fit Qwen/Qwen3-32B --gpu H100 --gpus 2 --prefer throughput --min-context 32768
      oominfer fit ./my-model --device cpu --memory 6GiB
    """
    from pathlib import Path

    from oominfer.report import fit_report

    spec, hardware, result, device = run_fit(model, opts)
    if output:
        Path(output).write_text(result.plan.to_json())
    if as_json:
        click.echo(result.plan.to_json(), nl=False)
        return
    for line in fit_report(spec, hardware, result, device=device):
        click.echo(line)
    if output:
        click.echo(f"Wrote {output}")


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("target")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--api-key", envvar="OOMINFER_API_KEY",
              help="Require this bearer token (also $OOMINFER_API_KEY).")  # fmt: skip
@click.option("--require-verified", is_flag=True, help="Refuse a plan the engine never ran.")
@click.option("--grace-period", type=click.IntRange(min=0), default=30, show_default=True,
              help="Seconds in-flight requests may take to finish after SIGTERM.")  # fmt: skip
@fit_options
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def serve(target: str, host: str, port: int, api_key: str | None, require_verified: bool,
          grace_period: int, extra: tuple[str, ...], **opts: Any) -> None:  # fmt: skip
    """Serve a plan (or fit MODEL first) behind the OpenAI API.

    TARGET is a plan.json written by `oominfer fit`, or a model (then the fit flags apply).
    Flags after `--` go to vLLM; one that the plan sets must agree with it. Exits with the
    engine's status.

    \b
    Examples:
      oominfer serve plan.json --port 8000
      oominfer serve ./my-model --device cpu --memory 6GiB --engine transformers
      oominfer serve plan.json -- --enable-prefix-caching
    """
    from pathlib import Path

    from oominfer.plan import PlanError, plan_from_json
    from oominfer.serve import run
    from oominfer.settings import to_vllm_args

    if target.endswith(".json") and Path(target).is_file():
        plan = plan_from_json(Path(target).read_text(), source=target)
    elif target.endswith(".json"):
        raise PlanError(f"no plan file at {target}.", hint="Write one with `oominfer fit -o`.")
    else:
        plan = run_fit(target, opts)[2].plan
    if not plan.verified:
        if require_verified:
            raise PlanError(
                f"the plan for {plan.model_id} was never verified by the engine.",
                hint="Run `oominfer fit` with --verify where the engine is installed.",
            )
        click.secho("Warning: this plan was not verified by the engine.", err=True, fg="yellow")
    state = "verified" if plan.verified else "unverified"
    click.echo(
        f"Serving {plan.model_id} ({plan.engine}, {state} plan) on http://{host}:{port}: "
        + " ".join(to_vllm_args(plan.settings)),
        err=True,
    )
    status = run(plan, host=host, port=port, extra=list(extra), api_key=api_key,
                 grace_period=grace_period,
                 on_failure=lambda why: click.secho(why, err=True, fg="red"))  # fmt: skip
    raise SystemExit(status)


def _register_k8s() -> None:
    from oominfer.k8s_cli import k8s_command

    main.add_command(k8s_command)


_register_k8s()
