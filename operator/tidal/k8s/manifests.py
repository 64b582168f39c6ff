"""Pods and Services for a placed gang: deterministic names, pinned nodes, rank environment.

The rank arithmetic (`GangShape`) lives in the pure core, `placement/shape.py`.
"""

from __future__ import annotations

import copy
from typing import Any

from tidal import API_GROUP, API_VERSION
from tidal.k8s import labels
from tidal.k8s.taints import NODE_LOST, toleration
from tidal.placement.compute_domains import DomainPlan, add_channel_claim
from tidal.placement.shape import GangShape

MASTER_PORT = 29500


def pod_name(owner: str, index: int) -> str:
    return f"{owner}-{index}"


def owner_reference(kind: str, name: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{API_GROUP}/{API_VERSION}",
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def pinned_pod(
    template: dict[str, Any],
    *,
    name: str,
    namespace: str,
    node: str,
    accelerator: str,
    gpus: int,
    pod_labels: dict[str, str],
    owner: dict[str, Any],
    env: dict[str, str],
    subdomain: str | None = None,
    priority_class_name: str | None = None,
    pod_annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod from the user's template, gated and pinned to `node`, with the tidal env and labels."""
    template = copy.deepcopy(template or {})
    meta = template.get("metadata") or {}
    spec = template.get("spec") or {}
    spec.setdefault("containers", [{"name": "main", "image": "registry.k8s.io/pause:3.10"}])
    spec.setdefault("restartPolicy", "Never")
    spec["schedulingGates"] = [*spec.get("schedulingGates", []), {"name": labels.GANG_GATE}]
    affinity = spec.setdefault("affinity", {})
    affinity["nodeAffinity"] = {
        **affinity.get("nodeAffinity", {}),
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
        },
    }
    if priority_class_name:  # the workload's class (validated to exist before any pod is made)
        spec["priorityClassName"] = priority_class_name
    if subdomain:
        spec["hostname"] = name
        spec["subdomain"] = subdomain
    # What ExtendedResourceToleration would add: a node tainted `<accelerator>:NoSchedule` (GKE's
    # GPU pools) is for pods like these, and placement counted it open (k8s/taints.closed).
    implied = {"key": accelerator, "operator": "Exists", "effect": "NoSchedule"}
    if implied not in (spec.get("tolerations") or []):
        spec["tolerations"] = [*(spec.get("tolerations") or []), implied]
    # tidal, not the taint manager, decides when a pod on a NotReady node goes (k8s/outage.py: a
    # control-plane outage restarts nothing): its 300 s default eviction would break the group
    # mid-outage, and these bare pods come back only through tidal anyway. Tolerate a lost node
    # without a time limit, unless the template tolerates it itself (its own limit then holds).
    own = [toleration(t) for t in spec["tolerations"]]
    for taint in NODE_LOST:
        if not any(t.tolerates(taint) for t in own):
            spec["tolerations"].append({"key": taint.key, "operator": "Exists", "effect": taint.effect})
    first = spec["containers"][0]
    resources = first.setdefault("resources", {})
    for kind in ("requests", "limits"):
        resources.setdefault(kind, {})[accelerator] = str(gpus)
    for container in spec["containers"]:
        existing = [e for e in container.get("env", []) if e.get("name") not in env]
        container["env"] = existing + [{"name": k, "value": v} for k, v in env.items()]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {**(meta.get("labels") or {}), **pod_labels, labels.MANAGED_BY: "tidal"},
            "annotations": {**(meta.get("annotations") or {}), **(pod_annotations or {})},
            "ownerReferences": [owner],
        },
        "spec": spec,
    }


WORLD_VOLUME = "tidal-world"
WORLD_MOUNT = "/etc/tidal/world"
"""Where every container of a training pod reads the job's current `world-size` and `dp`: files
the kubelet refreshes from the pod's annotations (a downward API volume), so an elastic trainer
learns the size after a resize, when its WORLD_SIZE env still holds the size it started with."""


def world_annotations(shape: GangShape) -> dict[str, str]:
    return {labels.WORLD_SIZE: str(shape.world_size), labels.CURRENT_DP: str(shape.dp)}


WORLD_FILES = {
    "world-size": labels.WORLD_SIZE,
    "dp": labels.CURRENT_DP,
    "generation": labels.WORLD_GENERATION,
    "leaving": labels.WORLD_LEAVING,
    "joining": labels.WORLD_JOINING,
    "checkpoint-requested": labels.CHECKPOINT_REQUESTED,
    "checkpoint-cancelled": labels.CHECKPOINT_CANCELLED,
}
"""File under WORLD_MOUNT -> the pod annotation it holds (empty while the annotation is unset): what
the workload library (tidal.workload) watches."""


