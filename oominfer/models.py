"""Where a model's spec comes from: a local folder, the built-in catalog, or the Hub.

Order: a local folder (config.json and the safetensors headers); the local Hugging Face
cache; the built-in catalog (exact sizes, offline, instant) unless a revision is asked for;
then the Hub over the network. Hub errors are translated here, by type, into oominfer's.
"""

from __future__ import annotations

import functools
import json
import os
import re
import struct
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from oominfer.errors import (
    CorruptWeightsError,
    GatedModelError,
    ModelError,
    ModelNotFoundError,
    UnsupportedConfigError,
)
from oominfer.spec import Checkpoint, ModelSpec

# A safetensors file starts with an 8-byte little-endian header length, then the JSON
# header; anything claiming more than this is corrupt (the format caps it at 100 MB).
_MAX_HEADER_BYTES = 100_000_000


@dataclass(frozen=True, slots=True)
class CatalogEntry:
    """One model of the built-in catalog."""

    model_id: str
    config: dict[str, Any]
    checkpoint: Checkpoint
    source: str


@functools.cache
def _catalog() -> dict[str, Any]:
    text = resources.files("oominfer.data").joinpath("models.json").read_text(encoding="utf-8")
    models: dict[str, Any] = json.loads(text)["models"]
    return models


def _key(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@functools.cache
def _catalog_index() -> dict[str, str]:
    index: dict[str, str] = {}
    for model_id, entry in _catalog().items():
        for alias in (model_id, model_id.split("/")[-1], *entry.get("aliases", [])):
            index.setdefault(_key(alias), model_id)
    return index


def catalog_ids() -> list[str]:
    """Every model id in the built-in catalog, sorted."""
    return sorted(_catalog())


def catalog_entry(name: str) -> CatalogEntry | None:
    """The catalog's entry for a model id or short name (case- and punctuation-insensitive)."""
    model_id = _catalog_index().get(_key(name))
    if model_id is None:
        return None
    entry = _catalog()[model_id]
    config = with_modelopt(entry["config"], entry.get("hf_quant_config"))
    checkpoint = Checkpoint(
        parameters=dict(entry.get("parameters") or {}),
        total_bytes=entry.get("total_size_bytes"),
    )
    return CatalogEntry(model_id, config, checkpoint, entry.get("source", ""))


def with_modelopt(config: dict[str, Any], hf_quant_config: Any) -> dict[str, Any]:
    """NVIDIA ModelOpt checkpoints describe their quantization in hf_quant_config.json, not
    in config.json; vLLM reads it from there. Fold it in as a quantization_config."""
    if "quantization_config" in config or not isinstance(hf_quant_config, dict):
        return config
    quant = hf_quant_config.get("quantization") or {}
    if not isinstance(quant, dict) or not quant.get("quant_algo"):
        return config
    return {**config, "quantization_config": {"quant_method": "modelopt", **quant}}


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
    return ModelSpec.from_hf_config(
        config,
        model_id=model_id or str(folder),
        checkpoint=checkpoint_from_headers(folder),
        source=source or str(folder),
    )


def load_spec(name: str, *, revision: str | None = None) -> ModelSpec:
    """Find a model by folder path, catalog name or Hub id.

    Raises:
        ModelNotFoundError: nowhere to be found; GatedModelError: no access;
        UnsupportedConfigError / CorruptWeightsError: found but unreadable.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        return spec_from_folder(path)
    if path.is_file() and path.name == "config.json":
        return ModelSpec.from_hf_config(read_config(path), model_id=str(path.parent))
    if name.count("/") > 1 or name.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"no model folder at {name}.")
    if revision is None:
        cached = _from_hf_cache(name)
        if cached is not None:
            return cached
        entry = catalog_entry(name)
        if entry is not None:
            return ModelSpec.from_hf_config(
                entry.config,
                model_id=entry.model_id,
                checkpoint=entry.checkpoint,
                source="catalog",
            )
    return _from_hub(name, revision=revision)


def _hf_cache_dir() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def _from_hf_cache(repo_id: str) -> ModelSpec | None:
    """A model already in the local Hugging Face cache, read without importing
    huggingface_hub (its import alone costs a third of a second)."""
    if "/" not in repo_id:
        return None
    repo = _hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    try:
        commit = (repo / "refs" / "main").read_text().strip()
    except OSError:
        return None
    folder = repo / "snapshots" / commit
    if not (folder / "config.json").is_file():
        return None
    return spec_from_folder(folder, model_id=repo_id, source=f"hf-cache:{folder}")


def _from_hub(repo_id: str, *, revision: str | None) -> ModelSpec:
    """config.json and safetensors metadata from the Hugging Face Hub (HF_TOKEN honoured)."""
    from huggingface_hub import HfApi, hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        LocalEntryNotFoundError,
        NotASafetensorsRepoError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
        SafetensorsParsingError,
    )

    known = ", ".join(catalog_ids()[:3])
    try:
        config_path = hf_hub_download(repo_id, "config.json", revision=revision)
        checkpoint = Checkpoint()
        try:
            meta = HfApi().get_safetensors_metadata(repo_id, revision=revision)
            checkpoint = Checkpoint(
                parameters={str(k): int(v) for k, v in meta.parameter_count.items()}
            )
        except (NotASafetensorsRepoError, SafetensorsParsingError, HfHubHTTPError, OSError):
            pass  # the sizes are optional: the architecture gives them too
    except GatedRepoError:
        raise GatedModelError(
            f"{repo_id} is gated and this token has no access to it.",
            hint=f"Request access at https://huggingface.co/{repo_id} and set HF_TOKEN.",
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFoundError(f"{repo_id} has no revision {revision!r}.") from None
    except (RepositoryNotFoundError, HFValidationError):
        raise ModelNotFoundError(
            f"unknown model {repo_id!r}: not a folder, not in the built-in catalog, "
            "not on the Hugging Face Hub.",
            hint=f"Check the name (e.g. {known}); `oominfer models` lists the catalog.",
        ) from None
    except LocalEntryNotFoundError:  # a subclass of EntryNotFoundError: test it first
        raise ModelNotFoundError(
            f"{repo_id!r} is not in the built-in catalog and the Hugging Face Hub cannot be "
            "reached (offline).",
            hint=f"Use a local folder, a catalog model (e.g. {known}), or go online.",
        ) from None
    except EntryNotFoundError:
        raise UnsupportedConfigError(f"{repo_id} has no config.json on the Hub.") from None
    return ModelSpec.from_hf_config(
        read_config(Path(config_path)), model_id=repo_id, checkpoint=checkpoint, source="hub"
    )
