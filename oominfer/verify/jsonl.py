"""The local stores of measurements: one JSON line per model x GPU x engine release."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from oominfer.rules.versions import release_of

KEY = ("model_id", "gpu", "engine_release")
T = TypeVar("T")


def store_key(model_id: str, gpu: str, engine_version: str) -> tuple[str, str, str]:
    """(model, GPU, release): ``0.32`` for any vLLM 0.32.x, ``transformers 5.19`` for the
    transformers engine on transformers 5.19.x (its measurements never stand for vLLM's); an
    engine whose version names no release (``not installed``, a stand-in) keeps its text."""
    release = release_of(engine_version)
    if release is None:
        return model_id, gpu, engine_version
    engine = "transformers " if engine_version.startswith("transformers") else ""
    return model_id, gpu, f"{engine}{release[0]}.{release[1]}"


def read_lines(path: Path) -> list[dict[str, Any]]:
    """The store's entries; a torn or foreign line is skipped, not fatal."""
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and set(KEY) <= set(entry):
            out.append(entry)
    return out


def find(path: Path, key: tuple[str, str, str], build: Callable[[dict[str, Any]], T]) -> T | None:
    """The entry of this model x GPU x engine release, built; None if none was kept or it
    cannot be read."""
    entry = next((e for e in read_lines(path) if tuple(e[k] for k in KEY) == key), None)
    if entry is None:
        return None
    try:
        return build(entry)
    except (KeyError, TypeError, ValueError):
        return None


def replace(path: Path, entry: dict[str, Any]) -> None:
    """Keep ``entry``, replacing the one of the same model x GPU x engine release; a store
    that cannot be written is not an error."""
    key = tuple(entry[k] for k in KEY)
    kept = [e for e in read_lines(path) if tuple(e[k] for k in KEY) != key]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(e) + "\n" for e in [*kept, entry]))
    except OSError:
        pass


def keep(
    path: Path,
    model_id: str,
    gpu: str,
    *,
    engine_version: str,
    measured_at: str,
    fields: dict[str, Any],
) -> None:
    """Keep (replace) the measurement of this model x GPU x engine release."""
    _, _, release = store_key(model_id, gpu, engine_version)
    replace(path, {"model_id": model_id, "gpu": gpu, "engine_release": release,
                   "engine_version": engine_version, "measured_at": measured_at,
                   **fields})  # fmt: skip
