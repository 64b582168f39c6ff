"""A point-in-time view of the cluster's accelerators, free of any Kubernetes types.

The operator builds it from informer caches, the simulator and benchmarks from plain data.
Per-supernode histograms of free GPUs per node are kept incrementally, so the placement engine
can count how many pods of a given size a supernode holds without walking its nodes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field


@dataclass(slots=True)
class NodeState:
    name: str
    supernode: str
    gpus: int
    allocated: int = 0
    ready: bool = True
    cordoned: bool = False
    spare: bool = False
    tainted: bool = False
    """Carries a taint that keeps pods off (NoSchedule, NoExecute): usable only by a workload that
    tolerates it, for which the caller lifts the flag while planning that workload."""

    @property
    def usable(self) -> bool:
        return self.ready and not self.cordoned and not self.tainted

    @property
    def free(self) -> int:
        """Unrequested GPUs on a usable node; a failed, cordoned or tainted node offers nothing."""
        if not self.ready or self.cordoned or self.tainted:
            return 0
        free = self.gpus - self.allocated
        return free if free > 0 else 0


@dataclass(slots=True)
class SupernodeState:
    name: str
    accelerator: str = "nvidia.com/gpu"
    nodes: list[str] = field(default_factory=list)
    block: str | None = None
    spine: str | None = None
    zone: str | None = None


class OverbookedError(ValueError):
    """An allocation would exceed a node's free GPUs."""


