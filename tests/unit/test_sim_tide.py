"""The simulator's demand model and what it charges, as the tide issue asks: demand per minute
with the trace's bursts, every policy seeing only the past; flaps counted from the eviction's
decision; Live and Restart resizes charged by kind; waits counting jobs never started; tidal's
whole-first admission and its grow-back that must pay."""

import ast
import dataclasses
import inspect
import random
import statistics

import pytest

from tidal.placement import GangRequest, plan_gang
from tidal.placement.workload_mix import JobShape
from tidal.rebalance.resize_cost import ResizeKind
from tidal.sim import policies
from tidal.sim.engine import FLAP_WINDOW_S, METRIC_WINDOW_S, Costs, Job, Simulation
from tidal.sim.policies import AutoscalePreemptGraceful, BurstHistory, Tidal, TidalBurst, TidalWhole
from tidal.sim.run import snapshot_for, summarize
from tidal.sim.workload import (
    MINUTE,
    WINDOW,
    TrainingArrival,
    Workload,
    build_workload,
    burst_blocks,
    per_minute,
)
from tidal.topology import build_fleet

from .test_sim import hand_sim, started, until

EMPTY = {"m-large": [0] * 144, "m-mid": [0] * 144, "m-small": [0] * 144}


def live(job: Job) -> Job:
    job.arrival = dataclasses.replace(job.arrival, live_resize=True)
    return job


# -- demand as it arrives ---------------------------------------------------------------------
def test_the_bursts_come_from_the_trace_and_keep_each_windows_mean():
    blocks = burst_blocks()
    assert len(blocks) == 49  # every 10-minute span of the trace's 58 whole minutes
    factors = [f for b in blocks for f in b]
    assert statistics.fmean(factors) == pytest.approx(1.0)
    assert 0.25 < statistics.pstdev(factors) < 0.45, "the Azure trace's minute-to-window variation"
    minutes = per_minute([10.0, 40.0], blocks, random.Random(1))
    assert len(minutes) == 2 * WINDOW // MINUTE
    assert statistics.fmean(minutes[:10]) == pytest.approx(10.0)
    assert statistics.fmean(minutes[10:]) == pytest.approx(40.0)
    assert max(minutes[10:]) > 45, "a burst above the window's mean"


def test_the_workload_is_per_minute_and_bursts_can_be_turned_off():
    bursty = build_workload(cluster_gpus=2880, nodes=160, days=1, seed=3)
    smooth = build_workload(cluster_gpus=2880, nodes=160, days=1, seed=3, bursts=False)
    assert bursty.demand_step_s == MINUTE and len(bursty.inference_replicas["m-small"]) == 1440
    series = smooth.inference_replicas["m-small"]
    assert all(len(set(series[w * 10 : w * 10 + 10])) == 1 for w in range(144)), "one value per window"
    assert bursty.inference_replicas != smooth.inference_replicas
    assert bursty.arrivals == smooth.arrivals, "the bursts do not move the training arrivals"


def test_a_policy_sees_only_the_last_minute():
    sim = hand_sim(pools={"m-large": [1] * 5 + [9] + [1] * 1434, "m-mid": [0] * 1440, "m-small": [0] * 1440})
    sim.workload.demand_step_s = MINUTE
    pool = sim.pools["m-large"]
    sim.now = 5 * 60  # the spike's minute has begun: the autoscaler has not seen it
    assert sim.demand(pool) == 9 and sim.observed(pool) == 1
    sim.now = 6 * 60
    assert sim.observed(pool) == 9


def test_no_policy_reads_the_present_demand():
    """Policies read `observed` (the past); `Simulation.demand` is the accounting's alone."""
    tree = ast.parse(inspect.getsource(policies))
    reads = [
        n.lineno
        for n in ast.walk(tree)
        if isinstance(n, ast.Attribute) and n.attr == "demand" and isinstance(n.value, ast.Name) and n.value.id == "sim"
    ]
    assert reads == []
    # The check itself catches a read.
    bad = ast.parse("def f(sim, pool):\n    return sim.demand(pool)\n")
    assert any(isinstance(n, ast.Attribute) and n.attr == "demand" for n in ast.walk(bad))


