"""Markdown tables from `python -m bench.sim --json` results, so the docs' simulator tables are
generated, not typed:

    python -m bench.sim --json --gpus 24048 --days 3 > docs/sim/runs/24k_w0.json
    python -m bench.sim_tables docs/sim/runs/24k_w0.json [more.json ...]
    python -m bench.sim_tables --write docs/simulator.md   # every block below, rendered afresh

In a Markdown file, a block between `<!-- sim-table: PATH -->` and `<!-- /sim-table -->` is the
table of the run in PATH (relative to the repository); `--write` renders every block again, and
tests/unit/test_sim_tables.py fails when one has drifted from its JSON.

Each file gives one table: per policy the mean over its seeds and [min, max], then the goodput
ratio to autoscale-preempt per seed and the ceiling (bench.sim's `ceiling`; for a file written
before it existed, the same formula with the inference demand rebuilt from the scenario).
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- sim-table: (?P<path>\S+) -->\n)(?P<body>.*?)(<!-- /sim-table -->)", re.DOTALL)

ROWS = (
    ("goodput, k GPU-h", "goodput_gpu_hours", 1e-3, "{:,.0f}"),
    ("inference demand met", "inference_demand_met", 100, "{:.2f}%"),
    ("minutes some pool short of warm replicas", "inference_slo_violation_minutes", 1, "{:,.0f}"),
    ("evictions (suspensions + shrinks)", "evictions", 1, "{:,.0f}"),
    ("of which shrinks", "shrinks", 1, "{:,.0f}"),
    ("grow-backs", "grow_backs", 1, "{:,.0f}"),
    ("flaps, old count (from the save)", "flaps", 1, "{:,.0f}"),
    ("flaps of jobs (from the decision)", "flaps_jobs", 1, "{:,.0f}"),
    ("flaps of replicas (added and removed within the hour)", "flaps_replicas", 1, "{:,.0f}"),
    ("job wait p50, s", "job_wait_p50_s", 1, "{:,.0f}"),
    ("job wait p95, s", "job_wait_p95_s", 1, "{:,.0f}"),
    ("job wait p99, s", "job_wait_p99_s", 1, "{:,.0f}"),
    ("jobs never started", "jobs_never_started", 1, "{:,.0f}"),
    ("work lost to preemption, k GPU-h", "lost_gpu_hours_preemption", 1e-3, "{:,.1f}"),
    ("work lost to failures, k GPU-h", "lost_gpu_hours_failures", 1e-3, "{:,.1f}"),
    ("stalled (saves, restores, rebuilds), k GPU-h", "stalled_gpu_hours", 1e-3, "{:,.1f}"),
    ("inference ahead of demand, k GPU-h", "inference_ahead_of_demand_gpu_hours", 1e-3, "{:,.0f}"),
    ("GPUs idle (mean)", "gpus_idle", 1, "{:,.0f}"),
)


def _cell(result: dict, policy: str, key: str, scale: float, fmt: str) -> str:
    mean = result["policies"][policy][key] * scale
    low, high = (v * scale for v in result["spread"][policy][key])
    if low == high:
        return fmt.format(mean)
    return f"{fmt.format(mean)} [{fmt.format(low)}, {fmt.format(high)}]"


def demanded_gpu_hours(result: dict) -> float:
    """The inference demand of the result's scenario, rebuilt (the same for every seed but noise)."""
    from tidal.sim.run import Scenario, build

    totals = []
    for seed in result["seeds"]:
        scenario = Scenario(
            shape=result["shape"],
            gpus=result["gpus"],
            days=result["days"],
            seed=seed,
            window_offset_days=result.get("window_offset_days", 0),
            bursts=result.get("bursts", True),
        )
        _, workload = build(scenario)
        tp = {p.name: p.tp for p in workload.pools}
        step = workload.demand_step_s
        totals.append(sum(sum(v) * tp[n] * step for n, v in workload.inference_replicas.items()) / 3600)
    return statistics.fmean(totals)


