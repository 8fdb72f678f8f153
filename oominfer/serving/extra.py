"""Extra vLLM flags given after ``--``, checked against the plan they would change."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Final

from oominfer.base.errors import InvalidSettingError
from oominfer.planning.document import Plan
from oominfer.settings import EngineSettings, declared, engine_args, flag

MEMORY_ADDITIONS: Final = (
    "speculative_config", "enable_lora", "max_loras", "max_lora_rank", "limit_mm_per_prompt",
    "enable_expert_parallel", "data_parallel_size", "hf_overrides",
)  # fmt: skip
"""Operator additions that change the GPU memory a plan was verified with (a draft, LoRA
slots, the encoder cache, the expert split, the model's config.json): given after ``--`` at
another value than the plan's, they are refused like any contradiction, even where the plan
left them at vLLM's default (and so does not render them)."""


def _flag_values(args: Sequence[str]) -> dict[str, str | None]:
    """--flag value pairs (and bare --flags) of an argv tail."""
    values: dict[str, str | None] = {}
    i = 0
    while i < len(args):
        token = args[i]
        if token.startswith("--"):
            name, eq, value = token.partition("=")
            if eq:
                values[name] = value
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                values[name] = args[i + 1]
                i += 1
            else:
                values[name] = None
        i += 1
    return values


def _check_additions(settings: EngineSettings, given: dict[str, str | None]) -> None:
    """Refuse an operator addition after ``--`` that the plan was not verified with."""
    for name in MEMORY_ADDITIONS:
        option = flag(name)
        if option not in given:
            continue
        planned = getattr(settings, name)
        if not _same(declared(name).kind, given[option], planned):
            raise InvalidSettingError(
                f"{option} changes the GPU memory the plan was verified with (the plan has "
                f"{planned}).",
                hint=f"Re-run `oominfer fit` with {option} to write a plan that counts it.",
            )


def _same(kind: type, text: str | None, planned: Any) -> bool:
    """Whether a flag's text on the command line means the plan's value."""
    if kind is bool:
        return text is None and planned is True
    if text is None or planned is None:
        return False
    try:
        if kind is str:  # JSON objects: equal when they parse equal
            return bool(json.loads(text) == json.loads(str(planned)))
        return int(text) == int(planned)
    except ValueError:
        return False


def merge_extra(plan: Plan, extra: Sequence[str]) -> list[str]:
    """Extra vLLM flags given after ``--``, checked against the plan.

    A flag the plan sets may be repeated with the same value (the Kubernetes manifests do, so
    the pod spec shows every flag) and is then dropped; a different value is refused, since
    what runs must be what was verified.

    Raises:
        InvalidSettingError: an extra flag contradicts the plan.
    """
    planned = _flag_values(engine_args(plan.settings))
    given = _flag_values(extra)
    for name, value in given.items():
        if name in planned and planned[name] != value:
            raise InvalidSettingError(
                f"{name} {value} contradicts the plan's {name} {planned[name]}.",
                hint="Re-run `oominfer fit` with the new constraint to write a verified plan.",
            )
    _check_additions(plan.settings, given)
    out: list[str] = []
    i = 0
    while i < len(extra):
        token = extra[i]
        name = token.partition("=")[0]
        takes_value = "=" not in token and i + 1 < len(extra) and not extra[i + 1].startswith("--")
        if name in planned:
            i += 2 if takes_value else 1
            continue
        out.append(token)
        if takes_value:
            out.append(extra[i + 1])
            i += 1
        i += 1
    return out
