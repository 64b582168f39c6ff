"""Pure day/night policy: how many inference replicas, and which training capacity gives way."""

from tidal.rebalance.capacity import CapacityPlan, plan_capacity
from tidal.rebalance.demand import DemandTracker, ScheduledPool, desired_replicas, schedule_floor, scheduled_rise_s

__all__ = [
    "CapacityPlan",
    "DemandTracker",
    "ScheduledPool",
    "desired_replicas",
    "plan_capacity",
    "schedule_floor",
    "scheduled_rise_s",
]
