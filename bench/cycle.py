"""The operator's own controller cycle at our users' size, in-process (no API server).

    python -m bench.cycle [--json] [--quick] [--fleet nvl72|mixed] [--cycles 30] [--seed 7]

Synthetic watch state is fed to the controller's WatchCache as kopf would: ~25,000 nodes /
100,000 GPUs (NVL72 racks, or the mixed NVL72/CM384/HGX fleet), ~100,000 pods of placed 1,024-GPU
jobs (1 GPU per pod) and 500 inference pools, and 1,000 queued jobs that do not fit. A recording
Api stands in for the API server: every status patch, pod create/delete and gate removal is
recorded and fed back as the watch event it would cause (pods bind and run at once).

Measured: steady cycles with churn (each cycle 200 pod updates and a node label change; every
10th cycle a node fails; every 15th a placed job finishes, freeing GPUs so the queue is tried
again) -> cycle_p50_ms / cycle_p99_ms. Then a real admission: the world holds 18 placed MoE jobs of
1,024 GPUs (tp=8, ep=8: one 64-GPU group per rack, 288 racks); they finish and a 16,384-GPU gang
(tp=8, ep=8, pp=4, dp=64, 4 GPUs per pod: 256 groups of 64) of the highest priority is submitted in
the same batch of events, and the next cycle of the operator's own code admits it:
admit_16k_gang_ms is that whole cycle (releases, the queue tried again, plan, and applying the
plan: the status write, the Service and 4,096 pod creations to the recording Api), split into
admit_16k_decide_ms (no API call) and admit_16k_write_ms (applying the plan). big_gang_admitted is
True only if the gang's status says Admitted with a placement of 256 groups and all 4,096 of its
pods were created. peak_rss_mb is the process's VmHWM after that.

The old code path is re-measured in the same run on the same state: the four per-cycle costs the
issue measured (every node against every Supernode selector, a snapshot rebuilt from all nodes and
pods, the manifests of every placed pod, one snapshot copy per queued job that does not fit);
`old_cycle_ms` is their sum and `speedup` old_cycle_ms / cycle_p50_ms. A profile of one steady
cycle (top functions by cumulative time) is printed with --profile.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import io
import itertools
import json
import pstats
import random
import resource as rusage
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from tidal.clock import FixedClock
from tidal.k8s import labels
from tidal.k8s.api import StatusConflict
from tidal.k8s.cache import build_snapshot, memberships
from tidal.k8s.compact import to_wire
from tidal.k8s.controller import Controller
from tidal.k8s.manifests import training_pods
from tidal.k8s.state import ClusterState, NodeView, PodView, ResourceView, pod_view
from tidal.k8s.training import allocations, placement_of, summary_fields
from tidal.logging import configure as configure_logging
from tidal.placement import GangRequest, GangShape, PlacementPlan, apply_plan, plan_gang
from tidal.topology.fleet import build_fleet, fleet_for_gpus
from tidal.topology.snapshot import ClusterSnapshot, NodeState, SupernodeState

TEMPLATE = {"spec": {"containers": [{"name": "trainer", "image": "trainer:latest"}]}}
NOW = dt.datetime(2026, 5, 1, tzinfo=dt.UTC)
_uid = itertools.count(1)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


class RecordingApi:
    """The Api surface the controller uses; every write is recorded and fed back to the cache."""

    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.pods_created: Counter[str] = Counter()
        """TrainingJob name -> pods created for it."""
        self.controller: Controller | None = None
        self.objects: dict[tuple[str, str | None, str], ResourceView] = {}

    @property
    def total_requests(self) -> int:
        return sum(self.requests.values())

    def parallel(self, fn, items):
        return [fn(i) for i in items]

    def _feed(self, kind: str, key: Any, view: Any) -> None:
        assert self.controller is not None
        self.controller.cache.feed(kind, key, view)

    def create_pod(self, body: dict[str, Any]) -> bool:
        self.requests["create_pod"] += 1
        meta = body["metadata"]
        self.pods_created[meta["labels"].get(labels.JOB, "")] += 1
        terms = body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        node = terms["nodeSelectorTerms"][0]["matchFields"][0]["values"][0]
        bound = {
            "metadata": {**meta, "uid": f"pod-{next(_uid)}"},
            "spec": {**body["spec"], "nodeName": node, "schedulingGates": []},
            "status": {"phase": "Running"},
        }
        self._feed("pod", (meta["namespace"], meta["name"]), pod_view(bound))
        return True

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = None, uid: str = "") -> None:
        self.requests["delete_pod"] += 1
        self._feed("pod", (namespace, name), None)

    def remove_gate(self, namespace, name, gate, gates) -> None:
        self.requests["ungate_pod"] += 1

    def annotate_pod(self, namespace, name, annotations) -> None:
        self.requests["annotate_pod"] += 1
        assert self.controller is not None
        pod = self.controller.cache.pods.get((namespace, name))
        if pod is not None:  # as the watch would bring it back: annotated once, not every cycle
            merged = {**pod.annotations, **{k: v for k, v in annotations.items() if v is not None}}
            self._feed("pod", (namespace, name), replace(pod, annotations=merged))

    def ensure_service(self, body) -> None:
        self.requests["create_service"] += 1

    def apply_service(self, body) -> str:
        self.requests["apply_service"] += 1
        return "created"

    def label_pod(self, namespace: str, name: str, pod_labels: dict[str, str]) -> None:
        self.requests["label_pod"] += 1
        assert self.controller is not None
        pod = self.controller.cache.pods.get((namespace, name))
        if pod is not None:
            self._feed("pod", (namespace, name), replace(pod, labels={**pod.labels, **pod_labels}))

    def create_compute_domain(self, body) -> bool:
        self.requests["create_compute_domain"] += 1
        return True

    def delete_compute_domain(self, namespace: str, name: str) -> None:
        self.requests["delete_compute_domain"] += 1

    def patch_status(
        self,
        kind: str,
        namespace: str | None,
        name: str,
        status: dict[str, Any],
        resource_version: str | None = None,
    ) -> str | None:
        self.requests["patch_status"] += 1
        key = (kind, namespace, name)
        view = self.objects.get(key)
        if view is None:
            return None
        if resource_version and resource_version != view.resource_version:
            raise StatusConflict(f"{kind} {name}: {resource_version} is not {view.resource_version}")
        merged = {k: v for k, v in {**view.status, **status}.items() if v is not None}
        new = replace(view, status=merged, resource_version=str(next(_uid)))
        self.objects[key] = new
        self._feed({"TrainingJob": "job", "InferencePool": "pool", "Supernode": "supernode"}[kind], _key(new), new)
        return new.resource_version

    def read_status(self, kind: str, namespace: str | None, name: str) -> tuple[dict[str, Any], str, str] | None:
        self.requests["get_status"] += 1
        view = self.objects.get((kind, namespace, name))
        return None if view is None else (dict(view.status), view.resource_version, view.uid)

    def annotate(self, kind, namespace, name, annotations) -> None:
        self.requests["annotate"] += 1

    def create_supernode(self, name, spec) -> bool:
        return False

    def event(self, kind, namespace, name, uid, reason, message, warning=False) -> None:
        self.requests["create_event"] += 1


def _key(view: ResourceView) -> Any:
    return view.name if view.kind == "Supernode" else (view.namespace, view.name)


def resource(kind: str, namespace: str | None, name: str, spec: dict, status: dict | None = None) -> ResourceView:
    n = next(_uid)
    return ResourceView(kind, namespace, name, f"uid-{n}", 1, f"2026-01-01T00:{n // 60 % 60:02d}:{n % 60:02d}Z",
                        spec, status or {}, {}, str(n), False)  # fmt: skip


def job_spec(
    tp: int, ep: int, pp: int, dp: int, gpp: int, priority: int = 0, accelerator: str = "nvidia.com/gpu"
) -> dict[str, Any]:
    spec = {"tp": tp, "ep": ep, "pp": pp, "dp": dp, "gpusPerPod": gpp, "priority": priority, "template": TEMPLATE}
    return spec if accelerator == "nvidia.com/gpu" else {**spec, "accelerator": accelerator}


def running_pod(
    job: ResourceView, name: str, node: str, group: int, gpus: int, accelerator: str = "nvidia.com/gpu"
) -> PodView:
    owner = ("TrainingJob", job.name) if job.kind == "TrainingJob" else ("InferencePool", job.name)
    pod_labels = {labels.JOB if job.kind == "TrainingJob" else labels.POOL: job.name, labels.HBD_GROUP: str(group)}
    return PodView(job.namespace or "", name, f"pod-{next(_uid)}", node, True, "Running", False, False,
                   {accelerator: gpus}, owner, group, pod_labels, {}, owner_uid=job.uid)  # fmt: skip


def build_world(fleet_kind: str, gpus: int, pods_target: int, queued: int, pools: int, seed: int, moe_jobs: int = 0):
    """(RecordingApi, ClusterState, keys of the MoE jobs) with placed jobs, pools and a queue, all
    Running as placed. `moe_jobs` 1,024-GPU MoE jobs (64-GPU groups, one per rack) are placed
    first: when they finish, their racks are the room for the big gang."""
    fleet = fleet_for_gpus(fleet_kind, gpus) if fleet_kind == "mixed" else build_fleet("nvl72", -(-gpus // 72))
    nodes: dict[str, NodeView] = {}
    supernodes: dict[str, ResourceView] = {}
    scratch = ClusterSnapshot()
    for sn in fleet:
        supernodes[sn.name] = resource("Supernode", None, sn.name, {"accelerator": sn.shape.accelerator})
        scratch.add_supernode(SupernodeState(sn.name, sn.shape.accelerator, [], sn.block))
        for n in sn.nodes:
            nodes[n.name] = NodeView(n.name, {labels.SUPERNODE: sn.name, labels.BLOCK: sn.block},
                                     {n.accelerator: n.gpus}, True, False)  # fmt: skip
            scratch.add_node(NodeState(n.name, sn.name, n.gpus))
    api = RecordingApi()
    jobs: dict[Any, ResourceView] = {}
    pods: dict[tuple[str, str], PodView] = {}
    pool_views: dict[Any, ResourceView] = {}
    # Pools first (one replica of 1 GPU each), then 1,024-GPU jobs at 1 GPU per pod.
    for i in range(pools):
        spec = {"tp": 1, "gpusPerPod": 1, "minReplicas": 1, "maxReplicas": 1, "priority": 1000, "template": TEMPLATE}
        view = resource("InferencePool", "serve", f"pool-{i:03d}", spec)
        plan = plan_gang(scratch, GangRequest(view.ref, groups=1, group_gpus=1, gpus_per_pod=1, priority=1000))
        if not isinstance(plan, PlacementPlan):
            break
        apply_plan(scratch, plan)
        g = plan.groups[0]
        view = replace(view, status={"placement": [{"group": 0, "supernode": g.supernode, "nodes": list(g.nodes)}],
                                     "placedReplicas": 1, "desiredReplicas": 1, "readyReplicas": 1})  # fmt: skip
        pool_views[_key(view)] = view
        pods[("serve", f"{view.name}-0-0")] = running_pod(view, f"{view.name}-0-0", g.nodes[0], 0, 1)
    moe_spec = job_spec(8, 8, 4, 4, 1)  # 1,024 GPUs, 1,024 pods, 16 groups of 64 (a rack's 16 nodes each)
    # Dense jobs: 1,024 GPUs, 1,024 pods, groups of 4 (one node each), of each accelerator in turn
    # until it is full, so a mixed fleet's CM384-like domains hold pods too.
    dense_specs = [job_spec(4, 1, 4, 64, 1, accelerator=a) for a in dict.fromkeys(sn.shape.accelerator for sn in fleet)]
    moe_keys: list[Any] = []
    i = 0
    while len(pods) + 1024 <= pods_target and (i < moe_jobs or dense_specs):
        shape_spec = moe_spec if i < moe_jobs else dense_specs[i % len(dense_specs)]
        shape, accelerator = GangShape.of(shape_spec), shape_spec.get("accelerator", "nvidia.com/gpu")
        view = resource("TrainingJob", "ml", f"job-{i:03d}", dict(shape_spec))
        plan = plan_gang(scratch, shape.request(view.ref, accelerator=accelerator))
        if not isinstance(plan, PlacementPlan):
            if i < moe_jobs:
                raise ValueError(f"the fleet has no room for {moe_jobs} MoE jobs")
            dense_specs.remove(shape_spec)  # this accelerator is full
            continue
        apply_plan(scratch, plan)
        placement = placement_of(plan)
        status = {"phase": "Running", **summary_fields(placement, shape), "admittedAt": "2026-05-01T00:00:00Z"}
        view = replace(view, status=to_wire(status))
        jobs[_key(view)] = view
        if i < moe_jobs:
            moe_keys.append(_key(view))
        for group in placement:
            for k, node in enumerate(group["nodes"]):
                name = f"{view.name}-{group['group'] * shape.pods_per_group + k}"
                pods[("ml", name)] = running_pod(view, name, node, group["group"], 1, accelerator)
        i += 1
    rng = random.Random(seed)
    for q in range(queued):  # each wants more than is free: they wait
        dp = rng.choice((32, 64, 128))
        view = resource("TrainingJob", "queue", f"wait-{q:04d}", job_spec(8, 1, 4, dp, 4, priority=rng.choice((0, 5))))
        jobs[_key(view)] = view
    api.objects = {
        (v.kind, v.namespace, v.name): v for v in (*jobs.values(), *pool_views.values(), *supernodes.values())
    }
    state = ClusterState(nodes=nodes, pods=pods, supernodes=supernodes, jobs=jobs, pools=pool_views)
    return api, state, moe_keys


def old_path_ms(state: ClusterState, controller: Controller) -> dict[str, float]:
    """The per-cycle costs of the code before the watch cache, re-measured on the same state."""
    out: dict[str, float] = {}
    t = time.perf_counter()
    members = memberships(state)
    out["membership_scan_ms"] = (time.perf_counter() - t) * 1000
    statuses = {v.uid: (v, controller.writer.effective(v)) for v in state.jobs.values()}
    t = time.perf_counter()
    held = [a for v, s in statuses.values() for a in allocations(v, s)]
    snapshot = build_snapshot(state, members, held)
    out["snapshot_rebuild_ms"] = (time.perf_counter() - t) * 1000
    t = time.perf_counter()
    for view, status in statuses.values():
        if status.get("placement"):
            shape = GangShape.of(view.spec, status.get("currentDP"))
            training_pods(view.name, view.namespace, view.uid, view.spec, shape,
                          {g["group"]: g["nodes"] for g in status["placement"]})  # fmt: skip
    out["all_pod_manifests_ms"] = (time.perf_counter() - t) * 1000
    queued = sum(1 for v, s in statuses.values() if not s.get("placement"))
    t = time.perf_counter()
    for _ in range(min(queued, 50)):
        snapshot.copy()
    out["queue_snapshot_copies_ms"] = (time.perf_counter() - t) * 1000 * queued / max(min(queued, 50), 1)
    out["old_cycle_ms"] = sum(out.values())
    return out


def peak_rss_mb() -> float:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return rusage.getrusage(rusage.RUSAGE_SELF).ru_maxrss / 1024


def run(
    fleet: str,
    gpus: int,
    pods: int,
    queued: int,
    pools: int,
    cycles: int,
    seed: int,
    profile: bool,
    big_dp: int,
    with_old_path: bool = True,
):
    t0 = time.perf_counter()
    big_groups = 4 * big_dp  # tp*ep = 64 GPUs a group, pp=4 groups per DP replica
    # One 64-GPU group per rack for each MoE job's 16 groups, with an eighth spare: churn fails
    # nodes, and a rack with a NotReady node no longer holds 64 free GPUs.
    moe_jobs = -(-big_groups * 9 // (8 * 16))
    api, state, moe_keys = build_world(fleet, gpus, pods, queued, pools, seed, moe_jobs)
    build_s = time.perf_counter() - t0
    controller = Controller(api, FixedClock(NOW))
    api.controller = controller
    controller.settings.min_cycle_seconds = 0.0
    controller.settings.spec_priority = True  # the synthetic world's jobs carry integer priorities
    t = time.perf_counter()
    controller.cycle(state)  # the first cycle: cache filled, snapshot built, every queued job tried once
    first_ms = (time.perf_counter() - t) * 1000
    controller.cycle()  # our own status writes come back
    rng = random.Random(seed)
    pod_keys = list(state.pods)
    node_names = list(state.nodes)
    job_keys = [k for k, v in state.jobs.items() if v.status and k not in moe_keys]
    placed = len(job_keys)
    times: list[float] = []
    cpu_times: list[float] = []  # this process's CPU: comparable when other work shares the cores
    prof = cProfile.Profile() if profile else None
    requests_before = api.total_requests
    requests_by_kind_before = Counter(api.requests)
    for c in range(cycles):
        cache = controller.cache
        for key in rng.sample(pod_keys, 200):  # pods change (annotations, say): their owners are looked at
            pod = cache.pods.get(key)
            if pod is not None:
                # Another controller's annotation: it adds to the pod's annotations, as a patch would.
                cache.feed("pod", key, replace(pod, annotations={**pod.annotations, "tick": str(c)}))
        name = rng.choice(node_names)
        node = cache.nodes[name]
        cache.feed("node", name, replace(node, labels={**node.labels, "tidal.dev/tick": str(c)}))
        if c % 10 == 5:  # a node fails: its group is re-placed
            victim = rng.choice(node_names)
            cache.feed("node", victim, replace(cache.nodes[victim], ready=False))
        if c % 15 == 7 and job_keys:  # a job finishes: GPUs free up, the queue is tried again
            _finish(controller, api, job_keys.pop())
        t, cpu = time.perf_counter(), time.process_time()
        if prof is not None and c == cycles // 2:
            prof.enable()
            controller.cycle()
            prof.disable()
        else:
            controller.cycle()
        times.append((time.perf_counter() - t) * 1000)
        cpu_times.append((time.process_time() - cpu) * 1000)
    steady_requests = api.total_requests - requests_before
    steady_by_kind = Counter(api.requests)
    steady_by_kind.subtract(requests_by_kind_before)
    # Room for a 16,384-GPU gang (the MoE jobs finish: a rack each of their groups now has 64
    # free GPUs; a rack of 72 holds one group of 64) and the gang, in one batch of events: the
    # highest priority in the queue, it is admitted by the cycle that sees the room.
    for key in moe_keys:
        _finish(controller, api, key)
    big = resource("TrainingJob", "ml", "big-gang", job_spec(8, 8, 4, big_dp, 4, priority=100))
    api.objects[("TrainingJob", "ml", "big-gang")] = big
    controller.cache.feed("job", ("ml", "big-gang"), big)
    t = time.perf_counter()
    report = controller.cycle()
    admit_ms = (time.perf_counter() - t) * 1000
    assert report is not None, "the admitting cycle did not run"
    big_status = next((s for v, s in report.statuses.values() if v.name == "big-gang"), {})
    big_pods = GangShape.of(big.spec).world_size // 4
    admitted = (
        big_status.get("phase") == "Admitted"
        and len(big_status.get("placement") or []) == big_groups
        and api.pods_created["big-gang"] == big_pods
    )
    rss = peak_rss_mb()
    cache = controller.cache
    result: dict[str, Any] = {
        "fleet": fleet,
        "nodes": len(cache.nodes),
        "gpus": sum(sum(n.capacity.values()) for n in cache.nodes.values()),
        "pods": len(state.pods),
        "queued_jobs": queued,
        "pools": len(state.pools),
        "placed_jobs_at_start": placed,
        "cycles": cycles,
        "cycle_p50_ms": round(percentile(times, 0.5), 1),
        "cycle_p99_ms": round(percentile(times, 0.99), 1),
        "cycle_cpu_p50_ms": round(percentile(cpu_times, 0.5), 1),
        "first_cycle_ms": round(first_ms, 1),
        "admit_16k_gang_ms": round(admit_ms, 1),
        "admit_16k_decide_ms": round(report.decide_seconds * 1000, 1),
        "admit_16k_write_ms": round(report.write_seconds * 1000, 1),
        "big_gang_gpus": 8 * 8 * 4 * big_dp,
        "big_gang_admitted": admitted,
        "big_gang_pods_created": api.pods_created["big-gang"],
        "jobs_admitted_in_that_cycle": report.cycle.counters.get("admitted", 0) if report.cycle else 0,
        "peak_rss_mb": round(rss, 1),
        "api_requests_steady": steady_requests,
        "api_requests_steady_by_kind": {k: n for k, n in sorted(steady_by_kind.items()) if n},
        "world_build_s": round(build_s, 1),
    }
    if with_old_path:
        old = old_path_ms(_state_of(controller), controller)
        result.update({k: round(v, 1) for k, v in old.items()})
        result["speedup"] = round(old["old_cycle_ms"] / max(result["cycle_p50_ms"], 0.1), 1)
    if prof is not None:
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(18)
        result["profile"] = out.getvalue()
    return result


def _finish(controller: Controller, api: RecordingApi, key: Any) -> None:
    cache = controller.cache
    view = cache.jobs.get(key)
    if view is None:
        return
    for pod in cache.pods_of("TrainingJob", view.namespace, view.name):
        cache.feed("pod", (pod.namespace, pod.name), None)
    cache.feed("job", key, None)
    api.objects.pop(("TrainingJob", view.namespace, view.name), None)


def _state_of(controller: Controller) -> ClusterState:
    c = controller.cache
    return ClusterState(nodes=dict(c.nodes), pods=dict(c.pods), supernodes=dict(c.supernodes),
                        jobs=dict(c.jobs), pools=dict(c.pools))  # fmt: skip


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a small world (CI smoke test)")
    parser.add_argument("--fleet", choices=("nvl72", "mixed"), default="nvl72")
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--profile", action="store_true", help="print a profile of one steady cycle")
    parser.add_argument("--no-old-path", action="store_true", help="skip re-measuring the old code path (minutes)")
    args = parser.parse_args(argv)
    configure_logging("WARNING", json=True)  # one log line per event would be the benchmark
    if args.quick:
        sizes = {"gpus": 40 * 72, "pods": 2_100, "queued": 20, "pools": 10, "cycles": min(args.cycles, 5), "dp": 2}
    else:
        # The mixed fleet has 216 NVL72 racks (the rest CM384-like and HGX): 13 MoE jobs' 208 racks
        # hold a gang of 184 groups of 64 (dp=46, 11,776 GPUs), not the NVL72 fleet's 16,384 GPUs.
        dp = 64 if args.fleet == "nvl72" else 46
        sizes = {"gpus": 100_000, "pods": 100_000, "queued": 1_000, "pools": 500, "cycles": args.cycles, "dp": dp}
    result = run(args.fleet, sizes["gpus"], sizes["pods"], sizes["queued"], sizes["pools"], sizes["cycles"],
                 args.seed, args.profile, sizes["dp"], not args.no_old_path)  # fmt: skip
    profile = result.pop("profile", None)
    if args.json:
        print(json.dumps(result))
    else:
        width = max(map(len, result))
        for k, v in result.items():
            print(f"{k:<{width}}  {v}")
    if profile:
        print(profile)
    return result


if __name__ == "__main__":
    main()
