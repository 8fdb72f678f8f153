"""A replica spanning nodes: a LeaderWorkerSet running vLLM on Ray, as in vLLM's multi-node
recipe (docs/deployment/frameworks/lws.md; examples/online_serving/multi-node-serving.sh).
Pure."""

from __future__ import annotations

from typing import Final

from oominfer.k8s.options import K8sOptions, Manifest, metadata, resource_name
from oominfer.k8s.pod import PLAN_DIR, env, pod_metadata, pod_spec, server_container, volume_mounts
from oominfer.k8s.sizing import Topology, resources, topology
from oominfer.planning.document import Plan

LWS_API: Final = "leaderworkerset.x-k8s.io/v1"
LWS_NAME_LABEL: Final = "leaderworkerset.sigs.k8s.io/name"
RAY_PORT: Final = 6379

RAY_LEADER_SCRIPT: Final = """\
#!/bin/sh
# LeaderWorkerSet leader: start the Ray head, wait until every pod of the group has joined
# (LWS_GROUP_SIZE is set by LWS), then exec the server given as arguments.
# vLLM's examples/online_serving/multi-node-serving.sh does the same.
set -eu
ray start --head --port=6379 --disable-usage-stats
python3 - <<'PY'
import os, sys, time
import ray
want = int(os.environ["LWS_GROUP_SIZE"])
ray.init(address="auto", logging_level="ERROR")
deadline = time.monotonic() + 600
while (alive := sum(node["Alive"] for node in ray.nodes())) < want:
    if time.monotonic() > deadline:
        sys.exit(f"only {alive} of {want} Ray nodes joined in 600 s")
    print(f"waiting for Ray workers: {alive}/{want} nodes", flush=True)
    time.sleep(5)
ray.shutdown()
PY
exec "$@"
"""
RAY_WORKER_SCRIPT: Final = """\
#!/bin/sh
# LeaderWorkerSet worker: join the leader's Ray head (LWS_LEADER_ADDRESS is set by LWS) and
# stay in the foreground; retry while the head is still starting.
set -u
for _ in $(seq 120); do
  ray start --address="$LWS_LEADER_ADDRESS:6379" --block --disable-usage-stats && exit 0
  echo "waiting for the Ray head at $LWS_LEADER_ADDRESS:6379" >&2
  sleep 5
done
exit 1
"""


def ray_scripts() -> dict[str, str]:
    """The scripts the leader and the workers run, by their file name in the ConfigMap."""
    return {"ray-leader.sh": RAY_LEADER_SCRIPT, "ray-worker.sh": RAY_WORKER_SCRIPT}


def _ray_port() -> Manifest:
    return {"name": "ray", "containerPort": RAY_PORT, "protocol": "TCP"}


def leader_container(plan: Plan, options: K8sOptions, topo: Topology) -> Manifest:
    """The server container, started by the Ray head once every worker has joined."""
    container = server_container(plan, options, topo)
    container["command"] = ["sh", f"{PLAN_DIR}/ray-leader.sh", *container["command"]]
    container["ports"] = [*container["ports"], _ray_port()]
    return container


def worker_container(plan: Plan, options: K8sOptions, topo: Topology) -> Manifest:
    """A LeaderWorkerSet worker: a Ray node holding ``gpus_per_pod`` GPUs, no server."""
    return {
        "name": "ray-worker",
        "image": options.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sh", f"{PLAN_DIR}/ray-worker.sh"],
        "ports": [_ray_port()],
        "env": env(options),
        "resources": resources(plan, topo),
        "securityContext": {"allowPrivilegeEscalation": False},
        "volumeMounts": volume_mounts(),
    }


def leader_worker_set(plan: Plan, options: K8sOptions) -> Manifest:
    """A replica spanning nodes: a leader (Ray head + server) and workers (Ray nodes).

    RecreateGroupOnPodRestart restarts the whole group when any pod restarts, since a Ray
    cluster with a lost member cannot serve; one group is rolled at a time, with no surge.
    """
    topo = topology(plan, options)
    leader = pod_spec(plan, options, leader_container(plan, options, topo), topo)
    worker = pod_spec(plan, options, worker_container(plan, options, topo), topo)
    return {
        "apiVersion": LWS_API,
        "kind": "LeaderWorkerSet",
        "metadata": metadata(plan, options, resource_name(plan, options)),
        "spec": {
            "replicas": options.replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {"maxUnavailable": 1, "maxSurge": 0},
            },
            "leaderWorkerTemplate": {
                "size": topo.pods,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": pod_metadata(plan, options, {"role": "leader"}),
                    "spec": leader,
                },
                "workerTemplate": {
                    "metadata": pod_metadata(plan, options, {"role": "worker"}),
                    "spec": worker,
                },
            },
        },
    }
