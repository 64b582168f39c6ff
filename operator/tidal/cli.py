"""`tidal` command line: run the operator, write CRDs, run the simulator."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _cmd_crds(args: argparse.Namespace) -> int:
    from tidal.model.crd import render_crds, write_crds

    targets = [args.out, *([Path(args.chart_crds)] if args.chart_crds else [])]
    if args.check:
        drifted = [
            directory / name
            for directory in targets
            for name, text in render_crds().items()
            if not (directory / name).exists() or (directory / name).read_text() != text
        ]
        for path in drifted:
            print(f"{path}: differs from the models; run `tidal crds`", file=sys.stderr)
        return 1 if drifted else 0
    for directory in targets:
        for path in write_crds(directory):
            print(path)
    return 0


def _cmd_fleet(args: argparse.Namespace) -> int:
    import yaml

    from tidal.k8s.fake_nodes import fleet_manifests
    from tidal.topology.fleet import build_fleet

    fleet = build_fleet(args.shape, args.supernodes, args.nodes_per_supernode, args.gpus_per_node)
    print(yaml.safe_dump_all(fleet_manifests(fleet), sort_keys=False), end="")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from tidal.k8s.runner import run

    return run(args)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from tidal.dashboard import render

    text = render()
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        if not same:
            print(f"{args.out}: differs from tidal/dashboard.py; run `tidal dashboard`", file=sys.stderr)
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(args.out)
    return 0


def _cmd_sim(args: argparse.Namespace) -> int:
    from tidal.sim.run import Scenario, run_scenario, table, write_outputs

    scenario = Scenario(
        shape=args.shape,
        gpus=args.gpus,
        days=args.days,
        seed=args.seed,
        inference_peak_share=args.inference_peak_share,
        training_load_share=args.training_load_share,
        traces_dir=args.traces,
        live_share=args.live_share,
        window_offset_days=args.window_offset_days,
        bursts=not args.no_bursts,
        training_preemption=not args.no_training_preemption,
    )
    result = run_scenario(scenario, args.policy or None, jobs=args.jobs)
    print(table(result))
    for path in write_outputs(result, args.out):
        print(f"wrote {path}")
    return 0


def _cmd_placement(args: argparse.Namespace) -> int:
    from tidal.k8s.api import load_client
    from tidal.k8s.report import placement_table

    print(placement_table(load_client(str(args.kubeconfig) if args.kubeconfig else None)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidal", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    from tidal.k8s.runner import add_arguments

    run = sub.add_parser("run", help="run the operator against the current cluster")
    add_arguments(run)
    run.set_defaults(func=_cmd_run)

    crds = sub.add_parser("crds", help="write the CRDs generated from the models")
    crds.add_argument("--out", type=Path, default=Path("crds"), help="directory (default: crds)")
    crds.add_argument(
        "--chart-crds",
        default="charts/tidal/crds",
        help="the Helm chart's copy (default: charts/tidal/crds; '' to skip)",
    )
    crds.add_argument("--check", action="store_true", help="exit 1 if the files differ from the models")
    crds.set_defaults(func=_cmd_crds)

    dashboard = sub.add_parser("dashboard", help="write the Grafana dashboard JSON generated from code")
    dashboard.add_argument("--out", type=Path, default=Path("charts/tidal/files/tidal-dashboard.json"))
    dashboard.add_argument("--check", action="store_true", help="exit 1 if the file differs")
    dashboard.set_defaults(func=_cmd_dashboard)

    sim = sub.add_parser("sim", help="replay the public traces through the policies, side by side")
    sim.add_argument("--shape", default="nvl72", choices=["nvl72", "cm384", "hgx8", "mixed"])
    sim.add_argument("--gpus", type=int, default=72_000, help="cluster size (rounded up to whole supernodes)")
    sim.add_argument("--days", type=int, default=7)
    sim.add_argument("--seed", type=int, default=7)
    sim.add_argument(
        "--policy",
        action="append",
        choices=[
            "autoscale-preempt",
            "autoscale-preempt-graceful",
            "static-split",
            "topology-only",
            "first-fit",
            "tidal",
            "tidal-reactive",
            "tidal-no-restart-shrink",
            "tidal-reactive-no-restart-shrink",
            "tidal-burst",
            "tidal-whole",
        ],
        help="run only these (repeatable); default: the first five",
    )
    sim.add_argument(
        "--inference-peak-share",
        type=float,
        default=0.4,
        help="share of the GPUs the busiest inference window needs (scales ServeGen rates)",
    )
    sim.add_argument(
        "--training-load-share",
        type=float,
        default=1.0,
        help="offered training load as a share of the GPUs (scales Helios arrivals)",
    )
    sim.add_argument(
        "--traces",
        type=Path,
        default=None,
        help="directory with the trace CSVs (default: the copies shipped in tidal/sim/data)",
    )
    sim.add_argument("--live-share", type=float, default=0.0, help="share of elastic jobs that resize Live (default 0)")
    sim.add_argument(
        "--window-offset-days", type=int, default=0, help="start the traces this many days in (another window)"
    )
    sim.add_argument(
        "--no-bursts", action="store_true", help="inference demand as 10-minute means (the old, smoothed model)"
    )
    sim.add_argument(
        "--no-training-preemption",
        action="store_true",
        help="queued training never evicts lower-priority training (default: it does, as the operator's admission)",
    )
    sim.add_argument("--out", type=Path, default=Path("sim-out"), help="where the table, JSON and plots go")
    sim.add_argument(
        "--jobs",
        type=int,
        default=2,
        help="processes running the policies in parallel (default 2; results do not depend on it)",
    )
    sim.set_defaults(func=_cmd_sim)

    placement = sub.add_parser("placement", help="print where every HBD group landed, per supernode")
    placement.add_argument("--kubeconfig", type=Path, default=None)
    placement.set_defaults(func=_cmd_placement)

    fleet = sub.add_parser("fleet", help="print Node manifests of a simulated GPU fleet (for KWOK)")
    fleet.add_argument("--shape", default="nvl72", choices=["nvl72", "cm384", "hgx8", "mixed"])
    fleet.add_argument("--supernodes", type=int, default=8)
    fleet.add_argument("--nodes-per-supernode", type=int, default=None, help="default: the shape's")
    fleet.add_argument("--gpus-per-node", type=int, default=None, help="default: the shape's")
    fleet.set_defaults(func=_cmd_fleet)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
