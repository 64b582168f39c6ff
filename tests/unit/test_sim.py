"""The simulator: deterministic for a seed, conserving GPUs and jobs, and deciding as the
operator's rebalancer does for the same state."""

import dataclasses
import datetime as dt
import heapq
import json

import pytest

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller, ControllerSettings
from tidal.placement import GangRequest, GroupAssignment, PlacementPlan, plan_gang
from tidal.placement.workload_mix import JobShape
from tidal.sim.engine import FREE, Costs, Job, Simulation
from tidal.sim.policies import DEFAULT_POLICIES, POLICIES, Policy, Tidal, job_request
from tidal.sim.run import Scenario, run_scenario, snapshot_for, write_outputs
from tidal.sim.workload import Failure, TrainingArrival, Workload, build_workload
from tidal.topology import build_fleet, snapshot_from_fleet

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, run

SMALL = Scenario(gpus=2880, days=1, seed=11)


def test_same_seed_same_results_and_another_seed_differs():
    a = run_scenario(SMALL)
    b = run_scenario(SMALL)
    for r in (a, b):
        r.pop("wall_s")
        r.pop("wall_s_by_policy")  # timings, not results
        r.pop("cpu_s_by_policy")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    c = run_scenario(dataclasses.replace(SMALL, seed=12))
    assert c["policies"] != a["policies"]


@pytest.mark.parametrize("policy", list(POLICIES))
def test_gpus_and_jobs_conserved_at_every_event(policy):
    fleet = build_fleet("nvl72", 40)
    workload = build_workload(cluster_gpus=2880, nodes=720, days=1, seed=5)
    sim = Simulation(snapshot_from_fleet(fleet), workload, POLICIES[policy](), check_every_event=True)
    totals = sim.run()
    assert len(sim.jobs) == sum(1 for a in workload.arrivals if a.at < sim.end)
    assert totals.useful_work > 0 and totals.training_gpu_s > 0
    if policy != "first-fit":
        assert totals.split_groups == 0, "topology-aware policies never split an HBD group"


