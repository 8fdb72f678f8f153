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

    Besides, the pipelined layouts of the widest TP that use every GPU given (``_all_used``),
    so that no GPU need sit idle. A requested ``-tp``/``-pp`` keeps only the layouts
    with that size. Every layout kept can be placed: each TP group inside one node of
    ``--gpus-per-node`` GPUs (``groups``).
    """
    if hardware.is_cpu or c.engine == "transformers":
        return [Layout(1, 1)]
    per_node = min(c.gpus_per_node, hardware.count)
    want_tp = c.requested.get("tensor_parallel_size")
    want_pp = c.requested.get("pipeline_parallel_size")
    sizes = (want_tp,) if want_tp else TENSOR_PARALLEL_SIZES
    tps = [tp for tp in sizes if tp <= per_node and tensor_parallel_refusal(spec, tp) is None]
    if not tps:
        return []  # not even one GPU: vLLM cannot shard this checkpoint at all
    found = {Layout(tp, 1) for tp in tps}
    widest = max(tps)
    found |= {Layout(widest, pp) for pp in range(2, hardware.count // widest + 1)}
    found |= _all_used(tps, hardware.count, c.gpus_per_node)
    if want_pp:
        found |= {Layout(tp, want_pp) for tp in tps}
    kept = [
        layout
        for layout in found
        if layout.pp <= spec.num_layers
        and (want_pp is None or layout.pp == want_pp)
        and groups(layout.tp, hardware.count, c.gpus_per_node) >= layout.pp
    ]
    return sorted(kept, key=lambda layout: (layout.world_size, layout.pp))


def _all_used(tps: list[int], count: int, gpus_per_node: int) -> set[Layout]:
    """Pipelined layouts that leave no GPU idle (with their replicas), on the widest TP
    that has one: TP 2 x PP 3 on six GPUs of nodes of 4, TP 1 x PP 3 on three, TP 1 x PP 2,
    4 or 8 on eight GPUs of nodes of 3 (whose three TP-2 groups leave two idle)."""
    for tp in sorted(tps, reverse=True):
        held = groups(tp, count, gpus_per_node)
        if held * tp != count:
            continue  # some GPUs fit no TP group of this size
        return {Layout(tp, pp) for pp in range(2, held + 1) if held % pp == 0}
    return set()


def nodes(count: int, gpus_per_node: int) -> list[int]:
    """The GPUs of each node: full nodes of ``gpus_per_node``, the rest on the last."""
    full, rest = divmod(count, gpus_per_node)
    return [gpus_per_node] * full + ([rest] if rest else [])


def groups(tp: int, count: int, gpus_per_node: int) -> int:
    """Tensor-parallel groups of ``tp`` GPUs that ``count`` GPUs hold, each group inside one
    node (a TP group never spans nodes: its all-reduce runs in every layer)."""
    return sum(n // tp for n in nodes(count, gpus_per_node))


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


def replicas(layout: Layout, hardware: Hardware, gpus_per_node: int = 8) -> int:
    """Replicas the given GPUs serve with this layout (at least one): each pipeline stage is
    a TP group inside one node, and a replica takes ``pp`` of them."""
    if hardware.is_cpu:
        return 1
    return max(1, groups(layout.tp, hardware.count, gpus_per_node) // layout.pp)


def idle_gpus(layout: Layout, hardware: Hardware, gpus_per_node: int = 8) -> int:
    """GPUs given that neither the layout nor its replicas use."""
    if hardware.is_cpu:
        return 0
    used = replicas(layout, hardware, gpus_per_node) * layout.world_size
    return max(0, hardware.count - used)


def idle_reason(layout: Layout, hardware: Hardware, gpus_per_node: int = 8) -> str:
    """Why GPUs sit idle under this layout, and the ``--gpus`` that would use them all;
    empty when none do."""
    idle = idle_gpus(layout, hardware, gpus_per_node)
    if idle == 0:
        return ""
    n = replicas(layout, hardware, gpus_per_node)
    used = n * layout.world_size
    per = f"{layout.world_size} GPU{'s' if layout.world_size > 1 else ''}"
    shape = f"tensor {layout.tp} x pipeline {layout.pp}"
    more = next(
        m
        for m in range(used + 1, used + layout.world_size * gpus_per_node + 2)
        if idle_gpus(layout, dataclasses.replace(hardware, count=m), gpus_per_node) == 0
    )
    nodes_of = f", {gpus_per_node} per node" if hardware.count > gpus_per_node else ""
    return (
        f"each replica takes {per} ({shape}{nodes_of}), so {hardware.count} GPUs hold {n} "
        f"replica{'s' if n > 1 else ''} and {idle} sit{'s' if idle == 1 else ''} idle; "
        f"with --gpus {used} or --gpus {more} none would"
    )