def test_the_trace_window_moves_both_traces():
    base = build_workload(cluster_gpus=2880, nodes=160, days=3, seed=3, bursts=False)
    later = build_workload(cluster_gpus=2880, nodes=160, days=3, seed=3, bursts=False, window_offset_days=2)
    # ServeGen's day 2 of the first run is day 0 of the later one (the scale is per run, so compare shapes).
    a = base.inference_replicas["m-small"][2 * 1440 : 3 * 1440]
    b = later.inference_replicas["m-small"][:1440]
    assert a.index(max(a)) == b.index(max(b))
    assert [x.at for x in base.arrivals] != [x.at for x in later.arrivals]


def test_the_live_share_changes_only_how_elastic_jobs_resize():
    none = build_workload(cluster_gpus=2880, nodes=160, days=1, seed=3)
    half = build_workload(cluster_gpus=2880, nodes=160, days=1, seed=3, live_share=0.5)
    every = build_workload(cluster_gpus=2880, nodes=160, days=1, seed=3, live_share=1.0)

    def rigid(w):
        return [dataclasses.replace(a, live_resize=False) for a in w.arrivals]

    assert rigid(none) == rigid(half) == rigid(every)
    elastic = [a for a in every.arrivals if a.min_dp]
    assert elastic and all(a.live_resize for a in elastic)
    assert not any(a.live_resize for a in none.arrivals) and not any(
        a.live_resize for a in every.arrivals if not a.min_dp
    )
    share = sum(a.live_resize for a in half.arrivals) / len(elastic)
    assert 0.3 < share < 0.7


# -- flaps by their definition ---------------------------------------------------------------
@pytest.mark.parametrize(("back_after", "real"), [(FLAP_WINDOW_S, 0), (FLAP_WINDOW_S - 1, 1)])
def test_a_flap_is_counted_from_the_evictions_decision(back_after, real):
    costs = Costs()
    sim = hand_sim(costs)
    job = started(sim)
    until(sim, 1000)
    sim.request_checkpoint(job, (1,))  # decided at 1000, saved some minutes later
    until(sim, 1000 + back_after)
    sim.grow(job, plan_gang(sim.snapshot, GangRequest(job.id, 1, 8, 4, group_ids=(1,))), 2)
    assert sim.totals.flaps_jobs == real
    assert sim.totals.flaps == 1, "the old count, from the save, called both a flap"


def test_tidals_grow_back_cooldown_runs_from_the_shrinks_decision_like_the_flap_count():
    """The cooldown and the flap window start at the same instant, the decision: a grow-back an
    hour after it is neither early nor a flap, though the save ended minutes later."""
    sim = hand_sim(Costs(), supernodes=1)
    policy = Tidal(budget_share=None)
    assert policy.grow_cooldown_s == policies.GROW_COOLDOWN_S == FLAP_WINDOW_S
    sim.policy = policy
    job = started(sim, JobShape(8, 1, 1, 9, 4, 1), min_dp=1)  # all 72 GPUs, Restart
    until(sim, 1000)
    policy.make_room(sim, sim.pools["m-large"], 1)  # one replica of the job, decided at 1000
    until(sim, 1000 + FLAP_WINDOW_S - 1)
    assert job.state == "running" and job.dp == 8 and job.down_at > 1000, "saved, then shrunk, after the decision"
    assert job not in policy.grow_candidates(sim)
    until(sim, 1000 + FLAP_WINDOW_S)
    assert job in policy.grow_candidates(sim)


