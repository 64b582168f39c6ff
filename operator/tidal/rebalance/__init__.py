"""Pure day/night policy: how many inference replicas, and which training capacity gives way."""

from tidal.rebalance.capacity import CapacityPlan, plan_capacity
from tidal.rebalance.demand import DemandTracker, desired_replicas, schedule_floor

__all__ = ["CapacityPlan", "DemandTracker", "desired_replicas", "plan_capacity", "schedule_floor"]
