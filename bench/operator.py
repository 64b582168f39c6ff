"""Operator scale benchmark on a real API server with >= 1,000 simulated GPU nodes (KWOK).

    python -m bench.operator [--json] [--nodes 1008] [--gang-pods 256] [--jobs 50] [--seed 7] [--keep]
                             [--py-spy .venv/bin/py-spy]

Brings up its own cluster (e2e/cluster.sh, name tidal-bench-<checkout>: --nodes rounded up to
whole NVL72 racks of 18 nodes, 4 GPUs each; 1,008 nodes = 56 racks, 4,032 GPUs), starts `tidal run`
as a separate process, submits one gang of --gang-pods pods (4 GPUs each; tp=8, ep=8, pp=4 and dp
to match: 256 pods = 1,024 GPUs at dp=4, 4,096 pods = 16,384 GPUs at dp=64) and then `--jobs` jobs
of 8 to 1,024 GPUs drawn from the calibrated mix, and measures: big_gang_seconds_to_running,
seconds_to_admit_all (every job placed), seconds_to_running_all, api_requests (the operator's own
count), operator_peak_rss_mb (VmHWM), and checks the pods actually bound: hbd_split_groups and
overbooked_gpus must both be 0. Beside the gang (issue 36): the floor (bench/floor.py: copies of
the gang's pods created with nodeName on the gang's nodes, no gates and no scheduler, over the
operator's number of connections, once the operator is stopped), gang_running_s (from the job
first seen by the watch, as the floor's clock starts at its first create), ratio_to_floor,
operator_cpu_ms_per_pod and api_writes_per_pod (the API server's own count of pod writes, by
every client, during the gang's start; its breakdown in api_writes).

Then the warm-up: the operator is SIGKILLed, a small job is submitted, a fresh operator process is
started, and warm_up_seconds is the time from starting it to that job's admission. By default the
fresh process is the container restarted in its pod (kopf's identity, POD_ID, is kept as the pod's
name is in a pod: its own dead record is no peer to wait for); with --restart pod it is a new pod, which first
waits out the dead pod's peering record (15 s less its age), then lists the cluster and builds its
view.

The profile (bench/operator_profile.py; tables on stderr, `profile` in the JSON): watches opened
before the submit time each gang pod's creation, gate removal, binding and Running and each job's
phase; CPU-seconds per cluster process, the operator, this bench and the whole machine over the
gang's window and the warm-up; the warm-up's moments from the restarted operator's log (peering
pause and resume, each kind listed, the startup gate open, the first tick, the first cycle);
`--py-spy PATH` samples the operator (GIL holder) during the gang. The operators log at INFO.

Client limits: kube-scheduler --kube-api-qps=500/--kube-api-burst=1000, kube-controller-manager
200/400 (set by e2e/cluster.sh); the operator has no client-side rate limit (its pod, Service and
status calls go through 16 worker threads over a pool of 32 connections).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from tests.cluster.kube import E2E, REPO, Kube, bin_dir, eventually
from tests.cluster.operator_process import OperatorProcess, free_port

from bench.floor import copies_of, floor_running, pod_writes, writes_between
from bench.operator_profile import (
    CpuMeter,
    PySpy,
    Watch,
    cluster_pids,
    cycles,
    gang_phases,
    gang_timeline,
    job_stages,
    load_average,
    log_lines,
    peer_deadline,
    phase_is,
    pod_stages,
    render,
    top_functions,
    warm_up_marks,
)
from tidal.k8s.api import load_client
from tidal.k8s.labels import JOB
from tidal.placement.workload_mix import TRAINING_MIX, sample_shapes

# One cluster per checkout: two clones benchmarking on one machine must not share (or fight over) one.
CLUSTER = f"tidal-bench-{hashlib.sha256(str(REPO).encode()).hexdigest()[:6]}"
NODES_PER_RACK = 18
TEMPLATE = {"spec": {"containers": [{"name": "trainer", "image": "trainer:latest"}]}}


def bench_cluster(supernodes: int, env: dict[str, str]) -> Kube:
    """The benchmarks' KWOK cluster (e2e/cluster.sh, name from env's TIDAL_CLUSTER_NAME), up with
    tidal's CRDs and the peering object: kept up if it already is."""
    out = subprocess.run(
        [str(E2E / "cluster.sh"), "up", "--shape", "nvl72", "--supernodes", str(supernodes)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    kube = Kube(Path(out.strip().splitlines()[-1].removeprefix("export KUBECONFIG=")), bin_dir())
    kube.run("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kube.run("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "crds"))
    kube.run("apply", "-f", str(REPO / "examples" / "peering.yaml"))
    return kube


def job_manifest(name: str, tp: int, ep: int, pp: int, dp: int, gpp: int, priority: int = 0) -> dict:
    return {
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": "bench"},
        "spec": {"tp": tp, "ep": ep, "pp": pp, "dp": dp, "gpusPerPod": gpp, "priority": priority, "template": TEMPLATE},
    }


def mixed_jobs(count: int, seed: int, budget: int) -> list[dict]:
    """`count` jobs of 8..1,024 GPUs from the calibrated mix, fitting in `budget` GPUs together."""
    rng = random.Random(seed)
    mix = tuple(s for s in TRAINING_MIX if 8 <= s.gpus <= 1024)
    smallest = min(s.gpus for s in mix)
    jobs, used = [], 0
    while len(jobs) < count:
        # Leave room for the jobs still to come, each at least the smallest shape.
        room = budget - used - smallest * (count - len(jobs) - 1)
        fitting = tuple(s for s in mix if s.gpus <= room)
        if not fitting:
            raise ValueError(f"{count} jobs do not fit in {budget} GPUs")
        shape = sample_shapes(rng, 1, fitting)[0]
        used += shape.gpus
        jobs.append(job_manifest(f"job-{len(jobs):02d}", shape.tp, shape.ep, shape.pp, shape.dp, shape.gpus_per_pod))
    return jobs


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def api_requests(metrics_port: int) -> int:
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    return int(sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("tidal_api_requests{")))


