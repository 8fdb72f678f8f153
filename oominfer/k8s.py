"""Kubernetes manifests that run a plan, as data. Pure: a plan in, a list of dicts out.

Every object is built as a dict by a small function and serialised once by ``dump_yaml``;
there are no string templates. The server container runs ``oominfer serve`` on the plan
mounted from a ConfigMap, with the vLLM flags from ``to_vllm_args`` (the code ``fit``
verified) after ``--``, one token per list item. A plan whose pipeline stages span nodes
becomes a LeaderWorkerSet running vLLM on Ray, as in vLLM's multi-node recipe
(docs/deployment/frameworks/lws.md; examples/online_serving/multi-node-serving.sh).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Final

import yaml

from oominfer import __version__
from oominfer.errors import InvalidSettingError
from oominfer.plan import Plan, PlanError
from oominfer.settings import to_vllm_args
from oominfer.units import MB, GiB

Manifest = dict[str, Any]

DEFAULT_IMAGE: Final = f"ghcr.io/oominfer/oominfer-serve:{__version__}"
"""The serve/ image of this oominfer release (build and push your own: serve/README.md)."""
PLAN_DIR: Final = "/etc/oominfer"
PLAN_PATH: Final = f"{PLAN_DIR}/plan.json"
CACHE_DIR: Final = "/models"
PLAN_SHA_ANNOTATION: Final = "oominfer.dev/plan-sha256"
GPU_RESOURCE: Final = "nvidia.com/gpu"
LWS_API: Final = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL: Final = "leaderworkerset.sigs.k8s.io/name"
HPA_METRIC: Final = "vllm_num_requests_waiting"
"""The custom metric the HPA reads: vLLM's ``vllm:num_requests_waiting`` as prometheus-adapter
exposes it (an adapter rule renames the series; deploy/k8s/README.md)."""
RAY_PORT: Final = 6379
_NAME_MAX: Final = 40  # leaves room for "-cache", "-plan" and LWS's "-<group>-<worker>"
_NAME_RE: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

# Start-up budget: a cold start downloads the checkpoint to the cache volume, reads it into
# GPU memory, then compiles (torch.compile) and captures CUDA graphs. The rates are
# deliberately low (a shared volume, the Hub on a busy link): a probe that gives up too early
# restarts the download, one that waits too long only delays a real failure.
DOWNLOAD_BYTES_PER_SECOND: Final = 100 * MB
LOAD_BYTES_PER_SECOND: Final = 500 * MB
PROCESS_START_SECONDS: Final = 60  # interpreter, imports, CUDA init, the profiling run
COMPILE_SECONDS: Final = 180  # torch.compile and graph capture with a cold cache
EAGER_SECONDS: Final = 30  # --enforce-eager: warm-up only
RAY_JOIN_SECONDS: Final = 120  # the leader waits for its workers to join the Ray cluster
PROBE_PERIOD_SECONDS: Final = 10
PRESTOP_SECONDS: Final = 10  # lets endpoints drop the pod before vLLM gets SIGTERM

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

RAY_LEADER_SCRIPT: Final = """\
#!/bin/sh
# LeaderWorkerSet leader: start the Ray head, wait until every pod of the group has joined
# (LWS_GROUP_SIZE is set by LWS), then exec the server given as arguments.
# vLLM's examples/online_serving/multi-node-serving.sh does the same.
set -eu
ray start --head --port=6379 --disable-usage-stats
python3 - <<'PY'
import os, sys, time
import ray
want = int(os.environ["LWS_GROUP_SIZE"])
ray.init(address="auto", logging_level="ERROR")
deadline = time.monotonic() + 600
while (alive := sum(node["Alive"] for node in ray.nodes())) < want:
    if time.monotonic() > deadline:
        sys.exit(f"only {alive} of {want} Ray nodes joined in 600 s")
    print(f"waiting for Ray workers: {alive}/{want} nodes", flush=True)
    time.sleep(5)
ray.shutdown()
PY
exec "$@"
"""
RAY_WORKER_SCRIPT: Final = """\
#!/bin/sh
# LeaderWorkerSet worker: join the leader's Ray head (LWS_LEADER_ADDRESS is set by LWS) and
# stay in the foreground; retry while the head is still starting.
set -u
for _ in $(seq 120); do
  ray start --address="$LWS_LEADER_ADDRESS:6379" --block --disable-usage-stats && exit 0
  echo "waiting for the Ray head at $LWS_LEADER_ADDRESS:6379" >&2
  sleep 5
