"""Run the policies side by side on the same fleet and workload; the table, JSON and plots."""

from __future__ import annotations

import json
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tidal.sim.engine import Costs, Simulation, Totals
from tidal.sim.policies import DEFAULT_POLICIES, POLICIES
from tidal.sim.workload import Workload, build_workload
from tidal.topology import fleet_for_gpus, snapshot_from_fleet


@dataclass(frozen=True)
class Scenario:
    shape: str = "nvl72"
    gpus: int = 72_000
    days: int = 7
    seed: int = 7
    inference_peak_share: float = 0.4
    training_load_share: float = 1.0
    traces_dir: Path | None = None
    spares_per_supernode: int = 0
    """Hot-spare nodes per supernode (used only to re-place failed groups)."""
    costs: Costs = field(default_factory=Costs)
    live_share: float = 0.0
    """Share of elastic jobs that resize Live (the TrainingJob's spec.elastic.resize); the rest Restart."""
    window_offset_days: int = 0
    """Start the traces this many days in (another week of ServeGen and Helios)."""
    bursts: bool = True
    """Inference demand per minute with the Azure trace's bursts (False: each 10-minute mean)."""
    training_preemption: bool = True
    """A queued training job may evict lower-priority preemptible training, as the operator's
    admission does and Kueue (withinClusterQueue: LowerPriority) and KAI do: autoscale-preempt
    kills whole gangs, tidal checkpoints first and shrinks before it suspends; the static
    policies never preempt training. False: the model before it (pools alone preempt)."""


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(totals: Totals, total_gpus: int, seconds: float) -> dict[str, float]:
    capacity = total_gpus * seconds
    return {
        # Useful work only: training goodput plus warm inference replicas the demand needs.
        "gpu_utilization": round((totals.useful_work + totals.inference_used_gpu_s) / capacity, 4),
        "goodput_gpu_hours": round(totals.useful_work / 3600, 1),
        "training_gpu_hours": round(totals.useful_work / 3600, 1),  # the same; kept for old readers
        "inference_demand_met": round(totals.served_gpu_s / totals.demanded_gpu_s, 4) if totals.demanded_gpu_s else 1.0,
        "inference_slo_violation_minutes": round(totals.slo_violation_s / 60, 1),
        "evictions": totals.evictions,
        "shrinks": totals.shrinks,
        "grow_backs": totals.grow_backs,
        "flaps": totals.flaps,
        # A flap by its definition: GPUs back to the same job within the hour of the eviction's
        # decision, or an inference replica added and removed within the hour.
        "flaps_real": totals.flaps_jobs + totals.flaps_replicas,
        "flaps_jobs": totals.flaps_jobs,
        "flaps_replicas": totals.flaps_replicas,
        "live_shrinks": totals.live_shrinks,
        "live_grow_backs": totals.live_grow_backs,
        "budget_limited": totals.budget_limited,
        # Arrival to first start; a job never started counts with its wait up to the horizon.
        "job_wait_p50_s": round(percentile(totals.waits + totals.waits_unstarted, 0.5), 1),
        "job_wait_p95_s": round(percentile(totals.waits + totals.waits_unstarted, 0.95), 1),
        "job_wait_p99_s": round(percentile(totals.waits + totals.waits_unstarted, 0.99), 1),
        "jobs_started": len(totals.waits),
        "jobs_never_started": len(totals.waits_unstarted),
        "hbd_split_groups": totals.split_groups,
        "failure_restarts": totals.restarts,
        "group_restarts": totals.group_restarts,
        "lost_gpu_hours_failures": round(totals.lost_failures_gpu_s / 3600, 1),
        "lost_gpu_hours_preemption": round(totals.lost_preemption_gpu_s / 3600, 1),
        "stalled_gpu_hours": round(totals.stalled_gpu_s / 3600, 1),
        "cold_start_gpu_hours": round(totals.cold_gpu_s / 3600, 1),
        "inference_demanded_gpu_hours": round(totals.demanded_gpu_s / 3600, 1),
        # Where the GPU-hours went (they add up to the usable GPU-hours): the goodput breakdown.
        "training_held_gpu_hours": round(totals.training_gpu_s / 3600, 1),
        "inference_held_gpu_hours": round(totals.inference_gpu_s / 3600, 1),
        "inference_ahead_of_demand_gpu_hours": round(
            (totals.inference_gpu_s - totals.inference_used_gpu_s - totals.cold_gpu_s) / 3600, 1
        ),
        "training_overhead_gpu_hours": round(
            (
                totals.training_gpu_s
                - totals.useful_work
                - totals.stalled_gpu_s
                - totals.lost_preemption_gpu_s
                - totals.lost_failures_gpu_s
            )
            / 3600,
            1,
        ),
        "gpus_idle": round(totals.idle_gpu_s / seconds, 1),
    }


