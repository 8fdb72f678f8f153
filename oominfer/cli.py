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

    settings = build_settings(opts)
    hardware = build_hardware(gpu, gpus, gpu_memory)
    spec = load_spec(model, revision=revision)
    b = run_estimate(spec, hardware=hardware, settings=settings, engine=engine)  # type: ignore[arg-type]
    fits, line = verdict(b)
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
