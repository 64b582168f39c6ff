"""`tidal run`: start the operator with kopf."""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import math
import os
import re
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from tidal.clock import FileClock, SystemClock
from tidal.logging import configure as configure_logging
from tidal.model.inference_pool import LOAD_SOURCE_NAME
from tidal.placement.types import Packing

if TYPE_CHECKING:
    from tidal.k8s.controller import ControllerSettings
    from tidal.k8s.rebalancing import RebalanceSettings


def run(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, json=not args.dev_logs)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = str(args.kubeconfig)  # kopf's own login reads it too
    import kopf

    from tidal.k8s import handlers  # noqa: F401  (registers the handlers)
    from tidal.k8s.api import Api, RetryPolicy, load_client
    from tidal.k8s.controller import Controller
    from tidal.k8s.informer import NODES, PODS, Informer, Informers
    from tidal.k8s.supernodes import Discovery

    api_client = load_client(str(args.kubeconfig) if args.kubeconfig else None)
    api = Api(api_client, policy=RetryPolicy(timeout_seconds=args.api_timeout))
    if not args.standalone and not _peering_ready(api, args):
        return 2
    clock = FileClock(Path(args.clock_file)) if args.clock_file else SystemClock()
    if (identity := peering_id(os.environ, os.getpid())) is not None:
        os.environ["POD_ID"] = identity
    settings = controller_settings(args)
    structlog.get_logger("tidal").info(
        "operator settings",
        packing=settings.packing.value,
        cycle_log_seconds=settings.cycle_log_seconds,
        disruption_budget_gpus_per_hour=settings.rebalance.disruption_budget_gpus_per_hour,
        admission_timeout_seconds=settings.admission_timeout_seconds,
    )
    controller = Controller(api, clock, settings)
    accelerators = tuple(args.accelerator_resources.split(","))
    discovery = Discovery(api, args.discover_supernodes, accelerators) if args.discover_supernodes else None
    # Pods and nodes are watched outside kopf (k8s/informer.py), from now on: a replica standing by
    # (kopf peering) keeps a warm cache, and takes over without listing every pod and node first.
    informers = Informers(
        pods=Informer(api_client, controller.cache, active=controller.ticking, watched=PODS),
        nodes=Informer(
            api_client,
            controller.cache,
            active=controller.ticking,
            watched=NODES,
            on_object=discovery.node if discovery is not None else None,
        ),
    )
    informers.start()
    if discovery is not None:
        discovery.start()
    if args.metrics_port:
        from tidal.metrics import Metrics

        metrics = Metrics()
        metrics.attach(controller)
        metrics.serve(args.metrics_port)
    memo = kopf.Memo(
        controller=controller,
        informers=informers,
        discovery=discovery,
        served_namespaces=frozenset(args.namespace),
    )
    kopf.run(
        clusterwide=True,  # --namespace filters what is served (handlers._served), never what is seen
        priority=peering_priority(args.priority),
        peering_name=args.peering_name,
        standalone=args.standalone,
        liveness_endpoint=f"http://0.0.0.0:{args.health_port}/healthz" if args.health_port else None,
        memo=memo,
    )
    return 0


def controller_settings(args: argparse.Namespace) -> ControllerSettings:
    from tidal.k8s.controller import ControllerSettings
    from tidal.k8s.disruption_ledger import CONFIGMAP_SUFFIX

    return ControllerSettings(
        min_cycle_seconds=args.cycle_seconds,
        rebalance=rebalance_settings(args),
        supernode_label=args.supernode_label,
        max_cycle_age_seconds=args.max_cycle_age,
        spec_priority=args.spec_priority,
        admission_timeout_seconds=args.admission_timeout,
        state_namespace=args.state_namespace,
        not_ready_grace_seconds=args.not_ready_grace,
        packing=Packing(args.packing),
        cycle_log_seconds=args.cycle_log_seconds,
        state_name=args.peering_name + CONFIGMAP_SUFFIX,
    )


