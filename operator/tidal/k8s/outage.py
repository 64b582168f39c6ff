"""NotReady nodes: failed machines, or an outage of the control plane?

A node is NotReady when its kubelet's lease lapses. One or two nodes at a time are failed
machines: their gang groups are placed again at once. When most nodes lapse together (an API
server or etcd brownout, a partitioned control plane), the kubelets and the training keep
running, and restarting every gang would throw away each one's work since its last checkpoint
for nothing. kube-controller-manager's node lifecycle controller makes the same call for its
evictions: a zone is in partial disruption when more than 2 and at least
`--unhealthy-zone-threshold` (0.55) of its nodes are NotReady, in full disruption when none is
Ready, and a small zone then evicts nothing. tidal applies it to every node it watches: while it
holds, a NotReady node alone restarts no gang group (a deleted node, a failed or disrupted pod still
do, and nothing new is placed on a NotReady node). The hold lasts until the nodes are back, are
known down (below) or are deleted, with no time limit of its own: a pod deleted on an unreachable
node stays Terminating until the node is fenced, so releasing the groups earlier would place
nothing new and would only kill the work if the partition heals (the alert TidalOutageHold tells
an admin after 30 minutes). kube-controller-manager's taint manager would evict a pod once its
default 300 s toleration of an unreachable node ran out, which breaks the group; tidal's pods
tolerate a lost node without a time limit (manifests.pinned_pod), since tidal decides when they go.

Leases lapse over several seconds in an outage (each kubelet renewed at its own moment, and the
node monitor looks every few seconds), so the outage is not seen whole at once. Hence the grace:
while more than 2 nodes are NotReady, a node restarts its groups only once it has been NotReady
for `grace` (operator flag --not-ready-grace); with at most 2, at once, so a single failed machine
is recovered without delay. An outage, or any spike of more than 2, ends the same way, node by
node: after an outage, each node that comes back gives the ones not back yet a grace from then
(so a slow recovery restarts nothing while it progresses), and for a grace after more than 2
were last NotReady even the last one or two wait it.

The nodes counted are the Supernodes' members (GPU nodes, not the cluster's CPU or system nodes),
less those known to be down for repair: NotReady and cordoned, or tainted out-of-service by an
admin. Inference pools are left out of the hold: a serving replica keeps no training progress, and
its endpoints drop from the Service once its node is NotReady, so it is replaced as before.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Collection

from tidal.k8s.state import NodeView
from tidal.k8s.taints import out_of_service

UNHEALTHY_SHARE = 0.55
"""kube-controller-manager's default --unhealthy-zone-threshold."""
FEW = 2
"""At most this many NotReady nodes are failed machines (kube-controller-manager: more than 2)."""


def down_for_repair(node: NodeView) -> bool:
    """NotReady and cordoned or tainted out-of-service: an admin knows it is down."""
    return not node.ready and (node.unschedulable or out_of_service(node.taints))


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
        self.settling_until = dt.datetime.min.replace(tzinfo=dt.UTC)
        """Until then (a grace after more than 2 were last NotReady) every NotReady node waits the grace."""
        self.failed: frozenset[str] = frozenset()
        """NotReady nodes whose groups are placed again (none during an outage)."""
        self.recovering = False
        """An outage has ended and its nodes are still coming back."""
        self.last_count = 0
        self.last_back = dt.datetime.min.replace(tzinfo=dt.UTC)

    def update(self, not_ready: Collection[str], nodes: int, now: dt.datetime) -> frozenset[str]:
        """Bring the record to this cycle's NotReady nodes; returns the nodes that newly count as
        failed (their workloads must be reconciled though nothing about them changed)."""
        for name in [n for n in self.since if n not in not_ready]:
            del self.since[name]
        for name in not_ready:
            self.since.setdefault(name, now)
        was, self.mass = self.mass, mass_not_ready(len(not_ready), nodes)
        if was and not self.mass:
            self.recovering = True
        if self.recovering and (was or len(self.since) < self.last_count):
            # The outage ends as it began, over seconds: while nodes keep coming back, the ones not
            # back yet get a grace from now, rather than count as failed for being NotReady so long.
            self.since = dict.fromkeys(self.since, now)
            self.last_back = now
        elif self.recovering and now - self.last_back >= self.grace:
            self.recovering = False  # a grace with none back: those left are failed machines
        self.last_count = len(self.since)
        if was or self.mass or len(self.since) > FEW:
            # Crowded: until a grace after the last crowded cycle, even the last one or two NotReady
            # nodes (stragglers of a spike or an outage) wait the grace, not only while many are down.
            self.settling_until = now + self.grace
        if self.mass:
            failed: frozenset[str] = frozenset()
        elif len(self.since) <= FEW and now >= self.settling_until:
            failed = frozenset(self.since)
        else:
            failed = frozenset(n for n, t in self.since.items() if now - t >= self.grace)
        newly = failed - self.failed
        self.failed = failed
        return newly
