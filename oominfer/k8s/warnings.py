"""What a user should know about a plan before applying its manifests."""

from __future__ import annotations

from oominfer.base.errors import PlanError
from oominfer.k8s.options import K8sOptions
from oominfer.k8s.sizing import quantity, shm_bytes, topology
from oominfer.k8s.versions import version_warnings
from oominfer.planning.document import Plan


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
    shm = quantity(shm_bytes(plan, topology(plan, options)))
    warnings += version_warnings(options.kube_version, shm_size=shm, keda=options.keda)
    return warnings
