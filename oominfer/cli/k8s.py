"""``oominfer k8s``: write the Kubernetes manifests that run a plan."""

from __future__ import annotations

import json
from pathlib import Path

import click

from oominfer.cli.options import JSON
from oominfer.k8s import (
    DEFAULT_IMAGE,
    LATEST_KUBE,
    K8sOptions,
    dump_yaml,
    manifest_files,
    parse_kube_version,
    plan_warnings,
    render,
    write_manifests,
)
from oominfer.planning.document import read_plan

_DEFAULTS = K8sOptions()


@click.command("k8s", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("plan_file", metavar="PLAN.json", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for one YAML file per object and a kustomization.yaml (default: stdout).",
)
@click.option("--image", default=DEFAULT_IMAGE, show_default=True, help="Pinned serve/ image.")
@click.option("--namespace", "-n", help="Namespace of every object (default: kubectl's).")
@click.option("--name", help="Name of every object (default: from the model id).")
@click.option(
    "--replicas",
    type=click.IntRange(min=1),
    help="Pods, one replica each (default: the replicas the plan's GPUs serve).",
)
@click.option("--storage-class", help="StorageClass of the model cache (default: the cluster's).")
@click.option(
    "--gpu-label-key",
    default=_DEFAULTS.gpu_label_key,
    show_default=True,
    help="Node label that names the GPU product (GKE: cloud.google.com/gke-accelerator).",
)
@click.option("--gpu-product", help="Value of the GPU label (default: the plan's product label).")
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=1),
    help="A plan needing more GPUs becomes a multi-node LeaderWorkerSet (default: the "
    f"--gpus-per-node the plan was fitted for, else {_DEFAULTS.gpus_per_node}).",
)
@click.option("--runtime-class", help="runtimeClassName of the pods (e.g. nvidia).")
@click.option(
    "--hf-token-secret",
    default=_DEFAULTS.hf_token_secret,
    show_default=True,
    help="Secret whose key 'token' the pods read as HF_TOKEN, for gated models (optional).",
)
@click.option("--pdb", is_flag=True, help="Add a PodDisruptionBudget.")
@click.option("--hpa", is_flag=True, help="Add an HPA on vllm:num_requests_waiting.")
@click.option("--keda", is_flag=True, help="Add a KEDA ScaledObject on the same metric.")
@click.option("--service-monitor", is_flag=True, help="Add a Prometheus ServiceMonitor.")
@click.option("--max-replicas", type=click.IntRange(min=1), help="Autoscaling upper bound.")
@click.option("--require-verified", is_flag=True, help="Refuse a plan no engine has run.")
@click.option(
    "--kube-version",
    metavar="X.Y",
    default=str(LATEST_KUBE),
    show_default=True,
    help="The cluster's Kubernetes release: before 1.21 the PDB is policy/v1beta1, before "
    "1.23 the HPA autoscaling/v2beta2; what it lacks is a warning.",
)
@JSON
def k8s_command(
    plan_file: Path,
    out_dir: Path | None,
    image: str,
    namespace: str | None,
    name: str | None,
    replicas: int | None,
    storage_class: str | None,
    gpu_label_key: str,
    gpu_product: str | None,
    gpus_per_node: int | None,
    runtime_class: str | None,
    hf_token_secret: str,
    pdb: bool,
    hpa: bool,
    keda: bool,
    service_monitor: bool,
    max_replicas: int | None,
    require_verified: bool,
    kube_version: str,
    as_json: bool,
) -> None:
    """Write Kubernetes manifests that run PLAN.json exactly as it was fitted.

    A Deployment (or, when the plan spans nodes, a LeaderWorkerSet on Ray), a Service, a
    model-cache PVC and the plan in a ConfigMap; apply the folder with `kubectl apply -k`.
    With --json, stdout is one JSON document: the objects as a v1 List (kubectl applies
    it), or with -o the folder and the files written.

    \b
    Examples:
      oominfer k8s plan.json -o deploy/llama70b
      oominfer k8s plan.json --namespace llm --pdb --service-monitor | kubectl apply -f -
      oominfer k8s plan.json --kube-version 1.20 --pdb --hpa -o deploy/llama70b
    """
    plan = read_plan(plan_file)
    options = K8sOptions(
        image=image,
        namespace=namespace,
        name=name,
        replicas=replicas or plan.replicas,
        storage_class=storage_class,
        gpu_label_key=gpu_label_key,
        gpu_product=gpu_product,
        # The placement the plan was fitted for: every TP group inside one node.
        gpus_per_node=gpus_per_node
        or int(plan.constraints.get("gpus_per_node") or _DEFAULTS.gpus_per_node),
        runtime_class_name=runtime_class,
        hf_token_secret=hf_token_secret,
        pdb=pdb,
        hpa=hpa,
        keda=keda,
        service_monitor=service_monitor,
        max_replicas=max_replicas,
        require_verified=require_verified,
        kube_version=parse_kube_version(kube_version),
    )
    for warning in plan_warnings(plan, options):
        click.secho(f"Warning: {warning}", err=True, fg="yellow")
    if out_dir is None:
        docs = render(plan, options)
        if as_json:
            click.echo(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}, indent=2))
        else:
            click.echo(dump_yaml(docs), nl=False)
        return
    written = write_manifests(manifest_files(plan, options), out_dir)
    if as_json:
        click.echo(json.dumps({"folder": str(out_dir), "files": [p.name for p in written]}))
    click.echo(f"Wrote {len(written)} files to {out_dir}; apply with:", err=True)
    click.echo(f"  kubectl apply -k {out_dir}", err=True)