def test_an_inference_replica_added_and_removed_within_the_hour_is_a_flap():
    sim = hand_sim(Costs())
    pool = sim.pools["m-large"]
    policies.Policy.place_free(sim, pool, 2)
    until(sim, FLAP_WINDOW_S - 1)
    sim.remove_replicas(pool, 1)
    until(sim, FLAP_WINDOW_S + 1)
    sim.remove_replicas(pool, 0)
    assert sim.totals.flaps_replicas == 1


# -- resizes charged by kind -------------------------------------------------------------------
def test_a_live_shrink_writes_nothing_frees_the_gpus_at_once_and_stalls_the_survivors_for_a_rebuild():
    costs = Costs()
    sim = hand_sim(costs)
    job = live(started(sim))
    until(sim, 1000)
    free = sim.snapshot.free_gpus()
    sim.request_checkpoint(job, (1,))
    assert job.state == "restoring", "no checkpoint is written"
    assert sim.snapshot.free_gpus() == free + 8 and job.dp == 1
    assert sim.totals.live_shrinks == 1 and sim.totals.lost_preemption_gpu_s == 0
    until(sim, 1000 + costs.rebuild_s + 1)
    assert job.state == "running"


def test_after_a_live_rebuild_the_work_since_the_last_save_is_still_at_risk():
    """Nothing is written in a Live shrink: the periodic checkpoints keep their cadence, so a
    failure after it loses the work since the last periodic save, not nothing."""
    costs = Costs()
    sim = hand_sim(costs)
    job = live(started(sim))
    until(sim, 1000)
    sim.request_checkpoint(job, (1,))
    until(sim, 1000 + costs.rebuild_s + 60)
    assert job.state == "running"
    at_risk = sim._lost_since_checkpoint(job)
    # Since the start (its restore ended at costs.restart_s), less the rebuild's stall.
    ran = (sim.now - costs.restart_s - costs.rebuild_s) % costs.checkpoint_every_s
    assert at_risk == pytest.approx(ran * job.rate, rel=0.01) and at_risk > 60 * job.rate


def test_a_restart_shrink_still_saves_first():
    sim = hand_sim(Costs())
    job = started(sim)
    until(sim, 1000)
    sim.request_checkpoint(job, (1,))
    assert job.state == "checkpointing" and job.gpus_held == 16


def test_a_live_grow_trains_on_while_the_new_replica_joins_then_rebuilds_once():
    costs = Costs()
    sim = hand_sim(costs)
    job = live(started(sim))
    until(sim, 1000)
    sim.request_checkpoint(job, (1,))
    until(sim, 2000)
    rate = job.rate
    before = sim.totals.stalled_gpu_s
    sim.grow(job, plan_gang(sim.snapshot, GangRequest(job.id, 1, 8, 4, group_ids=(1,))), 2)
    assert job.state == "running" and job.gpus_held == 16 and job.joining_gpus == 8
    assert job.rate == pytest.approx(rate, rel=0.01), "the survivors train on at their rate"
    join = costs.restart_s + costs.transfer_seconds(job.model_gpus)
    until(sim, 2000 + join - 1)
    stalled = sim.totals.stalled_gpu_s
    assert stalled - before == pytest.approx(8 * (join - 1), rel=0.01), "the joining GPUs count as stalled"
    until(sim, 2000 + join + 1)
    assert job.state == "restoring" and job.joining_gpus == 0
    assert sim.totals.stalled_gpu_s > stalled
    until(sim, 2000 + join + costs.rebuild_s + 2)
    assert job.state == "running" and job.rate == pytest.approx(2 * rate, rel=0.01)
    assert sim.totals.live_grow_backs == 1


def test_a_live_jobs_suspension_is_checkpoint_first():
    sim = hand_sim(Costs())
    job = live(started(sim))
    until(sim, 1000)
    sim.request_checkpoint(job, ())
    assert job.state == "checkpointing"