def rebalance_settings(args: argparse.Namespace) -> RebalanceSettings:
    from tidal.k8s.rebalancing import RebalanceSettings

    return RebalanceSettings(
        disruption_budget_gpus_per_hour=args.disruption_budget_gpus_per_hour,
        load_sources=load_sources(args.load_source),
        stabilization_window=dt.timedelta(seconds=args.scale_down_stabilization),
        expand_cooldown=dt.timedelta(seconds=args.grow_back_cooldown),
    )


def _peering_ready(api: object, args: argparse.Namespace) -> bool:
    """kopf idles silently while its peering object is missing: create it, or stop loudly."""
    from tidal.k8s.peering import PeeringUnavailable, ensure_peering

    log = structlog.get_logger("tidal.peering")
    try:
        created = ensure_peering(api.custom, args.peering_name)  # type: ignore[attr-defined]
    except PeeringUnavailable as exc:
        log.error("cannot start: " + str(exc))
        return False
    if created:
        log.warning(f"created the missing ClusterKopfPeering {args.peering_name!r}: replicas peer through it")
    return True


def load_sources(values: list[str]) -> dict[str, str]:
    """NAME=URL pairs of --load-source: the only addresses a pool's Prometheus load query goes to."""
    sources: dict[str, str] = {}
    for value in values:
        name, sep, url = value.partition("=")
        if not sep or not re.fullmatch(LOAD_SOURCE_NAME, name) or not url.startswith(("http://", "https://")):
            raise SystemExit(f"--load-source {value!r}: expected NAME=http(s)://host[:port][/path], NAME a DNS label")
        sources[name] = url
    return sources


def _positive_seconds(value: str) -> float:
    seconds = float(value)
    if not 0 < seconds < math.inf:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a number of seconds above 0")
    return seconds


def _seconds(value: str) -> float:
    seconds = float(value)
    if not 0 <= seconds < math.inf:
        raise argparse.ArgumentTypeError(f"{value!r}: expected a number of seconds, 0 or more")
    return seconds


def peering_id(env: Mapping[str, str], pid: int) -> str | None:
    """kopf's peering identity (it reads POD_ID): the pod's name for the container's own process,
    so that the container restarted in its pod (a crash, an OOM kill: the old process is gone)
    finds its own record and acts at once instead of waiting for it to expire. Only PID 1 (the
    image's exec-form entrypoint) gets it: a second `tidal run` exec'd into the pod shares the
    pod's environment, and with the same identity neither would see the other. None: kopf's own
    id, unique per process (and a POD_ID already set is kopf's to read)."""
    if "POD_ID" in env or pid != 1:
        return None
    return env.get("POD_NAME") or None


