"""A model saved on disk: its config.json and the headers of its safetensors files."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from oominfer.errors import (
    CorruptWeightsError,
    ModelError,
    ModelNotFoundError,
    UnsupportedConfigError,
)
from oominfer.model.config import spec_from_config, with_modelopt
from oominfer.model.spec import Checkpoint, ModelSpec

# A safetensors file starts with an 8-byte little-endian header length, then the JSON
# header; anything claiming more than this is corrupt (the format caps it at 100 MB).
_MAX_HEADER_BYTES = 100_000_000


def read_config(path: Path) -> dict[str, Any]:
    """Parse a config.json file.

    Raises:
        ModelNotFoundError: the file does not exist.
        UnsupportedConfigError: it is not a JSON object.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelNotFoundError(
            f"{path.parent} has no config.json.",
            hint="Point at the folder that holds the model's config.json and safetensors.",
        ) from None
    except OSError as err:
        raise ModelError(f"cannot read {path}: {err.strerror}.") from err
    try:
        config = json.loads(text)
    except json.JSONDecodeError as err:
        raise UnsupportedConfigError(
            f"{path} is not valid JSON (line {err.lineno}, column {err.colno}: {err.msg}).",
            hint="The file may be truncated; download it again.",
        ) from None
    if not isinstance(config, dict):
        raise UnsupportedConfigError(f"{path} must hold a JSON object.")
    return config


def safetensors_header(path: Path) -> dict[str, Any]:
    """Read only the JSON header of a safetensors file (never the tensors).

    Raises:
        CorruptWeightsError: the header is truncated, oversized or not JSON.
    """
    try:
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CorruptWeightsError(f"{path} is too short to be a safetensors file.")
            (size,) = struct.unpack("<Q", head)
            if size > _MAX_HEADER_BYTES:
                raise CorruptWeightsError(
                    f"{path} claims a {size}-byte header; the file is corrupt."
                )
            raw = f.read(size)
    except OSError as err:
        raise ModelError(f"cannot read {path}: {err.strerror}.") from err
    if len(raw) < size:
        raise CorruptWeightsError(
            f"{path} is truncated: its header needs {size} bytes, the file has {len(raw)}.",
            hint="Download the file again.",
        )
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CorruptWeightsError(
            f"{path} has a header that is not JSON; the file is corrupt."
        ) from None
    if not isinstance(header, dict):
        raise CorruptWeightsError(f"{path} has a header that is not a JSON object.")
    return header


def checkpoint_from_headers(folder: Path) -> Checkpoint:
    """Exact element counts per dtype, summed over the folder's safetensors files."""
    files = sorted(folder.glob("*.safetensors"))
    counts: dict[str, int] = {}
    total = 0
    for file in files:
        for name, tensor in safetensors_header(file).items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape = str(tensor["dtype"]), [int(d) for d in tensor["shape"]]
                start, end = (int(o) for o in tensor["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise CorruptWeightsError(
                    f"{file}: tensor {name!r} has a malformed entry."
                ) from None
            n = 1
            for d in shape:
                n *= d
            counts[dtype] = counts.get(dtype, 0) + n
            total += end - start
    return Checkpoint(parameters=counts, total_bytes=total or None)


def spec_from_folder(
    folder: Path, *, model_id: str | None = None, source: str | None = None
) -> ModelSpec:
    """A model saved on disk: its config.json (and a ModelOpt hf_quant_config.json beside
    it) and its safetensors headers."""
    config = read_config(folder / "config.json")
    side = folder / "hf_quant_config.json"
    if side.is_file():
        config = with_modelopt(config, read_config(side))
    return spec_from_config(
        config,
        model_id=model_id or str(folder),
        checkpoint=checkpoint_from_headers(folder),
        source=source or str(folder),
    )
