"""``oominfer fit``: plan the configuration that fits, prove it with the engine, write it."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from oominfer.base.errors import OutputError
from oominfer.cli.options import JSON, QUIET, build_constraints, build_hardware, fit_options
from oominfer.cli.progress import Progress
from oominfer.cli.weights import check_weights
from oominfer.planning.document import Plan

if TYPE_CHECKING:
    from oominfer.runtime.process import LiveEngine


def fit_from_flags(
    model: str,
    opts: dict[str, Any],
    progress: Progress,
    *,
    on_ready: Callable[[LiveEngine], None] | None = None,
    api_key: str | None = None,
    extra_args: tuple[str, ...] = (),
    serving: bool = False,
) -> tuple[Plan, bool]:
    """Fit MODEL with the parsed fit flags, telling the user what happens through ``progress``
    (``serving``: the engine will load the model whether verified or not).

    ``on_ready`` receives the engine that proved the plan, running (serve keeps it); it was
    started with ``api_key`` and ``extra_args``. Returns the plan, and whether it came from
    the cache of verified plans.
    """
    from oominfer.api import FitListener, can_verify, fit, load_model
    from oominfer.rules.installed import engine_version

    hardware = build_hardware(opts)
    constraints = build_constraints(opts)
    spec = load_model(model, revision=opts.get("revision"))
    verify = opts["verify"]
    if verify is None:
        verify = can_verify(hardware, constraints.engine)
    check_weights(model, spec, loads=verify or serving)
    cached: list[Plan] = []

    def launch(n: int, argv: list[str], log: Path) -> None:
        progress.launch(n, argv, log, engine_version(constraints.engine))

    listener = FitListener(
        on_note=progress.note,
        on_launch=launch,
        on_progress=progress.update,
        on_cache_hit=cached.append,
        on_ready=on_ready,
    )
    try:
        plan = fit(
            spec,
            hardware,
            constraints,
            verify=verify,
            max_launches=opts["max_launches"],
            timeout=opts["timeout"],
            use_estimate=not opts["no_estimate"],
            use_cache=not opts["no_cache"],
            listener=listener,
            api_key=api_key,
            extra_args=extra_args,
        )
    finally:
        progress.done()
    return plan, bool(cached)


_WRITABLE_HINT = "Pass -o a path in a folder that exists and that you can write."


def check_writable(output: Path) -> None:
    """Refuse, before any work, a plan path that cannot be written.

    Raises:
        OutputError: its folder is missing or not writable, or the path is a folder.
    """
    folder = output.parent
    why = None
    if output.is_dir():
        why = "it is a folder"
    elif not folder.is_dir():
        why = f"{folder} is not a folder" if folder.exists() else f"no folder {folder}"
    elif not os.access(folder, os.W_OK):
        why = f"{folder} is not writable"
    if why:
        raise OutputError(f"cannot write the plan to {output}: {why}.", hint=_WRITABLE_HINT)


def write_plan(plan: Plan, output: Path) -> None:
    """Write the plan file.

    Raises:
        OutputError: the file cannot be written (no such folder, no permission).
    """
    try:
        output.write_text(plan.to_json(), encoding="utf-8")
    except OSError as err:
        raise OutputError(
            f"cannot write the plan to {output}: {err.strerror}.", hint=_WRITABLE_HINT
        ) from None


@click.command()
@click.argument("model")
@fit_options
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="Write the plan here."
)
@JSON
@QUIET
def fit(model: str, output: Path | None, as_json: bool, quiet: bool, **opts: Any) -> None:
    """Plan the serving configuration that fits, prove it with the real engine, write it.

    MODEL is a local folder, a Hugging Face id, or a catalog name. Exits 3 when nothing
    fits (with the shortfall and the ways out), 4 when the engine fails otherwise.

    \b
    Examples:
      oominfer fit meta-llama/Llama-3.1-8B-Instruct --gpu L4 -o plan.json
      oominfer fit Qwen/Qwen3-32B --gpu H100 --gpus 2 --prefer throughput --min-context 32768
      oominfer fit ./my-model --device cpu --memory 6GiB
    """
    from oominfer.report.fit import fit_report

    if output:
        check_writable(output)  # before minutes of verifying, not after
    plan, cached = fit_from_flags(model, opts, Progress(quiet=quiet or as_json))
    if output:
        write_plan(plan, output)
    if as_json:
        click.echo(plan.to_json(), nl=False)
        return
    for line in fit_report(plan, cached=cached):
        click.echo(line)
    if output:
        click.echo(f"Wrote {output}")
