"""Typed, validating access to config.json fields: errors name the missing or bad field.

Every number the estimator reads from a config goes through here, so a field that is
missing, of the wrong type or negative is an UnsupportedConfigError naming it, never a
KeyError, ValueError or TypeError traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from oominfer.base.errors import UnsupportedConfigError


class ConfigReader:
    """Typed access to config fields, with errors that name the missing field.

    Args:
        cfg: the (flattened) config.json, or a section of it.
        model_id: the model, for messages.
        prefix: the section's path for messages (``quantization_config.``).
    """

    def __init__(self, cfg: Mapping[str, Any], model_id: str, prefix: str = "") -> None:
        self.cfg = cfg
        self.model_id = model_id
        self.prefix = prefix

    def invalid(self, key: str, value: Any, what: str) -> UnsupportedConfigError:
        """The error for field ``key`` holding ``value`` where ``what`` is needed."""
        return UnsupportedConfigError(
            f"{self.model_id}: config.json field {self.prefix + key!r} must be {what}, "
            f"got {value!r}."
        )

    def integer(self, *keys: str, default: int | None = None) -> int:
        """The first of ``keys`` that is set, as a non-negative integer; ``default`` when
        none is (an error naming them when there is no default)."""
        for key in keys:
            value = self.cfg.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise self.invalid(key, value, "a non-negative integer")
            return int(value)
        if default is not None:
            return default
        raise UnsupportedConfigError(
            f"{self.model_id}: config.json lacks "
            f"{' / '.join(repr(self.prefix + k) for k in keys)}, which the memory estimate "
            "needs.",
            hint="Check that the folder holds the model's own config.json.",
        )

    def opt_integer(self, *keys: str) -> int | None:
        """Like ``integer``, but None when none of ``keys`` is set."""
        if any(self.cfg.get(k) is not None for k in keys):
            return self.integer(*keys)
        return None

    def positive_or_none(self, *keys: str) -> int | None:
        """The first of ``keys`` that is set, as an integer; None when unset or not
        positive (GPTQ writes ``group_size: -1`` for one scale per channel)."""
        for key in keys:
            value = self.cfg.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise self.invalid(key, value, "an integer")
            return int(value) if value > 0 else None
        return None

    def number(self, key: str, default: float) -> float:
        """A non-negative number (``rope_scaling.factor``); ``default`` when unset."""
        value = self.cfg.get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise self.invalid(key, value, "a non-negative number")
        return float(value)

    def integers(self, key: str) -> list[int]:
        """A list of non-negative integers (``mlp_only_layers``); empty when unset."""
        value = self.cfg.get(key)
        if value is None:
            return []
        if not isinstance(value, list) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
        ):
            raise self.invalid(key, value, "a list of non-negative integers")
        return list(value)

    def section(self, key: str) -> ConfigReader | None:
        """A nested object (``quantization_config``) read the same way; None when unset."""
        value = self.cfg.get(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self.invalid(key, value, "an object")
        return ConfigReader(value, self.model_id, f"{self.prefix}{key}.")

    def text(self, key: str, default: str = "") -> str:
        """A string field (``quant_method``); ``default`` when unset."""
        value = self.cfg.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.invalid(key, value, "a string")
        return value

    def flag(self, key: str, default: bool) -> bool:
        """A boolean field; ``default`` when unset."""
        value = self.cfg.get(key)
        return default if value is None else bool(value)