done
exit 1
"""


@dataclass(frozen=True, slots=True, kw_only=True)
class K8sOptions:
    """How to run a plan on a cluster: what the plan itself cannot know."""

    image: str = DEFAULT_IMAGE
    """The serve/ image, with a pinned tag or digest (never ``latest``)."""
    namespace: str | None = None
    """None leaves the namespace to kubectl's context (or a kustomize overlay)."""
    name: str | None = None
    """Name of every object; None derives it from the model id."""
    replicas: int = 1
    storage_class: str | None = None
    """StorageClass of the model cache; None takes the cluster's default."""
    gpu_label_key: str = "nvidia.com/gpu.product"
    """Node label holding the GPU product (GKE: ``cloud.google.com/gke-accelerator``)."""
    gpu_product: str | None = None
    """Value of that label; None takes the plan's ``gpu.product_label``."""
    gpus_per_node: int = 8
    """GPUs one node offers: a plan needing more becomes a multi-node LeaderWorkerSet."""
    runtime_class_name: str | None = None
    hf_token_secret: str = "hf-token"
    hf_token_key: str = "token"
    run_as_user: int | None = 1000
    """The serve/ image's user; None runs as the image's default user."""
    port: int = 8000
    drain_seconds: int = 120
    """Time in-flight requests get to finish after SIGTERM."""
    pdb: bool = False
    hpa: bool = False
    keda: bool = False
    service_monitor: bool = False
    max_replicas: int | None = None
    """Upper bound for the HPA or KEDA; None is four times ``replicas``."""
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    """Where KEDA queries ``vllm:num_requests_waiting``."""
    require_verified: bool = False
    """Refuse a plan that no engine has run."""

    def __post_init__(self) -> None:
        """Reject options that would render manifests a cluster refuses or runs badly."""
        check_image(self.image)
        if self.name is not None and not valid_name(self.name):
            raise InvalidSettingError(
                f"--name {self.name!r} is not a valid Kubernetes name.",
                hint=f"Use lower-case letters, digits and '-', at most {_NAME_MAX} characters.",
            )
        for flag, value in (
            ("--replicas", self.replicas),
            ("--gpus-per-node", self.gpus_per_node),
            ("--port", self.port),
        ):
            if value < 1:
                raise InvalidSettingError(f"{flag} must be at least 1, got {value}.")
        if self.max_replicas is not None and self.max_replicas < self.replicas:
            raise InvalidSettingError(
                f"--max-replicas {self.max_replicas} is below --replicas {self.replicas}."
            )
        if self.hpa and self.keda:
            raise InvalidSettingError(
                "--hpa and --keda both scale the same pods; pick one.",
                hint="KEDA creates its own HPA from the ScaledObject.",
            )


def check_image(image: str) -> None:
    """Accept only an image pinned by a tag other than ``latest``, or by a digest.

    Raises:
        InvalidSettingError: no tag, or the ``latest`` tag.
    """
    if "@sha256:" in image:
        return
    last = image.rsplit("/", 1)[-1]
    tag = last.rsplit(":", 1)[1] if ":" in last else ""
    if tag in ("", "latest"):
        raise InvalidSettingError(
            f"--image {image!r} is not pinned: a rollout must not change what runs.",
            hint=f"Give a version tag or a digest, e.g. --image {DEFAULT_IMAGE}.",
        )


def valid_name(name: str) -> bool:
    """True for a DNS-1035 label short enough for the suffixes oominfer adds."""
    return len(name) <= _NAME_MAX and bool(_NAME_RE.match(name))


