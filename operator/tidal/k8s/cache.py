"""Turn the watched objects into the pure core's ClusterSnapshot.

Supernode membership comes from each Supernode's node selector; GPUs held by tidal workloads come
from their recorded placements (written before any pod is created, so a restarted operator sees
them at once), GPUs held by anything else from bound pods' requests.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from tidal.k8s import labels
from tidal.k8s.state import ClusterState, NodeView
from tidal.k8s.taints import closed
from tidal.topology.snapshot import ClusterSnapshot, NodeState, SupernodeState


@dataclass(frozen=True)
class Membership:
    supernode: str
    accelerator: str
    nodes: tuple[str, ...]
    block: str | None
    spine: str | None
    zone: str | None
    spares: frozenset[str]


def _selects(selector: dict[str, str], node: NodeView) -> bool:
    return all(node.labels.get(k) == v for k, v in selector.items())


def memberships(state: ClusterState, default_label: str = labels.SUPERNODE) -> dict[str, Membership]:
    """Supernode -> members; a node claimed by two Supernodes belongs to the first by name.

    Checks every node against every selector: the reference the incremental label index
    (`k8s/watch.py`) is tested against, and the "old code path" of `bench.cycle`.
    """
    claimed: set[str] = set()
    result: dict[str, Membership] = {}
    for name in sorted(state.supernodes):
        sn = state.supernodes[name]
        if sn.deleting:
            continue
        selector = sn.spec.get("nodeSelector") or {default_label: name}
        members = tuple(sorted(n.name for n in state.nodes.values() if n.name not in claimed and _selects(selector, n)))
        claimed.update(members)
        result[name] = membership_of(name, sn.spec, members, state.nodes)
    return result


def membership_of(name: str, spec: dict, members: tuple[str, ...], nodes: dict[str, NodeView]) -> Membership:
    topology = spec.get("topology") or {}
    node_blocks = Counter(nodes[m].labels.get(labels.BLOCK) for m in members)
    node_blocks.pop(None, None)
    block = topology.get("block") or (node_blocks.most_common(1)[0][0] if node_blocks else None)
    return Membership(
        supernode=name,
        accelerator=spec.get("accelerator", "nvidia.com/gpu"),
        nodes=members,
        block=block,
        spine=topology.get("spine"),
        zone=topology.get("zone"),
        spares=_spares(spec.get("spares") or {}, members, nodes),
    )


def _spares(policy: dict, members: tuple[str, ...], nodes: dict[str, NodeView]) -> frozenset[str]:
    explicit = [n for n in policy.get("nodes") or [] if n in members]
    labelled = [n for n in members if nodes[n].labels.get(labels.SPARE) == "true"]
    chosen = list(dict.fromkeys(explicit + labelled))
    count = int(policy.get("count") or 0)
    if len(chosen) < count:
        # Highest-named healthy members: a stable choice that does not move as load changes.
        healthy = [n for n in reversed(members) if nodes[n].ready and n not in chosen]
        chosen += healthy[: count - len(chosen)]
    return frozenset(chosen)


def supernode_states(members: dict[str, Membership]) -> Iterator[SupernodeState]:
    """The snapshot's supernodes, from membership (the full scan's and the watch cache's alike)."""
    for m in members.values():
        yield SupernodeState(m.supernode, m.accelerator, list(m.nodes), m.block, m.spine, m.zone)


def node_states(members: dict[str, Membership], nodes: dict[str, NodeView]) -> Iterator[tuple[NodeState, str]]:
    """(the snapshot's node with nothing held, the accelerator it is counted in) for every member."""
    for m in members.values():
        for name in m.nodes:
            node = nodes[name]
            state = NodeState(
                name=name,
                supernode=m.supernode,
                gpus=node.capacity.get(m.accelerator, 0),
                ready=node.ready,
                cordoned=node.unschedulable,
                spare=name in m.spares,
                tainted=bool(closed(node.taints, node.capacity)),
            )
            yield state, m.accelerator


def build_snapshot(
    state: ClusterState, members: dict[str, Membership], tidal_allocations: Iterable[tuple[str, int]]
) -> ClusterSnapshot:
    snapshot = ClusterSnapshot(supernode_states(members))
    accelerator_of: dict[str, str] = {}
    for node_state, accelerator in node_states(members, state.nodes):
        accelerator_of[node_state.name] = accelerator
        snapshot.add_node(node_state)
    held: Counter[str] = Counter()
    for pod in state.pods.values():
        if pod.owner is None and pod.bound and pod.active and pod.node in accelerator_of:
            held[pod.node] += pod.requests.get(accelerator_of[pod.node], 0)
    for node, gpus in tidal_allocations:
        if node in accelerator_of:
            held[node] += gpus
    for node, gpus in held.items():
        # Recorded as held even beyond capacity, so over-booking shows up instead of being hidden.
        snapshot.update_node(node, allocated=gpus)
    return snapshot


def overbooked_gpus(snapshot: ClusterSnapshot) -> int:
    return sum(max(n.allocated - n.gpus, 0) for n in snapshot.nodes.values())
