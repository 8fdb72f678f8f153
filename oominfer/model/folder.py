"""A model saved on disk: its config.json and the headers of its safetensors files."""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from oominfer.base.errors import (
    CorruptWeightsError,
    IncompleteCheckpointError,
    ModelError,
    ModelNotFoundError,
    UnsupportedConfigError,
)
from oominfer.model.config import spec_from_config, with_modelopt
from oominfer.model.spec import Checkpoint, ModelSpec

# A safetensors file starts with an 8-byte little-endian header length, then the JSON
# header; anything claiming more than this is corrupt (the format caps it at 100 MB).
_MAX_HEADER_BYTES = 100_000_000
INDEX_FILE: Final = "model.safetensors.index.json"
# The decoder layer a tensor belongs to: model.layers.3., transformer.h.3., blocks.3. ...
_LAYER_RE: Final = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)\.")
_REDOWNLOAD: Final = "The download is incomplete: download the model again."


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


def missing_shards(folder: Path) -> list[str]:
    """The shard files that ``model.safetensors.index.json`` names but the folder lacks
    (a partial download); empty without an index.

    Raises:
        CorruptWeightsError: the index is not valid JSON.
    """
    index = folder / INDEX_FILE
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except OSError as err:
        raise ModelError(f"cannot read {index}: {err.strerror}.") from err
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise CorruptWeightsError(f"{index} is not valid JSON.", hint=_REDOWNLOAD) from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        return []
    shards = sorted({str(shard) for shard in weight_map.values()})
    return [shard for shard in shards if not (folder / shard).is_file()]


def _tensors(file: Path) -> Iterable[tuple[str, str, int, int]]:
    """(name, dtype, elements, end offset) of each tensor in a safetensors header."""
    for name, tensor in safetensors_header(file).items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = str(tensor["dtype"]), [int(d) for d in tensor["shape"]]
            start, end = (int(o) for o in tensor["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CorruptWeightsError(f"{file}: tensor {name!r} has a malformed entry.") from None
        if start < 0 or end < start:
            raise CorruptWeightsError(f"{file}: tensor {name!r} has impossible data offsets.")
        n = 1
        for d in shape:
            n *= d
        yield name, dtype, n, end


def checkpoint_from_headers(folder: Path) -> Checkpoint:
    """Exact element counts per dtype, summed over the folder's safetensors files.

    Raises:
        CorruptWeightsError: a header cannot be read, or a file is shorter than its header
            says (a truncated download).
    """
    checkpoint, _ = _read_headers(folder)
    return checkpoint


def _read_headers(folder: Path) -> tuple[Checkpoint, set[int]]:
    """The checkpoint's sizes, and the decoder layers its tensor names cover."""
    counts: dict[str, int] = {}
    layers: set[int] = set()
    total = 0
    for file in sorted(folder.glob("*.safetensors")):
        data_end = 0
        for name, dtype, n, end in _tensors(file):
            counts[dtype] = counts.get(dtype, 0) + n
            data_end = max(data_end, end)
            layers.update(int(m.group(1)) for m in _LAYER_RE.finditer(name))
        with file.open("rb") as f:
            (header_size,) = struct.unpack("<Q", f.read(8))
        need, size = 8 + header_size + data_end, file.stat().st_size
        if size < need:
            raise CorruptWeightsError(
                f"{file} is truncated: its tensors end at byte {need:,}, the file has {size:,}.",
                hint=_REDOWNLOAD,
            )
        total += data_end
    return Checkpoint(parameters=counts, total_bytes=total or None), layers


def _ranges(numbers: list[int]) -> str:
    """``2-31`` or ``3, 5, 7-9``: sorted integers as ranges."""
    parts: list[str] = []
    start = prev = numbers[0]
    for n in [*numbers[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return ", ".join(parts)


def _params(n: int) -> str:
    """A parameter count for people: ``8.03 B``, ``494.0 M``, ``32,768``."""
    if n >= 10**9:
        return f"{n / 1e9:.2f} B"
    return f"{n / 1e6:.1f} M" if n >= 10**6 else f"{n:,}"


def check_complete(spec: ModelSpec, folder: Path, layers: set[int]) -> None:
    """Refuse a checkpoint that cannot hold the model config.json describes: shards the
    index names but the folder lacks, decoder layers no tensor belongs to, or far fewer
    parameters than the architecture has. Each would make the estimate silently small.

    Raises:
        IncompleteCheckpointError: what is missing, with the numbers.
    """
    missing = missing_shards(folder)
    if missing:
        named = ", ".join(missing[:3]) + (
            f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        )
        raise IncompleteCheckpointError(
            f"{folder} lacks {len(missing)} of the shards its {INDEX_FILE} names ({named}).",
            hint=_REDOWNLOAD,
        )
    if not spec.checkpoint.parameters:
        return  # no safetensors files: the architecture gives the sizes
    if layers:
        absent = sorted(set(range(spec.num_layers)) - layers)
        if absent:
            raise IncompleteCheckpointError(
                f"{folder}: no tensor belongs to layers {_ranges(absent)} of the "
                f"{spec.num_layers} layers config.json declares.",
                hint=_REDOWNLOAD,
            )
    expected = spec.params.total
    held = spec.checkpoint.float_params
    if held is None and spec.quantization is not None and spec.checkpoint.tensor_bytes:
        # Packed or 8-bit tensors: no quantized format stores fewer bits than it names.
        held = int(spec.checkpoint.tensor_bytes * 8 / spec.quantization.bits)
    if held is not None and held < expected // 2:
        raise IncompleteCheckpointError(
            f"{folder}: the safetensors files hold {_params(held)} parameters, but "
            f"config.json describes {_params(expected)}.",
            hint=_REDOWNLOAD + " Or the config.json belongs to another model.",
        )


def spec_from_folder(
    folder: Path, *, model_id: str | None = None, source: str | None = None
) -> ModelSpec:
    """A model saved on disk: its config.json (and a ModelOpt hf_quant_config.json beside
    it) and its safetensors headers."""
    config = read_config(folder / "config.json")
    side = folder / "hf_quant_config.json"
    if side.is_file():
        config = with_modelopt(config, read_config(side))
    checkpoint, layers = _read_headers(folder)
    spec = spec_from_config(
        config,
        model_id=model_id or str(folder),
        checkpoint=checkpoint,
        source=source or str(folder),
    )
    check_complete(spec, folder, layers)
    return spec