def build(scenario: Scenario) -> tuple[list, Workload]:
    fleet = fleet_for_gpus(scenario.shape, scenario.gpus)
    kinds: dict[str, int] = {}
    for sn in fleet:
        kinds[sn.shape.kind] = kinds.get(sn.shape.kind, 0) + sn.shape.gpus
    workload = build_workload(
        cluster_gpus=sum(kinds.values()),
        nodes=sum(len(sn.nodes) for sn in fleet),
        days=scenario.days,
        seed=scenario.seed,
        inference_peak_share=scenario.inference_peak_share,
        training_load_share=scenario.training_load_share,
        traces_dir=scenario.traces_dir,
        kinds=kinds,
        live_share=scenario.live_share,
        window_offset_days=scenario.window_offset_days,
        bursts=scenario.bursts,
    )
    return fleet, workload


def snapshot_for(fleet: list, spares: int):
    snapshot = snapshot_from_fleet(fleet)
    if spares:
        for sn in fleet:
            if len(sn.nodes) > spares:
                for node in sn.nodes[-spares:]:
                    snapshot.update_node(node.name, spare=True)
    return snapshot


def run_policy(scenario: Scenario, name: str, fleet: list, workload: Workload, check: bool = False):
    policy = POLICIES[name]()
    policy.training_preemption = scenario.training_preemption
    sim = Simulation(snapshot_for(fleet, scenario.spares_per_supernode), workload, policy, costs=scenario.costs)
    totals = sim.run()
    if check:
        sim.check_conservation()
    return sim, totals


# Longest first, so two processes finish together: the autoscaled policies re-plan capacity
# every tick, the static ones only place training.
_COST_ORDER = (
    "tidal",
    "tidal-burst",
    "tidal-whole",
    "tidal-reactive",
    "tidal-no-restart-shrink",
    "tidal-reactive-no-restart-shrink",
    "autoscale-preempt-graceful",
    "autoscale-preempt",
    "static-split",
    "topology-only",
    "first-fit",
)


@lru_cache(maxsize=4)
def _built(scenario: Scenario) -> tuple[list, Workload]:
    # A worker process runs several policies of one scenario: the fleet and workload are built
    # once per process (deterministic for the scenario, so every policy sees the same ones).
    return build(scenario)


def _policy_task(task: tuple[Scenario, str, bool]) -> dict:
    scenario, name, check = task
    fleet, workload = _built(scenario)
    t0, c0 = time.perf_counter(), time.process_time()
    sim, totals = run_policy(scenario, name, fleet, workload, check)
    gpus = sum(sn.shape.gpus for sn in fleet)
    return {
        "summary": summarize(totals, gpus, sim.end),
        "samples": totals.samples,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
    }


