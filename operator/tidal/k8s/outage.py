"""NotReady nodes: failed machines, or an outage of the control plane?

A node is NotReady when its kubelet's lease lapses. One or two nodes at a time are failed
machines: their gang groups are placed again at once. When most nodes lapse together (an API
server or etcd brownout, a partitioned control plane), the kubelets and the training keep
running, and restarting every gang would throw away each one's work since its last checkpoint
for nothing. kube-controller-manager's node lifecycle controller makes the same call for its
evictions: a zone is in partial disruption when more than 2 and at least
`--unhealthy-zone-threshold` (0.55) of its nodes are NotReady, in full disruption when none is
Ready, and a small zone then evicts nothing. tidal applies it to every node it watches: while it
holds, a NotReady node alone restarts no group (a deleted node, a failed or disrupted pod still
do, and nothing new is placed on a NotReady node).

Leases lapse over several seconds in an outage (each kubelet renewed at its own moment, and the
node monitor looks every few seconds), so the outage is not seen whole at once. Hence the grace:
while more than 2 nodes are NotReady, a node restarts its groups only once it has been NotReady
for `grace` (operator flag --not-ready-grace); with at most 2, at once, so a single failed machine
is recovered without delay.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection

UNHEALTHY_SHARE = 0.55
"""kube-controller-manager's default --unhealthy-zone-threshold."""
FEW = 2
"""At most this many NotReady nodes are failed machines (kube-controller-manager: more than 2)."""


def mass_not_ready(not_ready: int, nodes: int) -> bool:
    """Whether `not_ready` of `nodes` NotReady at once reads as a control-plane outage."""
    if not_ready <= 0:
        return False
    return not_ready == nodes or (not_ready > FEW and not_ready / nodes >= UNHEALTHY_SHARE)


class NotReadyTracker:
    """When each NotReady node was first seen so (operator clock), and which count as failed."""

    def __init__(self, grace: dt.timedelta) -> None:
        self.grace = grace
        self.since: dict[str, dt.datetime] = {}
        self.mass = False
        self.failed: frozenset[str] = frozenset()
        """NotReady nodes whose groups are placed again (none during an outage)."""

    def update(self, not_ready: Collection[str], nodes: int, now: dt.datetime) -> frozenset[str]:
        """Bring the record to this cycle's NotReady nodes; returns the nodes that newly count as
        failed (their workloads must be reconciled though nothing about them changed)."""
        for name in [n for n in self.since if n not in not_ready]:
            del self.since[name]
        for name in not_ready:
            self.since.setdefault(name, now)
        self.mass = mass_not_ready(len(not_ready), nodes)
        if self.mass:
            failed: frozenset[str] = frozenset()
        elif len(self.since) <= FEW:
            failed = frozenset(self.since)
        else:
            failed = frozenset(n for n, t in self.since.items() if now - t >= self.grace)
        newly = failed - self.failed
        self.failed = failed
        return newly
