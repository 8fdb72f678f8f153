"""Kubernetes manifests that run a plan, as data. Pure: a plan in, a list of dicts out.

Every object is built as a dict by a small function and serialised once by ``dump_yaml``;
there are no string templates. The server container runs ``oominfer serve`` on the plan
mounted from a ConfigMap, with the vLLM flags from ``to_vllm_args`` (the code ``fit``
verified) after ``--``, one token per list item. A plan whose pipeline stages span nodes
becomes a LeaderWorkerSet running vLLM on Ray (``k8s_multinode``).

This module renders the objects and writes them out; the options, names and labels are in
``k8s_options``, the sizing in ``k8s_sizing``, the pod in ``k8s_pod``, the PDB, autoscaling
and monitoring objects in ``k8s_optional``. It re-exports what callers use from them.
"""

from __future__ import annotations

from typing import Any

import yaml

from oominfer import __version__
from oominfer.k8s_multinode import (
    LWS_NAME_LABEL,
    RAY_LEADER_SCRIPT,
    RAY_WORKER_SCRIPT,
    leader_worker_set,
    ray_scripts,
)
from oominfer.k8s_optional import hpa, pdb, scaled_object, service_monitor
from oominfer.k8s_options import (
    DEFAULT_IMAGE,
    K8sOptions,
    Manifest,
    metadata,
    resource_name,
    selector,
    valid_name,
)
from oominfer.k8s_pod import PLAN_SHA_ANNOTATION, pod_metadata, pod_spec, server_container
from oominfer.k8s_sizing import (
    PVC_MARGIN,
    Topology,
    checkpoint_bytes,
    host_memory_bytes,
    load_seconds,
    pvc_bytes,
    quantity,
    startup_budget_seconds,
    topology,
)
from oominfer.plan import Plan, PlanError

__all__ = [
    "DEFAULT_IMAGE",
    "LWS_NAME_LABEL",
    "PLAN_SHA_ANNOTATION",
    "PVC_MARGIN",
    "RAY_LEADER_SCRIPT",
    "RAY_WORKER_SCRIPT",
    "K8sOptions",
    "Manifest",
    "Topology",
    "checkpoint_bytes",
    "deployment",
    "dump_yaml",
    "host_memory_bytes",
    "leader_worker_set",
    "load_seconds",
    "manifest_files",
    "plan_warnings",
    "pvc",
    "pvc_bytes",
    "quantity",
    "render",
    "resource_name",
    "startup_budget_seconds",
    "topology",
    "valid_name",
]


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
        data.update(ray_scripts())
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(plan, options, f"{resource_name(plan, options)}-plan"),
        "data": data,
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
