"""Extra vLLM flags given after ``--``, checked against the plan they would change."""

from __future__ import annotations

from collections.abc import Sequence

from oominfer.base.errors import InvalidSettingError
from oominfer.planning.document import Plan
from oominfer.settings import engine_args


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
    for flag, value in given.items():
        if flag in planned and planned[flag] != value:
            raise InvalidSettingError(
                f"{flag} {value} contradicts the plan's {flag} {planned[flag]}.",
                hint="Re-run `oominfer fit` with the new constraint to write a verified plan.",
            )
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