def resource_name(plan: Plan, options: K8sOptions) -> str:
    """The name of every object: ``--name``, else the model id's last part as a DNS label."""
    if options.name:
        return options.name
    base = re.sub(r"[^a-z0-9]+", "-", plan.model_id.rstrip("/").rsplit("/", 1)[-1].lower())
    base = base.strip("-")[:_NAME_MAX].rstrip("-")
    if not base or not base[0].isalpha():
        base = f"m-{base}"[:_NAME_MAX].rstrip("-")
    return base


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
    whole stages that fit a node (vLLM's Ray executor keeps a stage's ranks on one node),
    and the group has pipeline_parallel_size / stages_per_pod pods.

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
    stages = max(s for s in range(1, pp + 1) if pp % s == 0 and tp * s <= options.gpus_per_node)
    return Topology(pods=pp // stages, stages_per_pod=stages, gpus_per_pod=tp * stages)


def plan_warnings(plan: Plan, options: K8sOptions) -> list[str]:
    """What the user should know before applying the manifests; empty when nothing.

    Raises:
        PlanError: the plan is unverified and ``require_verified`` is set, or a plan that
            cannot run on Kubernetes as rendered.
    """
    warnings: list[str] = []
    if not plan.verified:
        status = plan.verification.status if plan.verification else "null"
        message = (
            f"the plan for {plan.model_id} is not verified (verification: {status}): "
            "no engine has loaded it at its limits, so the pods may fail to start."
        )
        if options.require_verified:
            raise PlanError(
                message[0].upper() + message[1:],
                hint="Verify it with `oominfer fit` on the target GPU, or leave out "
                "--require-verified.",
            )
        warnings.append(message)
    if plan.engine != "vllm" and topology(plan, options).multi_node:
        raise PlanError(
            f"the {plan.engine} engine cannot span nodes, but this plan needs "
            f"{plan.gpu_count} GPUs and a node has {options.gpus_per_node}.",
            hint="Re-fit with --engine vllm, or raise --gpus-per-node.",
        )
    if plan.gpu_count and not (options.gpu_product or plan.gpu.get("product_label")):
        warnings.append(
            f"the plan names no GPU product label for {plan.gpu.get('name', 'its GPU')}: "
            "the pods may land on any GPU node. Pass --gpu-product."
        )
    if plan.model_id.startswith(("/", ".")):
        warnings.append(
            f"the model is a local folder ({plan.model_id}); the pods must mount it there."
        )
    return warnings


def weights_bytes(plan: Plan) -> int:
    """Weights of one replica in GPU (and offloaded host) memory, from the plan.

    The plan records the busiest GPU; times the GPU count this slightly over-counts a
    pipeline-parallel plan, which only adds margin.

    Raises:
        PlanError: the plan records no weights size.
    """
    per_gpu = plan.predicted.get("weights_bytes")
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
    return weights_bytes(plan) * _DISK_FACTOR.get(plan.settings.quantization or "", 1)


def load_seconds(plan: Plan, topo: Topology) -> int:
    """Seconds a cold start takes: download + load + compile (+ Ray join), an upper estimate."""
    disk = checkpoint_bytes(plan)
    seconds = PROCESS_START_SECONDS + disk / DOWNLOAD_BYTES_PER_SECOND
    seconds += weights_bytes(plan) / LOAD_BYTES_PER_SECOND
    seconds += EAGER_SECONDS if plan.settings.enforce_eager else COMPILE_SECONDS
    if topo.multi_node:
        seconds += RAY_JOIN_SECONDS
    return math.ceil(seconds)


def startup_budget_seconds(plan: Plan, topo: Topology) -> int:
    """The startup probe's budget: the estimate, or twice the measured load time if longer."""
    measured = plan.verification.load_seconds if plan.verification else None
    return max(load_seconds(plan, topo), math.ceil(2 * (measured or 0)))


def shm_bytes(topo: Topology, tp: int) -> int:
    """``/dev/shm`` for the pod: NCCL and vLLM's shared-memory broadcast queue between ranks.

    1 GiB for one GPU; 2 GiB per GPU otherwise (vLLM's LWS recipe gives 8 GPUs 15 GiB).
    """
    if topo.gpus_per_pod <= 1 and tp == 1:
        return GiB
    return 2 * GiB * max(topo.gpus_per_pod, tp)


def host_memory_bytes(plan: Plan, topo: Topology) -> int:
    """Host memory one pod requests: processes, offloaded weights, and Ray when multi-node."""
    gpus = topo.gpus_per_pod
    total = HOST_BASE_BYTES + HOST_PER_GPU_BYTES * gpus
    total += int(plan.settings.cpu_offload_gb * GiB) * gpus
    if plan.gpu_count == 0:  # the CPU backend: weights and KV cache live in host memory
        total += weights_bytes(plan) + (plan.settings.kv_cache_memory_bytes or 4 * GiB)
    if topo.multi_node:
        total += HOST_RAY_BYTES
    return total


def pvc_bytes(plan: Plan) -> int:
    """The model cache: the checkpoint with a margin, plus room for compile caches."""
    return math.ceil(checkpoint_bytes(plan) * PVC_MARGIN) + PVC_EXTRA_BYTES


def quantity(n_bytes: int) -> str:
    """Bytes as a Kubernetes quantity in whole GiB, rounded up: ``24Gi``."""
    return f"{math.ceil(n_bytes / GiB)}Gi"


def labels(plan: Plan, options: K8sOptions) -> dict[str, str]:
    """Labels on every object; the pods' selector is the name and instance pair."""
    return {
        "app.kubernetes.io/name": "oominfer",
        "app.kubernetes.io/instance": resource_name(plan, options),
        "app.kubernetes.io/component": "server",
        "app.kubernetes.io/managed-by": "oominfer",
    }


def selector(plan: Plan, options: K8sOptions) -> dict[str, str]:
    """The labels that select this plan's server pods."""
    return {
        "app.kubernetes.io/name": "oominfer",
        "app.kubernetes.io/instance": resource_name(plan, options),
    }


def metadata(plan: Plan, options: K8sOptions, name: str) -> Manifest:
    """``metadata`` of a top-level object."""
    meta: Manifest = {"name": name}
    if options.namespace:
        meta["namespace"] = options.namespace
    meta["labels"] = labels(plan, options)
    return meta


def server_args(plan: Plan, options: K8sOptions) -> list[str]:
    """``oominfer serve`` flags: listen on all interfaces, then the plan's vLLM flags.

    ``oominfer serve`` checks that the flags after ``--`` agree with the plan.
    """
    args = ["--host", "0.0.0.0", "--port", str(options.port)]
    if plan.engine == "vllm":
        args += ["--", *to_vllm_args(plan.settings)]
    return args


def serve_command() -> list[str]:
    """The server's command: ``oominfer serve`` on the mounted plan."""
    return ["oominfer", "serve", PLAN_PATH]


def env(options: K8sOptions) -> list[Manifest]:
    """Caches on the volume, and the Hugging Face token from a Secret (optional)."""
    return [
        {"name": "HF_HOME", "value": f"{CACHE_DIR}/huggingface"},
        {"name": "VLLM_CACHE_ROOT", "value": f"{CACHE_DIR}/vllm"},
        {
            "name": "HF_TOKEN",
            "valueFrom": {
                "secretKeyRef": {
                    "name": options.hf_token_secret,
                    "key": options.hf_token_key,
                    "optional": True,
                }
            },
        },
    ]


def resources(plan: Plan, topo: Topology) -> Manifest:
    """Requests and limits: GPUs (requests = limits), CPU, and host memory.

    The memory limit adds ``/dev/shm``, since a memory-backed emptyDir is charged to the pod.
    No CPU limit: throttling the engine's busy loop costs latency.
    """
    memory = host_memory_bytes(plan, topo)
    requests: Manifest = {"cpu": str(2 + 2 * topo.gpus_per_pod), "memory": quantity(memory)}
    limits: Manifest = {"memory": quantity(memory + shm_bytes(topo, _tp(plan)))}
    if topo.gpus_per_pod:
        requests[GPU_RESOURCE] = str(topo.gpus_per_pod)
        limits[GPU_RESOURCE] = str(topo.gpus_per_pod)
    return {"requests": requests, "limits": limits}


def _tp(plan: Plan) -> int:
    return plan.settings.tensor_parallel_size


def probes(plan: Plan, options: K8sOptions, topo: Topology) -> Manifest:
    """Startup, readiness and liveness probes on vLLM's ``/health``.

    The startup probe holds the others off for the whole cold start
    (failureThreshold x periodSeconds >= ``startup_budget_seconds``).
    """
    http = {"path": "/health", "port": "http"}
    budget = startup_budget_seconds(plan, topo)
    return {
        "startupProbe": {
            "httpGet": http,
            "periodSeconds": PROBE_PERIOD_SECONDS,
            "timeoutSeconds": 5,
            "failureThreshold": math.ceil(budget / PROBE_PERIOD_SECONDS),
        },
        "readinessProbe": {
            "httpGet": http,
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "livenessProbe": {
            "httpGet": http,
            "periodSeconds": 30,
            "timeoutSeconds": 10,
            "failureThreshold": 5,
        },
    }


def volume_mounts() -> list[Manifest]:
    """The plan (read-only), the model cache, and ``/dev/shm``."""
    return [
        {"name": "plan", "mountPath": PLAN_DIR, "readOnly": True},
        {"name": "cache", "mountPath": CACHE_DIR},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]


def volumes(plan: Plan, options: K8sOptions, topo: Topology) -> list[Manifest]:
    """The ConfigMap, the cache PVC, and a memory-backed ``/dev/shm`` sized for the ranks."""
    name = resource_name(plan, options)
    return [
        {"name": "plan", "configMap": {"name": f"{name}-plan"}},
        {"name": "cache", "persistentVolumeClaim": {"claimName": f"{name}-cache"}},
        {
            "name": "dshm",
            "emptyDir": {"medium": "Memory", "sizeLimit": quantity(shm_bytes(topo, _tp(plan)))},
        },
    ]


def server_container(plan: Plan, options: K8sOptions, topo: Topology) -> Manifest:
    """The container that serves the plan; on a LeaderWorkerSet leader, after Ray starts."""
    command = serve_command()
    ports: list[Manifest] = [{"name": "http", "containerPort": options.port, "protocol": "TCP"}]
    if topo.multi_node:
        command = ["sh", f"{PLAN_DIR}/ray-leader.sh", *command]
        ports.append({"name": "ray", "containerPort": RAY_PORT, "protocol": "TCP"})
    return {
        "name": "server",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "args": server_args(plan, options),
        "ports": ports,
        "env": env(options),
        "resources": resources(plan, topo),
        **probes(plan, options, topo),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SECONDS)]}}},
        "securityContext": {"allowPrivilegeEscalation": False},
        "volumeMounts": volume_mounts(),
    }