def audit_pods(kube: Kube) -> tuple[int, int]:
    """(HBD groups bound across supernodes, GPUs bound beyond node capacity), from the live pods."""
    nodes = kube.get("nodes")["items"]
    supernode = {n["metadata"]["name"]: n["metadata"]["labels"]["tidal.dev/supernode"] for n in nodes}
    capacity = {n["metadata"]["name"]: int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in nodes}
    groups: dict[tuple[str, str], set[str]] = {}
    used: Counter[str] = Counter()
    for p in kube.get("pods", "-n", "bench")["items"]:
        node = p["spec"].get("nodeName")
        if not node or p["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        labels = p["metadata"]["labels"]
        groups.setdefault((labels["tidal.dev/job"], labels["tidal.dev/hbd-group"]), set()).add(supernode[node])
        used[node] += int(p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"])
    split = sum(1 for s in groups.values() if len(s) > 1)
    over = sum(max(g - capacity[n], 0) for n, g in used.items())
    return split, over


def run(
    nodes: int, gang_pods: int, jobs: int, seed: int, keep: bool, py_spy: str | None = None, restart: str = "container"
) -> dict[str, object]:
    if gang_pods % 64:
        raise ValueError("--gang-pods must be a multiple of 64 (tp=8, ep=8, pp=4 at 4 GPUs a pod)")
    supernodes = -(-nodes // NODES_PER_RACK)
    gang_gpus = gang_pods * 4
    env = {**os.environ, "TIDAL_CLUSTER_NAME": CLUSTER}
    load_before = load_average()
    started = time.monotonic()
    kube = bench_cluster(supernodes, env)
    kubeconfig = kube.kubeconfig
    cluster_up_s = time.monotonic() - started
    kube.run("create", "namespace", "bench", check=False)
    node_count = len(kube.get("nodes")["items"])
    metrics_port = free_port()
    op = OperatorProcess(
        kubeconfig,
        Path(tempfile.mkdtemp(prefix="tidal-bench-")),
        "--discover-supernodes",
        "tidal.dev/supernode",
        "--metrics-port",
        str(metrics_port),
        "--spec-priority",  # the synthetic jobs carry integer priorities (big-gang goes first)
        "--cycle-log-seconds",
        "0",  # a "cycle done" line for each cycle that acts: the profile times the gang's phases by them
        # INFO for the profile's log lines (cycles, startup gate, peering); kopf's per-timer
        # lines it also brings are ~60 a second at 1,008 nodes, a fraction of a percent of a core.
        # POD_ID is kopf's peering identity: in a pod the container's own process takes the pod's
        # name (runner.peering_id); this process is no PID 1, so it is set here. See the warm-up.
        env={"TIDAL_LOG_LEVEL": "INFO", "POD_ID": "tidal-bench-0"},
    )
    client = load_client(str(kubeconfig), pool_size=4)
    core, custom = k8s.CoreV1Api(client), k8s.CustomObjectsApi(client)
    job_watch = Watch(
        custom.list_namespaced_custom_object,
        job_stages,
        group="tidal.dev",
        version="v1alpha1",
        namespace="bench",
        plural="trainingjobs",
    ).start()
    components = cluster_pids(Path(kubeconfig).parent)
    op.start()
    try:
        eventually(
            lambda: sum(1 for s in kube.get("supernodes")["items"] if s.get("status", {}).get("gpus")) == supernodes,
            timeout=120,
            what="supernode status",
        )
        if kube.get("trainingjobs", "-n", "bench")["items"]:  # a cluster kept (--keep) from an earlier run
            kube.run("delete", "trainingjobs", "--all", "-n", "bench", "--wait=false")
            eventually(
                lambda: (
                    not kube.get("trainingjobs", "-n", "bench")["items"]
                    and not kube.get("pods", "-n", "bench")["items"]
                ),
                timeout=300,
                interval=2,
                what="the earlier run's jobs and pods gone",
            )
        requests_before = api_requests(metrics_port)
        cycles_before = cycle_metrics(metrics_port)
        big = job_manifest("big-gang", 8, 8, 4, gang_pods // 64, 4, priority=10)
        others = mixed_jobs(jobs, seed, budget=int(supernodes * 72 * 0.75) - gang_gpus) if jobs else []
        names = [j["metadata"]["name"] for j in (big, *others)]
        pod_watch = Watch(core.list_namespaced_pod, pod_stages, namespace="bench", label_selector=f"{JOB}=big-gang")
        pod_watch.start()
        meter = CpuMeter({**components, "operator": [op.proc.pid]})
        spy = PySpy(py_spy, op.proc.pid, op.workdir / "py-spy.txt") if py_spy else None
        writes_before = pod_writes(kube)
        meter.start()
        wall0, t0 = time.time(), time.monotonic()
        kube.run("apply", "-f", "-", input=yaml.safe_dump_all([big, *others]))
        timeout = 600 + gang_pods // 4  # a few thousand pods pass kube-scheduler at its qps limit
        running_at = job_watch.wait(phase_is(["big-gang"], "Running"), timeout, "big gang Running")
        big_s = running_at - t0
        gang_cpu = meter.stop()
        gang_writes = writes_between(writes_before, pod_writes(kube))
        spy_out = spy.stop() if spy else ""
        cycles_after = cycle_metrics(metrics_port)
        admit_s = job_watch.wait(phase_is(names, "Admitted", "Running"), timeout, "all admitted") - t0
        running_s = job_watch.wait(phase_is(names, "Running"), timeout, "all running") - t0
        split, over = audit_pods(kube)
        pods = len(kube.get("pods", "-n", "bench")["items"])
        requests = api_requests(metrics_port) - requests_before
        rss = peak_rss_mb(op.proc.pid)
        profile: dict[str, Any] = {
            "gang": gang_timeline(t0, job_watch.first.get("big-gang", {}), pod_watch.first),
            "gang_cpu": gang_cpu,
            # Read after every job ran: the cycle that wrote the gang's Running logs after the write.
            "gang_cycles": [c for c in cycles(log_lines(op.log_path), wall0) if 0 <= c["ended"] <= big_s + 1],
            "watch_resumed": {"pods": pod_watch.resumed, "jobs": job_watch.resumed},
            "gang_cycle_metrics": {
                "cycles": cycles_after[0] - cycles_before[0],
                "cycle_seconds": round(cycles_after[1] - cycles_before[1], 2),
            },
        }
        profile["gang_phases"] = dict(gang_phases(profile["gang"]))
        pod_watch.stop()
        if spy:
            collapsed = spy.out.read_text() if spy.out.exists() else ""
            profile["py_spy"] = {**top_functions(collapsed), "file": str(spy.out), "stderr": spy_out[-300:]}

        # Warm-up: a fresh process after a SIGKILL, to the first admission it makes: the
        # container restarted in its pod (same identity: its own record is no peer to wait for),
        # or with --restart pod a new pod (new identity: it waits out the dead pod's record).
        op.kill()
        if restart == "pod":
            op.env["POD_ID"] = "tidal-bench-1"
        kube.run("apply", "-f", "-", input=yaml.safe_dump_all([job_manifest("after-restart", 8, 1, 1, 2, 4)]))
        expires = peer_deadline(custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", "tidal"))
        meter = CpuMeter({**components, "operator": []})
        meter.start()
        wall1, t1 = time.time(), time.monotonic()
        op.start()
        health_s = time.monotonic() - t1
        meter.pids["operator"] = [op.proc.pid]
        meter.last[op.proc.pid] = 0.0  # it started inside the window
        admitted = job_watch.wait(phase_is(["after-restart"], "Admitted", "Running"), 600, "admission after restart")
        warm_up_s = admitted - t1
        warm_cpu = meter.stop()
        # The admitting cycle logs once its pods are made, after the status the watch saw.
        marks = eventually(
            lambda: (m := warm_up_marks(log_lines(op.log_path), wall1))["admitting_cycle_done"] is not None and m,
            timeout=60,
            interval=0.5,
            what="the admitting cycle's log line",
        )
        profile["warm_up"] = {
            "health_port_open": round(health_s, 3),
            "dead_peer_record_expires": None if expires is None else round(expires - wall1, 3),
            **marks,
            "job_admitted_seen": round(warm_up_s, 3),
        }
        profile["warm_up_cpu"] = warm_cpu
        split_after, over_after = audit_pods(kube)
        restarted_rss = peak_rss_mb(op.proc.pid)
        # The floor, in the same run and on the gang's own nodes, with no operator running.
        op.stop()
        try:
            floor = floor_running(kube, copies_of(kube.get("pods", "-n", "bench", "-l", f"{JOB}=big-gang")["items"]))
        except Exception as exc:  # the gang's figures stand without it
            floor = {"floor_error": repr(exc), "floor_running_s": None}
        operator_cpu = gang_cpu["cpu_seconds"].get("operator", 0.0)
        # From the moment the API server had the job (the watch saw it), as the floor's clock
        # starts at its first create: kubectl's own start-up is not the operator's.
        gang_s = running_at - min(job_watch.first["big-gang"].values())
        result = {
            "nodes": node_count,
            "gpus": node_count * 4,
            "cluster_up_seconds": round(cluster_up_s, 1),
            "big_gang_gpus": gang_gpus,
            "big_gang_pods": gang_pods,
            "big_gang_seconds_to_running": round(big_s, 2),
            "gang_running_s": round(gang_s, 2),
            "floor_running_s": floor["floor_running_s"],
            "ratio_to_floor": round(gang_s / floor["floor_running_s"], 2) if floor["floor_running_s"] else None,
            "operator_cpu_ms_per_pod": round(1000 * operator_cpu / gang_pods, 2),
            # Writes to pods by every client (the operator's creates and gate patches,
            # kube-scheduler's bindings) while the gang started; with --jobs 0 the gang's alone
            # (with other jobs their pods count too: the README's figures are at --jobs 0).
            "api_writes_per_pod": round(sum(gang_writes.values()) / gang_pods, 2),
            "api_writes": gang_writes,
            **{k: v for k, v in floor.items() if k != "floor_running_s"},
            "jobs": 1 + len(others),
            "job_gpus": gang_gpus
            + sum(j["spec"]["tp"] * j["spec"]["ep"] * j["spec"]["pp"] * j["spec"]["dp"] for j in others),
            "pods": pods,
            "seconds_to_admit_all": round(admit_s, 2),
            "seconds_to_running_all": round(running_s, 2),
            "api_requests": requests,
            "operator_peak_rss_mb": round(rss, 1),
            "hbd_split_groups": split,
            "overbooked_gpus": over,
            "warm_up_restart": restart,
            "warm_up_seconds": round(warm_up_s, 2),
            "warmup_s": round(warm_up_s, 2),
            "warm_up_health_port_seconds": round(health_s, 2),
            "restarted_operator_rss_mb": round(restarted_rss, 1),
            "hbd_split_groups_after_restart": split_after,
            "overbooked_gpus_after_restart": over_after,
            "client_limits": "kube-scheduler qps 500/burst 1000; kube-controller-manager qps 200/burst 400; "
            "operator: no client-side limit (16 API worker threads, 32 connections)",
            "load_average_before": load_before,
            "load_average_after": load_average(),
            "operator_logs": str(op.workdir),
            "profile": profile,
        }
    finally:
        job_watch.stop()
        op.stop()
        if not keep:
            subprocess.run([str(E2E / "cluster.sh"), "down"], env=env, check=False, capture_output=True)
    return result


def cycle_metrics(metrics_port: int) -> tuple[int, float]:
    """(cycles run, seconds spent in them) since the operator started, from its /metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).read().decode()
    values = {line.split()[0]: float(line.split()[-1]) for line in text.splitlines() if line.startswith("tidal_cycle")}
    return int(values.get("tidal_cycles_total", 0)), values.get("tidal_cycle_duration_seconds_sum", 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--nodes", type=int, default=1008, help="rounded up to NVL72 racks of 18 nodes")
    parser.add_argument("--gang-pods", type=int, default=256, help="pods of the big gang (4 GPUs each; 64 x k)")
    parser.add_argument("--jobs", type=int, default=50, help="jobs from the calibrated mix besides the gang")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument(
        "--py-spy",
        metavar="PY_SPY",
        default=None,
        help="py-spy binary: sample the operator during the gang (top functions in the profile)",
    )
    parser.add_argument(
        "--restart",
        choices=["container", "pod"],
        default="container",
        help="the warm-up's restart: the operator's container in its pod (default; kopf's identity, the "
        "pod's name, is kept) or a new pod (a new identity: it waits out the dead pod's peering record)",
    )
    args = parser.parse_args()
    result = run(args.nodes, args.gang_pods, args.jobs, args.seed, args.keep, args.py_spy, args.restart)
    # The tables go to stderr, so that --json's stdout stays one JSON document.
    print(render(result["profile"]), file=sys.stderr)  # type: ignore[arg-type]
    if args.json:
        print(json.dumps(result))
    else:
        width = max(map(len, result))
        for k, v in result.items():
            if k != "profile":
                print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
