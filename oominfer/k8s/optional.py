"""The optional objects of ``oominfer k8s``: a PodDisruptionBudget (--pdb), an HPA (--hpa)
or a KEDA ScaledObject (--keda) on queued requests, and a ServiceMonitor
(--service-monitor). Pure."""

from __future__ import annotations

from typing import Final

from oominfer.k8s.multinode import LWS_API, LWS_NAME_LABEL
from oominfer.k8s.options import K8sOptions, Manifest, labels, metadata, resource_name, selector
from oominfer.k8s.sizing import topology
from oominfer.k8s.versions import hpa_api, pdb_api
from oominfer.planning.document import Plan

HPA_METRIC: Final = "vllm_num_requests_waiting"
"""The custom metric the HPA reads: vLLM's ``vllm:num_requests_waiting`` as prometheus-adapter
exposes it (an adapter rule renames the series; deploy/k8s/README.md)."""


def pdb(plan: Plan, options: K8sOptions) -> Manifest:
    """Let voluntary evictions (node drains) take one server pod at a time.

    ``policy/v1beta1`` below Kubernetes 1.21 has the same ``maxUnavailable`` and ``selector``.
    """
    pods = selector(plan, options)
    if topology(plan, options).multi_node:
        pods = {LWS_NAME_LABEL: resource_name(plan, options)}
    return {
        "apiVersion": pdb_api(options.kube_version),
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

    Scale-down waits ten minutes: a GPU pod takes minutes to come back. Below Kubernetes
    1.23 it is ``autoscaling/v2beta2``, whose spec (``behavior`` included) is the same.
    """
    metric = {
        "type": "Pods",
        "pods": {
            "metric": {"name": HPA_METRIC},
            "target": {"type": "AverageValue", "averageValue": "5"},
        },
    }
    return {
        "apiVersion": hpa_api(options.kube_version),
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
