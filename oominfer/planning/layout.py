"""Multi-GPU layouts: tensor parallel inside a node, pipeline stages across nodes, replicas."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Final

from oominfer.hardware.hardware import Hardware
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.rules import parallel as parallel_rules
from oominfer.rules.parallel import tensor_parallel_refusal
from oominfer.settings import EngineSettings, ExecutorBackend

TENSOR_PARALLEL_SIZES: Final = (1, 2, 4, 8, 16)
"""The tensor-parallel sizes planned: powers of two, as NCCL and vLLM's custom all-reduce
are tuned for."""


@dataclass(frozen=True, slots=True)
class Layout:
    """How one replica spreads over GPUs."""

    tp: int
    pp: int

    @property
    def world_size(self) -> int:
        """GPUs one replica uses."""
        return self.tp * self.pp


def layouts(spec: ModelSpec, hardware: Hardware, c: Constraints) -> list[Layout]:
    """Every layout worth planning on ``hardware``, fewest GPUs first.

    Tensor parallel stays inside a node and only where vLLM accepts it; pipeline stages are
    added only on top of the widest tensor parallel a node allows, so a model spans nodes
    with one stage per node (TP 8 x PP 2 on two nodes of eight).
    """
    if hardware.is_cpu or c.engine == "transformers":
        return [Layout(1, 1)]
    per_node = min(c.gpus_per_node, hardware.count)
    tps = [
        tp
        for tp in TENSOR_PARALLEL_SIZES
        if tp <= per_node and tensor_parallel_refusal(spec, tp) is None
    ]
    if not tps:
        return []  # not even one GPU: vLLM cannot shard this checkpoint at all
    found = [Layout(tp, 1) for tp in tps]
    widest = max(tps)
    found += [
        Layout(widest, pp) for pp in range(2, hardware.count // widest + 1) if pp <= spec.num_layers
    ]
    return sorted(found, key=lambda layout: (layout.world_size, layout.pp))


def executor_backend(layout: Layout, c: Constraints) -> ExecutorBackend | None:
    """vLLM's executor for this layout (rules/parallel.py)."""
    return parallel_rules.executor_backend(layout.world_size, c.gpus_per_node)


def on_layout(settings: EngineSettings, layout: Layout, c: Constraints) -> EngineSettings:
    """``settings`` spread over ``layout`` (with the executor it needs)."""
    return dataclasses.replace(
        settings,
        tensor_parallel_size=layout.tp,
        pipeline_parallel_size=layout.pp,
        distributed_executor_backend=executor_backend(layout, c),
    )


def replicas(layout: Layout, hardware: Hardware) -> int:
    """Replicas the given GPUs serve with this layout (at least one)."""
    return max(1, hardware.count // layout.world_size)
