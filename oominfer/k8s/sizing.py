"""How a plan maps onto pods, and what each pod needs: GPUs, host memory, ``/dev/shm``, the
model cache, and the time a cold start takes. Pure: numbers from the plan, no objects."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from oominfer.base.errors import InvalidSettingError, PlanError
from oominfer.base.units import MB, GiB
from oominfer.k8s.options import K8sOptions, Manifest
from oominfer.planning.document import Plan
from oominfer.planning.layout import groups

GPU_RESOURCE: Final = "nvidia.com/gpu"

# Start-up budget: a cold start downloads the checkpoint to the cache volume, reads it into
# GPU memory, then compiles (torch.compile) and captures CUDA graphs. The rates are
# deliberately low (a shared volume, the Hub on a busy link): a probe that gives up too early
# restarts the download, one that waits too long only delays a real failure.
DOWNLOAD_BYTES_PER_SECOND: Final = 100 * MB
LOAD_BYTES_PER_SECOND: Final = 500 * MB
PROCESS_START_SECONDS: Final = 60  # interpreter, imports, CUDA init, the profiling run
COMPILE_SECONDS: Final = 180  # torch.compile and graph capture with a cold cache
EAGER_SECONDS: Final = 30  # enforce_eager: warm-up only
RAY_JOIN_SECONDS: Final = 120  # the leader waits for its workers to join the Ray cluster

# Host memory: the API server, engine core and tokenizer, plus one worker process per GPU
# (torch, the CUDA context and pinned buffers keep several GiB each); Ray's raylet and
# object store per pod. Reading the checkpoint goes through the page cache, which the
# kernel reclaims under the limit.
HOST_BASE_BYTES: Final = 8 * GiB
HOST_PER_GPU_BYTES: Final = 6 * GiB
HOST_RAY_BYTES: Final = 8 * GiB
# The checkpoint on disk is 16-bit when vLLM quantizes it while loading.
_DISK_FACTOR: Final = {"fp8_per_tensor": 2, "fp8": 2, "int8": 2, "bitsandbytes": 4}
PVC_MARGIN: Final = 1.2
PVC_EXTRA_BYTES: Final = 10 * GiB  # tokenizer, compile cache, a second revision's configs


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """How one replica of the plan maps onto pods."""

    pods: int
    """Pods per replica: 1 for a Deployment, the LeaderWorkerSet group size otherwise."""
    stages_per_pod: int
    """Pipeline-parallel stages each pod holds."""
    gpus_per_pod: int
    """tensor_parallel_size x stages_per_pod (0 on the CPU)."""

    @property
    def multi_node(self) -> bool:
        """True when the replica spans pods (a LeaderWorkerSet on Ray)."""
        return self.pods > 1


def topology(plan: Plan, options: K8sOptions) -> Topology:
    """Place the plan's pipeline stages on pods of at most ``gpus_per_node`` GPUs.

    A replica fits one pod when its GPUs fit one node. Otherwise each pod takes the most
    whole stages that fit a node (vLLM's Ray executor keeps a stage's ranks on one node) and
    that let every replica's pods be placed on the plan's GPUs, and the group has
    pipeline_parallel_size / stages_per_pod pods.

    Raises:
        InvalidSettingError: one tensor-parallel group is larger than a node.
    """
    tp, pp = plan.settings.tensor_parallel_size, plan.settings.pipeline_parallel_size
    if plan.gpu_count == 0:
        return Topology(pods=1, stages_per_pod=pp, gpus_per_pod=0)
    if plan.gpu_count <= options.gpus_per_node:
        return Topology(pods=1, stages_per_pod=pp, gpus_per_pod=plan.gpu_count)
    if tp > options.gpus_per_node:
        raise InvalidSettingError(
            f"tensor_parallel_size {tp} needs more GPUs than one node has "
            f"(--gpus-per-node {options.gpus_per_node}).",
            hint="Fit the plan with tensor parallel within a node and pipeline parallel "
            "across nodes, or raise --gpus-per-node.",
        )
    fitting = [s for s in range(1, pp + 1) if pp % s == 0 and tp * s <= options.gpus_per_node]
    # The pods of every replica must fit the nodes the plan was fitted for (the last one may
    # be partial: 8 GPUs on nodes of 3 are nodes of 3, 3 and 2): the most stages per pod that
    # do, else the most that fit one node.
    count = int(plan.gpu.get("count") or plan.gpu_count * plan.replicas)
    placed = [
        s
        for s in fitting
        if groups(tp * s, count, options.gpus_per_node) >= plan.replicas * (pp // s)
    ]
    stages = max(placed or fitting)
    return Topology(pods=pp // stages, stages_per_pod=stages, gpus_per_pod=tp * stages)


def replica_weights_bytes(plan: Plan) -> int:
    """Weights of one replica in GPU (and offloaded host) memory, from the plan.

    The plan records the busiest GPU; times the GPU count this slightly over-counts a
    pipeline-parallel plan, which only adds margin.

    Raises:
        PlanError: the plan records no weights size.
    """
    per_gpu = plan.predicted.weights_bytes if plan.predicted else None
    if not per_gpu and plan.verification is not None:
        per_gpu = plan.verification.weights_bytes
    if not isinstance(per_gpu, int) or per_gpu <= 0:
        raise PlanError(
            f"the plan for {plan.model_id} records no weights size (predicted.weights_bytes).",
            hint="Re-run `oominfer fit` to write a complete plan.",
        )
    gpus = max(plan.gpu_count, 1)
    return (per_gpu + int(plan.settings.cpu_offload_gb * GiB)) * gpus


def checkpoint_bytes(plan: Plan) -> int:
    """Size of the checkpoint on disk: the plan's record, else inferred from the weights."""
    recorded = plan.architecture.get("checkpoint_bytes")
    if isinstance(recorded, int) and recorded > 0:
        return recorded
    return replica_weights_bytes(plan) * _DISK_FACTOR.get(plan.settings.quantization or "", 1)


