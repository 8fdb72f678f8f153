"""A real Kubernetes API server for the manifest tests: ../shared/tools/kube-apiserver.sh.

The script builds Kubernetes 1.20.2 (apiserver, controller-manager, scheduler) and etcd from
Debian's packages once into its cache, then starts them on 127.0.0.1 with fake GPU nodes
(NVIDIA-L4 x1, NVIDIA-H100-80GB-HBM3 x8) and no kubelet: pods are scheduled, never run. Its
exit status 3 means "cannot be built or started on this host": the only failure that skips.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent
# CI runs a fresh clone with shared/ beside it: refer to it by a path relative to the repo.
TOOLS = REPO / ".." / "shared" / "tools"
SCRIPT = TOOLS / "kube-apiserver.sh"
CRDS = TOOLS / "crds"
CANNOT_BUILD_HERE = 3
BUILD_DONE_ENV = "OOMINFER_KAS_BUILD_DONE"
"""A file that .ci/run's background warm-up build writes its exit status into when it ends:
`up` must not build into the same cache at the same time."""
BUILD_WAIT_SECONDS = 1800


@dataclass(frozen=True)
class KubeApiServer:
    """A running API server and the kubectl that talks to it."""

    kubeconfig: Path

    def kubectl(
        self, *args: str, stdin: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this server; ``check`` fails the test with kubectl's stderr."""
        result = subprocess.run(
            ["kubectl", "--kubeconfig", str(self.kubeconfig), *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        if check:
            assert result.returncode == 0, f"kubectl {' '.join(args)}:\n{result.stderr}"
        return result

    def get(self, *args: str) -> Any:
        """``kubectl get ... -o json``, parsed."""
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def ensure_namespace(self, name: str) -> None:
        """Create ``name`` unless it exists."""
        if self.kubectl("get", "namespace", name, check=False).returncode != 0:
            self.kubectl("create", "namespace", name)

    def served(self) -> set[str]:
        """The apiVersions the server serves (``kubectl api-versions``)."""
        return set(self.kubectl("api-versions").stdout.split())


def _wait_for_warm_build() -> None:
    """Wait for .ci/run's background build to end (any exit status: `up` reports its own)."""
    done = os.environ.get(BUILD_DONE_ENV)
    if not done:
        return
    deadline = time.monotonic() + BUILD_WAIT_SECONDS
    while not Path(done).exists():
        if time.monotonic() > deadline:
            pytest.fail(f"the kube-apiserver warm-up build did not end in {BUILD_WAIT_SECONDS} s")
        time.sleep(5)


def _run_script(command: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), command],
        capture_output=True,
        text=True,
        env=env,
        timeout=BUILD_WAIT_SECONDS,
        check=False,
    )


def load_crds(server: KubeApiServer) -> None:
    """Apply the LeaderWorkerSet, ScaledObject and ServiceMonitor CRDs, as 1.20 takes them."""
    for crd in sorted(CRDS.glob("*.yaml")):
        converted = subprocess.run(
            [sys.executable, str(CRDS / "for_k8s120.py"), str(crd)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        server.kubectl("apply", "--server-side", "-f", "-", stdin=converted)
    server.kubectl("wait", "--for", "condition=established", "crd", "--all", "--timeout=60s")


START_ATTEMPTS = 3
"""Starts tried before a failure fails the tests (see ``start``)."""


def start(state: Path) -> Iterator[KubeApiServer]:
    """Start the server with its state in ``state``, CRDs loaded; stop it afterwards.

    Skips only when the script exits 3 (cannot be built here); any other failure fails.
    """
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not installed (the kube-apiserver tests need it)")
    assert SCRIPT.is_file(), f"{SCRIPT} is missing: shared/ must sit beside the repository"
    _wait_for_warm_build()
    env = {**os.environ, "KAS_STATE": str(state)}
    env.pop("KUBECONFIG", None)
    for _ in range(START_ATTEMPTS):
        result = _run_script("up", env)
        # The script draws its etcd and server ports at random from a range that overlaps
        # the kernel's ephemeral ports: a port an outgoing connection holds passes its
        # "nothing listens" check, then etcd cannot bind it ("address already in use"). A
        # failed start stops what it started, so starting again draws new ports.
        if result.returncode == 0 or result.returncode == CANNOT_BUILD_HERE:
            break
    if result.returncode == CANNOT_BUILD_HERE:
        pytest.skip(f"kube-apiserver cannot be built here: {result.stderr.strip()[-300:]}")
    assert result.returncode == 0, f"kube-apiserver.sh up failed:\n{result.stderr[-3000:]}"
    try:
        server = KubeApiServer(kubeconfig=state / "kubeconfig")
        load_crds(server)
        yield server
    finally:
        down = _run_script("down", env)
        assert down.returncode == 0, down.stderr
