"""The entry point: flags, model loading, start-up errors, then serving until a signal."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

import uvicorn

from oominfer.engines.transformers.config import ServerConfig, parse_args, resolve_config
from oominfer.engines.transformers.runner import ModelRunner
from oominfer.engines.transformers.server import Server
from oominfer.engines.transformers.shutdown import DrainingUvicorn
from oominfer.errors import OominferError

log = logging.getLogger("oominfer.transformers")


def _describe(config: ServerConfig, server: Server) -> str:
    s = config.settings
    return (
        f"Serving {config.model} as {config.served_model_name!r} on "
        f"http://{config.host}:{config.port} with transformers on {server.engine.device}: "
        f"dtype={s.dtype} quantization={s.quantization or 'none'} "
        f"max_model_len={server.max_model_len} max_num_seqs={config.max_num_seqs} "
        f"max_queue={config.max_queue} grace_period={config.grace_period_s:g}s "
        f"api_key={'set' if config.api_key else 'none'} "
        f"weights={server.engine.weights_bytes / 2**20:.1f} MiB"
    )


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
    uv_config = uvicorn.Config(
        server.app,
        host=config.host,
        port=config.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=5,
        access_log=False,
    )
    DrainingUvicorn(uv_config, server).run()
    log.info("Stopped.")
    return 0
