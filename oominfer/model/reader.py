"""Typed, validating access to config.json fields: errors name the missing or bad field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oominfer.errors import UnsupportedConfigError


class ConfigReader:
    """Typed access to config fields, with errors that name the missing field."""

    def __init__(self, cfg: Mapping[str, Any], model_id: str) -> None:
        self.cfg = cfg
        self.model_id = model_id

    def integer(self, *keys: str, default: int | None = None) -> int:
        for key in keys:
            value = self.cfg.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise UnsupportedConfigError(
                    f"{self.model_id}: config.json field {key!r} must be a non-negative "
                    f"integer, got {value!r}."
                )
            return int(value)
        if default is not None:
            return default
        raise UnsupportedConfigError(
            f"{self.model_id}: config.json lacks {' / '.join(repr(k) for k in keys)}, "
            "which the memory estimate needs.",
            hint="Check that the folder holds the model's own config.json.",
        )

    def opt_integer(self, *keys: str) -> int | None:
        return (
            self.integer(*keys, default=-1)
            if any(self.cfg.get(k) is not None for k in keys)
            else None
        )

    def flag(self, key: str, default: bool) -> bool:
        value = self.cfg.get(key)
        return default if value is None else bool(value)
