"""Serving a plan the engine never ran: verify it on the engine that will serve it, and keep it.

A plan written with ``--no-verify`` (or where no engine was) is proved here before it serves:
one launch, the load test at the plan's limits (one request at ``max_model_len``,
``max_num_seqs`` at once) as the warm-up, then the same engine behind the front. Nothing is
launched twice; a plan that fails here fails as serve fails at start (3 for memory, 4
otherwise), with the engine's own reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from oominfer.planning.document import Plan
from oominfer.runtime.process import LiveEngine, interrupts_kill_engines
from oominfer.verify.prober import EngineProber, ProbeResult


@dataclass(frozen=True, slots=True)
class Verified:
    """How the verifying launch went, and the engine when it passed (running)."""

    result: ProbeResult
    engine: LiveEngine | None


def verify_and_keep(
    plan: Plan,
    *,
    extra: Sequence[str] = (),
    api_key: str | None = None,
    on_launch: Callable[[int, list[str], Path], None] | None = None,
    on_progress: Callable[[float, str], None] | None = None,
    on_note: Callable[[str], None] | None = None,
    timeout: float = 900.0,
) -> Verified:
    """Launch the plan's engine (with serve's ``extra`` flags and ``api_key``), load it at the
    plan's limits, and hand it over running when it passed; stopped when it did not."""
    kept: list[LiveEngine] = []
    spared: set[int] = set()

    def ready(engine: LiveEngine) -> None:
        kept.append(engine)
        spared.add(engine.proc.pid)

    prober = EngineProber(
        deadline_seconds=timeout, on_progress=on_progress, on_launch=on_launch, on_note=on_note,
        revision=plan.revision, api_key=api_key, extra_args=tuple(extra), on_ready=ready,
        progress_seconds=1.0,
    )  # fmt: skip
    with interrupts_kill_engines(spared):
        result = prober(plan.model_id, plan.settings, engine=plan.engine, device=plan.device)
    return Verified(result, kept[0] if kept else None)
