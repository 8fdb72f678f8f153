"""`oominfer k8s --kube-version 1.20` against a real Kubernetes API server (tests/kube.py):
every manifest set is accepted by `kubectl apply --dry-run=server` (files and kustomization,
CRDs loaded), a pod that fits is scheduled onto a fake node with the right GPUs, one that
does not stays Pending with the scheduler's reason, and the committed deploy/k8s examples
pass the same check."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from click.testing import CliRunner
from kube import KubeApiServer

from oominfer.base.units import GiB
from oominfer.cli.k8s import k8s_command
from oominfer.k8s import hpa_api, pdb_api
from oominfer.k8s.versions import KubeVersion
from oominfer.planning.document import Plan, Prediction, plan_from_json
from oominfer.settings import EngineSettings

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "k8s"
SERVER = KubeVersion(1, 20)  # what kube-apiserver.sh builds
L4, H100 = "NVIDIA-L4", "NVIDIA-H100-80GB-HBM3"  # its fake nodes' products: 1 and 8 GPUs


def make_plan(*, product: str, tp: int = 1, pp: int = 1, weights: int = 8 * GiB) -> Plan:
    gpu = "L4" if product == L4 else "H100-SXM-80GB"
    return Plan(
        model_id="meta-llama/Llama-3.1-8B-Instruct",
        gpu={"name": gpu, "count": tp * pp, "product_label": product},
        engine_version="0.33.0",
        settings=EngineSettings(tensor_parallel_size=tp, pipeline_parallel_size=pp),
        predicted=Prediction(weights_bytes=weights),
    )


def committed_plan(folder: str) -> Plan:
    """An example plan of deploy/k8s: the planner's own choice for a catalog model."""
    return plan_from_json((DEPLOY / folder / "plan.json").read_text())


PLANS = {
    "example-base": (committed_plan("base"), []),
    "example-8b-l4": (committed_plan("examples/llama-3.1-8b-l4"), []),
    "example-70b-tp2": (committed_plan("examples/llama-3.3-70b-2xh100"), []),
    "example-405b-lws": (committed_plan("examples/llama-3.1-405b-2x8xh100"), []),
    "l4": (make_plan(product=L4), []),
    "tp2-h100": (make_plan(product=H100, tp=2, weights=70 * GiB), []),
    "replicas": (make_plan(product=L4), ["--replicas", "2"]),
    "multi-node-lws": (make_plan(product=H100, tp=8, pp=2, weights=50 * GiB), []),
}
OPTIONS = {
    "plain": [],
    "pdb-hpa-monitor": ["--pdb", "--hpa", "--service-monitor"],
    "keda": ["--keda", "--pdb"],
}


def render(plan: Plan, out: Path, *flags: str) -> tuple[Path, str]:
    """Run `oominfer k8s PLAN -o OUT --kube-version 1.20 FLAGS`; the folder and stderr."""
    plan_file = out.parent / f"{out.name}-plan.json"
    plan_file.write_text(plan.to_json())
    result = CliRunner().invoke(
        k8s_command, [str(plan_file), "-o", str(out), "--kube-version", str(SERVER), *flags]
    )
    assert result.exit_code == 0, result.output
    return out, result.stderr


def objects(folder: Path) -> list[dict[str, Any]]:
    return [
        doc
        for path in sorted(folder.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text())
    ]


def dry_run(server: KubeApiServer, *source: str, stdin: str | None = None) -> list[str]:
    """`kubectl apply --dry-run=server`: one "kind/name created (server dry run)" per object."""
    result = server.kubectl("apply", "--dry-run=server", *source, stdin=stdin)
    lines = result.stdout.splitlines()
    assert all(line.endswith("(server dry run)") for line in lines), result.stdout
    return lines


@pytest.mark.parametrize("options", OPTIONS, ids=str)
@pytest.mark.parametrize("case", PLANS, ids=str)
def test_the_server_accepts_every_manifest_for_1_20(
    kube_apiserver: KubeApiServer, tmp_path: Path, case: str, options: str
) -> None:
    plan, flags = PLANS[case]
    kube_apiserver.ensure_namespace("dry")
    out, _ = render(plan, tmp_path / case, "--namespace", "dry", *flags, *OPTIONS[options])
    docs = objects(out)
    kinds = {doc["kind"]: doc["apiVersion"] for doc in docs}
    if "PodDisruptionBudget" in kinds:
        assert kinds["PodDisruptionBudget"] == "policy/v1beta1"
    if "HorizontalPodAutoscaler" in kinds:
        assert kinds["HorizontalPodAutoscaler"] == "autoscaling/v2beta2"
    assert ("LeaderWorkerSet" in kinds) == case.endswith("lws")
    files = [a for p in sorted(out.glob("*.yaml")) if p.name != "kustomization.yaml"
             for a in ("-f", str(p))]  # fmt: skip
    assert len(dry_run(kube_apiserver, *files)) == len(docs)
    assert len(dry_run(kube_apiserver, "-k", str(out))) == len(docs)


