"""The simulator: deterministic for a seed, conserving GPUs and jobs, and deciding as the
operator's rebalancer does for the same state."""

import dataclasses
import datetime as dt
import json

import pytest

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller
from tidal.placement import GangRequest, GroupAssignment, PlacementPlan
from tidal.placement.workload_mix import JobShape
from tidal.sim.engine import Job, Simulation
from tidal.sim.policies import POLICIES, Tidal
from tidal.sim.run import Scenario, run_scenario, write_outputs
from tidal.sim.workload import TrainingArrival, Workload, build_workload
from tidal.topology import build_fleet, snapshot_from_fleet

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE, run

SMALL = Scenario(gpus=2880, days=1, seed=11)


def test_same_seed_same_results_and_another_seed_differs():
    a = run_scenario(SMALL)
    b = run_scenario(SMALL)
    for r in (a, b):
        r.pop("wall_s")
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
    controller = Controller(cluster, clock)
    run(cluster, controller)
    placed = {name: cluster.status("TrainingJob", "ml", name) for name in specs}
    assert all(s["phase"] == "Running" for s in placed.values())

    # The simulator, in the same state.
    snapshot = snapshot_from_fleet(build_fleet("nvl72", 4))
    workload = Workload(1, {"m-large": [replicas] * 144, "m-mid": [0] * 144, "m-small": [0] * 144}, [], [])
    policy = Tidal()
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
    policy.grow(sim, sim.pools["m-large"], replicas)

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
