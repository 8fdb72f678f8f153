"""Kubernetes manifests rendered as data from a plan.

``render`` turns a plan into dicts, ``dump_yaml`` writes them once; ``manifest_files`` gives
one file per object and a kustomization. The rest are the pieces, exported for tests and
tools.
"""

from oominfer.k8s.dump import dump_yaml
from oominfer.k8s.multinode import (
    LWS_NAME_LABEL,
    RAY_LEADER_SCRIPT,
    RAY_WORKER_SCRIPT,
    leader_worker_set,
)
from oominfer.k8s.options import DEFAULT_IMAGE, K8sOptions, Manifest, resource_name, valid_name
from oominfer.k8s.pod import PLAN_SHA_ANNOTATION
from oominfer.k8s.render import deployment, manifest_files, pvc, render
from oominfer.k8s.sizing import (
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
from oominfer.k8s.versions import (
    LATEST_KUBE,
    KubeVersion,
    hpa_api,
    parse_kube_version,
    pdb_api,
    version_warnings,
)
from oominfer.k8s.warnings import plan_warnings
from oominfer.k8s.write import write_manifests

__all__ = [
    "DEFAULT_IMAGE",
    "LATEST_KUBE",
    "LWS_NAME_LABEL",
    "PLAN_SHA_ANNOTATION",
    "PVC_MARGIN",
    "RAY_LEADER_SCRIPT",
    "RAY_WORKER_SCRIPT",
    "K8sOptions",
    "KubeVersion",
    "Manifest",
    "Topology",
    "checkpoint_bytes",
    "deployment",
    "dump_yaml",
    "host_memory_bytes",
    "hpa_api",
    "leader_worker_set",
    "load_seconds",
    "manifest_files",
    "parse_kube_version",
    "pdb_api",
    "plan_warnings",
    "pvc",
    "pvc_bytes",
    "quantity",
    "render",
    "resource_name",
    "startup_budget_seconds",
    "topology",
    "valid_name",
    "version_warnings",
    "write_manifests",
]
