"""The Hugging Face side: the local cache (read without importing huggingface_hub) and the
Hub over the network. Hub errors are translated here, by type, into oominfer's."""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
from pathlib import Path
from typing import Final

from oominfer.base.errors import GatedModelError, ModelNotFoundError, UnsupportedConfigError
from oominfer.model.catalog import catalog_ids
from oominfer.model.config import spec_from_config
from oominfer.model.folder import read_config, spec_from_folder
from oominfer.model.spec import Checkpoint, ModelSpec

_COMMIT_RE: Final = re.compile(r"^[0-9a-f]{40}$")
_EXAMPLES: Final = "meta-llama/Llama-3.1-8B-Instruct, Qwen/Qwen3-8B"
"""Catalog models to name where no close name is known."""
_HUB_TIMEOUT_S: Final = 10.0
"""The first request to the Hub: one try within this, never huggingface_hub's retries
(five, with back-off: 24 s before an offline machine says so)."""


def hf_cache_dir() -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub resolves it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def cached_repo_ids() -> list[str]:
    """The models in the local Hugging Face cache (``models--org--name`` folders)."""
    try:
        folders = sorted(hf_cache_dir().iterdir())
    except OSError:
        return []
    return [
        p.name.removeprefix("models--").replace("--", "/", 1)
        for p in folders
        if p.name.startswith("models--")
    ]


def close_names(name: str, *, limit: int = 2) -> list[str]:
    """Model ids of the catalog and the local Hugging Face cache that look like ``name``
    (a typo, another case, a missing organisation), closest first."""
    known = dict.fromkeys([*cached_repo_ids(), *catalog_ids()])
    by_key: dict[str, str] = {}
    for model_id in known:
        by_key.setdefault(model_id.lower(), model_id)
        by_key.setdefault(model_id.rsplit("/", 1)[-1].lower(), model_id)
    found = difflib.get_close_matches(name.lower(), list(by_key), n=limit * 2, cutoff=0.75)
    short = difflib.get_close_matches(
        name.rsplit("/", 1)[-1].lower(), list(by_key), n=limit * 2, cutoff=0.75
    )
    return list(dict.fromkeys(by_key[k] for k in [*found, *short]))[:limit]


def _did_you_mean(name: str, otherwise: str) -> str:
    close = close_names(name)
    if not close:
        return otherwise
    return f"Did you mean {' or '.join(close)}? `oominfer models` lists the catalog."


def from_hf_cache(repo_id: str, revision: str | None = None) -> ModelSpec | None:
    """A model already in the local Hugging Face cache, read without importing
    huggingface_hub (its import alone costs a third of a second).

    ``revision``: a branch or tag (``refs/<revision>``) or a commit (``snapshots/<commit>``);
    None is ``main``.
    """
    if "/" not in repo_id:
        return None
    repo = hf_cache_dir() / ("models--" + repo_id.replace("/", "--"))
    ref = revision or "main"
    try:
        commit = (repo / "refs" / ref).read_text().strip()
    except OSError:
        if not _COMMIT_RE.match(ref):
            return None
        commit = ref
    folder = repo / "snapshots" / commit
    if not (folder / "config.json").is_file():
        return None
    spec = spec_from_folder(folder, model_id=repo_id, source=f"hf-cache:{folder}")
    return dataclasses.replace(spec, revision=revision)


def _unreachable(repo_id: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"{repo_id!r} is not a local folder, not in the Hugging Face cache or the built-in "
        "catalog, and the Hugging Face Hub cannot be reached (offline).",
        hint=_did_you_mean(
            repo_id, f"Use a local folder, a catalog model (e.g. {_EXAMPLES}), or go online."
        ),
    )


def _network_errors() -> tuple[type[BaseException], ...]:
    """What huggingface_hub raises when the Hub cannot be reached: OSError (its offline
    mode; requests' connection errors are OSErrors) and the transport errors of the HTTP
    client it runs on (httpx and its successors: ``TransportError``, the base of their
    connect, timeout and protocol errors), found through its public ``get_session()``."""
    from huggingface_hub import get_session

    client = sys.modules[type(get_session()).__module__.partition(".")[0]]
    transport = getattr(client, "TransportError", None)
    if isinstance(transport, type) and issubclass(transport, BaseException):
        return (OSError, transport)
    return (OSError,)


def from_hub(repo_id: str, *, revision: str | None) -> ModelSpec:
    """config.json and safetensors metadata from the Hugging Face Hub (HF_TOKEN honoured).

    One request first, without retries: an offline machine or an unknown name is told so
    within a second or two, not after huggingface_hub's retries.
    """
    from huggingface_hub import HfApi, get_hf_file_metadata, hf_hub_download, hf_hub_url
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

    try:
        try:
            url = hf_hub_url(repo_id, "config.json", revision=revision)
            get_hf_file_metadata(url, timeout=_HUB_TIMEOUT_S)
        except HfHubHTTPError:
            raise  # the Hub answered: mapped below
        except _network_errors():
            raise _unreachable(repo_id) from None
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
    except HFValidationError:
        raise ModelNotFoundError(
            f"{repo_id!r} is not a model folder, a catalog name or a Hugging Face id "
            "(org/name: letters, digits, '-', '_' and '.').",
            hint=_did_you_mean(repo_id, f"For example: {_EXAMPLES}."),
        ) from None
    except RepositoryNotFoundError:
        raise ModelNotFoundError(
            f"unknown model {repo_id!r}: not a folder, not in the built-in catalog, "
            "not on the Hugging Face Hub.",
            hint=_did_you_mean(
                repo_id, f"Check the name (e.g. {_EXAMPLES}); `oominfer models` lists the catalog."
            ),
        ) from None
    except LocalEntryNotFoundError:  # a subclass of EntryNotFoundError: test it first
        raise _unreachable(repo_id) from None
    except EntryNotFoundError:
        raise UnsupportedConfigError(f"{repo_id} has no config.json on the Hub.") from None
    spec = spec_from_config(
        read_config(Path(config_path)), model_id=repo_id, checkpoint=checkpoint, source="hub"
    )
    return dataclasses.replace(spec, revision=revision)
