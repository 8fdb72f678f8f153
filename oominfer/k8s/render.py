"""Kubernetes manifests that run a plan, as data. Pure: a plan in, a list of dicts out.

Every object is built as a dict by a small function and serialised once by ``dump_yaml``;
there are no string templates. The server container runs ``oominfer serve`` on the plan
mounted from a ConfigMap: the engine's flags come from the plan itself (the settings ``fit``
verified), shown in the pod's ``oominfer.dev/engine-args`` annotation. A plan whose pipeline
stages span nodes becomes a LeaderWorkerSet running vLLM on Ray (``multinode``).

This module renders the objects; the options, names and labels are in ``options``, the
sizing in ``sizing``, the pod in ``pod``, the PDB, autoscaling and monitoring objects in
``optional``, the warnings in ``warnings`` and the YAML in ``dump``.
"""

from __future__ import annotations

from oominfer.base.version import __version__
from oominfer.k8s.dump import dump_yaml
from oominfer.k8s.multinode import LWS_NAME_LABEL, leader_worker_set, ray_scripts
from oominfer.k8s.optional import hpa, pdb, scaled_object, service_monitor
from oominfer.k8s.options import K8sOptions, Manifest, metadata, resource_name, selector
from oominfer.k8s.pod import pod_metadata, pod_spec, server_container
from oominfer.k8s.sizing import pvc_bytes, quantity, topology
from oominfer.k8s.warnings import plan_warnings
from oominfer.planning.document import Plan


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
