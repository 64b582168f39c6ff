"""Operator scale benchmark on a real API server with >= 1,000 simulated GPU nodes (KWOK).

    python -m bench.operator [--json] [--supernodes 56] [--jobs 50] [--seed 7] [--keep]

Brings up its own cluster (e2e/cluster.sh, name tidal-bench: 56 NVL72 racks = 1,008 nodes, 4,032
GPUs), starts `tidal run` as a separate process, submits one 1,024-GPU gang (tp=8, ep=8, pp=4, dp=4)
and then `--jobs` jobs of 8 to 1,024 GPUs drawn from the calibrated mix, and measures:
big_gang_seconds_to_running, seconds_to_admit_all (every job placed), seconds_to_running_all,
api_requests (the operator's own count), operator_peak_rss_mb (VmHWM), and checks the pods
actually bound: hbd_split_groups and overbooked_gpus must both be 0.
Client limits: kube-scheduler --kube-api-qps=500/--kube-api-burst=1000, kube-controller-manager
200/400 (set by e2e/cluster.sh); the operator has no client-side rate limit.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

import yaml
from tests.cluster.kube import E2E, REPO, Kube, bin_dir, eventually
from tests.cluster.operator_process import OperatorProcess, free_port

from tidal.placement.workload_mix import TRAINING_MIX, sample_shapes

CLUSTER = "tidal-bench"
TEMPLATE = {"spec": {"containers": [{"name": "trainer", "image": "trainer:latest"}]}}


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


def run(supernodes: int, jobs: int, seed: int, keep: bool) -> dict[str, object]:
    env = {**os.environ, "TIDAL_CLUSTER_NAME": CLUSTER}
    started = time.monotonic()
    out = subprocess.run(
        [str(E2E / "cluster.sh"), "up", "--shape", "nvl72", "--supernodes", str(supernodes)],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    cluster_up_s = time.monotonic() - started
    kube = Kube(Path(out.strip().splitlines()[-1].removeprefix("export KUBECONFIG=")), bin_dir())
    kube.run("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kube.run("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "crds"))
    kube.run("apply", "-f", str(REPO / "examples" / "peering.yaml"))
    kube.run("create", "namespace", "bench", check=False)
    node_count = len(kube.get("nodes")["items"])
    metrics_port = free_port()
    op = OperatorProcess(
        kube.kubeconfig,
        Path(tempfile.mkdtemp(prefix="tidal-bench-")),
        "--discover-supernodes",
        "tidal.dev/supernode",
        "--metrics-port",
        str(metrics_port),
        "--spec-priority",  # the synthetic jobs carry integer priorities (big-gang goes first)
        env={"TIDAL_LOG_LEVEL": "WARNING"},
    )
    op.start()
    try:
        eventually(
            lambda: sum(1 for s in kube.get("supernodes")["items"] if s.get("status", {}).get("gpus")) == supernodes,
            timeout=120,
            what="supernode status",
        )
        requests_before = api_requests(metrics_port)
        big = job_manifest("big-gang", 8, 8, 4, 4, 4, priority=10)
        others = mixed_jobs(jobs, seed, budget=int(supernodes * 72 * 0.75) - 1024)
        t0 = time.monotonic()
        kube.run("apply", "-f", "-", input=yaml.safe_dump_all([big, *others]))

        def phases() -> dict[str, str]:
            return {
                j["metadata"]["name"]: j.get("status", {}).get("phase", "")
                for j in kube.get("trainingjobs", "-n", "bench")["items"]
            }

        eventually(lambda: phases().get("big-gang") == "Running", timeout=600, interval=0.25, what="big gang")
        big_s = time.monotonic() - t0
        eventually(
            lambda: all(p in ("Admitted", "Running") for p in phases().values()),
            timeout=600,
            interval=0.25,
            what="all admitted",
        )
        admit_s = time.monotonic() - t0
        eventually(
            lambda: all(p == "Running" for p in phases().values()), timeout=600, interval=0.5, what="all running"
        )
        running_s = time.monotonic() - t0
        split, over = audit_pods(kube)
        pods = len(kube.get("pods", "-n", "bench")["items"])
        result = {
            "nodes": node_count,
            "gpus": node_count * 4,
            "cluster_up_seconds": round(cluster_up_s, 1),
            "big_gang_gpus": 1024,
            "big_gang_seconds_to_running": round(big_s, 2),
            "jobs": 1 + len(others),
            "job_gpus": 1024
            + sum(j["spec"]["tp"] * j["spec"]["ep"] * j["spec"]["pp"] * j["spec"]["dp"] for j in others),
            "pods": pods,
            "seconds_to_admit_all": round(admit_s, 2),
            "seconds_to_running_all": round(running_s, 2),
            "api_requests": api_requests(metrics_port) - requests_before,
            "operator_peak_rss_mb": round(peak_rss_mb(op.proc.pid), 1),
            "hbd_split_groups": split,
            "overbooked_gpus": over,
            "client_limits": "kube-scheduler qps 500/burst 1000; kube-controller-manager qps 200/burst 400",
        }
    finally:
        op.stop()
        if not keep:
            subprocess.run([str(E2E / "cluster.sh"), "down"], env=env, check=False, capture_output=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--supernodes", type=int, default=56, help="NVL72 racks of 18 nodes (56 -> 1,008 nodes)")
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    args = parser.parse_args()
    result = run(args.supernodes, args.jobs, args.seed, args.keep)
    if args.json:
        print(json.dumps(result))
    else:
        width = max(map(len, result))
        for k, v in result.items():
            print(f"{k:<{width}}  {v}")


if __name__ == "__main__":
    main()
