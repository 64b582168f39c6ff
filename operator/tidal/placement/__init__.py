"""Pure gang placement: all-or-nothing, every HBD group inside one supernode, and preemption."""

from tidal.placement.first_fit import plan_best_fit, plan_constrained_first_fit, plan_first_fit, split_groups
from tidal.placement.gang import apply_plan, plan_gang, release_plan
from tidal.placement.preemption import Eviction, PreemptionPlan, RunningGang, plan_preemption
from tidal.placement.shape import GangShape
from tidal.placement.types import (
    GangRequest,
    GroupAssignment,
    Packing,
    PlacementPlan,
    Unplaceable,
    UnplaceableReason,
)

__all__ = [
    "Eviction",
    "GangRequest",
    "GangShape",
    "GroupAssignment",
    "Packing",
    "PlacementPlan",
    "PreemptionPlan",
    "RunningGang",
    "Unplaceable",
    "UnplaceableReason",
    "apply_plan",
    "plan_best_fit",
    "plan_constrained_first_fit",
    "plan_first_fit",
    "plan_gang",
    "plan_preemption",
    "release_plan",
    "split_groups",
]
