"""Simulator benchmark: 7 days on 72,000 GPUs of NVL72 racks, the four policies side by side.

    python -m bench.sim [--json] [--days 7] [--gpus 72000] [--seed 7]

Prints one JSON object: wall_s, gpus, days, and per policy gpu_utilization, training_gpu_hours,
inference_demand_met (0..1), job_wait_p50_s, job_wait_p95_s, hbd_split_groups,
lost_gpu_hours_failures, lost_gpu_hours_preemption (and a few more). See tidal/sim/*.py for the
workload model and its calibration.
"""

from __future__ import annotations

import argparse
import json

from tidal.sim.run import Scenario, run_scenario, table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--gpus", type=int, default=72_000)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    result = run_scenario(Scenario(gpus=args.gpus, days=args.days, seed=args.seed))
    summary = {k: v for k, v in result.items() if k != "series"}
    if args.json:
        print(json.dumps(summary))
    else:
        print(table(result))
        print(
            f"wall {result['wall_s']} s, {result['gpus']} GPUs, {result['days']} days, "
            f"{result['training_jobs']} training jobs, {result['failures']} failures"
        )


if __name__ == "__main__":
    main()
