"""``oominfer serve``: run a plan (or fit a model first) behind the OpenAI API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from oominfer.cli.fit import fit_from_flags
from oominfer.cli.options import fit_options
from oominfer.errors import PlanError


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
    from oominfer.engines.vllm import to_vllm_args
    from oominfer.planning.document import read_plan
    from oominfer.serving.run import run

    if target.endswith(".json"):
        plan = read_plan(Path(target))
    else:
        plan, _ = fit_from_flags(target, opts)
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