def worker_container(plan: Plan, options: K8sOptions, topo: Topology) -> Manifest:
    """A LeaderWorkerSet worker: a Ray node holding ``gpus_per_pod`` GPUs, no server."""
    return {
        "name": "ray-worker",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", f"{PLAN_DIR}/ray-worker.sh"],
        "ports": [{"name": "ray", "containerPort": RAY_PORT, "protocol": "TCP"}],
        "env": env(options),
        "resources": resources(plan, topo),
        "securityContext": {"allowPrivilegeEscalation": False},
        "volumeMounts": volume_mounts(),
    }


def affinity(plan: Plan, options: K8sOptions) -> Manifest | None:
    """Require nodes whose GPU product label matches the plan's GPU; None when unknown."""
    product = options.gpu_product or plan.gpu.get("product_label")
    if not product:
        return None
    term = {"key": options.gpu_label_key, "operator": "In", "values": [str(product)]}
    required = {"nodeSelectorTerms": [{"matchExpressions": [term]}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def pod_spec(plan: Plan, options: K8sOptions, container: Manifest, topo: Topology) -> Manifest:
    """A pod running ``container`` on a node with the plan's GPU."""
    spec: Manifest = {
        "enableServiceLinks": False,  # a Service named vllm would inject VLLM_PORT
        "terminationGracePeriodSeconds": PRESTOP_SECONDS + options.drain_seconds,
    }
    if options.runtime_class_name:
        spec["runtimeClassName"] = options.runtime_class_name
    if options.run_as_user is not None:
        uid = options.run_as_user
        spec["securityContext"] = {
            "runAsNonRoot": uid != 0,
            "runAsUser": uid,
            "runAsGroup": uid,
            "fsGroup": uid,
            "fsGroupChangePolicy": "OnRootMismatch",  # no recursive chown of the checkpoint
        }
    if topo.gpus_per_pod:
        rule = affinity(plan, options)
        if rule is not None:
            spec["affinity"] = rule
        spec["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    spec["containers"] = [container]
    spec["volumes"] = volumes(plan, options, topo)
    return spec


def pod_metadata(plan: Plan, options: K8sOptions, extra: dict[str, str]) -> Manifest:
    """Pod labels, and the plan's digest so that a new plan rolls the pods."""
    return {
        "labels": {**labels(plan, options), **extra},
        "annotations": {PLAN_SHA_ANNOTATION: plan.sha256(), "oominfer.dev/model": plan.model_id},
    }


def deployment(plan: Plan, options: K8sOptions) -> Manifest:
    """The server on one pod per replica; Recreate, so a new pod never waits for GPUs."""
    topo = topology(plan, options)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(plan, options, resource_name(plan, options)),
        "spec": {
            "replicas": options.replicas,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": selector(plan, options)},
            "template": {
                "metadata": pod_metadata(plan, options, {}),
                "spec": pod_spec(plan, options, server_container(plan, options, topo), topo),
            },
        },
    }


def leader_worker_set(plan: Plan, options: K8sOptions) -> Manifest:
    """A replica spanning nodes: a leader (Ray head + server) and workers (Ray nodes).

    RecreateGroupOnPodRestart restarts the whole group when any pod restarts, since a Ray
    cluster with a lost member cannot serve; one group is rolled at a time, with no surge.
    """
    topo = topology(plan, options)
    leader = pod_spec(plan, options, server_container(plan, options, topo), topo)
    worker = pod_spec(plan, options, worker_container(plan, options, topo), topo)
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": metadata(plan, options, resource_name(plan, options)),
        "spec": {
            "replicas": options.replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "leaderWorkerTemplate": {
                "size": topo.pods,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": pod_metadata(plan, options, {"role": "leader"}),
                    "spec": leader,
                },
                "workerTemplate": {
                    "metadata": pod_metadata(plan, options, {"role": "worker"}),
                    "spec": worker,
                },
            },
        },
    }