# -- waits --------------------------------------------------------------------------------------
def test_a_job_never_started_counts_its_wait_up_to_the_horizon():
    sim = hand_sim(Costs())
    too_big = TrainingArrival(0, 3600.0, JobShape(8, 1, 1, 100, 4, 1), 1e6, 0, True, None)
    sim.workload.arrivals.append(too_big)
    totals = sim.run()
    assert totals.waits_unstarted == [sim.end - 3600.0]
    summary = summarize(totals, sim.total_gpus, sim.end)
    assert summary["jobs_never_started"] == 1 and summary["job_wait_p99_s"] == sim.end - 3600.0


# -- tidal's admission and grow-back -------------------------------------------------------------
def queue_of_two(policy):
    """Room for 16 GPUs; queued: an older elastic job of 32 GPUs (down to 8) and a rigid 16-GPU job."""
    sim = Simulation(
        snapshot_for(build_fleet("nvl72", 1), 0),
        Workload(1, dict(EMPTY), [], []),
        policy,
    )
    filler = started(sim, JobShape(8, 1, 1, 7, 4, 1), job_id=9)  # 56 of 72 GPUs
    jobs = []
    for i, (shape, min_dp) in enumerate([(JobShape(8, 1, 1, 4, 4, 1), 1), (JobShape(8, 1, 1, 2, 4, 1), None)]):
        job = Job(TrainingArrival(i, float(i), shape, 1e6, 0, True, min_dp), dp=shape.dp, remaining=1e9)
        sim.jobs[job.id] = job
        sim.queue.append(job)
        jobs.append(job)
    assert sim.snapshot.free_gpus() == 16 and filler.gpus_held == 56
    return sim, jobs


@pytest.mark.parametrize("policy", [Tidal, AutoscalePreemptGraceful])
def test_tidal_like_the_operator_starts_an_elastic_job_smaller_at_its_turn(policy):
    """The operator's admission (k8s/admission.py) and Kueue's partial admission alike: the older
    elastic job starts at the largest DP that fits, before the younger rigid job's turn."""
    sim, (elastic, rigid) = queue_of_two(policy())
    sim.policy.admit(sim)
    assert elastic.state == "restoring" and elastic.dp == 2 and rigid.state == "queued"


def shrunk_to_one() -> tuple[Simulation, Tidal, Job]:
    """A Restart job of four 8-GPU replicas shrunk to one, running again; tidal without a cooldown."""
    sim = hand_sim(Costs())
    policy = Tidal(budget_share=None, grow_cooldown_s=0)
    sim.policy = policy
    job = started(sim, JobShape(8, 1, 1, 4, 4, 1), min_dp=1)
    until(sim, 1000)
    sim.request_checkpoint(job, (1, 2, 3))
    until(sim, 2000)
    assert job.dp == 1 and job.state == "running"
    return sim, policy, job


def test_a_grow_back_that_would_stall_more_than_it_gains_is_not_made(monkeypatch: pytest.MonkeyPatch):
    sim, policy, job = shrunk_to_one()
    # The forecast wants the GPUs back in a minute: three replicas more cannot pay for a restart.
    monkeypatch.setattr(policy, "calm_s", lambda sim, accelerator, spare: 60.0)
    assert not policy.grow_pays(sim, job, 24, 24)
    assert policy.grow_back(sim, job, sim.snapshot.free_gpus()) == 0 and job.dp == 1
    monkeypatch.setattr(policy, "calm_s", lambda sim, accelerator, spare: policies.GROW_HORIZON_S)
    assert policy.grow_pays(sim, job, 24, 24)
    assert policy.grow_back(sim, job, sim.snapshot.free_gpus()) == 24 and job.dp == 4


def test_a_grow_back_does_not_know_when_the_job_ends():
    """The operator does not know a job's end (k8s/rebalancing.py, _grow_pays): neither may the
    simulator's tidal, so its remaining work never changes the answer."""
    sim, policy, job = shrunk_to_one()
    answers = set()
    for remaining in (job.rate * 60, 1e12):
        job.remaining = remaining
        answers.add(policy.grow_pays(sim, job, 24, 24))
    assert len(answers) == 1


