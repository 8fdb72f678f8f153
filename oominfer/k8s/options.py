"""What ``oominfer k8s`` needs beyond the plan (``K8sOptions``), and the names and labels
every object gets. Pure."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Final

from oominfer.base.errors import InvalidSettingError
from oominfer.base.version import __version__
from oominfer.k8s.versions import LATEST_KUBE, KubeVersion, check_kube_version
from oominfer.planning.document import Plan

Manifest = dict[str, Any]

DEFAULT_IMAGE: Final = f"ghcr.io/oominfer/oominfer-serve:{__version__}"
"""The serve/ image of this oominfer release (build and push your own: serve/README.md)."""
_NAME_MAX: Final = 40  # leaves room for "-cache", "-plan" and LWS's "-<group>-<worker>"
_NAME_RE: Final = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_LABEL_MAX: Final = 63
_DNS_LABEL_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")  # RFC 1123
_SUBDOMAIN_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_LABEL_VALUE_RE: Final = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")


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
    """Pods, each serving one replica of the plan."""
    storage_class: str | None = None
    """StorageClass of the model cache; None takes the cluster's default."""
    gpu_label_key: str = "nvidia.com/gpu.product"
    """Node label holding the GPU product (GKE: ``cloud.google.com/gke-accelerator``)."""
    gpu_product: str | None = None
    """Value of that label; None takes the plan's ``gpu.product_label``."""
    gpus_per_node: int = 8
    """GPUs one node offers: a plan needing more becomes a multi-node LeaderWorkerSet."""
    runtime_class_name: str | None = None
    """``runtimeClassName`` of the pods (e.g. ``nvidia``); None takes the cluster's default."""
    hf_token_secret: str = "hf-token"
    """Secret the pods read ``HF_TOKEN`` from (optional: public models need none)."""
    hf_token_key: str = "token"
    """The key of that Secret that holds the token."""
    run_as_user: int | None = 1000
    """The serve/ image's user; None runs as the image's default user."""
    port: int = 8000
    """Port of the OpenAI API in the pod, and of the Service."""
    drain_seconds: int = 120
    """Time in-flight requests get to finish after SIGTERM."""
    pdb: bool = False
    """Add a PodDisruptionBudget."""
    hpa: bool = False
    """Add a HorizontalPodAutoscaler on ``vllm:num_requests_waiting``."""
    keda: bool = False
    """Add a KEDA ScaledObject on the same metric (not with ``hpa``)."""
    service_monitor: bool = False
    """Add a Prometheus ServiceMonitor for ``/metrics``."""
    max_replicas: int | None = None
    """Upper bound for the HPA or KEDA; None is four times ``replicas``."""
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    """Where KEDA queries ``vllm:num_requests_waiting``."""
    require_verified: bool = False
    """Refuse a plan that no engine has run."""
    kube_version: KubeVersion = LATEST_KUBE
    """The cluster's release: which API versions to render (``versions``)."""

    def __post_init__(self) -> None:
        """Reject options that would render manifests a cluster refuses or runs badly."""
        check_image(self.image)
        check_kube_version(self.kube_version)
        if self.namespace is not None and not valid_namespace(self.namespace):
            raise InvalidSettingError(
                f"--namespace {self.namespace!r} is not a valid Kubernetes namespace.",
                hint="A namespace is a DNS label: lower-case letters, digits and '-', starting "
                f"and ending with a letter or digit, at most {_DNS_LABEL_MAX} characters.",
            )
        for option, object_name in (
            ("--storage-class", self.storage_class),
            ("--runtime-class", self.runtime_class_name),
            ("--hf-token-secret", self.hf_token_secret),
        ):
            if object_name is not None and not (
                len(object_name) <= 253 and _SUBDOMAIN_RE.match(object_name)
            ):
                raise InvalidSettingError(
                    f"{option} {object_name!r} is not a valid Kubernetes object name.",
                    hint="Use lower-case letters, digits, '-' and '.'.",
                )
        if self.gpu_product is not None and not (
            len(self.gpu_product) <= 63 and _LABEL_VALUE_RE.match(self.gpu_product)
        ):
            raise InvalidSettingError(
                f"--gpu-product {self.gpu_product!r} is not a valid label value.",
                hint="Use at most 63 letters, digits, '-', '_' and '.' (e.g. NVIDIA-L4).",
            )
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


def valid_namespace(namespace: str) -> bool:
    """True for an RFC 1123 DNS label, what Kubernetes takes as a namespace."""
    return len(namespace) <= _DNS_LABEL_MAX and bool(_DNS_LABEL_RE.match(namespace))


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