def load_seconds(plan: Plan, topo: Topology) -> int:
    """Seconds a cold start takes: download + load + compile (+ Ray join), an upper estimate."""
    disk = checkpoint_bytes(plan)
    seconds = PROCESS_START_SECONDS + disk / DOWNLOAD_BYTES_PER_SECOND
    seconds += replica_weights_bytes(plan) / LOAD_BYTES_PER_SECOND
    seconds += EAGER_SECONDS if plan.settings.enforce_eager else COMPILE_SECONDS
    if topo.multi_node:
        seconds += RAY_JOIN_SECONDS
    return math.ceil(seconds)


def startup_budget_seconds(plan: Plan, topo: Topology) -> int:
    """The startup probe's budget: the estimate, or twice the measured load time if longer."""
    measured = plan.verification.load_seconds if plan.verification else None
    return max(load_seconds(plan, topo), math.ceil(2 * (measured or 0)))


def shm_bytes(plan: Plan, topo: Topology) -> int:
    """``/dev/shm`` for the pod: NCCL and vLLM's shared-memory broadcast queue between ranks.

    1 GiB for one GPU; 2 GiB per GPU otherwise (vLLM's LWS recipe gives 8 GPUs 15 GiB).
    """
    tp = plan.settings.tensor_parallel_size
    if topo.gpus_per_pod <= 1 and tp == 1:
        return GiB
    return 2 * GiB * max(topo.gpus_per_pod, tp)


def host_memory_bytes(plan: Plan, topo: Topology) -> int:
    """Host memory one pod requests: processes, offloaded weights, and Ray when multi-node."""
    gpus = topo.gpus_per_pod
    total = HOST_BASE_BYTES + HOST_PER_GPU_BYTES * gpus
    total += int(plan.settings.cpu_offload_gb * GiB) * gpus
    if plan.gpu_count == 0:  # the CPU backend: weights and KV cache live in host memory
        total += replica_weights_bytes(plan) + (plan.settings.kv_cache_memory_bytes or 4 * GiB)
    if topo.multi_node:
        total += HOST_RAY_BYTES
    return total


def pvc_bytes(plan: Plan) -> int:
    """The model cache: the checkpoint with a margin, plus room for compile caches."""
    return math.ceil(checkpoint_bytes(plan) * PVC_MARGIN) + PVC_EXTRA_BYTES


def quantity(n_bytes: int) -> str:
    """Bytes as a Kubernetes quantity in whole GiB, rounded up: ``24Gi``."""
    return f"{math.ceil(n_bytes / GiB)}Gi"


def resources(plan: Plan, topo: Topology) -> Manifest:
    """Requests and limits: GPUs (requests = limits), CPU, and host memory.

    The memory limit adds ``/dev/shm``, since a memory-backed emptyDir is charged to the pod.
    No CPU limit: throttling the engine's busy loop costs latency.
    """
    memory = host_memory_bytes(plan, topo)
    requests: Manifest = {"cpu": str(2 + 2 * topo.gpus_per_pod), "memory": quantity(memory)}
    limits: Manifest = {"memory": quantity(memory + shm_bytes(plan, topo))}
    if topo.gpus_per_pod:
        requests[GPU_RESOURCE] = str(topo.gpus_per_pod)
        limits[GPU_RESOURCE] = str(topo.gpus_per_pod)
    return {"requests": requests, "limits": limits}
