"""The watch side: what the operator knows about the cluster, kept up to date event by event.

`WatchCache` holds the watched objects (the same plain views as `ClusterState`) plus indices that
watch events update in O(1) each:

- a node label index (label -> value -> node names), from which Supernode membership is derived
  only when a node's labels, readiness or existence or a Supernode changed (never per cycle);
- pods by owner (per-job pod views), the pod uids alive, and GPUs held by non-tidal pods per node;
- `dirty_owners` / `dirty_nodes`: what changed since the last cycle, so a cycle reconciles only
  the workloads whose pods, nodes or objects moved.

`SnapshotKeeper` keeps one `ClusterSnapshot` alive across cycles and updates it in place: node
capacity and health from the watch, GPUs held from each workload's recorded placement (diffed per
workload, only when its status object changed). A cycle mutates the snapshot as it admits and
releases (the journal notes which nodes); the next cycle puts exactly those nodes back to the
truth before it starts. `capacity_version` moves whenever any node's free GPUs go up, so a queued
job that did not fit need not be tried again until it moves (the Kueue "inadmissible until the
cluster changes" rule).

Events are fed from kopf handlers on the event loop and, for pods and nodes, from the informers'
threads (k8s/informer.py) (`feed`: an append), and applied by the cycle thread (`drain`), so neither
waits for a cycle and the cycle never sees a half-applied change. A listing (`resync`: every kind,
or one informer's kind alone) is queued like an event, never applied where it is made: whichever cycle drains it
brings those tables to it and then applies only their events fed after it, so no event is lost
when that cycle is skipped or late.
"""

from __future__ import annotations

import collections
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tidal.k8s import labels
from tidal.k8s.cache import Membership, membership_of, node_states, supernode_states
from tidal.k8s.priority import PriorityClassView
from tidal.k8s.quota import QuotaView
from tidal.k8s.state import ClusterState, NodeView, PodView, ResourceView, runs_nothing
from tidal.k8s.taints import closed
from tidal.topology.snapshot import ClusterSnapshot, NodeState, SupernodeState

OwnerKey = tuple[str, str | None, str]
_LISTING: Any = object()  # the kind of a queued full listing
_FORGET: Any = object()  # the kind of a queued phantom (an object a fresh LIST no longer has)
TABLES = {
    "node": "nodes",
    "pod": "pods",
    "supernode": "supernodes",
    "job": "jobs",
    "pool": "pools",
    "priorityclass": "priority_classes",
    "quota": "quotas",
}
"""Each kind the cache holds, and its table (the same attribute on WatchCache and ClusterState)."""


DELETED_REMEMBERED = 10_000
"""Pod deletions remembered by name: more than one cycle's worth at any churn."""


@dataclass(frozen=True)
class Deleted:
    """A pod's deletion as watched: its final view (`WatchCache.feed`)."""

    last: PodView


def _tells_a_drain(pod: PodView) -> bool:
    """A TrainingJob pod's last view worth keeping once it is gone (`WatchCache.departed`)."""
    return bool(pod.disruption) and pod.owner is not None and pod.owner[0] == "TrainingJob"


