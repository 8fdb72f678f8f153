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

from oominfer.base.errors import InvalidSettingError
from oominfer.base.units import parse_size
from oominfer.edge.limits import (
    DEFAULT_MAX_BODY,
    DEFAULT_TIMEOUT_KEEP_ALIVE_S,
    DEFAULT_TIMEOUT_REQUEST_S,
    MAX_CONNECTIONS_CEILING,
    ClientLimits,
    default_max_connections,
)
from oominfer.planning.document import Plan, plan_from_json
from oominfer.settings import DECLARED, EngineSettings

SETTINGS = tuple(d for d in DECLARED if "transformers" in d.engines)
"""The engine settings this server takes on its command line."""
log = logging.getLogger("oominfer.transformers")

API_KEY_ENV: Final = "OOMINFER_API_KEY"
DEFAULT_MAX_NUM_SEQS: Final = 8
DEFAULT_MAX_QUEUE: Final = 256
DEFAULT_GRACE_PERIOD_S: Final = 30.0
DEFAULT_MAX_TOKENS: Final = 4096
"""``max_tokens`` of a chat that gives none, when the checkpoint's generation_config.json sets
no ``max_new_tokens`` (see ``prompts.default_max_tokens``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """What one server process serves, resolved from the plan and the flags."""

    model: str
    served_model_name: str
    settings: EngineSettings
    revision: str | None = None
    """The Hub revision to load (``--revision``; default: the plan's)."""
    device: str = "auto"
    host: str = "127.0.0.1"
    port: int = 8000
    max_queue: int = DEFAULT_MAX_QUEUE
    api_key: str | None = None
    grace_period_s: float = DEFAULT_GRACE_PERIOD_S
    default_max_tokens: int | None = None
    """``--default-max-tokens``; None: the checkpoint's generation config, else 4096."""
    limits: ClientLimits = dataclasses.field(
        default_factory=lambda: ClientLimits(max_connections=MAX_CONNECTIONS_CEILING)
    )

    @property
    def max_num_seqs(self) -> int:
        """Sequences in one batch."""
        return self.settings.max_num_seqs or DEFAULT_MAX_NUM_SEQS


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The command line (see the package docstring)."""
    p = argparse.ArgumentParser(
        prog="python -m oominfer.engines.transformers",
        description="Serve a causal LM with transformers behind an OpenAI-compatible API.",
    )
    p.add_argument("--model", help="model folder or id (default: the plan's model_id)")
    p.add_argument("--plan", type=Path, help="a plan.json written by `oominfer fit`")
    p.add_argument("--revision", help="Hub revision of the model (default: the plan's)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: %(default)s); another than loopback "
                   "without --api-key logs a warning")  # fmt: skip
    p.add_argument("--port", type=int, default=8000)
    for d in SETTINGS:  # the engine settings, as declared once (oominfer.settings)
        p.add_argument(d.flag, type=d.kind, choices=d.choices or None, help=d.help)
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
    p.add_argument(
        "--default-max-tokens",
        type=int,
        help="max_tokens of a chat request that gives none, besides the context left after "
        "the prompt (vLLM's bound); default: the checkpoint's generation_config.json "
        f"max_new_tokens, else {DEFAULT_MAX_TOKENS}. Completions default to 16, as OpenAI's.",
    )
    p.add_argument(
        "--max-body-size",
        default=DEFAULT_MAX_BODY,
        help="largest request body; a larger one gets 413 (default: %(default)s)",
    )
    p.add_argument(
        "--timeout-keep-alive",
        type=int,
        default=DEFAULT_TIMEOUT_KEEP_ALIVE_S,
        help="close a connection with no request in progress after this many seconds, "
        "whether it has sent one before or not (default: %(default)s)",
    )
    p.add_argument(
        "--timeout-request",
        type=float,
        default=DEFAULT_TIMEOUT_REQUEST_S,
        help="seconds a client has to send a whole request once it starts; a slower one "
        "gets 408 and its connection is closed (default: %(default)s)",
    )
    p.add_argument(
        "--max-connections",
        type=int,
        help="open connections at most: a new one closes the longest-idle one, or is closed "
        "itself when every connection has a request in progress (default: what the open-file "
        f"limit leaves, at most {MAX_CONNECTIONS_CEILING})",
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
    base = plan.settings if plan else EngineSettings()
    overrides = {d.name: getattr(args, d.name) for d in SETTINGS}
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
    for flag, value in (
        ("--default-max-tokens", args.default_max_tokens),
        ("--max-connections", args.max_connections),
        ("--timeout-keep-alive", args.timeout_keep_alive),
        ("--timeout-request", args.timeout_request),
    ):
        if value is not None and value <= 0:
            raise InvalidSettingError(f"{flag} must be positive, got {value}.")
    limits = ClientLimits(
        max_connections=args.max_connections or default_max_connections(),
        timeout_keep_alive_s=args.timeout_keep_alive,
        timeout_request_s=args.timeout_request,
        max_body_bytes=parse_size(args.max_body_size),
    )
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
        default_max_tokens=args.default_max_tokens,
        limits=limits,
    )