def ceiling_of(result: dict) -> dict | None:
    if result.get("ceiling"):
        return result["ceiling"]
    base = result["policies"].get("autoscale-preempt")
    if base is None:
        return None
    whole = result["gpus"] * result["days"] * 24 - demanded_gpu_hours(result)
    paid = base["lost_gpu_hours_failures"] + base["training_overhead_gpu_hours"] + base["cold_start_gpu_hours"]
    return {
        "cluster_less_demand_gpu_hours": round(whole, 1),
        "realistic_gpu_hours": round(whole - paid, 1),
        "shares": {
            n: {
                "of_cluster_less_demand": round(p["goodput_gpu_hours"] / whole, 4),
                "of_realistic": round(p["goodput_gpu_hours"] / (whole - paid), 4),
            }
            for n, p in result["policies"].items()
        },
    }


def table(result: dict) -> str:
    names = list(result["policies"])
    lines = ["| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
    for label, key, scale, fmt in ROWS:
        if all(key in result["policies"][n] for n in names):
            lines.append(f"| {label} | " + " | ".join(_cell(result, n, key, scale, fmt) for n in names) + " |")
    bound = ceiling_of(result)
    if bound:
        lines.append(
            "| share of the ceiling (cluster less demand / realistic) | "
            + " | ".join(
                f"{100 * bound['shares'][n]['of_cluster_less_demand']:.1f}%"
                f" / {100 * bound['shares'][n]['of_realistic']:.1f}%"
                for n in names
            )
            + " |"
        )
    base = result["policies"].get("autoscale-preempt")
    out = "\n".join(lines)
    if base:
        ratios = []
        for n in names:
            if n == "autoscale-preempt":
                continue
            ratio = result["policies"][n]["goodput_gpu_hours"] / base["goodput_gpu_hours"]
            ratios.append(f"{n} {ratio:.3f}")
        out += "\n\nGoodput / autoscale-preempt (means): " + ", ".join(ratios) + "."
        spread = result.get("goodput_ratio_tidal_vs_autoscale_preempt")
        if spread:
            out += f" tidal per seed: {spread['min']:.3f}-{spread['max']:.3f}, mean {spread['mean']:.3f}."
        leads = ", ".join("null" if x is None else f"{x:.3f}" for x in result.get("per_seed_lead", []))
        out += f" `lead_vs_autoscale_preempt` per seed: {leads}."
    if bound:
        out += (
            f" Ceiling: {bound['cluster_less_demand_gpu_hours'] / 1e3:,.0f}k GPU-h (cluster less the inference demand),"
            f" {bound['realistic_gpu_hours'] / 1e3:,.0f}k less what the baseline pays whatever the policy."
        )
    return out


def command(result: dict) -> str:
    """The bench.sim command that made the result."""
    parts = ["python -m bench.sim --json", f"--gpus {result['gpus']}", f"--days {result['days']}"]
    if result["shape"] != "nvl72":
        parts.append(f"--shape {result['shape']}")
    if result["seeds"] != [7, 8, 9]:
        parts.append("--seeds " + ",".join(str(s) for s in result["seeds"]))
    if result.get("window_offset_days"):
        parts.append(f"--window-offset-days {result['window_offset_days']}")
    if result.get("live_share"):
        parts.append(f"--live-share {result['live_share']}")
    if not result.get("bursts", True):
        parts.append("--no-bursts")
    if not result.get("training_preemption", False):  # a run from before the flag: the old model
        parts.append("--no-training-preemption")
    parts += [f"--policy {n}" for n in result["policies"]]
    return " ".join(parts)


def caption(result: dict) -> str:
    return (
        f"{result['gpus']:,} GPUs ({result['shape']}), {result['days']} days, seeds {result['seeds']}, "
        f"trace window +{result.get('window_offset_days', 0)} days, Live share {result.get('live_share', 0.0):.0%}, "
        f"{'bursty per-minute' if result.get('bursts', True) else '10-minute mean'} demand, "
        f"{'training preempts lower-priority training' if result.get('training_preemption') else 'only pools preempt'}"
    )


def render(path: str) -> str:
    result = json.loads((REPO / path).read_text())
    return f"**{caption(result)}**: `{command(result)}` (`{path}`)\n\n{table(result)}\n"


def rendered(text: str) -> str:
    """The text with every sim-table block rendered from its JSON."""
    return BLOCK.sub(lambda m: m.group(1) + render(m.group("path")) + m.group(4), text)


def main(argv: list[str] | None = None) -> None:
    args = argv if argv is not None else sys.argv[1:]
    if args[:1] == ["--write"]:
        for doc in args[1:]:
            path = Path(doc)
            path.write_text(rendered(path.read_text()))
        return
    for path in args:
        print(render(path))


if __name__ == "__main__":
    main()
