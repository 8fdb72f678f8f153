"""Multi-GPU layouts: tensor parallel inside a node, pipeline stages across nodes, replicas."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from oominfer.hardware.hardware import Hardware
from oominfer.model.spec import ModelSpec
from oominfer.planning.constraints import Constraints
from oominfer.settings import ExecutorBackend

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


def tensor_parallel_refusal(spec: ModelSpec, tp: int) -> str | None:
    """Why vLLM refuses tensor parallel ``tp`` for this model, or None when it accepts it.

    vllm/config/model.py ``verify_with_parallel_config``: the attention heads must divide
    by tp; the KV heads are split when they divide by tp and replicated when tp divides
    by them (vllm/model_executor/layers/linear.py QKVParallelLinear), any other ratio fails.
    """
    heads, kv_heads = spec.num_attention_heads, spec.num_kv_heads
    if heads % tp:
        return f"tensor parallel {tp} does not divide the {heads} attention heads"
    if not spec.is_mla and kv_heads % tp and tp % kv_heads:
        return (
            f"tensor parallel {tp} neither divides the {kv_heads} KV heads nor is divided by them"
        )
    return None


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
    found = [Layout(tp, 1) for tp in tps]
    widest = max(tps)
    found += [
        Layout(widest, pp) for pp in range(2, hardware.count // widest + 1) if pp <= spec.num_layers
    ]
    return sorted(found, key=lambda layout: (layout.world_size, layout.pp))


def executor_backend(layout: Layout, c: Constraints) -> ExecutorBackend | None:
    """``ray`` when the replica spans nodes: vLLM's multiprocessing backend only sees the
    GPUs of its own node and refuses a larger world size (vllm/config/parallel.py)."""
    return "ray" if layout.world_size > c.gpus_per_node else None


def replicas(layout: Layout, hardware: Hardware) -> int:
    """Replicas the given GPUs serve with this layout (at least one)."""
    return max(1, hardware.count // layout.world_size)
