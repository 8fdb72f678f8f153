"""Verified plans, kept by everything that went into them, so a second fit costs nothing."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from oominfer.base.errors import OominferError
from oominfer.hardware.hardware import Hardware
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.planning.document import Plan, plan_from_json
from oominfer.planning.record import architecture_facts, hardware_facts


def cache_key(spec: ModelSpec, hardware: Hardware, constraints: Constraints, **inputs: Any) -> str:
    """Verified plans are cached by model revision, hardware, engine version, constraints and
    every other input of the fit (engine, device, dtype, estimate or not)."""
    data = json.dumps(
        [architecture_facts(spec), spec.model_id, spec.revision,
         hardware_facts(hardware),
         dataclasses.asdict(constraints), sorted(inputs.items())],
        sort_keys=True, default=str,
    )  # fmt: skip
    return hashlib.sha256(data.encode()).hexdigest()[:24]


def cache_dir() -> Path:
    """Where verified plans are kept (OOMINFER_CACHE_DIR, else the user's cache folder)."""
    if os.environ.get("OOMINFER_CACHE_DIR"):
        return Path(os.environ["OOMINFER_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "oominfer" / "plans"


def cached_plan(key: str) -> Plan | None:
    """A verified plan from an earlier fit with the same inputs."""
    path = cache_dir() / f"{key}.json"
    try:
        found = plan_from_json(path.read_text(), source=str(path))
    except (OSError, ValueError, OominferError):  # a stale or foreign entry is just a miss
        return None
    return found if found.verified else None


def store_plan(key: str, plan_: Plan) -> None:
    """Keep a verified plan for the next fit with the same inputs."""
    folder = cache_dir()
    try:
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{key}.json").write_text(plan_.to_json())
    except OSError:
        pass  # a cache that cannot be written is not an error
