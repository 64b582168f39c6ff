"""Node taints and pod tolerations, matched as kube-scheduler and the taint manager match them.

Plain data only (no Kubernetes client types), so the placement code can ask "may this workload's
pods go there?" of the watched node views.
"""

from __future__ import annotations

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


def taints_of(spec: dict[str, Any]) -> tuple[Taint, ...]:
    return tuple(
        Taint(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
        for t in spec.get("taints") or []
        if t.get("key")
    )


def tolerations_of(template: dict[str, Any] | None) -> tuple[Toleration, ...]:
    """The tolerations of a pod template (`{"spec": {"tolerations": [...]}}`)."""
    spec = (template or {}).get("spec") or {}
    return tuple(
        Toleration(
            str(t.get("key") or ""),
            str(t.get("operator") or "Equal"),
            str(t.get("value") or ""),
            str(t.get("effect") or ""),
        )
        for t in spec.get("tolerations") or []
    )


def blocking(taints: Iterable[Taint]) -> tuple[Taint, ...]:
    return tuple(t for t in taints if t.effect in BLOCKING_EFFECTS)


def untolerated(taints: Iterable[Taint], tolerations: Iterable[Toleration]) -> tuple[Taint, ...]:
    """The NoSchedule/NoExecute taints no toleration matches: any one keeps the pod off the node."""
    tolerations = tuple(tolerations)
    return tuple(t for t in blocking(taints) if not any(tol.tolerates(t) for tol in tolerations))


def out_of_service(taints: Iterable[Taint]) -> bool:
    return any(t.key == OUT_OF_SERVICE and t.effect in BLOCKING_EFFECTS for t in taints)
