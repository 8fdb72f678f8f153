"""What one server process serves: the command line and the plan, resolved to a ServerConfig."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from oominfer.engines.transformers.memory import TEST_OOM_ENV
from oominfer.errors import InvalidSettingError
from oominfer.planning.document import Plan, plan_from_json
from oominfer.settings import VllmSettings

log = logging.getLogger("oominfer.transformers")

API_KEY_ENV: Final = "OOMINFER_API_KEY"
DEFAULT_MAX_NUM_SEQS: Final = 8
DEFAULT_MAX_QUEUE: Final = 256
DEFAULT_GRACE_PERIOD_S: Final = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """What one server process serves, resolved from the plan and the flags."""

    model: str
    served_model_name: str
    settings: VllmSettings
    revision: str | None = None
    """The Hub revision to load (``--revision``; default: the plan's)."""
    device: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8000
    max_queue: int = DEFAULT_MAX_QUEUE
    api_key: str | None = None
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S

    @property
    def max_num_seqs(self) -> int:
        """Sequences in one batch."""
        return self.settings.max_num_seqs or DEFAULT_MAX_NUM_SEQS


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the package docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m oominfer.engines.transformers",
        description="Serve a causal LM with transformers behind an OpenAI-compatible API.",
        epilog=f"Test only: {TEST_OOM_ENV}=N makes the N-th batched forward pass raise "
        "torch.OutOfMemoryError.",
    )
    p.add_argument("--model", help="model folder or id (default: the plan's model_id)")
    p.add_argument("--plan", type=Path, help="a plan.json written by `oominfer fit`")
    p.add_argument("--revision", help="Hub revision of the model (default: the plan's)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--dtype", choices=["auto", "bfloat16", "float16", "float32"])
    p.add_argument("--quantization", choices=["bitsandbytes", "int8"])
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument(
        "--max-queue",
        type=int,
        default=DEFAULT_MAX_QUEUE,
        help="requests allowed to wait for a batch slot before 429 (default: %(default)s)",
    )
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"bearer token required on /v1/* (default: ${API_KEY_ENV})")  # fmt: skip
    p.add_argument("--served-model-name")
    p.add_argument(
        "--grace-period",
        type=float,
        default=DEFAULT_GRACE_PERIOD_S,
        help="seconds to finish in-flight requests after SIGTERM (default: %(default)s)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p.parse_args(argv)


def resolve_config(args: argparse.Namespace) -> ServerConfig:
    """Merge the plan (if any) with the flags; flags win.

    Raises:
        PlanError: the plan cannot be read.
        InvalidSettingError: an impossible setting.
    """
    plan: Plan | None = None
    if args.plan is not None:
        try:
            text = args.plan.read_text()
        except OSError as err:
            raise InvalidSettingError(f"cannot read --plan {args.plan}: {err.strerror}.") from None
        plan = plan_from_json(text, source=str(args.plan))
    base = plan.settings if plan else VllmSettings()
    overrides = {
        "dtype": args.dtype,
        "quantization": args.quantization,
        "max_model_len": args.max_model_len,
        "max_num_seqs": args.max_num_seqs,
    }
    settings = dataclasses.replace(base, **{k: v for k, v in overrides.items() if v is not None})
    if settings.quantization not in (None, "bitsandbytes", "int8"):
        log.warning("quantization %r is left to the checkpoint's own config.",
                    settings.quantization)  # fmt: skip
    model = args.model or (plan.model_id if plan else None)
    if not model:
        raise InvalidSettingError(
            "no model to serve.", hint="Pass --model DIR or --plan plan.json."
        )
    if args.max_queue < 1:
        raise InvalidSettingError(f"--max-queue must be a positive integer, got {args.max_queue}.")
    if args.grace_period < 0:
        raise InvalidSettingError(f"--grace-period must be >= 0, got {args.grace_period}.")
    return ServerConfig(
        model=model,
        served_model_name=args.served_model_name or model,
        settings=settings,
        revision=args.revision or (plan.revision if plan else None),
        device=args.device or (plan.device if plan else "auto"),
        host=args.host,
        port=args.port,
        max_queue=args.max_queue,
        api_key=args.api_key or None,
        grace_period_s=args.grace_period,
    )
