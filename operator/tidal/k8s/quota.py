"""Per-namespace GPU quotas: standard ResourceQuotas on `requests.<accelerator>`, checked at admission.

The API server enforces a ResourceQuota on `requests.nvidia.com/gpu` itself, but pod by pod: a gang
whose pods exceed it would be half-created (some pods made, the rest refused, the GPUs booked). So
tidal checks the whole gang against every quota of its namespace *before* it books GPUs or makes a
pod, and a job that does not fit stays Pending (Schedulable=False, reason QuotaExceeded) with the
quota and the numbers named. No tidal-specific object: the admin writes the same ResourceQuota that
also caps the namespace's non-tidal GPU pods.

Usage is tidal's own ledger, not only the quota's status.used: GPUs booked by the namespace's
placed workloads (before their pods exist), plus its other active GPU pods, and at least what the
API server last counted (status.used, which includes pods still terminating). Each count is kept by
PriorityClass, so a quota scoped to classes sums only what its scope selects, as the API server does.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tidal.k8s.state import ResourceView, _quantity

if TYPE_CHECKING:
    from tidal.k8s.cycle import Hold

QUOTA_EXCEEDED = "QuotaExceeded"
REQUESTS = "requests."

_NOT_OURS = frozenset({"BestEffort", "Terminating", "CrossNamespacePodAffinity"})
"""Quota scopes tidal's pods never fall in (they request GPUs, have no activeDeadlineSeconds
unless the template sets one, and tidal adds no cross-namespace affinity)."""


@dataclass(frozen=True)
class QuotaView:
    namespace: str
    name: str
    hard: dict[str, int]
    """Extended-resource request limits only: requests.<domain>/<name> -> count."""
    used: dict[str, int]
    scopes: tuple[str, ...] = ()
    priority_classes: tuple[str, tuple[str, ...]] | None = None
    """A PriorityClass scopeSelector: (operator, values)."""


def quota_view(body: dict[str, Any]) -> QuotaView:
    meta, spec, status = body.get("metadata", {}), body.get("spec", {}), body.get("status", {})

    def extended(counts: dict[str, Any] | None) -> dict[str, int]:
        return {k: _quantity(v) for k, v in (counts or {}).items() if k.startswith(REQUESTS) and "/" in k}

    selector = None
    for expr in (spec.get("scopeSelector") or {}).get("matchExpressions") or []:
        if expr.get("scopeName") == "PriorityClass":
            selector = (expr.get("operator", "In"), tuple(expr.get("values") or ()))
    return QuotaView(
        namespace=meta.get("namespace", ""),
        name=meta["name"],
        hard=extended(spec.get("hard")),
        used=extended(status.get("used")),
        scopes=tuple(spec.get("scopes") or ()),
        priority_classes=selector,
    )


def applies(quota: QuotaView, priority_class: str | None) -> bool:
    """Whether the quota counts a pod of this class (tidal's pods carry the workload's class)."""
    if any(s in _NOT_OURS for s in quota.scopes):
        return False
    if quota.priority_classes is None:
        return True
    op, values = quota.priority_classes
    if op == "In":
        return priority_class in values
    if op == "NotIn":
        return priority_class not in values
    if op == "Exists":
        return priority_class is not None
    if op == "DoesNotExist":
        return priority_class is None
    return True


def _named_class(view: ResourceView) -> str | None:
    """The class the workload names (Priorities.class_name also resolves the globalDefault)."""
    return view.spec.get("priorityClassName") or None


Counts = dict[tuple[str, str], Counter[str | None]]
"""(namespace, requests.<accelerator>) -> GPUs by the PriorityClass named by the workload or pod
holding them (None: none named): a quota scoped to classes counts only theirs, as the API server
does (its status.used is already scoped)."""


@dataclass
class Quotas:
    """The namespaces' quotas and GPUs in use, booked into as the cycle admits."""

    quotas: dict[str, list[QuotaView]] = field(default_factory=dict)
    """Namespace -> its quotas that limit some extended resource."""
    used: Counts = field(default_factory=dict)
    """GPUs booked or held when the cycle began."""
    booked: Counts = field(default_factory=dict)
    """GPUs admitted by this cycle: added on top of whichever count is higher, the ledger or the
    quota's own status.used (which may count terminating pods), so two admissions in one cycle
    never both fit into the same room."""
    version: int = 0
    held: dict[str, tuple[int, tuple[str, str], int, str | None]] = field(default_factory=dict)
    """Holder uid -> (priority, (namespace, requests.<accelerator>), GPUs, PriorityClass): last
    cycle's quota shares of workloads waiting for their victims, counted for every workload whose
    priority is not above the holder's until the holder is planned again (`release_hold`). The
    share has no placement yet, so the ledger rebuilt from placements does not count it."""
    rooms: dict[str, tuple[int, tuple[str, str], int, str | None]] = field(default_factory=dict)
    """Mover uid -> (priority, (namespace, requests.<accelerator>), GPUs, PriorityClass): the quota
    shares of defragmentation rooms taken later in this cycle (`keep_room_share`)."""
    priority_of: Callable[[ResourceView], int] = lambda view: 0
    class_of: Callable[[ResourceView], str | None] = _named_class
    """The PriorityClass a workload's pods get (`Priorities.class_name`: a workload without one gets
    the globalDefault class's name from the API server, and scoped quotas count it there)."""

    @classmethod
    def build(
        cls,
        quotas: Iterable[QuotaView],
        held: Iterable[tuple[str, str, int, str | None]],
        version: int = 0,
        class_of: Callable[[ResourceView], str | None] | None = None,
    ) -> Quotas:
        """`held`: (namespace, accelerator, GPUs, PriorityClass) of every booking and foreign GPU pod."""
        by_ns: dict[str, list[QuotaView]] = {}
        for q in quotas:
            if q.hard:
                by_ns.setdefault(q.namespace, []).append(q)
        used: Counts = {}
        for namespace, accelerator, gpus, priority_class in held:
            if namespace in by_ns:
                used.setdefault((namespace, REQUESTS + accelerator), Counter())[priority_class] += gpus
        return cls(by_ns, used, version=version, class_of=class_of or _named_class)

    def carry(self, holds: Mapping[str, Hold], priority_of: Callable[[ResourceView], int]) -> None:
        """Count last cycle's holds (`Cycle.held_before`) in quota-limited namespaces."""
        self.priority_of = priority_of
        self.held = {
            uid: (h.priority, (h.namespace, REQUESTS + h.accelerator), h.gpus, h.priority_class)
            for uid, h in holds.items()
            if h.gpus and self.limited(h.namespace)
        }

    def release_hold(self, uid: str) -> None:
        self.held.pop(uid, None)

    def limited(self, namespace: str | None) -> bool:
        return bool(self.quotas.get(namespace or ""))

    def problem(self, view: ResourceView, gpus: int) -> str | None:
        """Why `gpus` more for this workload would exceed a quota of its namespace, or None."""
        namespace = view.namespace or ""
        key = REQUESTS + view.spec.get("accelerator", "nvidia.com/gpu")
        for q in self.quotas.get(namespace, ()):
            if key not in q.hard or not applies(q, self.class_of(view)):
                continue
            used = self._in_use(namespace, key, q, view)
            if used + gpus > q.hard[key]:
                return (
                    f"ResourceQuota {namespace}/{q.name}: {key} {used} of {q.hard[key]} in use, "
                    f"{max(q.hard[key] - used, 0)} left; this needs {gpus}"
                )
        return None

    def room(self, view: ResourceView) -> int | None:
        """GPUs this workload may still take in its namespace (None: no quota limits it)."""
        namespace = view.namespace or ""
        key = REQUESTS + view.spec.get("accelerator", "nvidia.com/gpu")
        left = None
        for q in self.quotas.get(namespace, ()):
            if key in q.hard and applies(q, self.class_of(view)):
                free = max(q.hard[key] - self._in_use(namespace, key, q, view), 0)
                left = free if left is None else min(left, free)
        return left

    def shortfall(
        self,
        view: ResourceView,
        gpus: int,
        leaving: Counter[str | None] | None = None,
        departed: Counter[str | None] | None = None,
    ) -> tuple[int, Callable[[ResourceView], bool]]:
        """For preemption inside the namespace: by how many GPUs `gpus` more for `view` would
        still exceed its quotas (the largest excess; 0 when none would), and whether another
        workload's GPUs count under every quota that is short (only freeing those helps).
        `leaving`: GPUs of evictions under way for `view` (still booked), by PriorityClass.
        `departed`: GPUs that left for it lately, by class; a quota's own status.used may still
        count them (their pods terminate after the placement is dropped, and the quota controller
        lags), so they count as gone up to what status.used counts beyond tidal's own bookings.
        Each quota subtracts only the classes its scope counts. No floor at 0 on what is left: a
        quota lowered below its use is short by all of it."""
        namespace = view.namespace or ""
        key = REQUESTS + view.spec.get("accelerator", "nvidia.com/gpu")
        worst, short = 0, []
        for q in self.quotas.get(namespace, ()):
            if key not in q.hard or not applies(q, self.class_of(view)):
                continue
            counted_here, reported, _ = self._counts(namespace, key, q, view)
            gone = min(_scoped(departed, q), max(reported - counted_here, 0))
            in_use = self._in_use(namespace, key, q, view)
            over = in_use - gone - _scoped(leaving, q) + gpus - q.hard[key]
            if over > 0:
                worst = max(worst, over)
                short.append(q)

        def counted(other: ResourceView) -> bool:
            return (
                (other.namespace or "") == namespace
                and REQUESTS + other.spec.get("accelerator", "nvidia.com/gpu") == key
                and all(applies(q, self.class_of(other)) for q in short)
            )

        return worst, counted

    def keep_room_share(self, view: ResourceView, priority: int, gpus: int) -> None:
        """A defragmentation mover whose eviction ended this cycle takes its room later in it:
        `gpus` of its namespace's quota are kept for it from every workload it does not rank
        below, until `release_room`. Counted with tidal's bookings, inside the max with the
        quota's status.used, which still counts the mover's terminating pods: never twice."""
        if gpus and self.limited(view.namespace):
            key = REQUESTS + view.spec.get("accelerator", "nvidia.com/gpu")
            self.rooms[view.uid] = (priority, (view.namespace or "", key), gpus, self.class_of(view))

    def release_room(self, uid: str) -> None:
        self.rooms.pop(uid, None)

    def _counts(self, namespace: str, key: str, q: QuotaView, view: ResourceView) -> tuple[int, int, int]:
        """(tidal's bookings with the room shares `view` does not outrank and its own, the
        quota's status.used, `view`'s own room share), as `q` counts them."""
        where = (namespace, key)
        priority = self.priority_of(view)
        own = others = 0
        for uid, (p, k, g, c) in self.rooms.items():
            if k != where or not applies(q, c):
                continue
            if uid == view.uid:
                own += g
            elif p >= priority:
                others += g
        return _scoped(self.used.get(where), q) + others + own, q.used.get(key, 0), own

    def _in_use(self, namespace: str, key: str, q: QuotaView, view: ResourceView) -> int:
        counted, reported, own = self._counts(namespace, key, q, view)
        where = (namespace, key)
        return max(counted, reported) - own + _scoped(self.booked.get(where), q) + self._held_for(where, q, view)

    def _held_for(self, where: tuple[str, str], q: QuotaView, view: ResourceView) -> int:
        """Carried holds of others `view` does not outrank (a holder keeps its share from equals too)."""
        shares = [(p, g) for uid, (p, k, g, c) in self.held.items() if k == where and uid != view.uid and applies(q, c)]
        if not shares:
            return 0
        priority = self.priority_of(view)
        return sum(g for p, g in shares if p >= priority)

    def book(self, view: ResourceView, gpus: int) -> None:
        if self.limited(view.namespace):
            where = (view.namespace or "", REQUESTS + view.spec.get("accelerator", "nvidia.com/gpu"))
            self.booked.setdefault(where, Counter())[self.class_of(view)] += gpus


def _scoped(counts: Counter[str | None] | None, q: QuotaView) -> int:
    """The GPUs of `counts` that the quota's scope selects."""
    return sum(n for priority_class, n in counts.items() if applies(q, priority_class)) if counts else 0
