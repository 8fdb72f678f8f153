"""The entry point: flags, model loading, start-up errors, then serving until a signal."""

from __future__ import annotations

import ipaddress
import logging
import os
import sys
from collections.abc import Sequence

import uvicorn

from oominfer.base.errors import OominferError
from oominfer.base.units import format_bytes
from oominfer.edge.connections import protocol_class
from oominfer.engines.transformers.config import (
    API_KEY_ENV,
    ServerConfig,
    parse_args,
    resolve_config,
)
from oominfer.engines.transformers.runner import ModelRunner
from oominfer.engines.transformers.server import Server
from oominfer.engines.transformers.shutdown import DrainingUvicorn

log = logging.getLogger("oominfer.transformers")


def _describe(config: ServerConfig, server: Server) -> str:
    s = config.settings
    limits = config.limits
    return (
        f"Serving {config.model} as {config.served_model_name!r} on "
        f"http://{config.host}:{config.port} with transformers on {server.engine.device}: "
        f"dtype={s.dtype} quantization={s.quantization or 'none'} "
        f"max_model_len={server.max_model_len} max_num_seqs={config.max_num_seqs} "
        f"max_queue={config.max_queue} grace_period={config.grace_period_s:g}s "
        f"api_key={'set' if config.api_key else 'none'} "
        f"default_max_tokens={server.seqs.default_max_tokens} "
        f"max_body={format_bytes(limits.max_body_bytes)} "
        f"max_connections={limits.max_connections} "
        f"timeout_keep_alive={limits.timeout_keep_alive_s}s "
        f"timeout_request={limits.timeout_request_s:g}s "
        f"weights={server.engine.weights_bytes / 2**20:.1f} MiB"
    )


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the server until a signal; returns the process exit status."""
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        config = resolve_config(args)
        engine = ModelRunner.load(config)
        server = Server(config, engine)
    except OominferError as err:
        if os.environ.get("OOMINFER_DEBUG"):
            raise
        print(f"Error: {err}", file=sys.stderr)
        if err.hint:
            print(f"Hint: {err.hint}", file=sys.stderr)
        return int(err.exit_status)
    log.info("%s", _describe(config, server))
    if not config.api_key and not _loopback(config.host):
        log.warning("Listening on %s with no API key: anyone who can reach this host can use "
                    "the model; pass --api-key or set %s.", config.host, API_KEY_ENV)  # fmt: skip
    uv_config = uvicorn.Config(
        server.app,
        host=config.host,
        port=config.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
        access_log=False,
        http=protocol_class(config.limits),
        timeout_keep_alive=config.limits.timeout_keep_alive_s,
    )
    DrainingUvicorn(uv_config, server).run()
    log.info("Stopped.")
    return 0