class WatchCache:
    """ClusterState's interface (nodes, pods, supernodes, jobs, pools, pods_of) kept incrementally."""

    def __init__(self, supernode_label: str = labels.SUPERNODE):
        self.supernode_label = supernode_label
        self.nodes: dict[str, NodeView] = {}
        self.pods: dict[tuple[str, str], PodView] = {}
        self.supernodes: dict[str, ResourceView] = {}
        self.jobs: dict[tuple[str | None, str], ResourceView] = {}
        self.pools: dict[tuple[str | None, str], ResourceView] = {}
        self.priority_classes: dict[str, PriorityClassView] = {}
        self.priority_version = 0
        """Moves whenever a PriorityClass changed: queued jobs are tried again (one may now exist)."""
        self.quotas: dict[tuple[str, str], QuotaView] = {}
        self.quota_version = 0
        """Moves whenever a ResourceQuota changed: jobs waiting for quota are tried again."""
        self._label_index: dict[str, dict[str, set[str]]] = {}
        self._by_owner: dict[OwnerKey, dict[str, PodView]] = {}
        self._by_owner_uid: dict[str, dict[tuple[str, str], PodView]] = {}
        """Controlling workload uid -> its pods, for pods that outlive their workload."""
        self.pod_uids: set[str] = set()
        self._deleted_uids: collections.OrderedDict[tuple[str, str], str] = collections.OrderedDict()
        """Pod name -> uid of the last pod deleted under it (`_delete_pod`), the latest few thousand."""
        self._tidal_bound_on: dict[str, dict[tuple[str, str], PodView]] = {}
        """Node -> the bound pods of tidal workloads there (`pods_on_lost_nodes`)."""
        self.departed: dict[tuple[str, str], PodView] = {}
        """(namespace, name) -> the last view (the DELETED event's final state) of a deleted
        TrainingJob pod marked DisruptionTarget, until a pod of that name comes again or its job is
        gone (`forget_departed`): why a pod of a running gang vanished (a drain marks it before the
        delete; a crash leaves it Failed)."""
        self.other_held: dict[str, Counter[str]] = {}
        """Node -> accelerators held by bound, active pods tidal does not own."""
        self.tainted: set[str] = set()
        """Nodes with a NoSchedule or NoExecute taint: what a tolerating workload may get back."""
        self.not_ready: set[str] = set()
        """Nodes whose Ready condition is not True (the mass-outage guard counts them: cycle.py)."""
        self.dirty_owners: set[OwnerKey] = set()
        self.dirty_nodes: set[str] = set()
        self._members: dict[str, Membership] | None = None
        self._last_members: dict[str, Membership] | None = None
        self.membership_version = 0
        self._events: collections.deque[tuple[Any, Any, Any]] = collections.deque()
        self._gone: dict[tuple[str, Any], Any] = {}
        """(kind, key) -> the view of an object found deleted behind the watch's back (`forget`)."""
        self.deleted_jobs: list[ResourceView] = []
        """Final views of TrainingJobs gone from the cache since the controller last took them
        (their disruption records move to the ledger: k8s/disruption_ledger.py)."""

    # -- feeding (any thread) and draining (the cycle's thread) ---------------------------
    def feed(self, kind: str, key: Any, view: Any) -> None:
        """Record a watch event: `view` is the new object, None when it was deleted (or a pod is
        no longer one the cache holds), or for a pod `Deleted(final view)`: the deletion removes
        that pod (uid) only, never a successor under its name (a rank made again at once), and
        its final state is what tells a drain from a crash (`departed`)."""
        self._events.append((kind, key, view))

    def resync(self, state: ClusterState, kinds: Iterable[str] = TABLES) -> None:
        """Queue a full listing of `kinds` (every kind by default). The drain that reaches it brings
        those tables to it by difference and drops their events queued before it (each is already
        in the listing, or older than what it holds: events must be fed only after the listing's
        source has them, see k8s/handlers.py); other kinds' events keep their order."""
        self._events.append((_LISTING, frozenset(kinds), state))

    def forget(self, phantoms: Iterable[tuple[str, Any, Any]]) -> None:
        """Queue (kind, key, view) of objects a fresh LIST no longer has though the watch never
        said they were deleted (kopf lists again after a 410 Gone or a peering pause, and keeps
        what the new list lacks in its indices). Each is dropped where the cache still holds that
        very view, and kept out of every later listing copied from those indices; a new object
        under the same key comes with a new view, and stays."""
        for kind, key, view in phantoms:
            self._events.append((_FORGET, (kind, key), view))

    def known_gone(self, kind: str, key: Any, view: Any) -> bool:
        """True when this very object was already forgotten (kopf's index keeps it for good)."""
        return self._gone.get((kind, key)) is view

    @property
    def queued(self) -> int:
        return len(self._events)

    def drain(self) -> int:
        """Apply what was queued when the drain began (in order); returns the events applied."""
        batch = [self._events.popleft() for _ in range(len(self._events))]
        latest: dict[str, int] = {}  # kind -> the position of its last listing in the batch
        for i, (kind, key, view) in enumerate(batch):
            if kind is _FORGET:  # wherever it was queued: a listing after it must not bring it back
                self._gone[key] = view
            elif kind is _LISTING:
                latest.update(dict.fromkeys(key, i))
        applied = 0
        finals: dict[tuple[str, str], PodView] = {}
        for i, (kind, key, view) in enumerate(batch):
            if kind is _LISTING:
                kinds = {k for k in key if latest[k] == i}
                if kinds:
                    self.sync(view, kinds)
                continue
            if i < latest.get(key[0] if kind is _FORGET else kind, -1):
                if isinstance(view, Deleted):  # the listing lacks the pod: its final state is this
                    finals[key] = view.last
                continue  # superseded by a later listing of its kind
            applied += 1
            if kind is not _FORGET:
                self.apply(kind, key, view)
            elif getattr(self, TABLES[key[0]]).get(key[1]) == view:  # an equal update keeps the cache's older object
                self.apply(key[0], key[1], None)
        for key, last in finals.items():
            if key not in self.pods and _tells_a_drain(last):
                self.departed[key] = last  # not the older view the cache held when the listing removed it
        return applied

    def apply(self, kind: str, key: Any, view: Any) -> None:
        if kind == "node":
            self._put_node(key, view)
        elif kind == "pod":
            if isinstance(view, Deleted):
                self._delete_pod(key, view.last)
            else:
                self._upsert_pod(key, view)
        elif kind == "supernode":
            self._put_resource(self.supernodes, key, view, members=True)
        elif kind == "job":
            gone = self.jobs.get(key)
            if gone is not None and (view is None or view.uid != gone.uid):  # deleted, or made anew while unwatched
                self.deleted_jobs.append(gone)
            self._put_resource(self.jobs, key, view)
        elif kind == "pool":
            self._put_resource(self.pools, key, view)
        elif kind == "quota":
            if self.quotas.get(key) != view:
                self.quota_version += 1
            if view is None:
                self.quotas.pop(key, None)
            else:
                self.quotas[key] = view
        elif kind == "priorityclass":
            if self.priority_classes.get(key) != view:
                self.priority_version += 1
            if view is None:
                self.priority_classes.pop(key, None)
            else:
                self.priority_classes[key] = view
        else:
            raise ValueError(f"unknown kind {kind}")

    def sync(self, state: ClusterState, kinds: Iterable[str] = TABLES) -> None:
        """Bring the cache's tables of `kinds` to `state` (a full listing), applying only the
        differences; objects known to be gone (`forget`) are not in it, whatever the listing says."""
        for kind in kinds:
            table = TABLES[kind]
            mine, theirs = getattr(self, table), getattr(state, table)
            gone = {k: v for (gone_kind, k), v in self._gone.items() if gone_kind == kind}
            if gone:
                for key, view in gone.items():
                    if theirs.get(key) is not view:  # a new object under that key, or none left
                        del self._gone[(kind, key)]
                theirs = {k: v for k, v in theirs.items() if k not in gone or gone[k] is not v}
            for key in [k for k in mine if k not in theirs]:
                self.apply(kind, key, None)
            for key, view in theirs.items():
                old = mine.get(key)
                if old is not view and old != view:
                    self.apply(kind, key, view)

    # -- nodes ----------------------------------------------------------------------------
    def _put_node(self, name: str, view: NodeView | None) -> None:
        old = self.nodes.get(name)
        if view is not None and old == view:
            return
        self.dirty_nodes.add(name)
        if old is not None:
            for k, v in old.labels.items():
                if view is None or view.labels.get(k) != v:
                    values = self._label_index.get(k, {})
                    values.get(v, set()).discard(name)
        if view is not None and closed(view.taints, view.capacity):
            self.tainted.add(name)
        else:
            self.tainted.discard(name)
        if view is not None and not view.ready:
            self.not_ready.add(name)
        else:
            self.not_ready.discard(name)
        if view is None:
            self.nodes.pop(name, None)
            self._members = None
            return
        for k, v in view.labels.items():
            if old is None or old.labels.get(k) != v:
                self._label_index.setdefault(k, {}).setdefault(v, set()).add(name)
        self.nodes[name] = view
        if old is None or self._moves_membership(old, view):
            self._members = None  # membership (or the spare choice) may move

    def _moves_membership(self, old: NodeView, new: NodeView) -> bool:
        """Only labels some selector (or the block/spare rules) reads, or readiness when a
        Supernode chooses spares by count; a label nobody selects on changes nothing."""
        if old.ready != new.ready and any(
            (sn.spec.get("spares") or {}).get("count") for sn in self.supernodes.values()
        ):
            return True
        if old.labels == new.labels:
            return False
        changed = {k for k in old.labels.keys() | new.labels.keys() if old.labels.get(k) != new.labels.get(k)}
        keys = {self.supernode_label, labels.BLOCK, labels.SPARE}
        for sn in self.supernodes.values():
            keys.update((sn.spec.get("nodeSelector") or {}).keys())
        return bool(changed & keys)

    def nodes_with(self, selector: dict[str, str]) -> set[str]:
        """Nodes carrying every label of the selector, from the index (no scan)."""
        sets = []
        for k, v in selector.items():
            found = self._label_index.get(k, {}).get(v)
            if not found:
                return set()
            sets.append(found)
        if not sets:
            return set(self.nodes)
        sets.sort(key=len)
        return set(sets[0]).intersection(*sets[1:])

    # -- pods -----------------------------------------------------------------------------
    def _delete_pod(self, key: tuple[str, str], last: PodView) -> None:
        """A watched deletion: ignored where another pod (uid) holds the name now; its uid is
        remembered so that a late update of it does not bring it back."""
        self._forget_uid(key, last.uid)
        held = self.pods.get(key)
        if held is not None and held.uid != last.uid:
            return
        self._put_pod(key, last)  # its final state first: a drain's condition and deletionTimestamp (`departed`)
        self._put_pod(key, None)

    def _upsert_pod(self, key: tuple[str, str], view: PodView | None) -> None:
        if view is not None and self._deleted_uids.get(key) == view.uid:
            return  # an update of a pod already deleted, handled after its deletion
        held = self.pods.get(key)
        if view is not None and held is not None and held.uid != view.uid:
            # A name holds one pod at a time and is free only once its pod is gone, so a live pod
            # is newer than any terminating one of its name: this is an old pod's late update.
            if view.terminating and not held.terminating:
                self._forget_uid(key, view.uid)
                return
            self._forget_uid(key, held.uid)  # replaced: its own late events must not come back
        self._put_pod(key, view)

    def _forget_uid(self, key: tuple[str, str], uid: str) -> None:
        self._deleted_uids[key] = uid
        self._deleted_uids.move_to_end(key)
        while len(self._deleted_uids) > DELETED_REMEMBERED:
            self._deleted_uids.popitem(last=False)

    def _put_pod(self, key: tuple[str, str], view: PodView | None) -> None:
        old = self.pods.get(key)
        if view is not None and old == view:
            return
        if old is not None:
            self._index_pod(old, -1)
        if view is None:
            self.pods.pop(key, None)
            # Only what tells it from a crash: kept for every deleted pod, it would grow with churn.
            if old is not None and _tells_a_drain(old):
                self.departed[key] = old
        else:
            self.departed.pop(key, None)
            self.pods[key] = view
            self._index_pod(view, +1)

    def forget_departed(self, live_owner_uids: set[str]) -> None:
        """Drop the last views of pods whose workload is gone (no pod of that name will be asked about)."""
        for key in [k for k, v in self.departed.items() if v.owner_uid not in live_owner_uids]:
            del self.departed[key]

    def _index_pod(self, pod: PodView, sign: int) -> None:
        if pod.owner is not None:
            owner = (pod.owner[0], pod.namespace, pod.owner[1])
            self.dirty_owners.add(owner)
            pods = self._by_owner.setdefault(owner, {})
            if sign > 0:
                pods[pod.name] = pod
            else:
                pods.pop(pod.name, None)
                if not pods:
                    del self._by_owner[owner]
        if pod.owner is not None:
            by_uid = self._by_owner_uid.setdefault(pod.owner_uid, {})
            if sign > 0:
                by_uid[(pod.namespace, pod.name)] = pod
            else:
                by_uid.pop((pod.namespace, pod.name), None)
                if not by_uid:
                    del self._by_owner_uid[pod.owner_uid]
        if sign > 0:
            self.pod_uids.add(pod.uid)
        else:
            self.pod_uids.discard(pod.uid)
        if pod.owner is not None and pod.bound and pod.node:
            on_node = self._tidal_bound_on.setdefault(pod.node, {})
            if sign > 0:
                on_node[pod.key] = pod
            else:
                on_node.pop(pod.key, None)
                if not on_node:
                    del self._tidal_bound_on[pod.node]
        if pod.owner is None and pod.bound and pod.active and pod.node:
            held = self.other_held.setdefault(pod.node, Counter())
            for resource, n in pod.requests.items():
                held[resource] += sign * n
            self.dirty_nodes.add(pod.node)

    def pods_of(self, kind: str, namespace: str | None, name: str) -> list[PodView]:
        return list(self._by_owner.get((kind, namespace, name), {}).values())

    def pods_on_lost_nodes(self) -> list[PodView]:
        """As ClusterState.pods_on_lost_nodes, from the index: the nodes holding tidal pods that
        are gone, and the NotReady ones fenced (a cycle's cost is one set difference)."""
        lost = self._tidal_bound_on.keys() - self.nodes.keys()
        lost.update(n for n in self.not_ready if n in self._tidal_bound_on and runs_nothing(self.nodes.get(n)))
        return [pod for node in sorted(lost) for pod in self._tidal_bound_on[node].values()]

    def owner_uids(self) -> list[str]:
        """uids of the workloads that control a pod in the cache (live or gone)."""
        return list(self._by_owner_uid)

    def pods_of_owner_uid(self, uid: str) -> list[PodView]:
        return list(self._by_owner_uid.get(uid, {}).values())

    def pods_by_name(self, kind: str, namespace: str | None, name: str) -> dict[str, PodView]:
        return dict(self._by_owner.get((kind, namespace, name), {}))

    # -- tidal resources ------------------------------------------------------------------
    def _put_resource(self, store: dict, key: Any, view: ResourceView | None, members: bool = False) -> None:
        old = store.get(key)
        if view is None:
            if store.pop(key, None) is not None and members:
                self._members = None
            return
        store[key] = view
        if members and (old is None or old.spec != view.spec or old.deleting != view.deleting):
            self._members = None

    # -- membership -----------------------------------------------------------------------
    def memberships(self) -> dict[str, Membership]:
        """Supernode -> members from the label index; recomputed only after a relevant change."""
        if self._members is None:
            claimed: set[str] = set()
            result: dict[str, Membership] = {}
            for name in sorted(self.supernodes):
                sn = self.supernodes[name]
                if sn.deleting:
                    continue
                selector = sn.spec.get("nodeSelector") or {self.supernode_label: name}
                members = tuple(sorted(self.nodes_with(selector) - claimed))
                claimed.update(members)
                result[name] = membership_of(name, sn.spec, members, self.nodes)
            if result != self._last_members:  # recomputed to the same answer: the snapshot stays
                self.membership_version += 1
            self._members = self._last_members = result
        return self._members

    def invalidate_memberships(self) -> None:
        """Recompute membership at the next call, as a new answer (the snapshot is rebuilt)."""
        self._members = self._last_members = None

    def take_dirty(self) -> tuple[set[OwnerKey], set[str]]:
        owners, nodes = self.dirty_owners, self.dirty_nodes
        self.dirty_owners, self.dirty_nodes = set(), set()
        return owners, nodes