def service(plan: Plan, options: K8sOptions) -> Manifest:
    """A ClusterIP Service on the server port; on the leaders for a LeaderWorkerSet."""
    pods = selector(plan, options)
    if topology(plan, options).multi_node:
        pods = {**pods, LWS_NAME_LABEL: resource_name(plan, options), "role": "leader"}
    port = {"name": "http", "port": options.port, "targetPort": "http", "protocol": "TCP"}
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(plan, options, resource_name(plan, options)),
        "spec": {"type": "ClusterIP", "selector": pods, "ports": [port]},
    }


def pvc(plan: Plan, options: K8sOptions) -> Manifest:
    """The model cache (HF_HOME, VLLM_CACHE_ROOT): the checkpoint with a margin.

    ReadWriteOnce for a single pod; ReadWriteMany when several pods mount it (replicas,
    autoscaling, or a LeaderWorkerSet), which needs an RWX StorageClass.
    """
    shared = (
        options.replicas > 1 or options.hpa or options.keda or topology(plan, options).multi_node
    )
    spec: Manifest = {
        "accessModes": ["ReadWriteMany" if shared else "ReadWriteOnce"],
        "resources": {"requests": {"storage": quantity(pvc_bytes(plan))}},
    }
    if options.storage_class:
        spec["storageClassName"] = options.storage_class
    name = f"{resource_name(plan, options)}-cache"
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(plan, options, name),
        "spec": spec,
    }


