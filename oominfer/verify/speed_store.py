"""The speeds engines measured on this machine, one JSON line per model x GPU x engine
release, so the next estimate of the same setup starts from what was measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oominfer.rules.versions import release_of
from oominfer.speed import Measured
from oominfer.verify.cache import cache_dir


def store_path() -> Path:
    """speed.jsonl beside the verified plans (OOMINFER_CACHE_DIR, else the user's cache)."""
    return cache_dir() / "speed.jsonl"


def _release(version: str) -> str:
    """``0.32`` for any vLLM 0.32.x; an engine whose version names no release (``not
    installed``, a stand-in) keeps its own text."""
    release = release_of(version)
    return f"{release[0]}.{release[1]}" if release else version


def _key(model_id: str, gpu: str, engine_version: str) -> tuple[str, str, str]:
    return model_id, gpu, _release(engine_version)


def _lines() -> list[dict[str, Any]]:
    try:
        text = store_path().read_text()
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue  # a torn or foreign line is skipped, not fatal
        if isinstance(entry, dict) and {"model_id", "gpu", "engine_release"} <= set(entry):
            out.append(entry)
    return out


def remember(model_id: str, gpu: str, measured: Measured) -> None:
    """Keep (replace) the measurement of this model x GPU x engine release."""
    key = _key(model_id, gpu, measured.engine_version)
    entry = {
        "model_id": model_id,
        "gpu": gpu,
        "engine_release": key[2],
        "engine_version": measured.engine_version,
        "measured_at": measured.measured_at,
        "output_tokens_per_s": measured.output_tokens_per_s,
        "predicted_output_tokens_per_s": measured.predicted_output_tokens_per_s,
        "concurrency": measured.concurrency,
        "input_len": measured.input_len,
        "output_len": measured.output_len,
    }
    kept = [e for e in _lines() if (e["model_id"], e["gpu"], e["engine_release"]) != key]
    try:
        store_path().parent.mkdir(parents=True, exist_ok=True)
        store_path().write_text("".join(json.dumps(e) + "\n" for e in [*kept, entry]))
    except OSError:
        pass  # a store that cannot be written is not an error


def recall(model_id: str, gpu: str, engine_version: str) -> Measured | None:
    """The measurement of this model x GPU x engine release, if one was kept."""
    key = _key(model_id, gpu, engine_version)
    for e in _lines():
        if (e["model_id"], e["gpu"], e["engine_release"]) == key:
            try:
                return Measured(
                    output_tokens_per_s=float(e["output_tokens_per_s"]),
                    predicted_output_tokens_per_s=e.get("predicted_output_tokens_per_s"),
                    concurrency=int(e["concurrency"]),
                    input_len=int(e["input_len"]),
                    output_len=int(e["output_len"]),
                    engine_version=str(e.get("engine_version", "")),
                    measured_at=str(e.get("measured_at", "")),
                )
            except (KeyError, TypeError, ValueError):
                return None
    return None
