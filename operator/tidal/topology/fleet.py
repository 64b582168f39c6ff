"""Cluster shapes from plain numbers: NVL72 racks, CloudMatrix384-like domains, 8-GPU servers.

The same shapes feed the simulator, the benchmarks, the property tests and the KWOK cluster.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidal.topology.snapshot import ClusterSnapshot, NodeState, SupernodeState


@dataclass(frozen=True)
class SupernodeShape:
    kind: str
    nodes: int
    gpus_per_node: int
    accelerator: str
    supernodes_per_block: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


SHAPES: dict[str, SupernodeShape] = {
    # GB200 NVL72: 18 compute trays of 4 GPUs on one NVLink domain.
    "nvl72": SupernodeShape("nvl72", 18, 4, "nvidia.com/gpu", 16),
    # CloudMatrix384: 384 Ascend NPUs on the UB fabric, 48 servers of 8.
    "cm384": SupernodeShape("cm384", 48, 8, "huawei.com/Ascend910", 4),
    # HGX 8-GPU server: NVLink only inside the box, so each server is its own domain.
    "hgx8": SupernodeShape("hgx8", 1, 8, "nvidia.com/gpu", 32),
}


@dataclass(frozen=True)
class FleetNode:
    name: str
    supernode: str
    block: str
    gpus: int
    accelerator: str


@dataclass(frozen=True)
class FleetSupernode:
    name: str
    shape: SupernodeShape
    block: str
    nodes: tuple[FleetNode, ...]


def build_fleet(
    shape: str,
    supernodes: int,
    nodes_per_supernode: int | None = None,
    gpus_per_node: int | None = None,
    prefix: str | None = None,
) -> list[FleetSupernode]:
    """A homogeneous fleet, or with shape='mixed' a third of each shape (by supernode count)."""
    if shape == "mixed":
        fleet: list[FleetSupernode] = []
        kinds = list(SHAPES)
        for i, kind in enumerate(kinds):
            count = supernodes // len(kinds) + (1 if i < supernodes % len(kinds) else 0)
            fleet += build_fleet(kind, count, prefix=kind)
        return fleet
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of {[*SHAPES, 'mixed']}")
    base = SHAPES[shape]
    sn_shape = SupernodeShape(
        base.kind,
        nodes_per_supernode or base.nodes,
        gpus_per_node or base.gpus_per_node,
        base.accelerator,
        base.supernodes_per_block,
    )
    prefix = prefix or shape
    fleet = []
    for s in range(supernodes):
        sn_name = f"{prefix}-{s:04d}"
        block = f"{prefix}-block-{s // sn_shape.supernodes_per_block:03d}"
        nodes = tuple(
            FleetNode(f"{sn_name}-n{n:02d}", sn_name, block, sn_shape.gpus_per_node, sn_shape.accelerator)
            for n in range(sn_shape.nodes)
        )
        fleet.append(FleetSupernode(sn_name, sn_shape, block, nodes))
    return fleet


def fleet_for_gpus(shape: str, gpus: int) -> list[FleetSupernode]:
    """The smallest fleet of the shape with at least `gpus` accelerators."""
    if shape == "mixed":
        per_triple = sum(s.gpus for s in SHAPES.values())
        return build_fleet("mixed", 3 * -(-gpus // per_triple))
    return build_fleet(shape, -(-gpus // SHAPES[shape].gpus))


def snapshot_from_fleet(fleet: list[FleetSupernode]) -> ClusterSnapshot:
    snapshot = ClusterSnapshot(
        SupernodeState(sn.name, sn.shape.accelerator, [n.name for n in sn.nodes], sn.block) for sn in fleet
    )
    for sn in fleet:
        for n in sn.nodes:
            snapshot.add_node(NodeState(n.name, sn.name, n.gpus))
    return snapshot