def test_the_current_apis_are_what_1_20_lacks(kube_apiserver: KubeApiServer) -> None:
    """The default (a current cluster) renders policy/v1 and autoscaling/v2, which 1.20 does
    not serve: --kube-version is what makes the manifests apply there."""
    served = kube_apiserver.served()
    assert pdb_api(KubeVersion(1, 21)) not in served
    assert hpa_api(KubeVersion(1, 23)) not in served
    assert {pdb_api(SERVER), hpa_api(SERVER)} <= served


def wait_for(what: str, check: Any, timeout: float = 120) -> Any:
    """Poll ``check()`` until it returns something truthy; fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(1)
    pytest.fail(f"{what}: not within {timeout} s")


def pods(server: KubeApiServer, namespace: str, name: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={name}"
    items: list[dict[str, Any]] = server.get("pods", "-n", namespace, "-l", selector)["items"]
    return items


@pytest.mark.parametrize(
    ("name", "plan", "gpus"),
    [("fits-l4", make_plan(product=L4), 1), ("fits-h100", make_plan(product=H100, tp=4), 4)],
    ids=["l4", "h100-tp4"],
)
def test_a_pod_that_fits_lands_on_a_node_with_its_gpus(
    kube_apiserver: KubeApiServer, tmp_path: Path, name: str, plan: Plan, gpus: int
) -> None:
    kube_apiserver.ensure_namespace("apply")
    out, _ = render(plan, tmp_path / name, "--namespace", "apply", "--name", name)
    kube_apiserver.kubectl("apply", "-k", str(out))

    def scheduled() -> dict[str, Any] | None:
        found = pods(kube_apiserver, "apply", name)
        return found[0] if found and found[0]["spec"].get("nodeName") else None

    pod = wait_for(f"the pod of {name} scheduled", scheduled)
    node = kube_apiserver.get("node", pod["spec"]["nodeName"])
    product = plan.gpu["product_label"]
    assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == product
    (container,) = pod["spec"]["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == str(gpus)
    assert int(node["status"]["allocatable"]["nvidia.com/gpu"]) >= gpus


def test_a_pod_that_cannot_fit_stays_pending_with_the_schedulers_reason(
    kube_apiserver: KubeApiServer, tmp_path: Path
) -> None:
    """Two L4s per pod: the only L4 node has one, the H100 node the wrong product."""
    kube_apiserver.ensure_namespace("apply")
    name = "two-l4s"
    out, _ = render(make_plan(product=L4, tp=2), tmp_path / name, "-n", "apply", "--name", name)
    kube_apiserver.kubectl("apply", "-k", str(out))

    def unschedulable() -> dict[str, Any] | None:
        for pod in pods(kube_apiserver, "apply", name):
            for condition in pod["status"].get("conditions", []):
                if condition["type"] == "PodScheduled" and condition.get("reason"):
                    return pod
        return None

    pod = wait_for(f"the scheduler's verdict on {name}", unschedulable)
    assert pod["status"]["phase"] == "Pending"
    assert "nodeName" not in pod["spec"]
    (condition,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert condition["status"] == "False" and condition["reason"] == "Unschedulable"
    assert "Insufficient nvidia.com/gpu" in condition["message"], condition["message"]


KUSTOMIZATIONS = [DEPLOY / "base", *sorted((DEPLOY / "examples").iterdir())]


@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=lambda p: p.name)
def test_the_committed_examples_apply_to_1_20(kube_apiserver: KubeApiServer, folder: Path) -> None:
    """The committed files as they are, except the apiVersion of a PDB or HPA that 1.20 does
    not serve, which becomes the one `--kube-version 1.20` renders (their specs are the same
    in both versions)."""
    built = list(yaml.safe_load_all(kube_apiserver.kubectl("kustomize", str(folder)).stdout))
    served = kube_apiserver.served()
    older = {"PodDisruptionBudget": pdb_api(SERVER), "HorizontalPodAutoscaler": hpa_api(SERVER)}
    for doc in built:
        if doc["apiVersion"] not in served:
            assert doc["kind"] in older, f"1.20 does not serve {doc['apiVersion']} {doc['kind']}"
            doc["apiVersion"] = older[doc["kind"]]
        namespace = doc["metadata"].get("namespace")
        if namespace:
            kube_apiserver.ensure_namespace(namespace)
    lines = dry_run(kube_apiserver, "-f", "-", stdin=yaml.safe_dump_all(built))
    assert len(lines) == len(built)
