"""Simulator benchmark: 7 days on 72,000 GPUs of NVL72 racks, the five policies side by side,
over several seeds (mean and spread).

    python -m bench.sim [--json] [--days 7] [--gpus 72000] [--seeds 7,8,9] [--shape nvl72]
    python -m bench.sim --quick          # CI smoke: 1,440 GPUs, 1 day, one seed
    python -m bench.sim --sweep          # offered training load 50/80/100/120%, inference peak 0.2/0.4/0.6
    python -m bench.sim --live-share 0.5 # half the elastic jobs resize Live (spec.elastic.resize)
    python -m bench.sim --window-offset-days 2   # the traces from two days later (another window)

Prints (or with --json, one JSON object): per policy the mean over seeds of goodput_gpu_hours
(training progress after every cost), inference_demand_met, inference_slo_violation_minutes,
evictions, flaps (the old count), flaps_real (by the definition: GPUs back to the same job within
the hour of the eviction's decision, or a replica added and removed within it), job_wait_p50_s /
p95 / p99 (jobs never started counted at the horizon) and the rest of tidal.sim.run.summarize;
`spread` (min, max per figure);
lead_vs_autoscale_preempt = tidal goodput / autoscale-preempt goodput (mean over seeds; null if
tidal met less inference demand in some seed); goodput_ratio_tidal_vs_autoscale_preempt and,
with `--policy autoscale-preempt-graceful` (the baseline whose preempted gangs save within a grace
period, not in the default five), goodput_ratio_tidal_vs_autoscale_preempt_graceful (mean, min,
max over seeds); wall_s per seed for the whole policy set; and the job mix's shares of jobs and
of offered GPU-time.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from tidal.sim.policies import DEFAULT_POLICIES, POLICIES
from tidal.sim.run import Scenario, over_seeds, run_scenarios, table, write_outputs
from tidal.sim.workload import mix_gpu_time_shares

SWEEP_LOADS = (0.5, 0.8, 1.0, 1.2)
SWEEP_PEAKS = (0.2, 0.4, 0.6)


def run_seeds(base: Scenario, seeds: list[int], policies: list[str], jobs: int = 2, out: Path | None = None) -> dict:
    """Mean and spread over the seeds; with `out`, the first seed's table, JSON and plots go there
    (as `tidal sim --out` writes them), from the same runs."""
    runs = run_scenarios([dataclasses.replace(base, seed=s) for s in seeds], policies, jobs=jobs)
    if out is not None:
        write_outputs(runs[0], out)
    return _aggregate(base, seeds, runs)


def _aggregate(base: Scenario, seeds: list[int], runs: list[dict]) -> dict:
    for r in runs:
        r.pop("series")
    agg = over_seeds(runs)
    return {
        "gpus": runs[0]["gpus"],
        "shape": base.shape,
        "days": base.days,
        "seeds": seeds,
        "inference_peak_share": base.inference_peak_share,
        "training_load_share": base.training_load_share,
        "live_share": base.live_share,
        "window_offset_days": base.window_offset_days,
        "bursts": base.bursts,
        "training_preemption": base.training_preemption,
        "wall_s_per_seed": [r["wall_s"] for r in runs],
        "wall_s_by_policy": [r["wall_s_by_policy"] for r in runs],
        "cpu_s_by_policy": [r["cpu_s_by_policy"] for r in runs],
        "training_jobs": [r["training_jobs"] for r in runs],
        "failures": [r["failures"] for r in runs],
        "policies": {n: {k: v["mean"] for k, v in m.items()} for n, m in agg["policies"].items()},
        "spread": {n: {k: [v["min"], v["max"]] for k, v in m.items()} for n, m in agg["policies"].items()},
        "lead_vs_autoscale_preempt": agg["lead_vs_autoscale_preempt"]["mean"]
        if agg["lead_vs_autoscale_preempt"]
        else None,
        "goodput_ratio_tidal_vs_autoscale_preempt": agg["goodput_ratio_tidal_vs_autoscale_preempt"],
        "goodput_ratio_tidal_vs_autoscale_preempt_graceful": agg["goodput_ratio_tidal_vs_autoscale_preempt_graceful"],
        "seeds_tidal_met_less_inference_than_autoscale_preempt": agg[
            "seeds_tidal_met_less_inference_than_autoscale_preempt"
        ],
        "seeds_tidal_met_less_inference_than_autoscale_preempt_graceful": agg[
            "seeds_tidal_met_less_inference_than_autoscale_preempt_graceful"
        ],
        "per_seed_lead": [r["lead_vs_autoscale_preempt"] for r in runs],
        "ceiling": ceiling(runs),
        "_agg": agg,
    }


def ceiling(runs: list[dict]) -> dict | None:
    """What training goodput could be at most, per seed: the cluster's GPU-hours less the inference
    demand (`cluster_less_demand`), and that less what the baseline pays whatever the policy
    (failures' lost work, periodic checkpoints, cold starts: `realistic`); each policy's goodput
    as a share of both (mean over seeds)."""
    if any("autoscale-preempt" not in r["policies"] for r in runs):
        return None
    bounds = []
    for r in runs:
        base = r["policies"]["autoscale-preempt"]
        whole = r["gpus"] * r["days"] * 24 - base["inference_demanded_gpu_hours"]
        paid = base["lost_gpu_hours_failures"] + base["training_overhead_gpu_hours"] + base["cold_start_gpu_hours"]
        bounds.append((whole, whole - paid))
    shares = {
        name: {
            "of_cluster_less_demand": round(
                statistics.fmean(
                    r["policies"][name]["goodput_gpu_hours"] / b[0] for r, b in zip(runs, bounds, strict=True)
                ),
                4,
            ),
            "of_realistic": round(
                statistics.fmean(
                    r["policies"][name]["goodput_gpu_hours"] / b[1] for r, b in zip(runs, bounds, strict=True)
                ),
                4,
            ),
        }
        for name in runs[0]["policies"]
    }
    return {
        "cluster_less_demand_gpu_hours": round(statistics.fmean(b[0] for b in bounds), 1),
        "realistic_gpu_hours": round(statistics.fmean(b[1] for b in bounds), 1),
        "shares": shares,
    }


def mix_lines() -> list[str]:
    lines = ["job mix (tp*ep group, GPUs): share of jobs / share of offered GPU-time"]
    for shape, jobs, gpu_time in mix_gpu_time_shares():
        lines.append(f"  {shape.gpus:>5} GPUs, group {shape.tp * shape.ep:>3}: {jobs:6.1%} / {gpu_time:6.1%}")
    return lines


def sweep(base: Scenario, seeds: list[int], policies: list[str], jobs: int) -> list[dict]:
    """The full grid: every offered training load with every inference peak share (12 points),
    all (point, seed, policy) runs in one process pool."""
    points = [
        dataclasses.replace(base, training_load_share=load, inference_peak_share=peak)
        for load in SWEEP_LOADS
        for peak in SWEEP_PEAKS
    ]
    runs = run_scenarios([dataclasses.replace(p, seed=s) for p in points for s in seeds], policies, jobs=jobs)
    out = []
    for k, p in enumerate(points):
        r = _aggregate(p, seeds, runs[k * len(seeds) : (k + 1) * len(seeds)])
        r.pop("_agg")
        out.append(r)
    return out


def sweep_table(rows: list[dict]) -> str:
    names = list(rows[0]["policies"])
    head = f"{'load':>5} {'peak':>5}  " + "  ".join(f"{n:>17}" for n in names) + "  tidal/autoscale"
    lines = ["goodput M GPU-h (inference demand met %)", head]
    for r in rows:
        cells = [
            f"{r['policies'][n]['goodput_gpu_hours'] / 1e6:.3f} ({100 * r['policies'][n]['inference_demand_met']:.2f})"
            for n in names
        ]
        ratio = r["goodput_ratio_tidal_vs_autoscale_preempt"]
        lines.append(
            f"{r['training_load_share']:>5} {r['inference_peak_share']:>5}  "
            + "  ".join(f"{c:>17}" for c in cells)
            + (f"  {ratio['mean']:.3f}" if ratio else "")
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--gpus", type=int, default=72_000)
    parser.add_argument("--seeds", default="7,8,9", help="comma-separated; at least 3 for a spread")
    parser.add_argument("--shape", default="nvl72", choices=["nvl72", "cm384", "hgx8", "mixed"])
    parser.add_argument("--policy", action="append", choices=list(POLICIES), help="default: the five")
    parser.add_argument("--training-load-share", type=float, default=1.0)
    parser.add_argument("--inference-peak-share", type=float, default=0.4)
    parser.add_argument("--quick", action="store_true", help="CI smoke: 1,440 GPUs, 1 day, seed 7")
    parser.add_argument(
        "--live-share", type=float, default=0.0, help="share of elastic jobs that resize Live (default 0)"
    )
    parser.add_argument(
        "--window-offset-days", type=int, default=0, help="start the traces this many days in (another window)"
    )
    parser.add_argument(
        "--no-bursts", action="store_true", help="inference demand as 10-minute means (the old, smoothed model)"
    )
    parser.add_argument(
        "--no-training-preemption",
        action="store_true",
        help="queued training never evicts lower-priority training (the model before it; default: it does,"
        " autoscale-preempt killing whole gangs, tidal checkpointing first)",
    )
    parser.add_argument("--out", type=Path, help="write the first seed's table, JSON and plots here (e.g. docs/sim)")
    parser.add_argument("--sweep", action="store_true", help="load sweep instead of the single table")
    parser.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="processes running (seed, policy) pairs in parallel; results do not depend on it",
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    base = Scenario(
        shape=args.shape,
        gpus=args.gpus,
        days=args.days,
        training_load_share=args.training_load_share,
        inference_peak_share=args.inference_peak_share,
        live_share=args.live_share,
        window_offset_days=args.window_offset_days,
        bursts=not args.no_bursts,
        training_preemption=not args.no_training_preemption,
    )
    if args.quick:
        base, seeds = dataclasses.replace(base, gpus=1440, days=1), seeds[:1]
    policies = args.policy or list(DEFAULT_POLICIES)
    if args.sweep:
        rows = sweep(base, seeds, policies, args.jobs)
        print(json.dumps(rows) if args.json else sweep_table(rows))
        return
    result = run_seeds(base, seeds, policies, args.jobs, args.out)
    agg = result.pop("_agg")
    result["mix"] = [
        {"gpus": s.gpus, "group_gpus": s.tp * s.ep, "job_share": round(j, 4), "gpu_time_share": round(g, 4)}
        for s, j, g in mix_gpu_time_shares()
    ]
    if args.json:
        print(json.dumps(result))
        return
    print(table(agg))
    print(f"lead_vs_autoscale_preempt {result['lead_vs_autoscale_preempt']} (per seed {result['per_seed_lead']})")
    print(
        f"{result['gpus']} GPUs ({result['shape']}), {result['days']} days, seeds {seeds}; "
        f"wall per seed {result['wall_s_per_seed']} s; training jobs {result['training_jobs']}"
    )
    print("\n".join(mix_lines()))


if __name__ == "__main__":
    main()