def configmap(plan: Plan, options: K8sOptions) -> Manifest:
    """plan.json (and the Ray scripts of a LeaderWorkerSet), mounted at /etc/oominfer."""
    data = {"plan.json": plan.to_json()}
    if topology(plan, options).multi_node:
        data["ray-leader.sh"] = RAY_LEADER_SCRIPT
        data["ray-worker.sh"] = RAY_WORKER_SCRIPT
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(plan, options, f"{resource_name(plan, options)}-plan"),
        "data": data,
    }


def pdb(plan: Plan, options: K8sOptions) -> Manifest:
    """Let voluntary evictions (node drains) take one server pod at a time."""
    pods = selector(plan, options)
    if topology(plan, options).multi_node:
        pods = {LWS_NAME_LABEL: resource_name(plan, options)}
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(plan, options, resource_name(plan, options)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": pods}},
    }


def _scale_target(plan: Plan, options: K8sOptions) -> Manifest:
    name = resource_name(plan, options)
    if topology(plan, options).multi_node:
        return {"apiVersion": LWS_API, "kind": "LeaderWorkerSet", "name": name}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "name": name}


def _max_replicas(options: K8sOptions) -> int:
    return options.max_replicas or 4 * options.replicas


def hpa(plan: Plan, options: K8sOptions) -> Manifest:
    """Scale on queued requests per pod (prometheus-adapter serves the metric).

    Scale-down waits ten minutes: a GPU pod takes minutes to come back.
    """
    metric = {
        "type": "Pods",
        "pods": {
            "metric": {"name": HPA_METRIC},
            "target": {"type": "AverageValue", "averageValue": "5"},
        },
    }
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": metadata(plan, options, resource_name(plan, options)),
        "spec": {
            "scaleTargetRef": _scale_target(plan, options),
            "minReplicas": options.replicas,
            "maxReplicas": _max_replicas(options),
            "metrics": [metric],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 600}},
        },
    }


