"""``oominfer estimate``: the memory split vLLM will make, offline, in a fraction of a second."""

from __future__ import annotations

import json
from typing import Any

import click

from oominfer.cli.options import (
    JSON,
    REVISION,
    build_hardware,
    build_settings,
    hardware_options,
    settings_options,
)
from oominfer.errors import DoesNotFitError
from oominfer.units import format_bytes


@click.command()
@click.argument("model")
@hardware_options
@settings_options
@REVISION
@JSON
def estimate(model: str, revision: str | None, as_json: bool, **opts: Any) -> None:
    """Estimate the memory MODEL needs on a GPU, offline, in well under a second.

    MODEL is a local folder, a Hugging Face id, or a catalog name (`oominfer models`).
    Exits 3 when it does not fit.

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
    from oominfer.report.shapes import breakdown_json

    settings = build_settings(opts)
    hardware = build_hardware(opts)
    spec = load_model(model, revision=revision)
    b = run_estimate(spec, hardware, settings, engine=opts["engine"])
    predicted = Prediction.of(b)
    fits, line = verdict(predicted)
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
        bar = memory_bar(predicted)
        click.echo("".join(click.style(g, fg=c) for g, c, _ in bar))
        click.echo("  ".join(click.style(legend, fg=c) for g, c, legend in bar if g))
        click.secho(line, fg="green" if fits else "red", bold=True)
    if not fits:
        if as_json:
            click.echo(line, err=True)
        raise DoesNotFitError(line, shortfall_bytes=b.shortfall_bytes, reported=True)
