"""The planning context: what every step after the API boundary reads, made once.

The model, the hardware, the user's requirements (``Constraints``), and the engine release
whose memory profile and rules apply, resolved here and nowhere else (``--engine-version``,
else the installed vLLM, else the latest release: ``rules.versions.resolve_release``). The
estimate, the planner, verification and the report all take it from here, so the same
inputs give the same answer whichever vLLM is installed, once the release is named.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from oominfer.hardware.hardware import Hardware
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.rules.installed import vllm_release
from oominfer.rules.versions import EngineVersion, resolve_release


@dataclass(frozen=True, slots=True)
class PlanningContext:
    """One request to plan or estimate, with everything resolved that can be."""

    spec: ModelSpec
    hardware: Hardware
    constraints: Constraints
    """The user's requirements, ``engine_version`` filled in."""
    version: EngineVersion
    """The vLLM release the memory model and the rules follow."""

    @property
    def release(self) -> str:
        """The release as text (``0.33.0``), as the plan records it."""
        return str(self.constraints.engine_version)

    @property
    def context_cap(self) -> int:
        """The longest context any plan may have: the user's ``max_model_len``, else the
        model's trained length."""
        return self.constraints.context_cap(self.spec.max_position_embeddings)


def engine_release(named: str | None) -> str:
    """The release to follow when ``named`` (``--engine-version``) or None."""
    return resolve_release(named, vllm_release())


def make_context(spec: ModelSpec, hardware: Hardware, constraints: Constraints) -> PlanningContext:
    """The context for planning ``spec`` on ``hardware`` under ``constraints``: the engine
    release resolved once (``engine_release``)."""
    release = engine_release(constraints.engine_version)
    resolved = dataclasses.replace(constraints, engine_version=release)
    return PlanningContext(spec, hardware, resolved, EngineVersion.parse(release))
