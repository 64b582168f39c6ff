"""Hypothesis strategies: random mixed fleets with random load and health, random gang requests."""

from __future__ import annotations

from hypothesis import strategies as st

from tidal.placement import GangRequest
from tidal.topology import ClusterSnapshot, build_fleet, snapshot_from_fleet


@st.composite
def snapshots(draw) -> ClusterSnapshot:
    fleet = (
        build_fleet("nvl72", draw(st.integers(0, 5)), nodes_per_supernode=draw(st.sampled_from([4, 18])))
        + build_fleet("cm384", draw(st.integers(0, 2)), nodes_per_supernode=draw(st.sampled_from([6, 48])))
        + build_fleet("hgx8", draw(st.integers(0, 6)))
    )
    if not fleet:
        fleet = build_fleet("hgx8", 1)
    snap = snapshot_from_fleet(fleet)
    for name, node in snap.nodes.items():
        state = draw(st.sampled_from(["free", "free", "partial", "full", "failed", "cordoned", "spare"]))
        if state == "partial":
            snap.allocate(name, draw(st.integers(1, node.gpus)))
        elif state == "full":
            snap.allocate(name, node.gpus)
        elif state == "failed":
            snap.update_node(name, ready=False)
        elif state == "cordoned":
            snap.update_node(name, cordoned=True)
        elif state == "spare":
            snap.update_node(name, spare=True)
    return snap


@st.composite
def requests(draw, snap: ClusterSnapshot, name: str = "req") -> GangRequest:
    accelerator = draw(st.sampled_from(sorted({s.accelerator for s in snap.supernodes.values()})))
    gpp = draw(st.sampled_from([1, 2, 4, 8]))
    pods_per_group = draw(st.sampled_from([1, 2, 4, 8, 16, 18]))
    return GangRequest(
        name,
        groups=draw(st.integers(1, 12)),
        group_gpus=gpp * pods_per_group,
        gpus_per_pod=gpp,
        accelerator=accelerator,
        priority=draw(st.integers(0, 10)),
        recovery=draw(st.booleans()),
    )