def test_the_forecast_lead_is_the_time_making_room_takes():
    """Yesterday's demand rose at 08:20: at 08:00 (20 minutes ahead) the forecast does not act
    on it, at 08:12 (8 minutes ahead, within the ~10 minutes room takes) it does."""
    day = [2] * 50 + [14] * 94
    sim = hand_sim(pools={"m-large": day * 2, "m-mid": [0] * 288, "m-small": [0] * 288})
    pool = sim.pools["m-large"]
    policy = Tidal()
    assert 500 < policy.lead_s(sim) < 900, "not an hour"
    sim.now = 86400 + 8 * 3600
    assert policy.forecast(sim, pool) == 2
    sim.now = 86400 + 8 * 3600 + 12 * 60
    assert policy.forecast(sim, pool) == 14
    assert policies.TidalReactive().lead_s(sim) == 0


# -- the two settings beside tidal --------------------------------------------------------------
def test_burst_history_keeps_only_what_was_observed_and_sizes_for_its_quantile():
    history = BurstHistory()
    for minute in range(120):
        history.observe("p", 20 if minute % 10 == 9 else 10)  # a 2x burst every tenth minute
    assert history.ahead("p", 0.5) == 10 and history.ahead("p", 0.95) >= 19
    fresh = BurstHistory()
    for _ in range(30):
        fresh.observe("p", 10)
    assert fresh.ahead("p", 0.95) == 0, "nothing before an hour has been observed"


def test_tidal_burst_keeps_warm_replicas_ahead_of_the_bursts_it_has_seen():
    sim = hand_sim(pools={"m-large": ([10] * 4 + [20]) * 576, "m-mid": [0] * 2880, "m-small": [0] * 2880})
    sim.workload.demand_step_s = MINUTE
    pool = sim.pools["m-large"]
    plain, burst = Tidal(), TidalBurst()
    for minute in range(1, 200):
        sim.now = minute * 60.0
        for policy in (plain, burst):
            policy.bursts.observe(pool.name, sim.observed(pool))
    sim.now = 201 * 60.0  # the minute after a burst: a plain autoscaler wants what it saw
    assert sim.observed(pool) == 10
    assert plain.target(sim, pool) == 10
    assert burst.target(sim, pool) >= 20, "warm for the next burst, from what it observed"


def test_tidal_whole_starts_no_job_smaller():
    sim, (elastic, rigid) = queue_of_two(TidalWhole())
    sim.policy.admit(sim)
    assert rigid.state == "restoring" and elastic.state == "queued"
    sim._release_groups(rigid, rigid.groups)  # it ends: its 16 GPUs are free again
    rigid.groups, rigid.state = [], "done"
    sim.active.pop(rigid.id)
    sim.policy.admit(sim)
    assert elastic.state == "queued", "tidal would start it at dp 2 in its second pass"
    sim.policy = Tidal()
    sim.policy.admit(sim)
    assert elastic.state == "restoring" and elastic.dp < elastic.shape.dp


@pytest.mark.parametrize("policy", ["tidal", "tidal-burst", "tidal-whole"])
def test_gpus_and_jobs_conserved_with_live_resizes(policy):
    workload = build_workload(cluster_gpus=2880, nodes=720, days=1, seed=5, live_share=1.0)
    sim = Simulation(
        snapshot_for(build_fleet("nvl72", 40), 0), workload, policies.POLICIES[policy](), check_every_event=True
    )
    totals = sim.run()
    assert totals.useful_work > 0 and totals.live_shrinks + totals.live_grow_backs > 0


