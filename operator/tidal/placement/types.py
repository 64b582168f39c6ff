"""Requests and results of gang placement."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import StrEnum


class Packing(StrEnum):
    """Which refusals a full cluster trades for which (operator flag --packing; README "Placement").

    No one rule refuses fewer jobs and fewer GPUs than best-fit in every regime (`bench.churn`
    regimes): keeping racks whole for domain-sized groups pays where jobs queue and costs small
    jobs where an arrival that does not fit is refused at once.
    """

    KEEP_WHOLE = "keep-whole"
    """Joining a partly used supernode with few residents costs (`gang.resident_cost`), so racks
    come back whole for domain-sized groups: for clusters whose jobs queue (TrainingJobs do)."""
    FILL = "fill"
    """Leftover for the demanded group sizes alone (no whole-domain worth, no resident cost): for
    clusters whose users resubmit rather than queue (fewer refused jobs there, more large ones)."""


@dataclass(frozen=True)
class GangRequest:
    """`groups` units of `group_gpus` GPUs; each unit must sit inside one supernode.

    A unit is one HBD group (tp*ep GPUs of one pipeline stage of one DP replica) or, when a
    pod holds several HBD groups, one pod.
    """

    name: str
    groups: int
    group_gpus: int
    gpus_per_pod: int
    accelerator: str = "nvidia.com/gpu"
    priority: int = 0
    recovery: bool = False
    """Recovery of failed groups may use hot-spare nodes; nothing else may."""
    prefer_supernodes: tuple[str, ...] = ()
    """Try these supernodes first, in order (e.g. the group's own supernode on recovery)."""
    resident_on: frozenset[str] = frozenset()
    """Supernodes the workload already holds (growth, recovery): joining them costs nothing,
    since it is a resident there already (`gang.resident_cost`)."""
    group_ids: tuple[int, ...] | None = None
    """The caller's ids of the groups, e.g. the broken groups being re-placed; default 0..groups-1."""
    packing: Packing = Packing.KEEP_WHOLE
    """How placement values leftovers: the operator's --packing, stamped on every request it
    builds (k8s/training.job_request, k8s/rebalancing._request), so every planner that places
    the request (plan_gang, preemption, defragmentation, plan_capacity) follows it."""

    def __post_init__(self) -> None:
        if self.groups < 1 or self.group_gpus < 1 or self.gpus_per_pod < 1:
            raise ValueError(f"{self.name}: groups, group_gpus and gpus_per_pod must be >= 1")
        if self.group_gpus % self.gpus_per_pod:
            raise ValueError(f"{self.name}: group_gpus {self.group_gpus} not a multiple of {self.gpus_per_pod}")
        if self.group_ids is not None and len(self.group_ids) != self.groups:
            raise ValueError(f"{self.name}: {len(self.group_ids)} group_ids for {self.groups} groups")

    @property
    def pods_per_group(self) -> int:
        return self.group_gpus // self.gpus_per_pod

    def group_id(self, index: int) -> int:
        return self.group_ids[index] if self.group_ids is not None else index

    @property
    def total_gpus(self) -> int:
        return self.groups * self.group_gpus


@dataclass(frozen=True)
class GroupAssignment:
    group: int
    supernode: str
    nodes: tuple[str, ...]
    """The node of each pod of the group, in pod order."""


@dataclass(frozen=True)
class PlacementPlan:
    request: GangRequest
    groups: tuple[GroupAssignment, ...]

    def gpus_by_node(self) -> Counter[str]:
        per_node: Counter[str] = Counter()
        for g in self.groups:
            for node in g.nodes:
                per_node[node] += self.request.gpus_per_pod
        return per_node

    def pods(self) -> Iterator[tuple[int, int, str]]:
        """(group, pod index within group, node) for every pod."""
        for g in self.groups:
            for i, node in enumerate(g.nodes):
                yield g.group, i, node

    @property
    def supernodes(self) -> set[str]:
        return {g.supernode for g in self.groups}


class UnplaceableReason(StrEnum):
    NO_MATCHING_SUPERNODES = "NoMatchingSupernodes"
    POD_LARGER_THAN_NODES = "PodLargerThanNodes"
    GROUP_LARGER_THAN_SUPERNODES = "GroupLargerThanSupernodes"
    LARGER_THAN_CLUSTER = "LargerThanCluster"
    INSUFFICIENT_FREE_CAPACITY = "InsufficientFreeCapacity"


@dataclass(frozen=True)
class Unplaceable:
    request: GangRequest
    reason: UnplaceableReason
    message: str
    groups_fitting_now: int = 0
    supernodes_fitting_now: int = 0
    details: dict[str, int] = field(default_factory=dict)

    @property
    def permanent(self) -> bool:
        """True when even an empty, fully healthy cluster could not hold the request."""
        return self.reason is not UnplaceableReason.INSUFFICIENT_FREE_CAPACITY
