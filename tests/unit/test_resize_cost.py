"""The resize cost model (tidal.rebalance.resize_cost) and plan_capacity weighing it: a Restart
shrink stalls the whole job, a Live one only its survivors' rebuild, a suspension the whole job's
save and reload; the planner takes the cheaper way, never suspending a higher priority for it."""

from dataclasses import replace

from tidal.placement import GangRequest
from tidal.rebalance import plan_capacity
from tidal.rebalance.resize_cost import ResizeCosts, ResizeKind

from .test_rebalance import place, racks

COSTS = ResizeCosts()


def test_a_live_shrink_costs_the_survivors_rebuild_and_a_restart_shrink_the_whole_jobs_save_and_reload():
    live = COSTS.shrink_gpu_s(ResizeKind.LIVE, gpus=1024, leaving=64, model_gpus=64)
    restart = COSTS.shrink_gpu_s(ResizeKind.RESTART, gpus=1024, leaving=64, model_gpus=64)
    assert live == 960 * COSTS.rebuild_s
    assert restart == 1024 * COSTS.save_seconds(64, 1024) + 960 * COSTS.restore_seconds(64, 960)
    assert restart > 5 * live


def test_a_live_grow_holds_the_new_gpus_through_start_and_transfer_and_stalls_everyone_once():
    grow = COSTS.grow_gpu_s(ResizeKind.LIVE, gpus=960, added=64, model_gpus=64)
    assert grow == 64 * (COSTS.restart_s + COSTS.transfer_seconds(64)) + 1024 * COSTS.rebuild_s
    assert COSTS.transfer_seconds(64) == 14 * 2e9 / 40e9  # one GPU's shard over one NIC
    assert grow < COSTS.grow_gpu_s(ResizeKind.RESTART, gpus=960, added=64, model_gpus=64)


def test_the_forecast_lead_is_the_time_room_takes():
    lead = COSTS.room_lead_s(decision_period_s=60, cold_start_s=180)
    assert lead == COSTS.save_seconds(1, 1) + 60 + 180  # the slowest write: one replica's own GPUs
    assert 500 < lead < 700


def big_and_small(big_resize: str = "Restart", small_priority: int = 0):
    """Five 16-GPU racks, full: an elastic 64-GPU job (four 16-GPU replicas, down to one) and a
    16-GPU rigid job. A pool wants one 16-GPU replica."""
    snap = racks(5)
    big = place(snap, "big", 4, priority=0, min_replicas=1)
    small = place(snap, "small", 1, priority=small_priority)
    return snap, [replace(big, resize=big_resize), small]


def evictions(plan):
    return [(e.gang, e.whole) for e in plan.evictions]


def test_without_costs_the_shrink_stage_comes_first():
    snap, gangs = big_and_small()
    plan = plan_capacity(snap, GangRequest("pool", 1, 16, 4, priority=1000), gangs, None)
    assert evictions(plan) == [("big", False)]


def test_a_restart_shrink_dearer_than_a_suspension_gives_way_to_it():
    snap, gangs = big_and_small()
    shrink = COSTS.shrink_gpu_s(ResizeKind.RESTART, 64, 16, 16)
    suspend = COSTS.suspend_gpu_s(16, 16)
    assert suspend < shrink
    plan = plan_capacity(snap, GangRequest("pool", 1, 16, 4, priority=1000), gangs, None, COSTS)
    assert evictions(plan) == [("small", True)]
    assert "cheaper than shrinking Restart jobs" in plan.reason
    within_budget = plan_capacity(snap, GangRequest("pool", 1, 16, 4, priority=1000), gangs, 16, COSTS)
    assert evictions(within_budget) == [("small", True)]


def test_a_live_shrink_stays_the_cheapest_way():
    snap, gangs = big_and_small(big_resize="Live")
    plan = plan_capacity(snap, GangRequest("pool", 1, 16, 4, priority=1000), gangs, None, COSTS)
    assert evictions(plan) == [("big", False)]


def test_of_two_elastic_jobs_alike_the_live_one_is_shrunk_whatever_the_first_search_found():
    """Same priority, same size, one Restart and one Live: whichever the GPU search takes first,
    the plan that spares Restart jobs shrinks the Live one, and its rebuild is the cheaper way."""
    for restart_name, live_name in (("a-restart", "z-live"), ("z-restart", "a-live")):
        snap = racks(4)
        restart = replace(place(snap, restart_name, 2, priority=0, min_replicas=1), resize="Restart")
        live = replace(place(snap, live_name, 2, priority=0, min_replicas=1), resize="Live")
        plan = plan_capacity(snap, GangRequest("pool", 1, 16, 4, priority=1000), [restart, live], None, COSTS)
        assert evictions(plan) == [(live_name, False)]


def test_a_cheaper_plan_never_suspends_a_higher_priority_than_the_first_one():
    """A (priority 0) shrinks by one of two replicas and B (priority 5) by three of four: suspending
    A whole is not enough, and suspending B whole would be cheaper, but B outranks A."""
    snap = racks(6)
    a = place(snap, "a", 2, priority=0, min_replicas=1)
    b = place(snap, "b", 4, priority=5, min_replicas=1)
    shrinks = COSTS.shrink_gpu_s(ResizeKind.RESTART, 32, 16, 16) + COSTS.shrink_gpu_s(ResizeKind.RESTART, 64, 48, 16)
    assert COSTS.suspend_gpu_s(64, 16) < shrinks, "the suspension of B is the cheaper way"
    plan = plan_capacity(snap, GangRequest("pool", 4, 16, 4, priority=1000), [a, b], None, COSTS)
    assert evictions(plan) == [("a", False), ("b", False)]


def test_a_grow_back_pays_when_its_work_outweighs_its_stall():
    cost = COSTS.grow_gpu_s(ResizeKind.RESTART, 960, 64, 64)
    assert not COSTS.grow_pays(ResizeKind.RESTART, 960, 64, 64, expected_s=cost / 64 - 1)
    assert COSTS.grow_pays(ResizeKind.RESTART, 960, 64, 64, expected_s=cost / 64 + 1)
    assert COSTS.grow_pays(ResizeKind.LIVE, 960, 64, 64, expected_s=cost / 64 - 1), "Live pays sooner"


def test_a_grow_back_the_forecast_will_want_back_pays_for_that_shrink_too():
    cost = COSTS.grow_gpu_s(ResizeKind.RESTART, 960, 64, 64)
    again = COSTS.shrink_gpu_s(ResizeKind.RESTART, 1024, 64, 64)
    expected = (cost + again / 2) / 64
    assert COSTS.grow_pays(ResizeKind.RESTART, 960, 64, 64, expected)
    assert not COSTS.grow_pays(ResizeKind.RESTART, 960, 64, 64, expected, shrunk_again=True)


def test_a_cheaper_plan_never_suspends_above_what_the_first_plan_suspends():
    """The first plan suspends A (priority 0) and shrinks B (priority 5) by three of four; suspending
    B whole would be cheaper, but B outranks everything the first plan suspends."""
    snap = racks(5)
    a = place(snap, "a", 1, priority=0)
    b = place(snap, "b", 4, priority=5, min_replicas=1)
    first = COSTS.suspend_gpu_s(16, 16) + COSTS.shrink_gpu_s(ResizeKind.RESTART, 64, 48, 16)
    assert COSTS.suspend_gpu_s(64, 16) < first, "the suspension of B is the cheaper way"
    plan = plan_capacity(snap, GangRequest("pool", 4, 16, 4, priority=1000), [a, b], None, COSTS)
    assert evictions(plan) == [("a", True), ("b", False)]
