"""Which Kubernetes the manifests are rendered for (``--kube-version``): the API versions that
cluster serves, and what it lacks. Pure.

The dates are Kubernetes' own (kubernetes.io/docs/reference/using-api/deprecation-guide/ and
the feature-gate table): PodDisruptionBudget is served as ``policy/v1`` from 1.21
(``policy/v1beta1`` until 1.24), HorizontalPodAutoscaler as ``autoscaling/v2`` from 1.23
(``autoscaling/v2beta2``, which has ``behavior`` from 1.18, until 1.25).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from oominfer.base.errors import InvalidSettingError


@dataclass(frozen=True, order=True, slots=True)
class KubeVersion:
    """A Kubernetes minor release, e.g. ``KubeVersion(1, 20)``."""

    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


LATEST_KUBE: Final = KubeVersion(1, 37)
"""A current cluster: the newest release whose schemas the tests validate against
(kubernetes-validate 1.37). Every release from 1.23 on renders the same objects."""
OLDEST_KUBE: Final = KubeVersion(1, 18)
"""The startup probe that holds liveness off during a cold start is on by default from 1.18;
below it the pods would be killed while the weights load."""
PDB_V1: Final = KubeVersion(1, 21)
HPA_V2: Final = KubeVersion(1, 23)
FS_GROUP_CHANGE_POLICY: Final = KubeVersion(1, 20)  # beta, on by default (GA in 1.23)
SIZED_MEMORY_VOLUMES: Final = KubeVersion(1, 22)  # SizeMemoryBackedVolumes: beta, on by default
CEL_VALIDATION: Final = KubeVersion(1, 25)  # x-kubernetes-validations in CRDs: beta, on

_VERSION_RE: Final = re.compile(r"v?(\d+)\.(\d+)(?:\.\d+)?")


def parse_kube_version(text: str) -> KubeVersion:
    """``"1.20"``, ``"v1.20"`` or ``"1.20.2"`` (what ``kubectl version`` prints) as a release.

    Raises:
        InvalidSettingError: not a version, or older than ``OLDEST_KUBE``.
    """
    match = _VERSION_RE.fullmatch(text.strip())
    if not match:
        raise InvalidSettingError(
            f"--kube-version {text!r} is not a Kubernetes version.",
            hint="Give the cluster's MAJOR.MINOR, as `kubectl version` prints it, e.g. 1.29.",
        )
    version = KubeVersion(int(match.group(1)), int(match.group(2)))
    check_kube_version(version)
    return version


def check_kube_version(version: KubeVersion) -> None:
    """Refuse a release the manifests cannot run on.

    Raises:
        InvalidSettingError: older than ``OLDEST_KUBE``.
    """
    if version < OLDEST_KUBE:
        raise InvalidSettingError(
            f"--kube-version {version} is older than {OLDEST_KUBE}, the first release whose "
            "startup probe is on by default: the pods would be killed while the model loads.",
            hint=f"Upgrade the cluster to {OLDEST_KUBE} or newer.",
        )


def pdb_api(version: KubeVersion) -> str:
    """The apiVersion of a PodDisruptionBudget that ``version`` serves."""
    return "policy/v1" if version >= PDB_V1 else "policy/v1beta1"


def hpa_api(version: KubeVersion) -> str:
    """The apiVersion of a HorizontalPodAutoscaler (with ``behavior``) that ``version`` serves."""
    return "autoscaling/v2" if version >= HPA_V2 else "autoscaling/v2beta2"


def version_warnings(version: KubeVersion, *, shm_size: str, keda: bool) -> list[str]:
    """What the manifests ask for that a cluster of ``version`` does not do; empty when all.

    Args:
        version: the cluster's release.
        shm_size: the ``/dev/shm`` sizeLimit the pods get.
        keda: whether a KEDA ScaledObject is rendered.
    """
    warnings: list[str] = []
    if version < FS_GROUP_CHANGE_POLICY:
        warnings.append(
            f"Kubernetes {version} ignores fsGroupChangePolicy (on by default from "
            f"{FS_GROUP_CHANGE_POLICY}): the kubelet changes the owner of every file in the "
            "model cache at each pod start, which can take minutes for a large checkpoint."
        )
    if version < SIZED_MEMORY_VOLUMES:
        warnings.append(
            f"Kubernetes {version} mounts a memory-backed /dev/shm at the kernel's default size "
            f"(half the node's memory), not its sizeLimit of {shm_size} (from "
            f"{SIZED_MEMORY_VOLUMES}); the sizeLimit still evicts a pod that writes more."
        )
    if keda and version < CEL_VALIDATION:
        warnings.append(
            f"current KEDA releases validate the ScaledObject with CEL rules, which Kubernetes "
            f"applies from {CEL_VALIDATION}: {version} accepts what they would refuse; install a "
            f"KEDA release that supports {version}."
        )
    return warnings