def scaled_object(plan: Plan, options: K8sOptions) -> Manifest:
    """A KEDA ScaledObject on ``vllm:num_requests_waiting`` summed over the Service."""
    name = resource_name(plan, options)
    matchers = f'service="{name}"'
    if options.namespace:
        matchers = f'namespace="{options.namespace}",{matchers}'
    trigger = {
        "type": "prometheus",
        "metadata": {
            "serverAddress": options.prometheus_url,
            "query": f"sum(vllm:num_requests_waiting{{{matchers}}})",
            "threshold": "5",
        },
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": metadata(plan, options, name),
        "spec": {
            "scaleTargetRef": _scale_target(plan, options),
            "minReplicaCount": options.replicas,
            "maxReplicaCount": _max_replicas(options),
            "cooldownPeriod": 600,
            "triggers": [trigger],
        },
    }


def service_monitor(plan: Plan, options: K8sOptions) -> Manifest:
    """Prometheus Operator scrapes vLLM's ``/metrics`` through the Service."""
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": metadata(plan, options, resource_name(plan, options)),
        "spec": {
            "selector": {"matchLabels": labels(plan, options)},
            "endpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }


def render(plan: Plan, options: K8sOptions) -> list[Manifest]:
    """Every object that runs ``plan``, in apply order.

    Raises:
        PlanError: an unverified plan with ``require_verified``, or a plan lacking what the
            manifests need (see ``plan_warnings`` and ``weights_bytes``).
        InvalidSettingError: a plan that cannot be placed on nodes of ``gpus_per_node``.
    """
    plan_warnings(plan, options)
    multi = topology(plan, options).multi_node
    docs = [configmap(plan, options), pvc(plan, options)]
    docs.append(leader_worker_set(plan, options) if multi else deployment(plan, options))
    docs.append(service(plan, options))
    if options.pdb:
        docs.append(pdb(plan, options))
    if options.hpa:
        docs.append(hpa(plan, options))
    if options.keda:
        docs.append(scaled_object(plan, options))
    if options.service_monitor:
        docs.append(service_monitor(plan, options))
    return docs


def kustomization(docs: list[Manifest], options: K8sOptions) -> Manifest:
    """A kustomization listing the files of ``manifest_files``."""
    result: Manifest = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"}
    if options.namespace:
        result["namespace"] = options.namespace
    result["resources"] = list(file_names(docs))
    return result


def file_names(docs: list[Manifest]) -> list[str]:
    """One file name per object: its kind, plus its name when two share a kind."""
    kinds = [doc["kind"].lower() for doc in docs]
    return [
        f"{kind}.yaml" if kinds.count(kind) == 1 else f"{kind}-{doc['metadata']['name']}.yaml"
        for kind, doc in zip(kinds, docs, strict=True)
    ]


def manifest_files(plan: Plan, options: K8sOptions) -> dict[str, str]:
    """File name -> YAML text: one file per object and a kustomization.yaml."""
    docs = render(plan, options)
    header = (
        f"# Generated by `oominfer k8s` {__version__} from the plan of {plan.model_id} "
        f"(sha256 {plan.sha256()[:12]}). Change the plan, not this file.\n"
    )
    files = {
        name: header + dump_yaml([doc]) for name, doc in zip(file_names(docs), docs, strict=True)
    }
    files["kustomization.yaml"] = header + dump_yaml([kustomization(docs, options)])
    return files


class _ManifestDumper(yaml.SafeDumper):
    """SafeDumper that writes multi-line strings as ``|`` blocks and never uses aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str_representer(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_ManifestDumper.add_representer(str, _str_representer)


def dump_yaml(docs: list[Manifest]) -> str:
    """Objects as one multi-document YAML stream, keys in the order they were built.

    A ``yaml.SafeDumper`` (what ``yaml.safe_dump_all`` uses) that writes plan.json and the
    scripts as readable ``|`` blocks and repeats shared dicts instead of anchoring them.
    """
    return yaml.dump_all(
        docs, Dumper=_ManifestDumper, sort_keys=False, explicit_start=True, width=100
    )