class ClusterSnapshot:
    def __init__(self, supernodes: Iterable[SupernodeState] = (), nodes: Iterable[NodeState] = ()):
        self.supernodes: dict[str, SupernodeState] = {}
        self.nodes: dict[str, NodeState] = {}
        # supernode -> Counter(free GPUs per node -> node count), for usable non-spare / spare nodes
        self._free_hist: dict[str, Counter[int]] = {}
        self._spare_hist: dict[str, Counter[int]] = {}
        # Free GPUs per supernode (usable, non-spare nodes), kept with the histograms: a quick
        # test before counting pod slots.
        self._free_total: dict[str, int] = {}
        # accelerator -> free GPUs -> supernodes with exactly that many: the planners visit only
        # supernodes that can hold a group, which at ~99% allocation is a small share of 25,000.
        self._free_buckets: dict[str, dict[int, set[str]]] = {}
        # "What fits an empty cluster", per request shape; valid while shape_version holds. Kept on
        # the snapshot so no other snapshot can ever read it (an id() key could be reused).
        self.empty_cluster_cache: dict[tuple, tuple[int, int, int]] = {}
        self._domain_cache: dict[tuple, int] = {}
        # Bumped when capacity (not allocation) changes; caches of "what fits an empty cluster" use it.
        self.shape_version = 0
        # Supernode -> workloads with GPUs booked there, as the snapshot's owner reports them (the
        # operator from placements, a benchmark from its running jobs); absent means none known.
        self.residents: Counter[str] = Counter()
        # Supernode -> nodes added before it (attached when it is added).
        self._unattached: dict[str, list[str]] = {}
        for sn in supernodes:
            self.add_supernode(sn)
        for node in nodes:
            self.add_node(node)

    # -- building -------------------------------------------------------------------------
    def add_supernode(self, sn: SupernodeState) -> None:
        if sn.name in self.supernodes:
            raise ValueError(f"duplicate supernode {sn.name}")
        members = list(sn.nodes)
        sn.nodes = []
        self.supernodes[sn.name] = sn
        self._free_hist[sn.name] = Counter()
        self._spare_hist[sn.name] = Counter()
        self._free_total[sn.name] = 0
        self._bucket(sn.name, 0, +1)
        self.shape_version += 1
        for name in members:
            node = self.nodes.get(name)
            if node is not None and node.supernode != sn.name:
                raise ValueError(f"supernode {sn.name} lists node {name}, which belongs to {node.supernode}")
        # Nodes added before their supernode join it, listed or not, as add_node would have them:
        # a node left out would still be counted by later updates, and the counts would drift.
        listed = set(members)
        waiting = [self.nodes[n] for n in self._unattached.pop(sn.name, []) if n not in listed]
        for node in [*(self.nodes[m] for m in members if m in self.nodes), *waiting]:
            self._attach(node)

    def add_node(self, node: NodeState) -> None:
        if node.name in self.nodes:
            raise ValueError(f"duplicate node {node.name}")
        if node.allocated < 0:
            raise ValueError(f"node {node.name}: negative allocation")
        self.nodes[node.name] = node
        if node.supernode in self.supernodes:
            self._attach(node)
        else:
            self._unattached.setdefault(node.supernode, []).append(node.name)

    def _attach(self, node: NodeState) -> None:
        self.shape_version += 1
        sn = self.supernodes[node.supernode]
        if node.name not in sn.nodes:
            sn.nodes.append(node.name)
        self._hist_add(node, +1)

    def _hist_add(self, node: NodeState, delta: int) -> None:
        hist = self._spare_hist if node.spare else self._free_hist
        if node.supernode not in hist:
            return
        counter = hist[node.supernode]
        free = node.free
        counter[free] += delta
        if counter[free] == 0:
            del counter[free]
        if not node.spare and free:
            before = self._free_total[node.supernode]
            self._bucket(node.supernode, before, -1)
            self._free_total[node.supernode] = before + delta * free
            self._bucket(node.supernode, before + delta * free, +1)

    def _bucket(self, supernode: str, free: int, delta: int) -> None:
        buckets = self._free_buckets.setdefault(self.supernodes[supernode].accelerator, {})
        if delta > 0:
            buckets.setdefault(free, set()).add(supernode)
        else:
            members = buckets[free]
            members.discard(supernode)
            if not members:
                del buckets[free]

    def update_node(self, name: str, **changes: object) -> None:
        """Change ready/cordoned/tainted/spare/gpus/allocated of a node, keeping the histograms right."""
        node = self.nodes[name]
        self._hist_add(node, -1)
        for key, value in changes.items():
            setattr(node, key, value)
        self._hist_add(node, +1)
        if "gpus" in changes or "spare" in changes:
            self.shape_version += 1

    # -- allocation -----------------------------------------------------------------------
    def allocate(self, name: str, gpus: int) -> None:
        node = self.nodes[name]
        if gpus > node.free:
            raise OverbookedError(f"node {name}: {gpus} GPUs requested, {node.free} free")
        self.update_node(name, allocated=node.allocated + gpus)

    def release(self, name: str, gpus: int) -> None:
        node = self.nodes.get(name)
        if node is None:
            return  # a node that vanished took its allocation with it
        self.update_node(name, allocated=max(node.allocated - gpus, 0))

    def add_residents(self, supernodes: Iterable[str], delta: int = 1) -> None:
        """A workload arrived on (delta 1) or left (-1) these supernodes; placement reads the count."""
        for name in set(supernodes):
            self.residents[name] += delta
            if self.residents[name] <= 0:
                del self.residents[name]

    def copy(self) -> ClusterSnapshot:
        clone = ClusterSnapshot.__new__(ClusterSnapshot)
        clone.supernodes = {
            k: SupernodeState(v.name, v.accelerator, list(v.nodes), v.block, v.spine, v.zone)
            for k, v in self.supernodes.items()
        }
        clone.nodes = {
            k: NodeState(v.name, v.supernode, v.gpus, v.allocated, v.ready, v.cordoned, v.spare, v.tainted)
            for k, v in self.nodes.items()
        }
        clone._free_hist = {k: Counter(v) for k, v in self._free_hist.items()}
        clone._spare_hist = {k: Counter(v) for k, v in self._spare_hist.items()}
        clone._free_total = dict(self._free_total)
        clone._free_buckets = {a: {f: set(m) for f, m in b.items()} for a, b in self._free_buckets.items()}
        clone.empty_cluster_cache = dict(self.empty_cluster_cache)
        clone._domain_cache = dict(self._domain_cache)
        clone.shape_version = self.shape_version
        clone.residents = Counter(self.residents)
        clone._unattached = {k: list(v) for k, v in self._unattached.items()}
        return clone

    # -- queries --------------------------------------------------------------------------
    def pod_slots(self, supernode: str, gpus_per_pod: int, include_spares: bool = False) -> int:
        """How many pods of gpus_per_pod fit in the supernode's free GPUs (pods never span nodes)."""
        # Plain loops, not sum() over a generator: called per supernode by every planner, twice as fast.
        slots = 0
        for free, n in self._free_hist[supernode].items():
            slots += n * (free // gpus_per_pod)
        if include_spares:
            for free, n in self._spare_hist[supernode].items():
                slots += n * (free // gpus_per_pod)
        return slots

    def supernodes_with_free(self, accelerator: str, at_least: int) -> list[str]:
        """Supernodes of the accelerator with >= at_least free non-spare GPUs, without a full scan."""
        buckets = self._free_buckets.get(accelerator, {})
        return [name for free, members in buckets.items() if free >= at_least for name in members]

    def domain_gpus(self, supernode: str) -> int:
        """GPUs of the supernode's non-spare nodes: its free count when whole and healthy."""
        key = ("domain", supernode, self.shape_version)
        cached = self._domain_cache.get(key)
        if cached is None:
            if len(self._domain_cache) > 100_000:
                self._domain_cache.clear()
            cached = self._domain_cache[key] = sum(n.gpus for n in self.member_nodes(supernode) if not n.spare)
        return cached

    def accelerators(self) -> set[str]:
        return set(self._free_buckets)

    def member_nodes(self, supernode: str) -> Iterator[NodeState]:
        for name in self.supernodes[supernode].nodes:
            yield self.nodes[name]

    def supernode_totals(self, supernode: str) -> SupernodeTotals:
        total = allocated = free = failed = spare = 0
        for node in self.member_nodes(supernode):
            total += node.gpus
            allocated += min(node.allocated, node.gpus)
            if not node.ready:
                failed += node.gpus
            elif node.spare:
                spare += node.gpus
            else:
                free += node.free
        return SupernodeTotals(total, allocated, free, failed, spare)

    def largest_free_slice(self, supernode: str) -> int:
        """Free GPUs one HBD group could use: every free GPU of a supernode shares its scale-up fabric."""
        return self._free_total[supernode]

    def total_gpus(self) -> int:
        return sum(n.gpus for n in self.nodes.values())

    def allocated_gpus(self) -> int:
        return sum(n.allocated for n in self.nodes.values())

    def free_gpus(self) -> int:
        return sum(self._free_total.values())

    def free_gpus_of(self, accelerator: str) -> int:
        """Free non-spare GPUs of the accelerator's supernodes, from the buckets (no node scan)."""
        return sum(free * len(members) for free, members in self._free_buckets.get(accelerator, {}).items())


@dataclass(frozen=True, slots=True)
class SupernodeTotals:
    total: int
    allocated: int
    free: int
    failed: int
    spare: int