class JournaledSnapshot(ClusterSnapshot):
    """A ClusterSnapshot that notes which nodes a cycle changed and whether free GPUs went up."""

    def __init__(self, supernodes: Iterable[SupernodeState] = (), nodes: Iterable[NodeState] = ()):
        self.touched: set[str] = set()
        """Nodes this cycle changed (admissions, releases, reservations)."""
        self.refreshed: set[str] = set()
        """Nodes put back to the truth at the start of this cycle."""
        self.rebuilt = True
        """Built from scratch for this cycle (every node is new)."""
        self.capacity_version = 0
        self.mutations = 0
        super().__init__(supernodes, nodes)

    def update_node(self, name: str, **changes: object) -> None:
        node = self.nodes[name]
        before = node.free
        super().update_node(name, **changes)
        self.mutations += 1
        self.touched.add(name)
        if node.free > before:
            self.capacity_version += 1

    def set_truth(self, name: str, **changes: object) -> None:
        ClusterSnapshot.update_node(self, name, **changes)


class SnapshotKeeper:
    """One long-lived snapshot: rebuilt only when membership changes, otherwise patched in place."""

    def __init__(self) -> None:
        self.snapshot: JournaledSnapshot | None = None
        self._membership_version = -1
        self._accelerator_of: dict[str, str] = {}
        self._spares: dict[str, frozenset[str]] = {}
        self.tidal_held: Counter[str] = Counter()
        """Node -> GPUs booked by tidal placements (from statuses)."""
        self._allocs: dict[str, tuple[Any, dict[str, int]]] = {}
        """Workload uid -> (the status object it was computed from, node -> GPUs)."""
        self.uids_on_node: dict[str, set[str]] = {}
        self.domain_held: Counter[str] = Counter()
        """Node -> workloads holding it whole for a ComputeDomain (it counts as fully allocated)."""
        self._truth_free: dict[str, int] = {}
        self._stale: set[str] = set()
        self.capacity_version = 0
        self.rebuilds = 0
        self._whole: dict[str, frozenset[str]] = {}
        """Workload uid -> the nodes it holds whole (see set_allocations)."""
        self.residents: Counter[str] = Counter()
        """Supernode -> workloads with GPUs booked there (placement's `resident_cost` reads it)."""
        self._resident_on: dict[str, frozenset[str]] = {}
        self._residents_stale: set[str] = set()

    # -- bookings from statuses -----------------------------------------------------------
    def set_allocations(
        self,
        uid: str,
        source: Any,
        allocations: Iterable[tuple[str, int]],
        whole: Callable[[], Iterable[str]] = tuple,
    ) -> bool:
        """Book a workload's GPUs; `source` (its status object) skips the work when unchanged.
        `whole`: the nodes it holds whole (a ComputeDomain of its own runs there; asked only when
        the status changed). Returns True if its nodes grew (a new potential preemption victim)."""
        old = self._allocs.get(uid)
        if old is not None and old[0] is source:
            return False
        per_node: Counter[str] = Counter()
        for node, gpus in allocations:
            per_node[node] += gpus
        held = frozenset(whole()) if per_node else frozenset()
        before = old[1] if old else {}
        held_before = self._whole.get(uid, frozenset())
        if before == per_node and held_before == held:
            self._allocs[uid] = (source, before)
            return False
        for node, gpus in before.items():
            self.tidal_held[node] -= gpus
            self.uids_on_node.get(node, set()).discard(uid)
            self._stale.add(node)
        for node in held_before:
            self.domain_held[node] -= 1
            self._stale.add(node)
        for node, gpus in per_node.items():
            self.tidal_held[node] += gpus
            self.uids_on_node.setdefault(node, set()).add(uid)
            self._stale.add(node)
        for node in held:
            self.domain_held[node] += 1
            self._stale.add(node)
        self._allocs[uid] = (source, dict(per_node))
        self._residents_stale.add(uid)
        if held:
            self._whole[uid] = held
        else:
            self._whole.pop(uid, None)
        return any(per_node.get(n, 0) > before.get(n, 0) for n in per_node)

    def forget(self, live: set[str]) -> None:
        for uid in [u for u in self._allocs if u not in live]:
            self.set_allocations(uid, None, ())
            del self._allocs[uid]

    def jobs_on(self, nodes: Iterable[str]) -> set[str]:
        out: set[str] = set()
        for node in nodes:
            out |= self.uids_on_node.get(node, set())
        return out

    # -- the snapshot ---------------------------------------------------------------------
    def refresh(self, cache: WatchCache, dirty_nodes: set[str]) -> JournaledSnapshot:
        """The snapshot for this cycle: last cycle's scratch changes undone, watch changes in."""
        members = cache.memberships()
        if self.snapshot is None or cache.membership_version != self._membership_version:
            self._rebuild(cache, members)
            self._count_residents(self.snapshot, everyone=True)
            return self.snapshot
        snap = self.snapshot
        stale = self._stale | snap.touched | dirty_nodes
        self._stale = set()
        snap.touched = set()
        snap.refreshed = stale
        snap.rebuilt = False
        for name in stale:
            state = snap.nodes.get(name)
            if state is None:
                continue
            node = cache.nodes.get(name)
            if node is None:  # gone: the next membership change drops it; hold it unusable till then
                snap.set_truth(name, ready=False)
            else:
                acc = self._accelerator_of[name]
                snap.set_truth(
                    name,
                    gpus=node.capacity.get(acc, 0),
                    ready=node.ready,
                    cordoned=node.unschedulable,
                    tainted=bool(closed(node.taints, node.capacity)),
                    spare=name in self._spares.get(state.supernode, ()),
                    allocated=self._held(name),
                )
            if state.free > self._truth_free.get(name, 0):
                self.capacity_version += 1
            self._truth_free[name] = state.free
        snap.capacity_version = self.capacity_version
        self._count_residents(snap)
        return snap

    def _count_residents(self, snap: JournaledSnapshot, everyone: bool = False) -> None:
        """Supernodes per workload from its bookings, recounted only for workloads whose bookings
        changed (all of them when membership moved); the cycle gets its own copy to add to."""
        if everyone:
            self.residents.clear()
            self._resident_on.clear()
            stale: Iterable[str] = list(self._allocs)
        else:
            stale = self._residents_stale
        for uid in stale:
            for supernode in self._resident_on.pop(uid, ()):
                self.residents[supernode] -= 1
                if not self.residents[supernode]:
                    del self.residents[supernode]
            booked = self._allocs.get(uid)
            on = frozenset(snap.nodes[n].supernode for n in (booked[1] if booked else ()) if n in snap.nodes)
            if on:
                self._resident_on[uid] = on
                self.residents.update(on)
        self._residents_stale = set()
        snap.residents = Counter(self.residents)

    def end_cycle(self) -> None:
        """Free GPUs that went up inside the cycle (releases) count as capacity for the queue."""
        if self.snapshot is not None:
            self.capacity_version = max(self.capacity_version, self.snapshot.capacity_version)

    def _held(self, name: str) -> int:
        acc = self._accelerator_of.get(name, "")
        held = self.tidal_held.get(name, 0) + self._other(name, acc)
        if self.domain_held.get(name, 0) > 0:
            # A ComputeDomain's node serves no other domain: nothing else may be placed there.
            # max(): a node also holding someone else's pods is not reported as over-booked.
            node = self._cache.nodes.get(name)
            capacity = node.capacity.get(acc, 0) if node is not None else 0
            held = max(held, capacity)
        return held

    def _other(self, name: str, acc: str) -> int:
        held = self._cache.other_held.get(name)
        return held.get(acc, 0) if held else 0

    def _rebuild(self, cache: WatchCache, members: dict[str, Membership]) -> None:
        self._cache = cache
        snap = JournaledSnapshot(supernode_states(members))
        self._accelerator_of = {}
        self._spares = {m.supernode: m.spares for m in members.values()}
        for node_state, accelerator in node_states(members, cache.nodes):
            self._accelerator_of[node_state.name] = accelerator
            snap.add_node(node_state)
        for name in snap.nodes:
            held = self._held(name)
            if held:
                # Recorded as held even beyond capacity, so over-booking shows up instead of hiding.
                snap.set_truth(name, allocated=held)
        old_free = self._truth_free
        self._truth_free = {name: n.free for name, n in snap.nodes.items()}
        if any(free > old_free.get(name, 0) for name, free in self._truth_free.items()):
            self.capacity_version += 1
        snap.capacity_version = self.capacity_version
        self._stale = set()
        self.snapshot = snap
        self._membership_version = cache.membership_version
        self.rebuilds += 1

    _cache: WatchCache