def test_table_json_and_plots_are_written(tmp_path):
    result = run_scenario(SMALL, ["tidal", "first-fit"])
    written = write_outputs(result, tmp_path)
    assert {p.name for p in written} == {"table.txt", "results.json", "gpus_by_class.png", "fragmentation.png"}
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["policies"]["tidal"]) >= {
        "gpu_utilization",
        "training_gpu_hours",
        "inference_demand_met",
        "job_wait_p50_s",
        "job_wait_p95_s",
        "hbd_split_groups",
        "lost_gpu_hours_failures",
        "lost_gpu_hours_preemption",
    }
    assert (tmp_path / "gpus_by_class.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "inference_demand_met" in (tmp_path / "table.txt").read_text()


@pytest.mark.parametrize(
    ("replicas", "expected"),
    [
        (12, {"job-0": (1,)}),  # free GPUs, then one DP replica of the elastic job
        (20, {"job-0": (1,), "job-1": ()}),  # ...then the lowest-priority preemptible job, whole
    ],
)
def test_tidal_policy_decides_like_the_operator_rebalancer(replicas, expected):
    """Same cluster, same placed training, same pool demand: the simulator's tidal policy and the
    operator's controller ask the same jobs to checkpoint, for the same DP replicas."""
    cluster = FakeCluster("nvl72", 4)
    specs = {
        "elastic": {
            "tp": 4,
            "ep": 16,
            "pp": 1,
            "dp": 2,
            "gpusPerPod": 4,
            "priority": 2,
            "preemptible": True,
            "elastic": {"minDP": 1, "maxDP": 2},
        },
        "batch": {"tp": 4, "ep": 16, "pp": 1, "dp": 1, "gpusPerPod": 4, "priority": 0, "preemptible": True},
        "pinned": {"tp": 4, "ep": 16, "pp": 1, "dp": 1, "gpusPerPod": 4, "priority": 0, "preemptible": False},
    }
    for name, spec in specs.items():
        cluster.add("TrainingJob", "ml", name, {**spec, "template": TEMPLATE})
    clock = FixedClock(dt.datetime(2026, 5, 1, 3, tzinfo=dt.UTC))
    # The simulator's workloads carry integer priorities: the operator honours them (--spec-priority).
    controller = Controller(cluster, clock, ControllerSettings(spec_priority=True))
    run(cluster, controller)
    placed = {name: cluster.status("TrainingJob", "ml", name) for name in specs}
    assert all(s["phase"] == "Running" for s in placed.values())

    # The simulator, in the same state.
    snapshot = snapshot_from_fleet(build_fleet("nvl72", 4))
    workload = Workload(1, {"m-large": [replicas] * 144, "m-mid": [0] * 144, "m-small": [0] * 144}, [], [])
    policy = Tidal(budget_share=None)  # the operator here runs without a disruption budget
    sim = Simulation(snapshot, workload, policy)
    for i, (name, spec) in enumerate(specs.items()):
        shape = JobShape(spec["tp"], spec["ep"], spec["pp"], spec["dp"], spec["gpusPerPod"], 1)
        arrival = TrainingArrival(
            i, 0.0, shape, 3600.0, spec["priority"], spec["preemptible"], (spec.get("elastic") or {}).get("minDP")
        )
        job = Job(arrival, dp=spec["dp"], remaining=1e9)
        sim.jobs[job.id] = job
        groups = [GroupAssignment(g["group"], g["supernode"], tuple(g["nodes"])) for g in placed[name]["placement"]]
        sim.start(job, PlacementPlan(GangRequest(job.id, len(groups), 64, 4), tuple(groups)), spec["dp"])
    sim_victims: dict[str, tuple] = {}
    original = sim.request_checkpoint
    sim.request_checkpoint = lambda job, replicas: (sim_victims.__setitem__(job.id, replicas), original(job, replicas))
    policy.make_room(sim, sim.pools["m-large"], replicas)

    # The operator, asked for the same replicas of 8 GPUs.
    cluster.add(
        "InferencePool",
        "serve",
        "m-large",
        {
            "minReplicas": replicas,
            "maxReplicas": replicas,
            "tp": 8,
            "gpusPerPod": 4,
            "priority": 1000,
            "template": TEMPLATE,
        },
    )
    run(cluster, controller, cycles=1)
    operator_victims = {}
    for i, name in enumerate(specs):
        eviction = cluster.status("TrainingJob", "ml", name).get("eviction")
        if eviction:
            operator_victims[f"job-{i}"] = tuple(eviction["replicas"])
    assert operator_victims == expected
    assert {k: tuple(v) for k, v in sim_victims.items()} == operator_victims


# -- costs ------------------------------------------------------------------------------------
DENSE = JobShape(8, 1, 1, 2, 4, 1)  # 16 GPUs: two DP replicas of one 8-GPU group
BIG_MODEL = JobShape(8, 1, 4, 2, 4, 1)  # four pipeline stages: a model four times the size


class Idle(Policy):
    """Admits nothing and changes nothing: tests drive the simulation by hand."""

    name = "idle"

    def admit(self, sim):
        pass


def hand_sim(costs=None, supernodes=2, spares=0, pools=None):
    snapshot = snapshot_for(build_fleet("nvl72", supernodes), spares)
    workload = Workload(1, pools or {"m-large": [0] * 144, "m-mid": [0] * 144, "m-small": [0] * 144}, [], [])
    return Simulation(snapshot, workload, Idle(), costs=costs)


def started(sim, shape=DENSE, job_id=0, priority=0, min_dp=1):
    arrival = TrainingArrival(job_id, sim.now, shape, 1e6, priority, True, min_dp)
    job = Job(arrival, dp=shape.dp, remaining=1e9)
    sim.jobs[job.id] = job
    plan = plan_gang(sim.snapshot, job_request(job, shape.dp))
    sim.start(job, plan, shape.dp)
    return job


def until(sim, t):
    """Process events up to time t, as Simulation.run does."""
    while sim._events and sim._events[0][0] <= t:
        at, _, kind, payload = heapq.heappop(sim._events)
        sim._account(at)
        sim.now = at
        getattr(sim, f"_on_{kind}")(payload)
    sim._account(t)
    sim.now = t


def test_checkpoint_time_grows_with_model_size_and_a_request_holds_the_gpus_that_long():
    costs = Costs()
    assert costs.save_s(BIG_MODEL, 16) == pytest.approx(4 * costs.save_s(DENSE, 16))  # same GPUs, 4x the bytes
    assert costs.save_s(BIG_MODEL, 64) > 60
    sim = hand_sim(costs)
    job = started(sim, BIG_MODEL)
    until(sim, 3600)
    sim.request_checkpoint(job, ())
    until(sim, 3600 + costs.save_s(BIG_MODEL, 64) - 1)
    assert job.state == "checkpointing" and job.gpus_held == 64
    until(sim, 3600 + costs.save_s(BIG_MODEL, 64) + 1)
    assert job.state == "queued" and job.gpus_held == 0


@pytest.mark.parametrize("how", ["shrink", "grow", "readmit", "first start"])
def test_every_resize_restart_and_readmission_costs_restore_time(how):
    costs = Costs()
    sim = hand_sim(costs)
    job = started(sim)
    assert job.state == "restoring"  # even a first start initializes before it trains
    until(sim, 1000)
    assert job.state == "running"
    if how == "shrink":
        sim.request_checkpoint(job, (1,))
        until(sim, 1000 + costs.save_s(DENSE, 16))
        stall, gpus = costs.restore_s(DENSE, 8), 8
    elif how == "grow":
        sim.request_checkpoint(job, (1,))
        until(sim, 2000)
        request = GangRequest(job.id, 1, 8, 4, group_ids=(1,))
        sim.grow(job, plan_gang(sim.snapshot, request), 2)
        stall, gpus = costs.save_s(DENSE, 8) + costs.restore_s(DENSE, 16), 16
    elif how == "readmit":
        sim.kill(job)
        until(sim, 2000)
        sim.start(job, plan_gang(sim.snapshot, job_request(job, 2)), 2)
        stall, gpus = costs.restore_s(DENSE, 16), 16
    else:
        stall, gpus = None, 16
    if stall is None:
        return
    begin, work = sim.now, sim.totals.useful_work
    assert job.state == "restoring" and job.gpus_held == gpus
    until(sim, begin + stall - 1)
    sim._progress(job)
    assert sim.totals.useful_work == work, "no progress while restoring"
    until(sim, begin + stall + 100)
    sim._progress(job)
    assert job.state == "running"
    assert sim.totals.useful_work == pytest.approx(work + 99 * gpus * (1 - job.overhead), rel=0.02)


def test_killed_without_a_checkpoint_request_loses_the_work_since_the_last_periodic_checkpoint():
    costs = Costs()
    sim = hand_sim(costs)
    job = started(sim)
    until(sim, costs.restart_s)  # running from here; periodic saves every 1800 s
    until(sim, costs.restart_s + 1800 + 600)
    rate = job.rate
    sim.kill(job)
    assert sim.totals.lost_preemption_gpu_s == pytest.approx(600 * rate)
    assert sim.totals.useful_work == pytest.approx(1800 * rate)


def test_periodic_checkpoints_slow_training():
    sim = hand_sim(Costs())
    job = started(sim)
    until(sim, 1000)
    assert 0 < job.overhead < 0.1 and job.rate < job.gpus_held
    free = hand_sim(FREE)
    other = started(free)
    until(free, 1000)
    assert other.rate == other.gpus_held


def test_an_inference_replica_serves_only_after_its_cold_start():
    costs = Costs()
    sim = hand_sim(costs, pools={"m-large": [2] * 144, "m-mid": [0] * 144, "m-small": [0] * 144})
    Policy.place_free(sim, sim.pools["m-large"], 2)
    until(sim, 600)
    assert sim.totals.served_gpu_s == pytest.approx((600 - costs.cold_start_s) * 16)
    assert sim.totals.slo_violation_s == pytest.approx(costs.cold_start_s)


def test_scale_down_removes_loading_replicas_last_started_first_then_the_newest():
    """remove_replicas (one pass since the speed work) keeps the rule of the old loop: replicas
    still in their cold start go first, the last in the list first, wherever they are; then the
    newest warm ones. The warm count kept between events follows every change."""
    sim = hand_sim(Costs(), pools={"m-small": [0] * 144, "m-mid": [0] * 144, "m-large": [0] * 144})
    pool = sim.pools["m-small"]
    Policy.place_free(sim, pool, 3)  # warm at 180
    until(sim, 300)
    assert pool.ready(sim.now) == 3
    Policy.place_free(sim, pool, 4)  # warm at 480
    warm, cold = pool.replicas[:3], pool.replicas[3:]
    # A loading replica ahead of the warm ones (a list order the engine may not make itself):
    # "from the end" and "loading first" then differ.
    pool.replicas = [cold[0], *warm, *cold[1:]]
    pool.changed()
    assert pool.ready(sim.now) == 3
    sim.remove_replicas(pool, 4)
    assert pool.replicas == [cold[0], *warm], "loading replicas go first, the last one first"
    sim.remove_replicas(pool, 2)
    assert pool.replicas == warm[:2], "the loading one at the front, then the newest warm one"
    assert pool.ready(sim.now) == 2
    sim.check_conservation()
    Policy.place_free(sim, pool, 1)
    assert pool.ready(sim.now) == 2
    until(sim, 700)
    assert pool.ready(sim.now) == 3


def test_parallel_policies_give_the_same_results_as_one_process():
    one = run_scenario(Scenario(gpus=1440, days=1, seed=4), ["tidal", "autoscale-preempt"], jobs=1)
    two = run_scenario(Scenario(gpus=1440, days=1, seed=4), ["tidal", "autoscale-preempt"], jobs=2)
    assert one["policies"] == two["policies"] and one["series"] == two["series"]
    assert list(two["policies"]) == ["tidal", "autoscale-preempt"]


def test_a_failure_replaces_only_the_broken_group_on_a_hot_spare_of_its_supernode():
    costs = Costs()
    sim = hand_sim(costs, supernodes=1, spares=2)
    job = started(sim, JobShape(8, 1, 1, 4, 4, 1))
    until(sim, 5000)
    before = {g.group: g for g in job.groups}
    broken = before[2]
    sim._on_failure(Failure(5000, sim.node_names.index(broken.nodes[0]), "GPU", "Faulty GPU", 3600))
    after = {g.group: g for g in job.groups}
    assert {g: after[g] for g in (0, 1, 3)} == {g: before[g] for g in (0, 1, 3)}, "healthy groups stay"
    assert all(sim.snapshot.nodes[n].spare for n in after[2].nodes), "hot spares first"
    assert job.state == "restoring" and sim.totals.group_restarts == 1
    assert sim.totals.lost_failures_gpu_s > 0
    sim.check_conservation()


# -- hysteresis, grow-back ------------------------------------------------------------------
def test_demand_10_4_10_4_does_not_flap():
    """Pool demand alternating 10 and 4 replicas every tick: the pool holds 10 (the
    stabilization window is longer than the tick), training is asked once, and nothing flaps."""
    fleet = build_fleet("nvl72", 2)
    workload = Workload(1, {"m-large": [10, 4] * 72, "m-mid": [0] * 144, "m-small": [0] * 144}, [], [])
    policy = Tidal(budget_share=None)
    sim = Simulation(snapshot_from_fleet(fleet), workload, policy)
    job = started(sim, JobShape(8, 1, 1, 16, 4, 1), min_dp=4)  # 128 GPUs, elastic down to 32
    sizes = []
    original = policy.tick

    def tick(s):
        original(s)
        sizes.append(len(s.pools["m-large"].replicas))

    policy.tick = tick
    sim.run()
    assert sizes[3:] == [10] * len(sizes[3:]), "the pool never shrinks between the peaks"
    assert sim.totals.shrinks <= 1 and sim.totals.flaps == 0 and sim.totals.grow_backs == 0
    assert job.state in ("running", "restoring")


def shrunk_and_queued(shrunk_priority, queued_priority, room_replicas):
    """A job at dp 1 of 4 (8-GPU replicas) and a queued job of one 8-GPU group, with room for
    `room_replicas` replicas of 8 GPUs."""
    sim = hand_sim(FREE, supernodes=1)
    policy = Tidal(budget_share=None, grow_cooldown_s=0)
    sim.policy = policy
    shrunk = started(sim, JobShape(8, 1, 1, 4, 4, 1), job_id=1, priority=shrunk_priority)
    until(sim, 1000)
    sim.request_checkpoint(shrunk, (1, 2, 3))
    until(sim, 2000)
    assert shrunk.dp == 1 and shrunk.state == "running"
    filler = started(sim, JobShape(8, 1, 1, 8 - room_replicas, 4, 1), job_id=9, priority=3)
    filler.arrival = dataclasses.replace(filler.arrival, preemptible=False)
    arrival = TrainingArrival(2, sim.now, JobShape(8, 1, 1, 1, 4, 1), 1e6, queued_priority, True, None)
    queued = Job(arrival, dp=1, remaining=1e9)
    sim.jobs[queued.id] = queued
    sim.queue.append(queued)
    assert sim.snapshot.free_gpus() == 8 * room_replicas
    return sim, policy, shrunk, queued


def test_admission_of_higher_priority_work_comes_before_grow_back():
    sim, policy, shrunk, queued = shrunk_and_queued(shrunk_priority=1, queued_priority=3, room_replicas=1)
    policy.admit(sim)
    assert queued.state == "restoring" and shrunk.dp == 1
    sim, policy, shrunk, queued = shrunk_and_queued(shrunk_priority=3, queued_priority=1, room_replicas=1)
    policy.admit(sim)
    assert queued.state == "queued" and shrunk.dp == 2


def test_grow_back_is_partial_when_not_all_replicas_fit():
    sim, policy, shrunk, queued = shrunk_and_queued(shrunk_priority=3, queued_priority=0, room_replicas=2)
    sim.queue.remove(queued)
    policy.admit(sim)
    assert shrunk.dp == 3 and shrunk.gpus_held == 24 and sim.totals.grow_backs == 1


def uncached_gangs(sim):
    for job in sim.jobs.values():
        job.gang = None
    return sim.running_gangs()


def test_running_gangs_follow_every_shrink_grow_and_re_placement():
    """running_gangs reuses a job's RunningGang while it has not moved; a stale one would offer
    the capacity planner replicas the job no longer holds (or hide the ones it grew)."""
    sim = hand_sim(FREE)
    job = started(sim, JobShape(8, 1, 1, 4, 4, 1), min_dp=1)
    until(sim, 1000)
    first = sim.running_gangs()
    assert len(first[0].replicas) == 4 and sim.running_gangs()[0] is first[0]  # unchanged: reused
    sim.request_checkpoint(job, (2, 3))
    until(sim, 2000)
    shrunk = sim.running_gangs()
    assert len(shrunk[0].replicas) == 2 and shrunk == uncached_gangs(sim)
    request = GangRequest(job.id, 2, 8, 4, group_ids=(2, 3))
    sim.grow(job, plan_gang(sim.snapshot, request), 4)
    grown = sim.running_gangs()
    assert len(grown[0].replicas) == 4 and grown == uncached_gangs(sim)
    until(sim, 3000)
    node = next(iter(dict(grown[0].replicas[0])))
    sim.snapshot.update_node(node, ready=False)
    sim._fail(job, [g for g in job.groups if node in g.nodes])
    moved = sim.running_gangs()
    assert node not in dict(moved[0].replicas[0]) and moved == uncached_gangs(sim)


def test_admission_counts_fitting_groups_afresh_in_every_pass():
    """A pass skips plan_gang for requests larger than what it last counted as fitting, but a
    smaller one still gets its try, and the next pass counts again once GPUs came back."""
    sim = hand_sim(FREE, supernodes=4)
    sim.policy = policy = Policy()
    nodes = {sn: list(sim.snapshot.supernodes[sn].nodes) for sn in sim.snapshot.supernodes}
    for members in nodes.values():  # 4 free GPUs per supernode: 16 free, room for no 8-GPU group
        for name in members[1:]:
            sim.snapshot.allocate(name, 4)
    one_group = JobShape(8, 1, 1, 1, 4, 1)
    job = Job(TrainingArrival(1, 0.0, one_group, 1e6, 5, True, None), dp=1, remaining=1e9)
    sim.jobs[job.id] = job
    sim.queue.append(job)
    policy.admit(sim)
    assert job.state == "queued"
    first, second = list(nodes)[:2]
    sim.snapshot.release(nodes[first][1], 4)
    policy.admit(sim)
    assert job.state == "restoring"
    sim.snapshot.release(nodes[second][1], 4)  # 16 free GPUs again, room for one 8-GPU group, not two
    two = Job(TrainingArrival(2, 0.0, JobShape(8, 1, 1, 2, 4, 1), 1e6, 5, True, None), dp=2, remaining=1e9)
    small = Job(TrainingArrival(3, 0.0, one_group, 1e6, 1, True, None), dp=1, remaining=1e9)
    for j in (two, small):
        sim.jobs[j.id] = j
        sim.queue.append(j)
    policy.admit(sim)
    assert two.state == "queued" and small.state == "restoring"


def test_first_fit_admission_counts_free_pods_afresh_in_every_pass():
    """First fit's refusal counts the free pod slots; a smaller request still gets its try, and
    the next pass asks again once GPUs came back."""
    sim = hand_sim(FREE, supernodes=1)
    sim.policy = policy = POLICIES["first-fit"]()
    names = list(sim.snapshot.nodes)
    for name in names[3:]:
        sim.snapshot.allocate(name, 4)
    sim.snapshot.allocate(names[1], 2)
    sim.snapshot.allocate(names[2], 2)  # 8 free GPUs, one free 4-GPU pod slot
    two_pods = Job(TrainingArrival(1, 0.0, JobShape(8, 1, 1, 1, 4, 1), 1e6, 5, True, None), dp=1, remaining=1e9)
    one_pod = Job(TrainingArrival(2, 0.0, JobShape(4, 1, 1, 1, 4, 1), 1e6, 1, True, None), dp=1, remaining=1e9)
    refusal = policy.planner(sim.snapshot, job_request(two_pods, 1))
    assert refusal.details["pods_fitting_now"] == 1
    for j in (two_pods, one_pod):
        sim.jobs[j.id] = j
        sim.queue.append(j)
    policy.admit(sim)
    assert two_pods.state == "queued" and one_pod.state == "restoring"
    sim.snapshot.release(names[1], 2)
    sim.snapshot.release(names[2], 2)
    policy.admit(sim)
    assert two_pods.state == "restoring"


def test_the_forecast_follows_the_time_and_the_workload():
    """tidal's forecast is kept for the current time: a kept one must not outlive the time (nor
    serve another simulation's workload)."""
    day = [2] * 48 + [2 + k for k in range(12)] + [14] * 84  # a two-hour rise from 08:00
    sim = hand_sim(pools={"m-large": day * 2, "m-mid": [0] * 288, "m-small": [0] * 288})
    pool = sim.pools["m-large"]
    policy = Tidal()
    seen = []
    for hour in (7, 7, 8.1, 12):  # 08:06: the rise within the lead (~10 min: save, sync, cold start)
        sim.now = 86400 + hour * 3600
        seen.append(policy.forecast(sim, pool))
        assert seen[-1] == policy._forecast(sim, pool)
    assert seen[0] == seen[1] and len(set(seen)) == 3, seen
    other = hand_sim(pools={"m-large": [5] * 288, "m-mid": [0] * 288, "m-small": [0] * 288})
    other.now = sim.now
    assert policy.forecast(other, other.pools["m-large"]) == 5 != seen[-1]


# -- shapes, quick mode -----------------------------------------------------------------------
@pytest.mark.parametrize("shape", ["nvl72", "cm384", "hgx8", "mixed"])
def test_no_shape_leaves_most_of_its_gpus_idle_under_full_load(shape):
    result = run_scenario(Scenario(shape=shape, gpus=3000, days=1, seed=3), ["tidal"])
    tidal = result["policies"]["tidal"]
    assert tidal["gpus_idle"] < 0.3 * result["gpus"], tidal
    assert tidal["gpu_utilization"] > 0.5, tidal
    assert tidal["inference_demand_met"] > 0.95, tidal


def test_quick_run_of_the_five_policies():
    result = run_scenario(Scenario(gpus=1440, days=1, seed=2), list(DEFAULT_POLICIES), check=True)
    assert set(result["policies"]) == {"autoscale-preempt", "static-split", "topology-only", "first-fit", "tidal"}
    for name, r in result["policies"].items():
        assert r["goodput_gpu_hours"] > 0 and 0 < r["inference_demand_met"] <= 1, name
        assert {"evictions", "flaps", "inference_slo_violation_minutes"} <= set(r)


def test_the_graceful_baseline_saves_before_it_goes_and_so_loses_nothing_to_preemption():
    # The plain baseline kills at once; a careful Kueue/KAI user gives a preempted pod a grace
    # period long enough to save. Same preemption otherwise: whole gangs, so evictions happen.
    result = run_scenario(SMALL, ["autoscale-preempt", "autoscale-preempt-graceful"], jobs=1, check=True)
    plain, graceful = result["policies"]["autoscale-preempt"], result["policies"]["autoscale-preempt-graceful"]
    assert plain["evictions"] > 0 and plain["lost_gpu_hours_preemption"] > 0
    assert graceful["evictions"] > 0 and graceful["lost_gpu_hours_preemption"] == 0
    assert graceful["shrinks"] == 0 and graceful["grow_backs"] == 0, "no elastic shrink: still the baseline"


@pytest.mark.parametrize(("policy", "dp"), [("autoscale-preempt-graceful", 6), ("autoscale-preempt", None)])
def test_the_graceful_baseline_admits_an_elastic_job_at_a_smaller_size_like_kueue_partial_admission(policy, dp):
    sim = hand_sim()  # 144 GPUs
    started(sim, JobShape(8, 1, 1, 12, 4, 1))  # 96 held, 48 free
    shape = JobShape(8, 1, 1, 8, 4, 1)  # 64 GPUs in 8-GPU DP replicas: 6 of its 8 fit
    job = Job(TrainingArrival(1, sim.now, shape, 1e6, 0, True, 2), dp=shape.dp, remaining=1e9)
    sim.jobs[job.id] = job
    sim.queue.append(job)
    POLICIES[policy]().admit(sim)
    assert (job.dp if job.state != "queued" else None) == dp