def run_scenarios(
    scenarios: list[Scenario], policies: list[str] | None = None, check: bool = False, jobs: int = 1
) -> list[dict]:
    """run_scenario for each scenario; with jobs > 1 every (scenario, policy) pair runs in a pool
    of that many processes. The results do not depend on `jobs`: each policy's run is a separate
    deterministic simulation of the same fleet and workload."""
    started = time.perf_counter()
    names = list(policies or DEFAULT_POLICIES)
    tasks = [(s, n, check) for s in scenarios for n in names]
    if jobs > 1 and len(tasks) > 1:
        rank = {n: i for i, n in enumerate(_COST_ORDER)}
        # Scenario by scenario (a worker then builds few workloads), the longest policies first.
        by_cost = sorted(range(len(tasks)), key=lambda i: (i // len(names), rank.get(tasks[i][1], len(rank)), i))
        with ProcessPoolExecutor(min(jobs, len(tasks))) as pool:
            done = dict(zip(by_cost, pool.map(_policy_task, [tasks[i] for i in by_cost]), strict=True))
        outs = [done[i] for i in range(len(tasks))]
    else:
        outs = [_policy_task(t) for t in tasks]
    wall = time.perf_counter() - started
    results = []
    for k, scenario in enumerate(scenarios):
        mine = outs[k * len(names) : (k + 1) * len(names)]
        fleet, workload = _built(scenario)
        policies_out = {n: o["summary"] for n, o in zip(names, mine, strict=True)}
        results.append(
            {
                # Whole set's wall time when run alone, else this scenario's share of the pool's.
                "wall_s": round(wall / len(scenarios), 1),
                "wall_s_by_policy": {n: round(o["wall_s"], 1) for n, o in zip(names, mine, strict=True)},
                "cpu_s_by_policy": {n: round(o["cpu_s"], 1) for n, o in zip(names, mine, strict=True)},
                "gpus": sum(sn.shape.gpus for sn in fleet),
                "nodes": sum(len(sn.nodes) for sn in fleet),
                "shape": scenario.shape,
                "days": scenario.days,
                "seed": scenario.seed,
                "inference_peak_share": scenario.inference_peak_share,
                "training_load_share": scenario.training_load_share,
                "training_jobs": len(workload.arrivals),
                "failures": len(workload.failures),
                "policies": policies_out,
                "lead_vs_autoscale_preempt": lead(policies_out),
                "series": {n: o["samples"] for n, o in zip(names, mine, strict=True)},
            }
        )
    return results


def run_scenario(scenario: Scenario, policies: list[str] | None = None, check: bool = False, jobs: int = 1) -> dict:
    """The policies side by side on one fleet and workload; `jobs` processes run them in parallel."""
    return run_scenarios([scenario], policies, check, jobs)[0]


def lead(results: dict[str, dict]) -> float | None:
    """tidal goodput / autoscale-preempt goodput, when tidal meets at least as much inference
    demand (else None: no lead is claimed)."""
    t, a = results.get("tidal"), results.get("autoscale-preempt")
    if not t or not a or not a["goodput_gpu_hours"]:
        return None
    if t["inference_demand_met"] < a["inference_demand_met"]:
        return None
    return round(t["goodput_gpu_hours"] / a["goodput_gpu_hours"], 3)


def over_seeds(runs: list[dict]) -> dict:
    """Mean and spread (min, max) of every figure over the runs of several seeds."""
    out: dict = {"seeds": [r["seed"] for r in runs], "policies": {}}
    for name in runs[0]["policies"]:
        out["policies"][name] = {}
        for key in runs[0]["policies"][name]:
            values = [r["policies"][name][key] for r in runs]
            out["policies"][name][key] = {
                "mean": round(statistics.fmean(values), 4),
                "min": min(values),
                "max": max(values),
            }
    leads = [r["lead_vs_autoscale_preempt"] for r in runs]
    out["lead_vs_autoscale_preempt"] = (
        {"mean": round(statistics.fmean(leads), 3), "min": min(leads), "max": max(leads)}
        if leads and all(x is not None for x in leads)
        else None
    )
    for baseline in ("autoscale-preempt", "autoscale-preempt-graceful"):
        ratios = [
            r["policies"]["tidal"]["goodput_gpu_hours"] / r["policies"][baseline]["goodput_gpu_hours"]
            for r in runs
            if "tidal" in r["policies"] and baseline in r["policies"]
        ]
        out[f"goodput_ratio_tidal_vs_{baseline.replace('-', '_')}"] = (
            {"mean": round(statistics.fmean(ratios), 3), "min": round(min(ratios), 3), "max": round(max(ratios), 3)}
            if ratios
            else None
        )
        # Unlike lead(), the ratio is printed whatever inference got: say in how many seeds tidal
        # met less of the demand, so a goodput lead bought with inference is not read as a win.
        out[f"seeds_tidal_met_less_inference_than_{baseline.replace('-', '_')}"] = sum(
            r["policies"]["tidal"]["inference_demand_met"] < r["policies"][baseline]["inference_demand_met"]
            for r in runs
            if "tidal" in r["policies"] and baseline in r["policies"]
        )
    return out


COLUMNS = (
    "gpu_utilization",
    "goodput_gpu_hours",
    "inference_demand_met",
    "inference_slo_violation_minutes",
    "evictions",
    "shrinks",
    "grow_backs",
    "flaps",
    "flaps_real",
    "flaps_jobs",
    "flaps_replicas",
    "budget_limited",
    "job_wait_p50_s",
    "job_wait_p95_s",
    "job_wait_p99_s",
    "jobs_never_started",
    "hbd_split_groups",
    "failure_restarts",
    "lost_gpu_hours_failures",
    "lost_gpu_hours_preemption",
    "stalled_gpu_hours",
    "cold_start_gpu_hours",
    # where the GPU-hours went (the goodput breakdown)
    "training_held_gpu_hours",
    "training_overhead_gpu_hours",
    "inference_held_gpu_hours",
    "inference_ahead_of_demand_gpu_hours",
    "gpus_idle",
)


def table(result: dict) -> str:
    names = list(result["policies"])
    width = max(len(c) for c in COLUMNS)
    lines = [f"{'':<{width}}  " + "  ".join(f"{n:>17}" for n in names)]
    for column in COLUMNS:
        cells = []
        for n in names:
            v = result["policies"][n][column]
            if isinstance(v, dict):  # over seeds: mean and spread
                half = (v["max"] - v["min"]) / 2
                cells.append(f"{_fmt(v['mean'])}±{_fmt(half)}")
            else:
                cells.append(str(v))
        lines.append(f"{column:<{width}}  " + "  ".join(f"{c:>17}" for c in cells))
    return "\n".join(lines)


def _fmt(v: float) -> str:
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    return f"{v:.4g}"


def write_outputs(result: dict, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "table.txt", out / "results.json"]
    written[0].write_text(table(result) + "\n")
    written[1].write_text(json.dumps({k: v for k, v in result.items() if k != "series"}, indent=2) + "\n")
    written += plot(result, out)
    return written


def plot(result: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["series"])
    fig, axes = plt.subplots(len(names), 1, figsize=(11, 2.6 * len(names)), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names, strict=True):
        s = result["series"][name]
        hours = [p["t"] / 3600 for p in s]
        ax.stackplot(
            hours,
            [p["inference"] for p in s],
            [p["training"] for p in s],
            [p["idle"] for p in s],
            [p["failed"] for p in s],
            labels=["inference", "training", "idle", "failed"],
            colors=["#d95f02", "#1b9e77", "#d9d9d9", "#e7298a"],
        )
        ax.set_title(f"{name}: GPUs by class", fontsize=10)
        ax.set_ylabel("GPUs")
        ax.set_ylim(0, result["gpus"])
    axes[0, 0].legend(loc="upper right", ncol=4, fontsize=8)
    axes[-1, 0].set_xlabel("hours since the start of the trace (local time of the ServeGen day 0)")
    fig.suptitle(f"{result['gpus']:,} GPUs ({result['shape']}), {result['days']} days, seed {result['seed']}")
    fig.tight_layout()
    by_class = out / "gpus_by_class.png"
    fig.savefig(by_class, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(11, 3.5))
    for name in names:
        s = result["series"][name]
        hourly = _hourly_means([(p["t"], p["stranded_free"]) for p in s])
        ax.plot([h for h, _ in hourly], [v for _, v in hourly], label=name, linewidth=1.2)
    ax.set_title("Fragmentation: free GPUs stranded in supernodes with fewer than 64 free (hourly mean)")
    ax.set_xlabel("hours since the start of the trace")
    ax.set_ylabel("stranded free GPUs")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fragmentation = out / "fragmentation.png"
    fig.savefig(fragmentation, dpi=110)
    plt.close(fig)
    return [by_class, fragmentation]


def _hourly_means(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    buckets: dict[int, list[float]] = {}
    for t, v in points:
        buckets.setdefault(int(t // 3600), []).append(v)
    return [(h, statistics.fmean(vs)) for h, vs in sorted(buckets.items())]
