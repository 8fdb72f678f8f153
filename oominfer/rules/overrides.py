"""``--hf-overrides``: changes to a model's config.json, as vLLM applies them before it derives
the context it serves.

oominfer models the keys that move the context: ``max_position_embeddings`` and the RoPE
scaling section (``rope_scaling``, or transformers 5's ``rope_parameters``), which extend a
model trained for it (Qwen2.5 and Qwen3 with YaRN: 32,768 positions x 4). Any other key
changes what vLLM builds in a way the estimate does not follow, and is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from oominfer.base.errors import InvalidSettingError
from oominfer.model.spec import ModelSpec
from oominfer.rules.versions import EngineVersion
from oominfer.settings import compact_json, flag, json_object

MODELLED: Final = ("max_position_embeddings", "rope_scaling", "rope_parameters")
_FLAG: Final = flag("hf_overrides")
_UNSCALED: Final = frozenset(
    {"default", "mrope", "su", "longrope", "llama3", "yarn", "deepseek_yarn",
     "deepseek_llama_scaling"}
)  # fmt: skip
"""RoPE types whose factor vLLM does not multiply the context by (config/model.py
``_get_and_verify_max_len``, 0.32-0.33): the rest (linear, dynamic) stretch it."""


def with_overrides(
    spec: ModelSpec,
    overrides_json: str | None,
    version: EngineVersion,
    *,
    max_model_len: int | None = None,
) -> ModelSpec:
    """``spec`` as vLLM ``version`` sees the model under ``--hf-overrides overrides_json``:
    the context it derives (max_position_embeddings, RoPE scaling), checked against the
    ``max_model_len`` asked for. Applying the same overrides twice changes nothing.

    Raises:
        InvalidSettingError: a key oominfer does not model, a malformed RoPE section, or a
            ``--max-model-len`` longer than the overridden context (with the key to add).
    """
    overrides = json_object("hf_overrides", overrides_json)
    text = compact_json(overrides) if overrides else ""
    if text == spec.config_overrides:
        return spec
    unknown = sorted(set(overrides) - set(MODELLED))
    if unknown:
        raise InvalidSettingError(
            f"{_FLAG} sets {', '.join(unknown)}, which changes the model in a way oominfer "
            "does not estimate; its plan would not hold.",
            hint=f"oominfer models {', '.join(MODELLED)}; leave the other keys out.",
        )
    length = _positive(overrides.get("max_position_embeddings"), "max_position_embeddings")
    base = int(length) if length else spec.max_position_embeddings
    rope = _rope(overrides)
    derived = base if rope is None else _scaled(base, rope, version)
    if max_model_len is not None and max_model_len > derived:
        message, hint = _too_short(max_model_len, derived, rope, version, spec)
        raise InvalidSettingError(message, hint=hint)
    return dataclasses.replace(
        spec, max_position_embeddings=derived, default_max_model_len=0, config_overrides=text
    )


def _positive(value: Any, key: str) -> float | None:
    """A number of the overrides (None where absent), refused unless positive."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise InvalidSettingError(f"{_FLAG} {key} must be a positive number, got {value!r}.")
    return float(value)


def _rope_type(rope: Mapping[str, Any] | None) -> str | None:
    """A RoPE section's type (transformers' rope_type, or the legacy type)."""
    return (rope or {}).get("rope_type") or (rope or {}).get("type")


def _rope(overrides: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The RoPE section the overrides set (transformers 5 names it rope_parameters)."""
    for key in ("rope_parameters", "rope_scaling"):
        if key in overrides:
            rope = overrides[key]
            if not isinstance(rope, Mapping) or not _rope_type(rope):
                raise InvalidSettingError(
                    f"{_FLAG} {key} must be an object with a rope_type, got {rope!r}.",
                    hint=f"""For YaRN: {_FLAG} '{{"{key}": {{"rope_type": "yarn", "factor": """
                    """4.0, "original_max_position_embeddings": 32768}}'.""",
                )
            return rope
    return None


def _scaled(base: int, rope: Mapping[str, Any], version: EngineVersion) -> int:
    """The context vLLM derives from ``base`` positions under ``rope``."""
    kind = _rope_type(rope)
    factor = _positive(rope.get("factor"), "factor")
    if kind == "yarn" and version.yarn_from_original:
        original = _positive(
            rope.get("original_max_position_embeddings"), "original_max_position_embeddings"
        )
        if original is None or factor is None:
            raise InvalidSettingError(
                f"{_FLAG}: vLLM {version.number} derives a YaRN context from "
                "original_max_position_embeddings x factor, and this RoPE section lacks one.",
                hint="Give both, as the model card says (Qwen3: 32768 and 4.0).",
            )
        return int(int(original) * factor)
    if kind in _UNSCALED or factor is None:
        return base
    return int(base * factor)


def _too_short(
    asked: int,
    derived: int,
    rope: Mapping[str, Any] | None,
    version: EngineVersion,
    spec: ModelSpec,
) -> tuple[str, str]:
    why = (
        f"{flag('max_model_len')} {asked:,} is longer than the {derived:,} tokens vLLM "
        f"{version.number} derives for {spec.model_id} under {_FLAG}"
    )
    if _rope_type(rope) == "yarn" and not version.yarn_from_original:
        return (
            f"{why}: from 0.32 vLLM keeps max_position_embeddings under YaRN, as transformers "
            "does.",
            f'Add "max_position_embeddings": {asked} to {_FLAG}.',
        )
    return f"{why}.", f"Pass {flag('max_model_len')} {derived} or less."
