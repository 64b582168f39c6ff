"""CI smoke of `python -m bench.sim --quick --json`: the fields the tide issue asks for are printed
for every policy, and --live-share / --window-offset-days reach the scenario."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def bench_sim(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "bench.sim", "--quick", "--json", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    return json.loads(out.stdout)


def test_quick_run_prints_the_tide_fields_per_policy():
    result = bench_sim("--live-share", "0.5", "--window-offset-days", "2")
    assert result["live_share"] == 0.5 and result["window_offset_days"] == 2 and result["bursts"] is True
    assert {"per_seed_lead", "lead_vs_autoscale_preempt"} <= result.keys()
    bound = result["ceiling"]
    assert 0 < bound["realistic_gpu_hours"] < bound["cluster_less_demand_gpu_hours"] < result["gpus"] * 24
    assert 0 < bound["shares"]["tidal"]["of_cluster_less_demand"] < bound["shares"]["tidal"]["of_realistic"] <= 1
    for name, figures in result["policies"].items():
        for field in (
            "flaps_real",
            "flaps",
            "job_wait_p50_s",
            "job_wait_p95_s",
            "job_wait_p99_s",
            "jobs_never_started",
            "inference_slo_violation_minutes",
            "inference_demand_met",
        ):
            assert field in figures, (name, field)


def test_tidal_sim_takes_every_policy_and_the_tide_options():
    from tidal.cli import build_parser
    from tidal.sim.policies import POLICIES

    parser = build_parser()
    args = parser.parse_args(["sim", "--live-share", "0.5", "--window-offset-days", "4", "--no-bursts"])
    assert (args.live_share, args.window_offset_days, args.no_bursts) == (0.5, 4, True)
    assert not args.no_training_preemption, "training preempts training unless told otherwise"
    assert parser.parse_args(["sim", "--no-training-preemption"]).no_training_preemption
    sim = next(a for a in parser._subparsers._group_actions[0].choices["sim"]._actions if a.dest == "policy")
    assert set(sim.choices) == set(POLICIES)
