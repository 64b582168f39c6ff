"""Run the policies side by side on the same fleet and workload; the table, JSON and plots."""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from tidal.sim.engine import Simulation, Totals
from tidal.sim.policies import POLICIES
from tidal.sim.workload import build_workload
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


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def summarize(totals: Totals, total_gpus: int, seconds: float) -> dict[str, float]:
    capacity = total_gpus * seconds
    return {
        # Busy GPUs: training, plus inference replicas that the demand actually needs.
        "gpu_utilization": round((totals.training_gpu_s + totals.inference_used_gpu_s) / capacity, 4),
        "training_gpu_hours": round(totals.useful_work / 3600, 1),
        "inference_demand_met": round(totals.served_gpu_windows / totals.demanded_gpu_windows, 4)
        if totals.demanded_gpu_windows
        else 1.0,
        "job_wait_p50_s": round(percentile(totals.waits, 0.5), 1),
        "job_wait_p95_s": round(percentile(totals.waits, 0.95), 1),
        "jobs_started": len(totals.waits),
        "hbd_split_groups": totals.split_groups,
        "lost_gpu_hours_failures": round(totals.lost_failures_gpu_s / 3600, 1),
        "lost_gpu_hours_preemption": round(totals.lost_preemption_gpu_s / 3600, 1),
        "gpus_idle": round(totals.idle_gpu_s / seconds, 1),
    }


def run_scenario(scenario: Scenario, policies: list[str] | None = None, check: bool = False) -> dict:
    started = time.perf_counter()
    fleet = fleet_for_gpus(scenario.shape, scenario.gpus)
    nodes = sum(len(sn.nodes) for sn in fleet)
    gpus = sum(sn.shape.gpus for sn in fleet)
    workload = build_workload(
        cluster_gpus=gpus,
        nodes=nodes,
        days=scenario.days,
        seed=scenario.seed,
        inference_peak_share=scenario.inference_peak_share,
        training_load_share=scenario.training_load_share,
        traces_dir=scenario.traces_dir,
    )
    results, series = {}, {}
    for name in policies or list(POLICIES):
        sim = Simulation(snapshot_from_fleet(fleet), workload, POLICIES[name]())
        totals = sim.run()
        if check:
            sim.check_conservation()
        results[name] = summarize(totals, gpus, sim.end)
        series[name] = totals.samples
    return {
        "wall_s": round(time.perf_counter() - started, 1),
        "gpus": gpus,
        "nodes": nodes,
        "shape": scenario.shape,
        "days": scenario.days,
        "seed": scenario.seed,
        "training_jobs": len(workload.arrivals),
        "failures": len(workload.failures),
        "policies": results,
        "series": series,
    }


COLUMNS = (
    "gpu_utilization",
    "training_gpu_hours",
    "inference_demand_met",
    "job_wait_p50_s",
    "job_wait_p95_s",
    "hbd_split_groups",
    "lost_gpu_hours_failures",
    "lost_gpu_hours_preemption",
    "gpus_idle",
)


def table(result: dict) -> str:
    names = list(result["policies"])
    width = max(len(c) for c in COLUMNS)
    lines = [f"{'':<{width}}  " + "  ".join(f"{n:>14}" for n in names)]
    for column in COLUMNS:
        lines.append(f"{column:<{width}}  " + "  ".join(f"{result['policies'][n][column]:>14}" for n in names))
    return "\n".join(lines)


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
