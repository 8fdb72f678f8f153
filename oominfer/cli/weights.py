"""A local model folder without weights: planned from its config.json alone, or refused
where an engine must load it."""

from __future__ import annotations

from pathlib import Path

import click

from oominfer.base.errors import IncompleteCheckpointError
from oominfer.model.spec import ModelSpec

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt", "*.gguf")
"""Files an engine loads weights from."""


def weightless_folder(model: str, spec: ModelSpec) -> Path | None:
    """The folder ``model`` names when it holds a config.json but no weight files."""
    folder = Path(model)
    if not folder.is_dir() or spec.checkpoint.tensor_bytes is not None:
        return None
    if any(next(folder.glob(pattern), None) for pattern in WEIGHT_PATTERNS):
        return None
    return folder


def check_weights(model: str, spec: ModelSpec, *, loads: bool) -> None:
    """Warn that a folder without weights is estimated from config.json alone; refuse it
    when the engine must load it (``loads``: fit with verification, serve).

    Raises:
        IncompleteCheckpointError: the folder has no weights and the engine must load them.
    """
    folder = weightless_folder(model, spec)
    if folder is None:
        return
    if loads:
        raise IncompleteCheckpointError(
            f"{folder} has a config.json but no weights (no *.safetensors or *.bin): the "
            "engine has nothing to load.",
            hint="Download the weights into it, or pass --no-verify to plan from config.json.",
        )
    click.echo(
        f"Warning: {folder} has no weights; the estimate comes from its config.json alone "
        "(the layers and widths), not from the checkpoint's tensors.",
        err=True,
    )