def test_a_jobs_live_replicas_still_joining_are_not_grown_again_and_a_shrink_waits_for_them():
    costs = Costs()
    sim = hand_sim(costs)
    policy = Tidal(budget_share=None, grow_cooldown_s=0)
    sim.policy = policy
    job = live(started(sim, JobShape(8, 1, 1, 4, 4, 1), min_dp=1))
    until(sim, 1000)
    sim.request_checkpoint(job, (1, 2, 3))
    until(sim, 2000)
    sim.grow(job, plan_gang(sim.snapshot, GangRequest(job.id, 1, 8, 4, group_ids=(1,))), 2)
    assert job.joining_gpus == 8 and job not in policy.grow_candidates(sim)
    join_end = job.join_end
    until(sim, 2010)
    sim.request_checkpoint(job, (1,))  # a Live shrink while the replica joins
    until(sim, join_end + costs.rebuild_s - 1)
    assert job.state == "restoring", "the survivors wait for the join before they rebuild"
    until(sim, join_end + costs.rebuild_s + 1)
    assert job.state == "running"


def test_the_room_a_live_shrink_frees_goes_to_the_pool_before_queued_training():
    costs = Costs()
    sim = hand_sim(costs, supernodes=1)
    policy = Tidal(budget_share=None)
    sim.policy = policy
    job = live(started(sim, JobShape(8, 1, 1, 9, 4, 1), min_dp=1))  # all 72 GPUs
    until(sim, 1000)
    waiting = Job(TrainingArrival(5, 1000.0, JobShape(8, 1, 1, 1, 4, 1), 1e6, 0, True, None), dp=1, remaining=1e9)
    sim.jobs[waiting.id] = waiting
    sim.queue.append(waiting)
    pool = sim.pools["m-large"]
    policy.make_room(sim, pool, 1)
    policy.admit(sim)
    assert job.dp == 8 and len(pool.replicas) == 1 and waiting.state == "queued"


def test_a_grow_back_checks_that_each_size_it_tries_pays():
    sim, policy, job = shrunk_to_one()
    asked = []
    policy.grow_pays = lambda s, j, added, room: asked.append(added) or added <= 8
    assert policy.grow_back(sim, job, sim.snapshot.free_gpus()) == 8 and job.dp == 2
    assert asked == [24, 8], "three replicas do not pay; one does"


def test_the_engine_charges_a_restart_grow_what_the_planner_weighs():
    costs = Costs()
    sim = hand_sim(costs)
    job = started(sim, JobShape(8, 1, 1, 2, 4, 1), min_dp=1)
    until(sim, 1000)
    sim.request_checkpoint(job, (1,))
    until(sim, 2000)
    before = sim.totals.stalled_gpu_s
    sim.grow(job, plan_gang(sim.snapshot, GangRequest(job.id, 1, 8, 4, group_ids=(1,))), 2)
    until(sim, 9000)
    charged = sim.totals.stalled_gpu_s - before
    assert charged == pytest.approx(costs.grow_gpu_s(ResizeKind.RESTART, 8, 8, job.model_gpus), rel=0.001)


class FutureGuard(Workload):
    """A workload that fails a read of the present or the future made while a policy decides."""

    deciding_at: float | None = None

    def desired_at(self, pool, t):
        if self.deciding_at is not None:
            # Before a minute has passed, the first minute stands for the steady state the run starts in.
            seen = max(self.deciding_at - METRIC_WINDOW_S, 0.0)
            assert t <= seen, f"a policy read minute {t // 60} at {self.deciding_at}"
        return super().desired_at(pool, t)

    def window_mean(self, pool, t):
        if self.deciding_at is not None:
            assert (t // WINDOW + 1) * WINDOW <= self.deciding_at, (
                f"a policy read the window of {t} at {self.deciding_at}"
            )
        return super().window_mean(pool, t)


AUTOSCALED = [
    "autoscale-preempt",
    "autoscale-preempt-graceful",
    "tidal",
    "tidal-reactive",
    "tidal-burst",
    "tidal-whole",
    "tidal-no-restart-shrink",
    "tidal-reactive-no-restart-shrink",
]


def test_the_guard_below_covers_every_autoscaled_policy():
    autoscaled = {name for name, cls in policies.POLICIES.items() if issubclass(cls, policies.Autoscaled)}
    assert autoscaled == set(AUTOSCALED)


