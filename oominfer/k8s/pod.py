"""The pod that serves a plan: the server container, its probes and volumes, and the pod
spec that places it on the plan's GPU. Pure."""

from __future__ import annotations

import math
import shlex
from typing import Final

from oominfer.k8s.options import K8sOptions, Manifest, labels, resource_name
from oominfer.k8s.sizing import (
    GPU_RESOURCE,
    Topology,
    quantity,
    resources,
    shm_bytes,
    startup_budget_seconds,
)
from oominfer.planning.document import Plan
from oominfer.settings import engine_args

PLAN_DIR: Final = "/etc/oominfer"
PLAN_PATH: Final = f"{PLAN_DIR}/plan.json"
CACHE_DIR: Final = "/models"
PLAN_SHA_ANNOTATION: Final = "oominfer.dev/plan-sha256"
ENGINE_ARGS_ANNOTATION: Final = "oominfer.dev/engine-args"
PROBE_PERIOD_SECONDS: Final = 10
PRESTOP_SECONDS: Final = 10  # lets endpoints drop the pod before vLLM gets SIGTERM


def server_args(plan: Plan, options: K8sOptions) -> list[str]:
    """``oominfer serve`` flags: listen on all interfaces. The engine's flags come from the
    mounted plan itself, so what runs is what was verified; the pod's annotations show them
    (``pod_metadata``)."""
    return ["--host", "0.0.0.0", "--port", str(options.port)]


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
            "emptyDir": {"medium": "Memory", "sizeLimit": quantity(shm_bytes(plan, topo))},
        },
    ]


def server_container(plan: Plan, options: K8sOptions, topo: Topology) -> Manifest:
    """The container that serves the plan (``k8s_multinode.leader_container`` starts Ray first)."""
    return {
        "name": "server",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "command": serve_command(),
        "args": server_args(plan, options),
        "ports": [{"name": "http", "containerPort": options.port, "protocol": "TCP"}],
        "env": env(options),
        "resources": resources(plan, topo),
        **probes(plan, options, topo),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRESTOP_SECONDS)]}}},
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
        "annotations": {
            PLAN_SHA_ANNOTATION: plan.sha256(),
            "oominfer.dev/model": plan.model_id,
            # What `oominfer serve` hands the engine, rendered from the plan, for the reader.
            ENGINE_ARGS_ANNOTATION: shlex.join(engine_args(plan.settings, plan.engine)),
        },
    }
