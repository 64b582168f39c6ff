"""Priorities of TrainingJobs and InferencePools from Kubernetes PriorityClasses.

A free integer in the spec let any namespace outrank (and preempt) any other tenant's preemptible
work. Priorities therefore come from `spec.priorityClassName`, as pods' do: the cluster admin
creates the PriorityClasses and can limit who uses which (a ResourceQuota with a
`priorityClass` scope selector, or an admission policy), and tidal reads their values from the
API. Without a class name a workload gets the value of the globalDefault PriorityClass, or 0,
again as pods do. The integer `spec.priority` is deprecated: ignored unless the operator runs
with `--spec-priority` (a cluster whose tenants all trust each other).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from tidal.k8s.state import ResourceView

UNKNOWN_PRIORITY_CLASS = "UnknownPriorityClass"
"""Schedulable=False reason of a workload naming a PriorityClass that does not exist."""
HIGHEST_USER_PRIORITY = 1_000_000_000
"""PriorityClass values above this are Kubernetes' system range (system-cluster-critical,
system-node-critical exist in every cluster and no quota limits them by default)."""
SPEC_PRIORITY_DEFAULTS = {"TrainingJob": 0, "InferencePool": 1000}
"""What `spec.priority` defaulted to per kind (used only with --spec-priority)."""


@dataclass(frozen=True)
class PriorityClassView:
    name: str
    value: int
    global_default: bool


def priority_class_view(body: dict[str, Any]) -> PriorityClassView:
    return PriorityClassView(
        name=body.get("metadata", {})["name"],
        value=int(body.get("value") or 0),
        global_default=bool(body.get("globalDefault")),
    )


@dataclass
class Priorities:
    """Resolves a workload's priority; `version` moves whenever any PriorityClass changed."""

    classes: Mapping[str, PriorityClassView] = field(default_factory=dict)
    spec_priority: bool = False
    """Honour the deprecated integer spec.priority of workloads without a class name."""
    version: int = 0

    def default(self) -> int:
        """The globalDefault class's value (the highest if several claim it, as the API server's
        Priority admission picks), else 0."""
        return max((c.value for c in self.classes.values() if c.global_default), default=0)

    def class_name(self, view: ResourceView) -> str | None:
        """The PriorityClass the API server gives the workload's pods: its own, else the
        globalDefault class's name (the highest value, as the Priority admission plugin picks),
        else none. ResourceQuotas scoped by PriorityClass count the pods under that name."""
        name = view.spec.get("priorityClassName")
        if name:
            return name
        defaults = [c for c in self.classes.values() if c.global_default]
        return max(defaults, key=lambda c: (c.value, c.name)).name if defaults else None

    def of(self, view: ResourceView) -> int:
        name = view.spec.get("priorityClassName")
        if name:
            found = self.classes.get(name)
            # A class deleted under a placed workload: it is treated like one without a class.
            return found.value if found is not None else self.default()
        if self.spec_priority:
            return int(view.spec.get("priority", SPEC_PRIORITY_DEFAULTS.get(view.kind, 0)))
        return self.default()

    def problem(self, view: ResourceView) -> str | None:
        """Why the workload may not be admitted yet (its pods would be refused by the API server)."""
        name = view.spec.get("priorityClassName")
        if name and name not in self.classes:
            return f"spec.priorityClassName: PriorityClass {name!r} not found"
        if name and self.classes[name].value > HIGHEST_USER_PRIORITY:
            # Any tenant could name it and outrank (preempt) every workload in the cluster.
            return (
                f"spec.priorityClassName: PriorityClass {name!r} is in the system range "
                f"(value > {HIGHEST_USER_PRIORITY:,}), reserved for cluster components"
            )
        return None