@pytest.mark.parametrize("name", AUTOSCALED)
def test_no_policy_reads_the_present_or_the_future(name):
    built = build_workload(cluster_gpus=1440, nodes=360, days=2, seed=4)
    workload = FutureGuard(**{f.name: getattr(built, f.name) for f in dataclasses.fields(Workload) if f.init})
    policy = policies.POLICIES[name]()
    sim = Simulation(snapshot_for(build_fleet("nvl72", 20), 0), workload, policy)
    for method in ("tick", "admit", "after_checkpoint"):
        inner = getattr(policy, method)

        def guarded(s, inner=inner):
            workload.deciding_at = s.now
            try:
                inner(s)
            finally:
                workload.deciding_at = None

        setattr(policy, method, guarded)
    totals = sim.run()
    assert totals.useful_work > 0
    assert not policy.forecasting or policy.forecasts, "the forecast was asked (from day 1 on)"


# -- training preemption (Scenario.training_preemption) ------------------------------------------
def full_of_low_priority(policy) -> tuple[Simulation, Job, Job]:
    """One rack (72 GPUs) full with a priority-0 elastic job (9 replicas of 8 GPUs, down to 1);
    queued: a rigid priority-2 job of 16 GPUs. Training preemption on."""
    policy.training_preemption = True
    sim = Simulation(snapshot_for(build_fleet("nvl72", 1), 0), Workload(1, dict(EMPTY), [], []), policy)
    victim = started(sim, JobShape(8, 1, 1, 9, 4, 1), job_id=9)
    until(sim, 1800)
    job = Job(TrainingArrival(1, sim.now, JobShape(8, 1, 1, 2, 4, 1), 1e6, 2, True, None), dp=2, remaining=1e9)
    sim.jobs[job.id] = job
    sim.queue.append(job)
    return sim, victim, job


@pytest.mark.parametrize("policy", [Tidal, TidalWhole])
def test_tidal_preempts_training_for_training_as_the_operator_does_shrinking_after_a_checkpoint(policy):
    sim, victim, job = full_of_low_priority(policy(budget_share=None))
    sim.policy.admit(sim)
    assert victim.state == "checkpointing" and victim.evicting == (7, 8), "a shrink by two replicas, saved first"
    assert job.state == "queued", "it waits for the save"
    until(sim, 1800 + sim.costs.save_s(victim.shape, 72) + 1)
    assert job.state != "queued" and job.gpus_held == 16
    assert victim.dp == 7 and sim.totals.lost_preemption_gpu_s == 0, "nothing lost"


def test_autoscale_preempt_kills_a_whole_lower_priority_gang_and_starts_the_job_at_once():
    sim, victim, job = full_of_low_priority(policies.AutoscalePreempt())
    sim.policy.admit(sim)
    assert victim.state == "queued" and victim.gpus_held == 0, "killed whole, no checkpoint"
    assert job.state != "queued" and job.gpus_held == 16
    assert sim.totals.lost_preemption_gpu_s > 0, "the work since its last periodic save is lost"


def test_the_graceful_baseline_preempts_training_whole_and_saves_first():
    sim, victim, job = full_of_low_priority(AutoscalePreemptGraceful())
    sim.policy.admit(sim)
    assert victim.state == "checkpointing" and victim.evicting == (), "the whole gang, saving in its grace period"
    until(sim, 1800 + sim.costs.save_s(victim.shape, 72) + 1)
    assert job.state != "queued" and job.gpus_held == 16 and sim.totals.lost_preemption_gpu_s == 0
    assert victim.gpus_held <= 72 - 16, "suspended whole, then (partial admission) started again smaller"


@pytest.mark.parametrize("policy", [Tidal, policies.AutoscalePreempt, AutoscalePreemptGraceful])
def test_without_training_preemption_nobody_is_evicted_for_training(policy):
    sim, victim, job = full_of_low_priority(policy())
    sim.policy.training_preemption = False
    sim.policy.admit(sim)
    assert victim.state == "running" and victim.dp == 9 and job.state == "queued"