def mount_world_files(pod_spec: dict[str, Any]) -> None:
    """Add the downward API volume with the WORLD_FILES to every container (in place)."""
    items = [
        {"path": path, "fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}} for path, key in WORLD_FILES.items()
    ]
    volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") != WORLD_VOLUME]
    pod_spec["volumes"] = [*volumes, {"name": WORLD_VOLUME, "downwardAPI": {"items": items}}]
    for container in pod_spec["containers"]:
        mounts = [m for m in container.get("volumeMounts") or [] if m.get("name") != WORLD_VOLUME]
        container["volumeMounts"] = [*mounts, {"name": WORLD_VOLUME, "mountPath": WORLD_MOUNT, "readOnly": True}]


def pinned_node(pod: dict[str, Any]) -> str:
    """The node a manifest made by pinned_pod is pinned to."""
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    return terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]


def training_pods(
    job: str,
    namespace: str,
    uid: str,
    spec: dict[str, Any],
    shape: GangShape,
    group_nodes: dict[int, list[str]],
    claims: dict[int, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Pod name -> manifest for every pod of the placed groups (group index -> node per pod);
    `claims`: group -> the ResourceClaimTemplate of its supernode's ComputeDomain; `annotations`:
    the world annotations the pods start with (the shape's size when None)."""
    owner = owner_reference("TrainingJob", job, uid)
    master = f"{pod_name(job, 0)}.{job}.{namespace}.svc"
    pods = {}
    for group, nodes in group_nodes.items():
        for i, node in enumerate(nodes):
            index = group * shape.pods_per_group + i
            rank = shape.rank_of(group, i)
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(shape.world_size),
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": str(shape.gpus_per_pod),
                "NODE_RANK": str(index),
                "MASTER_ADDR": master,
                "MASTER_PORT": str(MASTER_PORT),
                "TIDAL_JOB": job,
                "TIDAL_HBD_GROUP": str(group),
                **{f"TIDAL_{axis}_RANK": str(v) for axis, v in shape.parallel_ranks(rank).items()},
                **{f"TIDAL_{axis}": str(getattr(shape, axis.lower())) for axis in ("TP", "EP", "PP", "DP")},
            }
            name = pod_name(job, index)
            pods[name] = pinned_pod(
                spec.get("template") or {},
                name=name,
                namespace=namespace,
                node=node,
                accelerator=spec.get("accelerator", "nvidia.com/gpu"),
                gpus=shape.gpus_per_pod,
                pod_labels={labels.JOB: job, labels.HBD_GROUP: str(group), labels.RANK: str(rank)},
                owner=owner,
                env=env,
                subdomain=job,
                priority_class_name=spec.get("priorityClassName"),
                pod_annotations=annotations or world_annotations(shape),
            )
            mount_world_files(pods[name]["spec"])
            template = (claims or {}).get(group)
            if template:
                add_channel_claim(pods[name]["spec"], template)  # the first container holds the GPUs
    return pods


def compute_domain(
    namespace: str, owner_uid: str, job: str, domain: DomainPlan, kind: str = "TrainingJob"
) -> dict[str, Any]:
    """The NVIDIA ComputeDomain of one job on one supernode (or of one InferencePool replica,
    `kind`), owned by the job or pool (deleted with it).

    numNodes stays 0, as the driver recommends with its default IMEXDaemonsWithDNSNames: each
    pod is released once the IMEX daemon of its own node runs, so nothing waits for a count."""
    return {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {
            "name": domain.name,
            "namespace": namespace,
            "labels": {labels.POOL if kind == "InferencePool" else labels.JOB: job, labels.MANAGED_BY: "tidal"},
            # An annotation, not a label: a supernode's name may be longer than a label value.
            "annotations": {labels.SUPERNODE: domain.supernode},
            "ownerReferences": [owner_reference(kind, job, owner_uid)],
        },
        "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": domain.template}}},
    }


def headless_service(job: str, namespace: str, uid: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": job,
            "namespace": namespace,
            "labels": {labels.JOB: job, labels.MANAGED_BY: "tidal"},
            "ownerReferences": [owner_reference("TrainingJob", job, uid)],
        },
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {labels.JOB: job},
            "ports": [{"name": "rendezvous", "port": MASTER_PORT}],
        },
    }


