"""Cluster topology: nodes, supernodes and their free accelerators, as plain data."""

from tidal.topology.fleet import SHAPES, build_fleet, fleet_for_gpus, snapshot_from_fleet
from tidal.topology.snapshot import ClusterSnapshot, NodeState, OverbookedError, SupernodeState

__all__ = [
    "SHAPES",
    "ClusterSnapshot",
    "NodeState",
    "OverbookedError",
    "SupernodeState",
    "build_fleet",
    "fleet_for_gpus",
    "snapshot_from_fleet",
]