def test_the_room_a_preemption_makes_is_held_for_its_job_until_the_last_victim_is_gone():
    """Two rigid victims save for a priority-2 job of 48 GPUs, one fast (40 GPUs of a small model),
    one slow (32 GPUs of a four-stage model): what the fast one frees on the job's planned nodes is
    held for it (the operator's held nodes), not taken by a lower-priority job queued behind it,
    and the job starts when the slow one is gone."""
    policy = Tidal(budget_share=None)
    policy.training_preemption = True
    sim = Simulation(snapshot_for(build_fleet("nvl72", 1), 0), Workload(1, dict(EMPTY), [], []), policy)
    slow = started(sim, JobShape(8, 1, 4, 1, 4, 1), job_id=7, min_dp=None)
    fast = started(sim, JobShape(8, 1, 1, 5, 4, 1), job_id=8, min_dp=None)
    until(sim, 1800)
    job = Job(TrainingArrival(1, sim.now, JobShape(8, 1, 1, 6, 4, 1), 1e6, 2, True, None), dp=6, remaining=1e9)
    small = Job(TrainingArrival(2, sim.now, JobShape(8, 1, 1, 1, 4, 1), 1e6, 1, True, None), dp=1, remaining=1e9)
    for queued in (job, small):
        sim.jobs[queued.id] = queued
        sim.queue.append(queued)
    sim.policy.admit(sim)
    assert slow.state == fast.state == "checkpointing" and job.state == small.state == "queued"
    sim.policy.admit(sim)  # a second admission while they save evicts nothing more
    assert sim.totals.evictions == 0 and slow.state == fast.state == "checkpointing"
    fast_done = 1800 + sim.costs.save_s(fast.shape, 40)
    assert fast_done + 1 < 1800 + sim.costs.save_s(slow.shape, 32)
    until(sim, fast_done + 1)
    held = sim.holds.get(job.id)
    assert fast.state == "queued" and slow.state == "checkpointing" and held, "the fast one's GPUs held"
    assert not {n for g in small.groups for n in g.nodes} & set(held), "the small job kept off them"
    until(sim, 1800 + sim.costs.save_s(slow.shape, 32) + 1)
    assert job.state != "queued" and job.gpus_held == 48 and job.id not in sim.holds
    sim.check_conservation()


def test_a_live_victims_room_starts_the_job_in_the_same_admission():
    sim, victim, job = full_of_low_priority(Tidal(budget_share=None))
    live(victim)
    sim.policy.admit(sim)
    assert victim.dp == 7 and job.state != "queued" and job.gpus_held == 16, "no save to wait for"


def test_a_scenario_hands_its_training_preemption_to_the_policy():
    from tidal.sim.run import Scenario, _built, run_policy

    scenario = Scenario(gpus=1440, days=1)
    fleet, workload = _built(scenario)
    for flag in (True, False):
        sim, _ = run_policy(dataclasses.replace(scenario, training_preemption=flag), "tidal", fleet, workload)
        assert sim.policy.training_preemption is flag


def test_a_pool_waits_only_for_the_victims_it_asked_to_save():
    """Kueue's preemptions for one workload do not wait on another's saves: a save for another
    reason (here a job's own suspension) does not hold a pool's room up."""
    sim = hand_sim(Costs())
    policy = AutoscalePreemptGraceful()
    sim.policy = policy
    other = started(sim, job_id=1)
    victim = started(sim, job_id=2)
    until(sim, 1000)
    pool = sim.pools["m-large"]
    sim.request_checkpoint(other, ())  # saving, but not for the pool
    assert other.state == "checkpointing" and not policy.still_saving(sim, pool)
    policy.asked_to_save(sim, pool, victim, ())
    assert policy.still_saving(sim, pool)
    until(sim, sim.now + 3600)
    assert victim.state != "checkpointing" and not policy.still_saving(sim, pool)
