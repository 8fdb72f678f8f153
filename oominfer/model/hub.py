"""The Hugging Face side: the local cache (read without importing huggingface_hub) and the
Hub over the network. Hub errors are translated here, by type, into oominfer's."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from oominfer.errors import GatedModelError, ModelNotFoundError, UnsupportedConfigError
from oominfer.model.catalog import catalog_ids
from oominfer.model.config import spec_from_config
from oominfer.model.folder import read_config, spec_from_folder
from oominfer.model.spec import Checkpoint, ModelSpec


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def from_hf_cache(repo_id: str) -> ModelSpec | None:
    """A model already in the local Hugging Face cache, read without importing
    huggingface_hub (its import alone costs a third of a second)."""
    if "/" not in repo_id:
        return None
    repo = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    try:
        commit = (repo / "refs" / "main").read_text().strip()
    except OSError:
        return None
    folder = repo / "snapshots" / commit
    if not (folder / "config.json").is_file():
        return None
    return spec_from_folder(folder, model_id=repo_id, source=f"hf-cache:{folder}")


def from_hub(repo_id: str, *, revision: str | None) -> ModelSpec:
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
    spec = spec_from_config(
        read_config(Path(config_path)), model_id=repo_id, checkpoint=checkpoint, source="hub"
    )
    return dataclasses.replace(spec, revision=revision)
