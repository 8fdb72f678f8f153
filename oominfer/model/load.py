"""Where a model's spec comes from, in order.

A local folder (config.json and the safetensors headers); the local Hugging Face cache (at
the revision asked for, else ``main``); the built-in catalog (exact sizes, offline, instant)
unless a revision is asked for; then the Hub over the network.
"""

from __future__ import annotations

from pathlib import Path

from oominfer.base.errors import InvalidSettingError, ModelNotFoundError
from oominfer.model.catalog import catalog_entry
from oominfer.model.config import spec_from_config
from oominfer.model.folder import read_config, spec_from_folder
from oominfer.model.hub import from_hf_cache, from_hub
from oominfer.model.spec import ModelSpec


def load_spec(name: str, *, revision: str | None = None) -> ModelSpec:
    """Find a model by folder path, catalog name or Hub id.

    Raises:
        ModelNotFoundError: nowhere to be found; GatedModelError: no access;
        UnsupportedConfigError / CorruptWeightsError / IncompleteCheckpointError: found but
        unreadable. InvalidSettingError: a revision for a local folder.
    """
    path = Path(name).expanduser()
    if revision is not None and (path.is_dir() or path.is_file()):
        raise InvalidSettingError(
            f"--revision {revision} is for Hub models; {name} is a local path.",
            hint="Leave out --revision, or name the model by its Hub id.",
        )
    if path.is_dir():
        return spec_from_folder(path)
    if path.is_file() and path.name == "config.json":
        return spec_from_config(read_config(path), model_id=str(path.parent))
    if name.count("/") > 1 or name.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"no model folder at {name}.")
    cached = from_hf_cache(name, revision)
    if cached is not None:
        return cached
    if revision is None:
        entry = catalog_entry(name)
        if entry is not None:
            return spec_from_config(
                entry.config,
                model_id=entry.model_id,
                checkpoint=entry.checkpoint,
                source="catalog",
            )
    return from_hub(name, revision=revision)