def peering_priority(value: str) -> int:
    """A number, or "auto": a stable number from the pod's name, so that replicas of one Deployment
    get different priorities (kopf freezes all replicas that share one)."""
    if value != "auto":
        return int(value)
    name = os.environ.get("POD_NAME") or socket.gethostname()
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "big") % 1_000_000


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kubeconfig", type=Path, default=None, help="default: in-cluster, then $KUBECONFIG")
    parser.add_argument(
        "--namespace",
        "-n",
        action="append",
        default=[],
        help=(
            "serve TrainingJobs and InferencePools only in these namespaces (repeatable); "
            "nodes and pods are always watched cluster-wide"
        ),
    )
    parser.add_argument("--priority", default="0", help="kopf peering priority of this replica, or 'auto'")
    parser.add_argument(
        "--supernode-label",
        default="tidal.dev/supernode",
        help="node label selecting a Supernode's members when it has no nodeSelector",
    )
    parser.add_argument(
        "--accelerator-resources",
        default="nvidia.com/gpu,huawei.com/Ascend910,amd.com/gpu",
        help="extended resources that count as accelerators for discovery (comma-separated)",
    )
    parser.add_argument("--peering-name", default="tidal", help="kopf peering object shared by the replicas")
    parser.add_argument("--standalone", action="store_true", help="run without peering (single replica only)")
    parser.add_argument("--health-port", type=int, default=8080, help="liveness endpoint /healthz; 0 disables")
    parser.add_argument("--metrics-port", type=int, default=8081, help="Prometheus /metrics; 0 disables")
    parser.add_argument(
        "--discover-supernodes",
        metavar="LABEL",
        nargs="?",
        const="nvidia.com/gpu.clique",
        default=None,
        help="create Supernodes from a node label (default nvidia.com/gpu.clique)",
    )
    parser.add_argument(
        "--clock-file", default=None, help="read the current time from this file when present (drills and tests)"
    )
    parser.add_argument(
        "--disruption-budget-gpus-per-hour",
        type=int,
        default=None,
        help="most training GPUs the rebalancer may evict per hour (default: no limit)",
    )
    parser.add_argument(
        "--not-ready-grace",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help="while more than 2 nodes are NotReady, how long one must be before its groups are placed "
        "again (an outage may still be spreading; default 30); with 2 or fewer, at once",
    )
    parser.add_argument(
        "--packing",
        choices=[p.value for p in Packing],
        default=Packing.KEEP_WHOLE.value,
        help="how placement values what a group leaves free. keep-whole (default): racks kept whole for "
        "whole-rack groups (fewest refused jobs where jobs queue, as TrainingJobs do); fill: by the queued "
        "and recent group sizes alone (fewest refused GPUs with a queue; fewest jobs and GPUs on average "
        "where users delete and resubmit what does not start). README: 'With and without a queue'",
    )
    parser.add_argument(
        "--cycle-log-seconds",
        type=_seconds,
        default=30.0,
        metavar="SECONDS",
        help='the "cycle done" INFO summary at most this often, summing the cycles since the last '
        "(default 30; 0: a line for each cycle that admitted or made pod calls). Every decision "
        'has its own "event" line',
    )
    parser.add_argument(
        "--state-namespace",
        default=None,
        metavar="NAMESPACE",
        help="keep the disruption budget's records of deleted jobs in the ConfigMap "
        "<peering name>-disruptions there, so a restart keeps them (default: in memory only)",
    )
    parser.add_argument(
        "--scale-down-stabilization",
        type=_positive_seconds,
        default=300.0,
        metavar="SECONDS",
        help="an InferencePool scales down only once its demand stayed lower this long (default 300)",
    )
    parser.add_argument(
        "--grow-back-cooldown",
        type=_positive_seconds,
        default=600.0,
        metavar="SECONDS",
        help="an elastic TrainingJob shrunk for a pool grows back no sooner than this (default 600)",
    )
    parser.add_argument(
        "--load-source",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="a Prometheus server InferencePools may query for load, by NAME (repeatable); pools never name URLs",
    )
    parser.add_argument(
        "--spec-priority",
        action="store_true",
        help="honour the deprecated integer spec.priority of workloads without spec.priorityClassName "
        "(only where every tenant may outrank every other)",
    )
    parser.add_argument(
        "--api-timeout",
        type=_positive_seconds,
        default=15.0,
        help="read timeout of each Kubernetes API request in seconds (connect: at most 5); "
        "429, 5xx and timeouts are retried with capped exponential backoff",
    )
    parser.add_argument(
        "--admission-timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="a placed gang whose pods are not all bound and Running this long after placement has those "
        "groups placed again (condition PodsReady=False, reason AdmissionTimeout); 0 disables",
    )
    parser.add_argument("--cycle-seconds", type=float, default=0.5, help="minimum time between controller cycles")
    parser.add_argument(
        "--max-cycle-age",
        type=float,
        default=120.0,
        help="/healthz fails when timers fire but no controller cycle has finished for this many seconds",
    )
    parser.add_argument("--log-level", default=os.environ.get("TIDAL_LOG_LEVEL", "INFO"))
    parser.add_argument("--dev-logs", action="store_true", help="human-readable logs instead of JSON")