# -- serving: the Service in front of an InferencePool's replicas ----------------------------------


def leader_selector(pool: str) -> dict[str, str]:
    """The leader pod of every replica of `pool`: one pod per replica, the one that takes requests.

    Leaders only, not every pod: a multi-pod replica (tp*ep > gpusPerPod) serves through its pod 0,
    and an HPA reading the scale subresource's selector counts each selected pod as one replica."""
    return {labels.POOL: pool, labels.ROLE: labels.LEADER}


def selector_string(selector: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector.items()))


def serving_ports(template: dict[str, Any]) -> list[dict[str, Any]]:
    """Service ports from the containers' declared ports (first declaration of a name or number wins)."""
    ports: list[dict[str, Any]] = []
    names: set[str] = set()
    numbers: set[tuple[int, str]] = set()
    for container in ((template or {}).get("spec") or {}).get("containers") or []:
        for p in container.get("ports") or []:
            number, protocol = p.get("containerPort"), p.get("protocol", "TCP")
            if not isinstance(number, int):
                continue
            # A Service with several ports needs a name on each; a container port's name is a valid one.
            name = p.get("name") or f"{protocol.lower()}-{number}"
            if name in names or (number, protocol) in numbers:
                continue
            names.add(name)
            numbers.add((number, protocol))
            ports.append({"name": name, "port": number, "targetPort": number, "protocol": protocol})
    return ports


def pool_service(pool: str, namespace: str, uid: str, template: dict[str, Any]) -> dict[str, Any] | None:
    """The pool's Service: its ready leader pods on the template's ports; None without ports."""
    ports = serving_ports(template)
    if not ports:
        return None  # nothing declared to route to (and a ClusterIP Service must have a port)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": pool,
            "namespace": namespace,
            "labels": {labels.POOL: pool, labels.MANAGED_BY: "tidal"},
            "ownerReferences": [owner_reference("InferencePool", pool, uid)],
        },
        "spec": {
            "selector": leader_selector(pool),
            "ports": ports,
            # Traffic only to leaders whose Ready condition is True (a starting or failing server gets none).
            "publishNotReadyAddresses": False,
        },
    }


_PORT_KEYS = ("name", "port", "targetPort", "protocol")


def service_update(current: dict[str, Any], desired: dict[str, Any]) -> dict[str, Any] | None:
    """The body to PUT to bring `current` (as read, controlled by the pool) to `desired` in the
    fields tidal owns (our labels, selector, ports, publishNotReadyAddresses), or None when nothing
    differs. Fields the API server or a user set (clusterIP, type, annotations...) are kept."""
    meta, spec = current.get("metadata") or {}, current.get("spec") or {}
    want_meta, want_spec = desired["metadata"], desired["spec"]
    have_ports = [{k: p.get(k) for k in _PORT_KEYS} for p in spec.get("ports") or []]
    want_ports = [{k: p.get(k) for k in _PORT_KEYS} for p in want_spec["ports"]]
    same = (
        all((meta.get("labels") or {}).get(k) == v for k, v in want_meta["labels"].items())
        and (spec.get("selector") or {}) == want_spec["selector"]
        and have_ports == want_ports
        and bool(spec.get("publishNotReadyAddresses")) == want_spec["publishNotReadyAddresses"]
    )
    if same:
        return None
    node_ports = {p.get("name"): p["nodePort"] for p in spec.get("ports") or [] if p.get("nodePort")}
    ports = [{**p, **({"nodePort": node_ports[p["name"]]} if p["name"] in node_ports else {})} for p in want_ports]
    return {
        **current,
        "metadata": {**meta, "labels": {**(meta.get("labels") or {}), **want_meta["labels"]}},
        "spec": {
            **spec,
            "selector": dict(want_spec["selector"]),
            "ports": ports,
            "publishNotReadyAddresses": want_spec["publishNotReadyAddresses"],
        },
    }


def controlled_by_owner(current: dict[str, Any], desired: dict[str, Any]) -> bool:
    """True if `current` is controlled by `desired`'s owner. A Service of that name made by a user
    or another controller (a TrainingJob's rendezvous Service, a pool deleted and made again
    before the garbage collector removed the old one's) is never taken over."""
    owner_uid = desired["metadata"]["ownerReferences"][0]["uid"]
    refs = (current.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("controller") and r.get("uid") == owner_uid for r in refs)
