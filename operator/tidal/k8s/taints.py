"""Node taints and pod tolerations, matched as kube-scheduler and the taint manager match them.

Plain data only (no Kubernetes client types), so the placement code can ask "may this workload's
pods go there?" of the watched node views.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

NO_SCHEDULE = "NoSchedule"
NO_EXECUTE = "NoExecute"
BLOCKING_EFFECTS = frozenset({NO_SCHEDULE, NO_EXECUTE})
"""Effects that keep an untolerating pod off a node; PreferNoSchedule is only a preference."""

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
"""The non-graceful node shutdown taint: an admin's word that the node runs nothing any more."""


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True, slots=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    """Empty: every effect."""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if self.operator == "Exists":
            return not self.key or self.key == taint.key  # an empty key with Exists tolerates everything
        return self.key == taint.key and self.value == taint.value


NODE_LOST = (
    Taint("node.kubernetes.io/unreachable", "", NO_EXECUTE),
    Taint("node.kubernetes.io/not-ready", "", NO_EXECUTE),
)
"""What kube-controller-manager taints a NotReady node with; the taint manager evicts the pods
that do not tolerate them (by default after 300 s: the DefaultTolerationSeconds admission plugin)."""


def toleration(raw: dict[str, Any]) -> Toleration:
    """A pod spec's toleration, its tolerationSeconds aside."""
    return Toleration(
        str(raw.get("key") or ""),
        str(raw.get("operator") or "Equal"),
        str(raw.get("value") or ""),
        str(raw.get("effect") or ""),
    )


def taints_of(spec: dict[str, Any]) -> tuple[Taint, ...]:
    return tuple(
        Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
        for t in spec.get("taints") or []
        if t.get("key")
    )


def tolerations_of(template: dict[str, Any] | None) -> tuple[Toleration, ...]:
    """The tolerations of a pod template (`{"spec": {"tolerations": [...]}}`) as placement counts
    them: one with `tolerationSeconds` tolerates a NoExecute taint only for that long (the taint
    manager evicts the pod after it), so for placement it tolerates NoSchedule taints only."""
    spec = (template or {}).get("spec") or {}
    out = []
    for t in spec.get("tolerations") or []:
        parsed = toleration(t)
        if t.get("tolerationSeconds") is not None:
            if parsed.effect == NO_EXECUTE:
                continue
            parsed = dataclasses.replace(parsed, effect=parsed.effect or NO_SCHEDULE)
        out.append(parsed)
    return tuple(out)


def blocking(taints: Iterable[Taint]) -> tuple[Taint, ...]:
    return tuple(t for t in taints if t.effect in BLOCKING_EFFECTS)


def untolerated(taints: Iterable[Taint], tolerations: Iterable[Toleration]) -> tuple[Taint, ...]:
    """The NoSchedule/NoExecute taints no toleration matches: any one keeps the pod off the node."""
    tolerations = tuple(tolerations)
    return tuple(t for t in blocking(taints) if not any(tol.tolerates(t) for tol in tolerations))


def implied_tolerations(resources: Iterable[str]) -> tuple[Toleration, ...]:
    """What a pod requesting these extended resources tolerates without saying so: the API
    server's ExtendedResourceToleration plugin adds `<resource>:NoSchedule` (GKE taints GPU nodes
    `nvidia.com/gpu=present:NoSchedule` and relies on it), and tidal puts the same toleration on
    its own pods (manifests.pinned_pod), so it holds with or without the plugin."""
    return tuple(
        Toleration(r, "Exists", "", NO_SCHEDULE) for r in resources if "/" in r and not r.startswith("kubernetes.io/")
    )


def closed(taints: Iterable[Taint], capacity: Iterable[str]) -> tuple[Taint, ...]:
    """The taints that keep tidal's pods off a node unless their template tolerates them: the
    blocking ones, less those every tidal pod there tolerates (`capacity`: the node's resources)."""
    return untolerated(taints, implied_tolerations(capacity))


def out_of_service(taints: Iterable[Taint]) -> bool:
    return any(t.key == OUT_OF_SERVICE and t.effect in BLOCKING_EFFECTS for t in taints)
