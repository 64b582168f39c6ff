"""Fault-injection run of the real operator on a real API server with KWOK GPU nodes.

    python -m bench.faults [--json] [--quick] [--kills 20] [--node-failure-share 0.1]
                           [--fault-rate 0.05] [--seed 7] [--kubeconfig PATH] [--keep]

The operator (`tidal run`, a subprocess) reaches the API server only through bench.fault_proxy,
which injects latency, hangs, 409, 429 and 500 at `--fault-rate` and cuts watches. Meanwhile:
a mix of TrainingJobs (priorities, preemptible, elastic, groups that fill racks) is submitted in
waves; a storm of foreign (non-tidal) GPU pods lands on free nodes and on nodes tidal has planned
(`nodeName` onto the pinned node of a still-gated tidal pod) and through kube-scheduler; the
operator is SIGKILLed `--kills` times at random moments spread over admission, recovery and
rebalancing, and restarted; `--node-failure-share` of the nodes are deleted mid-run.

After each fault the harness checks, from the API server's objects and never the operator's
memory: split_groups (an HBD group's pods on more than one supernode), overbooked_gpus (GPUs
requested beyond a node's allocatable by pods bound there, and at the end also by tidal pods
pinned there), duplicate_ranks (two live pods of one job claiming one rank), and at the end,
after the settle: orphans (live tidal pods with no live owner, beyond the job's world size, or
held by a job that is not admitted) and stuck_jobs (a job neither Running nor Pending with a
reason, or Pending although its smallest shape fits in the GPUs that are free; a gang released
for a whole-gang restart and queued again counts as Pending).

Without --kubeconfig it brings up its own cluster (e2e/cluster.sh, name tidal-faults, 8 NVL72
racks = 144 nodes) and removes it afterwards unless --keep. Failed nodes are put back at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml
from tests.cluster.kube import E2E, REPO, Kube, bin_dir, eventually
from tests.cluster.operator_process import OperatorProcess

from bench.fault_proxy import FaultProxy, FaultRates

GPU = "nvidia.com/gpu"
CLUSTER = "tidal-faults"
TEMPLATE = {"spec": {"containers": [{"name": "trainer", "image": "trainer:latest"}]}}
FOREIGN_NS_SUFFIX = "-foreign"
SUPERNODE_LABEL = "tidal.dev/supernode"


@dataclass
class FaultConfig:
    kills: int = 20
    node_failure_share: float = 0.10
    fault_rate: float = 0.05
    seed: int = 7
    foreign_pods: int = 24
    settle_timeout: float = 300.0
    hang_seconds: float = 10.0
    quick: bool = False

    @classmethod
    def quick_config(cls, seed: int = 7) -> FaultConfig:
        """The CI size: 3 kills, a small mix, a 10% node failure; 2-5 minutes on the loaded 2-core CI machine."""
        return cls(
            kills=3,
            node_failure_share=0.10,
            fault_rate=0.05,
            seed=seed,
            foreign_pods=10,
            settle_timeout=180,
            quick=True,
        )


def job(name: str, tp: int, ep: int, pp: int, dp: int, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"tp": tp, "ep": ep, "pp": pp, "dp": dp, "gpusPerPod": 4, "template": TEMPLATE}
    # Node failures restart groups; a job that Fails for running out of restarts is not what is tested.
    body["restartPolicy"] = {"scope": "Group", "maxRestarts": 1000}
    body.update(spec)
    return {"apiVersion": "tidal.dev/v1alpha1", "kind": "TrainingJob", "metadata": {"name": name}, "spec": body}


def job_waves(quick: bool) -> list[list[dict[str, Any]]]:
    """Jobs in waves: the first fills most of 8 racks (576 GPUs), the later ones need preemption,
    shrinking or freed capacity. Preemptible jobs checkpoint within 3 s (nobody confirms here)."""
    quick_ckpt = {"gracePeriodSeconds": 3}
    first = [
        job("rack-filler", 4, 16, 1, 2, priority=10),  # two groups of 64: whole racks
        job("moe", 4, 4, 2, 2, priority=5),  # four groups of 16
        job("batch", 4, 8, 1, 3, priority=1, preemptible=True, checkpoint=quick_ckpt),  # three of 32
        job(
            "elastic", 4, 4, 1, 4, priority=2, preemptible=True, elastic={"minDP": 1, "maxDP": 6}, checkpoint=quick_ckpt
        ),
        job("small-a", 4, 1, 1, 2),
        job("small-b", 4, 2, 1, 2, priority=3),
    ]
    second = [
        job("urgent", 4, 16, 1, 2, priority=100),  # 128 GPUs at top priority: preempts or shrinks
        job("small-c", 4, 1, 2, 1, priority=4),
    ]
    third = [job("late", 4, 4, 1, 2, priority=6), job("too-big", 4, 16, 1, 9)]  # too-big never fits: 9 racks
    if quick:
        return [first[:2] + first[3:5], second[:1], third[1:]]
    return [first, second, third]


# -- the independent checks, from the API server's objects --------------------------------------------


def _live(pod: dict[str, Any]) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and pod["status"].get("phase") not in ("Succeeded", "Failed")


def _gpus(pod: dict[str, Any]) -> int:
    total = 0
    for c in pod["spec"].get("containers", []):
        res = c.get("resources") or {}
        total += int({**(res.get("limits") or {}), **(res.get("requests") or {})}.get(GPU, 0))
    return total


def _pinned(pod: dict[str, Any]) -> str | None:
    terms = (
        pod["spec"]
        .get("affinity", {})
        .get("nodeAffinity", {})
        .get("requiredDuringSchedulingIgnoredDuringExecution", {})
    ).get("nodeSelectorTerms") or []
    for term in terms:
        for expr in term.get("matchFields") or []:
            if expr.get("key") == "metadata.name" and len(expr.get("values", [])) == 1:
                return expr["values"][0]
    return None


def _is_tidal(pod: dict[str, Any]) -> bool:
    return pod["metadata"].get("labels", {}).get("app.kubernetes.io/managed-by") == "tidal"


@dataclass
class Snapshot:
    nodes: list[dict[str, Any]]
    pods: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    pools: list[dict[str, Any]]

    @classmethod
    def take(cls, kube: Kube) -> Snapshot:
        return cls(
            kube.get("nodes")["items"],
            kube.get("pods", "-A")["items"],
            kube.get("trainingjobs", "-A")["items"],
            kube.get("inferencepools", "-A")["items"],
        )

    def supernode_of(self) -> dict[str, str]:
        return {n["metadata"]["name"]: n["metadata"].get("labels", {}).get(SUPERNODE_LABEL, "") for n in self.nodes}

    def capacity(self) -> dict[str, int]:
        return {n["metadata"]["name"]: int(n["status"].get("allocatable", {}).get(GPU, 0)) for n in self.nodes}

    def booked(self, with_pinned: bool) -> Counter[str]:
        """GPUs per node held by live pods bound there and, if asked, by tidal pods pinned there."""
        used: Counter[str] = Counter()
        for p in self.pods:
            if not _live(p):
                continue
            node = p["spec"].get("nodeName") or (_pinned(p) if with_pinned and _is_tidal(p) else None)
            if node:
                used[node] += _gpus(p)
        return used

    def planned_nodes(self) -> list[str]:
        """Nodes live tidal pods are pinned to but not yet bound on."""
        unbound = (p for p in self.pods if _is_tidal(p) and _live(p) and not p["spec"].get("nodeName"))
        return [n for p in unbound if (n := _pinned(p))]

    def split_groups(self, known: dict[str, str] | None = None) -> list[str]:
        """`known`: node -> supernode of nodes seen before, so that pods on a deleted node still count
        in their rack (a deleted node's pods stay until garbage-collected)."""
        where = {**(known or {}), **self.supernode_of()}
        groups: dict[tuple[str, str, str], set[str]] = {}
        for p in self.pods:
            labels = p["metadata"].get("labels", {})
            if not _live(p) or not _is_tidal(p) or "tidal.dev/hbd-group" not in labels:
                continue
            node = p["spec"].get("nodeName") or _pinned(p)
            if node:
                key = (p["metadata"]["namespace"], labels.get("tidal.dev/job", ""), labels["tidal.dev/hbd-group"])
                groups.setdefault(key, set()).add(where.get(node, f"gone:{node}"))
        return [f"{ns}/{j} group {g}: {sorted(s)}" for (ns, j, g), s in groups.items() if len(s) > 1]

    def overbooked(self, with_pinned: bool) -> dict[str, int]:
        """GPUs booked beyond allocatable, per node."""
        capacity = self.capacity()
        return {n: g - capacity[n] for n, g in self.booked(with_pinned).items() if n in capacity and g > capacity[n]}

    def duplicate_ranks(self) -> list[str]:
        seen: Counter[tuple[str, str, str]] = Counter()
        for p in self.pods:
            labels = p["metadata"].get("labels", {})
            if _live(p) and _is_tidal(p) and "tidal.dev/rank" in labels and "tidal.dev/job" in labels:
                seen[(p["metadata"]["namespace"], labels["tidal.dev/job"], labels["tidal.dev/rank"])] += 1
        return [f"{ns}/{j} rank {r}: {n} pods" for (ns, j, r), n in seen.items() if n > 1]

    def orphans(self) -> list[str]:
        jobs = {(j["metadata"]["namespace"], j["metadata"]["uid"]): j for j in self.jobs}
        pools = {(p["metadata"]["namespace"], p["metadata"]["uid"]) for p in self.pools}
        found = []
        for p in self.pods:
            if not _live(p) or not _is_tidal(p):
                continue
            meta = p["metadata"]
            owner_uids = [o["uid"] for o in meta.get("ownerReferences", [])]
            owner = next((jobs[(meta["namespace"], u)] for u in owner_uids if (meta["namespace"], u) in jobs), None)
            if owner is None:
                if not any((meta["namespace"], u) in pools for u in owner_uids):
                    found.append(f"{meta['namespace']}/{meta['name']}: no live owner")
                continue
            st = owner.get("status", {})
            world = st.get("worldSize")
            rank = int(meta.get("labels", {}).get("tidal.dev/rank", "-1"))
            if st.get("phase") in ("Pending", "Failed", "Succeeded", "Suspended", None):
                found.append(f"{meta['namespace']}/{meta['name']}: held by {st.get('phase')} job")
            elif world is not None and rank >= int(world):
                found.append(f"{meta['namespace']}/{meta['name']}: rank {rank} beyond worldSize {world}")
        return found

    def free_groups(self, group_gpus: int, gpus_per_pod: int) -> int:
        """How many groups of `group_gpus` (pods of `gpus_per_pod`, one supernode each) fit in the GPUs
        no live pod holds or is pinned to, on Ready schedulable nodes."""
        booked = self.booked(with_pinned=True)
        slots: Counter[str] = Counter()
        for n in self.nodes:
            name = n["metadata"]["name"]
            ready = any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))
            if not ready or n["spec"].get("unschedulable") or n["spec"].get("taints"):
                continue
            free = int(n["status"].get("allocatable", {}).get(GPU, 0)) - booked[name]
            slots[n["metadata"].get("labels", {}).get(SUPERNODE_LABEL, "")] += max(free, 0) // gpus_per_pod
        pods_per_group = max(group_gpus // gpus_per_pod, 1)
        return sum(s // pods_per_group for s in slots.values())

    def stuck_jobs(self) -> list[str]:
        stuck = []
        for j in self.jobs:
            name = f"{j['metadata']['namespace']}/{j['metadata']['name']}"
            st, spec = j.get("status", {}), j["spec"]
            phase = st.get("phase")
            if phase == "Running":
                continue
            reason = st.get("reason") or next(
                (c.get("message") for c in st.get("conditions", []) if c.get("status") == "False" and c.get("message")),
                "",
            )
            # A gang released for a whole-gang restart waits in the queue like a Pending job (it is
            # queued ahead of new work as a recovery): judged the same way, not as stuck per se.
            released = not st.get("assignment") and not st.get("placement")
            waiting = phase == "Pending" or (phase == "Restarting" and released)
            if not waiting or not reason:
                stuck.append(f"{name}: phase {phase!r} reason {reason!r}")
                continue
            gpp = int(spec.get("gpusPerPod", 1))
            group = max(int(spec.get("tp", 1)) * int(spec.get("ep", 1)), gpp)
            dp = int((spec.get("elastic") or {}).get("minDP", spec.get("dp", 1)))
            needed = int(spec.get("tp", 1)) * int(spec.get("ep", 1)) * int(spec.get("pp", 1)) * dp // group
            fit = self.free_groups(group, gpp)
            if fit >= needed:
                stuck.append(
                    f"{name}: Pending ({reason!r}) though {needed} group(s) of {group} need room and {fit} fit"
                )
        return stuck


# -- the run ---------------------------------------------------------------------------------------


@dataclass
class Tally:
    operator_kills: int = 0
    operator_crashes: int = 0  # exits the harness did not cause (restarted, as a kubelet would)
    nodes_failed: int = 0
    foreign_pods: int = 0
    foreign_rejected: int = 0  # nodeName pods a kubelet would refuse (the node filled up meanwhile)
    split_groups: set[str] = field(default_factory=set)
    overbooked: dict[str, int] = field(default_factory=dict)  # node -> most GPUs over allocatable seen
    duplicate_ranks: set[str] = field(default_factory=set)
    checks: int = 0
    kill_moments: list[str] = field(default_factory=list)


class FaultRun:
    def __init__(self, kube: Kube, workdir: Path, config: FaultConfig, namespace: str = "faults"):
        self.kube = kube
        self.workdir = workdir
        self.config = config
        self.namespace = namespace
        self.foreign_ns = namespace + FOREIGN_NS_SUFFIX
        self.rng = random.Random(config.seed)
        self.tally = Tally()
        self.proxy = FaultProxy(
            kube.kubeconfig, FaultRates(rate=config.fault_rate, hang_seconds=config.hang_seconds, seed=config.seed)
        )
        self.operator: OperatorProcess | None = None
        self.failed_nodes: list[str] = []
        self.known_supernodes: dict[str, str] = {}
        self.log: list[str] = []
        self.t0 = time.monotonic()

    def note(self, message: str) -> None:
        line = f"[{time.monotonic() - self.t0:6.1f}s] {message}"
        self.log.append(line)
        print(line, file=sys.stderr, flush=True)

    # -- the operator, as a kubelet would run it: restarted whenever it exits ------------------------
    def start_operator(self) -> None:
        assert self.operator is not None
        for _ in range(10):
            try:
                self.operator.start()
                return
            except RuntimeError as e:  # an injected fault at start-up made it exit: restart it
                self.tally.operator_crashes += 1
                self.note(f"operator exited at start-up, restarting: {str(e)[-300:]}")
                time.sleep(1)
        raise RuntimeError("the operator did not stay up through 10 starts")

    def ensure_operator(self) -> None:
        assert self.operator is not None
        if self.operator.proc is not None and self.operator.proc.poll() is not None:
            self.tally.operator_crashes += 1
            self.note(f"operator exited by itself (code {self.operator.proc.returncode}), restarting")
            self.start_operator()

    def kill_operator(self, moment: str) -> None:
        assert self.operator is not None
        self.ensure_operator()
        self.operator.kill()
        self.tally.operator_kills += 1
        self.tally.kill_moments.append(moment)
        self.note(f"SIGKILL #{self.tally.operator_kills} during {moment}")
        self.start_operator()
        self.check(f"after kill #{self.tally.operator_kills}")

    def kills_during(self, moment: str, count: int, spread_seconds: float) -> None:
        """`count` kills at random moments within about `spread_seconds`."""
        for _ in range(count):
            time.sleep(self.rng.uniform(0.2, spread_seconds / max(count, 1)))
            self.kill_operator(moment)

    # -- continuous safety checks -------------------------------------------------------------------
    def check(self, when: str) -> Snapshot:
        snap = Snapshot.take(self.kube)
        self.tally.checks += 1
        # Mid-run only bound pods count as booked: a gated pod pinned to a node a foreign pod just
        # took is tidal's to re-plan, and only a wrong binding books a GPU twice.
        self.known_supernodes.update(snap.supernode_of())
        split = snap.split_groups(self.known_supernodes)
        for attr, found in (("split_groups", split), ("duplicate_ranks", snap.duplicate_ranks())):
            for item in found:
                if item not in getattr(self.tally, attr):
                    self.note(f"VIOLATION {attr} {when}: {item}")
                getattr(self.tally, attr).add(item)
        self.record_overbooked(snap.overbooked(with_pinned=False), when)
        return snap

    def record_overbooked(self, over: dict[str, int], when: str) -> None:
        for node, excess in over.items():
            if excess > self.tally.overbooked.get(node, 0):
                self.note(f"VIOLATION overbooked {when}: {node} has {excess} GPU(s) booked beyond allocatable")
                self.tally.overbooked[node] = excess

    # -- faults -------------------------------------------------------------------------------------
    def submit(self, jobs: list[dict[str, Any]]) -> None:
        self.kube.run("apply", "-n", self.namespace, "-f", "-", input=yaml.safe_dump_all(jobs))
        self.note("submitted " + ", ".join(j["metadata"]["name"] for j in jobs))

    def foreign_storm(self, count: int, wait_for_plans: float = 6.0) -> None:
        """Non-tidal GPU pods: half with nodeName onto nodes tidal planned (the pinned node of a tidal
        pod not yet bound) or else onto free nodes, half left to kube-scheduler. A nodeName pod is
        only sent where the GPUs bound there leave room, as a kubelet admits it."""
        deadline = time.monotonic() + wait_for_plans
        while True:  # catch tidal between planning a gang and its binding, when the race is real
            snap = Snapshot.take(self.kube)
            planned = snap.planned_nodes()
            if planned or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        capacity = snap.capacity()
        bound = snap.booked(with_pinned=False)
        free = [n for n in capacity if capacity[n] - bound[n] > 0]
        pods = []
        for i in range(count):
            gpus = self.rng.choice((1, 2, 4))
            name = f"storm-{self.tally.foreign_pods + i:03d}"
            spec: dict[str, Any] = {
                "containers": [{"name": "foreign", "image": "foreign:latest", "resources": {"limits": {GPU: gpus}}}],
                "terminationGracePeriodSeconds": 0,
            }
            if i % 2 == 0:
                targets = [n for n in (planned or free) if capacity.get(n, 0) - bound[n] >= gpus]
                if targets:
                    node = self.rng.choice(targets)
                    bound[node] += gpus
                    spec["nodeName"] = node
            pods.append(
                {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": name, "labels": {"app": "storm"}},
                    "spec": spec,
                }
            )
        self.kube.run("apply", "-n", self.foreign_ns, "-f", "-", input=yaml.safe_dump_all(pods))
        self.tally.foreign_pods += count
        on_planned = sum(1 for p in pods if p["spec"].get("nodeName") in set(planned))
        self.note(f"foreign storm: {count} GPU pods, {on_planned} onto nodes tidal planned")
        time.sleep(1)
        self.kubelet_admission()

    def kubelet_admission(self) -> None:
        """A real kubelet refuses a nodeName pod its node has no GPUs left for (OutOfnvidia.com/gpu);
        KWOK does not, so the harness does: such foreign pods are deleted, newest first."""
        snap = Snapshot.take(self.kube)
        capacity, used = snap.capacity(), snap.booked(with_pinned=False)
        foreign = sorted(
            (
                p
                for p in snap.pods
                if p["metadata"]["namespace"] == self.foreign_ns and _live(p) and p["spec"].get("nodeName")
            ),
            key=lambda p: p["metadata"]["name"],
            reverse=True,
        )
        for p in foreign:
            node = p["spec"]["nodeName"]
            if used[node] > capacity.get(node, 0):
                used[node] -= _gpus(p)
                self.kube.delete("pod", "-n", self.foreign_ns, p["metadata"]["name"])
                self.tally.foreign_rejected += 1
                self.note(f"kubelet emulation: refused foreign {p['metadata']['name']} on full {node}")

    def release_foreign(self, share: float) -> None:
        names = sorted(p["metadata"]["name"] for p in self.kube.get("pods", "-n", self.foreign_ns)["items"] if _live(p))
        gone = self.rng.sample(names, int(len(names) * share))
        if gone:
            self.kube.run("delete", "pod", "-n", self.foreign_ns, "--wait=false", *gone)
        self.note(f"released {len(gone)} foreign pods")

    def fail_nodes(self) -> None:
        """Delete a share of the nodes, half of them chosen among nodes running tidal pods."""
        deadline = time.monotonic() + 90
        while True:  # recovery is only exercised if something runs: give admission a bounded while
            snap = Snapshot.take(self.kube)
            if any(j.get("status", {}).get("phase") == "Running" for j in snap.jobs) or time.monotonic() > deadline:
                break
            time.sleep(1)
        names = sorted(n["metadata"]["name"] for n in snap.nodes)
        count = max(1, round(len(names) * self.config.node_failure_share))
        busy = sorted(
            {p["spec"]["nodeName"] for p in snap.pods if _is_tidal(p) and _live(p) and p["spec"].get("nodeName")}
        )
        chosen = self.rng.sample(busy, min(len(busy), count // 2 + count % 2))
        rest = [n for n in names if n not in chosen]
        chosen += self.rng.sample(rest, count - len(chosen))
        self.kube.run("delete", "node", "--wait=false", *chosen)
        self.failed_nodes += chosen
        self.tally.nodes_failed += len(chosen)
        self.note(f"failed {len(chosen)} nodes ({len(set(chosen) & set(busy))} running tidal pods)")

    def restore_nodes(self) -> None:
        """Put the failed nodes back from the same fleet manifests the cluster was made with."""
        if not self.failed_nodes:
            return
        manifests = subprocess.run(
            [sys.executable, "-m", "tidal", "fleet", "--shape", "nvl72", "--supernodes", str(self._supernodes())],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        wanted = [
            d
            for d in yaml.safe_load_all(manifests)
            if d and d.get("metadata", {}).get("name") in set(self.failed_nodes)
        ]
        self.kube.run("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(wanted))

        def back() -> bool:
            nodes = {n["metadata"]["name"]: n for n in self.kube.get("nodes")["items"]}
            return all(
                n in nodes
                and any(
                    c["type"] == "Ready" and c["status"] == "True" for c in nodes[n]["status"].get("conditions", [])
                )
                and not nodes[n]["spec"].get("taints")
                for n in self.failed_nodes
            )

        eventually(back, timeout=180, interval=1, what="failed nodes back, Ready and untainted")
        self.note(f"restored {len(self.failed_nodes)} nodes")
        self.failed_nodes = []

    def _supernodes(self) -> int:
        return len({n["metadata"]["labels"][SUPERNODE_LABEL] for n in self.kube.get("nodes")["items"]})

    # -- settle and judge ---------------------------------------------------------------------------
    def settle(self) -> tuple[Snapshot, float]:
        """Wait until every check passes and no job changed phase for a while, or the timeout."""
        start = time.monotonic()
        deadline = start + self.config.settle_timeout
        last_phases: dict[str, str] | None = None
        calm_since = time.monotonic()
        while True:
            self.ensure_operator()
            snap = self.check("while settling")
            phases = {j["metadata"]["name"]: j.get("status", {}).get("phase", "") for j in snap.jobs}
            if phases != last_phases:
                last_phases, calm_since = phases, time.monotonic()
            clean = not snap.stuck_jobs() and not snap.orphans() and not snap.overbooked(with_pinned=True)
            if clean and time.monotonic() - calm_since >= 10:
                return snap, time.monotonic() - start
            if time.monotonic() > deadline:
                return snap, time.monotonic() - start
            time.sleep(2)

    def run(self) -> dict[str, Any]:
        cfg = self.config
        for ns in (self.namespace, self.foreign_ns):
            # A previous run's namespace may still be terminating (deleting 100+ pods is slow here).
            self.kube.run("wait", "--for=delete", f"namespace/{ns}", "--timeout=300s", check=False)
            self.kube.run("create", "namespace", ns)
        self.proxy.start()
        kubeconfig = self.proxy.operator_kubeconfig(self.workdir / "proxy.kubeconfig")
        self.operator = OperatorProcess(
            kubeconfig, self.workdir, "--discover-supernodes", SUPERNODE_LABEL, env={"TIDAL_LOG_LEVEL": "WARNING"}
        )
        waves = job_waves(cfg.quick)
        # Kills spread over the three phases the issue names, in proportion 2:1:1 (admission has the
        # most interleavings: pod creation, ungating, status writes).
        admission = max(1, cfg.kills // 2)
        recovery = max(1, (cfg.kills - admission) // 2) if cfg.kills > 1 else 0
        rebalancing = max(0, cfg.kills - admission - recovery)
        timings: dict[str, float] = {}
        try:
            self.start_operator()
            eventually(
                lambda: (
                    sum(1 for s in self.kube.get("supernodes")["items"] if s.get("status", {}).get("gpus"))
                    >= self._supernodes()
                ),
                timeout=120,
                what="supernodes discovered",
            )
            t = time.monotonic()
            self.submit(waves[0])
            self.foreign_storm(cfg.foreign_pods // 2)
            self.kills_during("admission", admission, spread_seconds=8 * admission)
            timings["admission_seconds"] = time.monotonic() - t

            t = time.monotonic()
            self.fail_nodes()
            self.check("after node failure")
            self.kills_during("recovery", recovery, spread_seconds=6 * recovery)
            timings["recovery_seconds"] = time.monotonic() - t

            t = time.monotonic()
            self.submit(waves[1])
            self.foreign_storm(cfg.foreign_pods - cfg.foreign_pods // 2)
            self.release_foreign(0.3)
            if len(waves) > 2:
                self.submit(waves[2])
            # Deleting a job mid-run: its pods must go, none left as orphans.
            self.kube.delete("trainingjob", "-n", self.namespace, waves[0][-1]["metadata"]["name"])
            self.note(f"deleted job {waves[0][-1]['metadata']['name']}")
            self.kills_during("rebalancing", rebalancing, spread_seconds=6 * max(rebalancing, 1))
            timings["rebalancing_seconds"] = time.monotonic() - t

            self.kubelet_admission()
            final, settle_s = self.settle()
            timings["settle_seconds"] = settle_s
        finally:
            # The operator stays up, faults off, through cleanup: it removes its finalizers from the
            # jobs of the namespaces deleted there (cleanup() stops it and the proxy).
            self.proxy.enabled = False
        stuck, orphans = final.stuck_jobs(), final.orphans()
        # At the end tidal's plan must fit too: pinned tidal pods count as booked.
        self.record_overbooked(final.overbooked(with_pinned=True), "at the end (bound and pinned)")
        for item in (*stuck, *orphans):
            self.note(f"VIOLATION at the end: {item}")
        result: dict[str, Any] = {
            "faults_injected": self.proxy.faults_injected,
            "operator_kills": self.tally.operator_kills,
            "nodes_failed": self.tally.nodes_failed,
            "foreign_pods": self.tally.foreign_pods,
            "split_groups": len(self.tally.split_groups),
            "overbooked_gpus": sum(self.tally.overbooked.values()),
            "duplicate_ranks": len(self.tally.duplicate_ranks),
            "orphans": len(orphans),
            "stuck_jobs": len(stuck),
            "faults_by_kind": dict(sorted(self.proxy.injected.items())),
            "api_requests_proxied": self.proxy.requests,
            "operator_crashes": self.tally.operator_crashes,
            "foreign_refused_by_kubelet": self.tally.foreign_rejected,
            "checks": self.tally.checks,
            "kill_moments": dict(Counter(self.tally.kill_moments)),
            "jobs": {j["metadata"]["name"]: j.get("status", {}).get("phase", "") for j in final.jobs},
            **{k: round(v, 1) for k, v in timings.items()},
            "total_seconds": round(time.monotonic() - self.t0, 1),
            "evidence": {
                "split_groups": sorted(self.tally.split_groups),
                "overbooked": dict(sorted(self.tally.overbooked.items())),
                "duplicate_ranks": sorted(self.tally.duplicate_ranks),
                "orphans": orphans,
                "stuck_jobs": stuck,
            },
        }
        return result

    def cleanup(self) -> None:
        """Leave the cluster as found: failed nodes back, the run's namespaces gone, no operator."""
        self.proxy.enabled = False
        try:
            if self.operator is not None:
                self.ensure_operator()  # it must be up to drop tidal's finalizers from the jobs
            self.restore_nodes()
        finally:
            for ns in (self.namespace, self.foreign_ns):
                self.kube.delete("namespace", ns)
            for ns in (self.namespace, self.foreign_ns):
                self.kube.run("wait", "--for=delete", f"namespace/{ns}", "--timeout=300s", check=False)
            if self.operator is not None:
                self.operator.stop()
            self.proxy.stop()


def run_faults(
    kube: Kube, config: FaultConfig, workdir: Path | None = None, namespace: str = "faults"
) -> dict[str, Any]:
    run = FaultRun(kube, workdir or Path(tempfile.mkdtemp(prefix="tidal-faults-")), config, namespace)
    try:
        return run.run()
    finally:
        run.cleanup()


def cluster(keep: bool) -> tuple[Kube, Callable[[], None]]:
    env = {**os.environ, "TIDAL_CLUSTER_NAME": CLUSTER}
    out = subprocess.run(
        [str(E2E / "cluster.sh"), "up", "--shape", "nvl72", "--supernodes", "8"],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    kube = Kube(Path(out.strip().splitlines()[-1].removeprefix("export KUBECONFIG=")), bin_dir())

    def down() -> None:
        if not keep:
            subprocess.run([str(E2E / "cluster.sh"), "down"], env=env, check=False, capture_output=True)

    return kube, down


def prepare(kube: Kube) -> None:
    kube.run("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    kube.run("wait", "--for=condition=Established", "--timeout=60s", "-f", str(REPO / "crds"))
    kube.run("apply", "-f", str(REPO / "examples" / "peering.yaml"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="the CI size: 3 kills, a small mix")
    parser.add_argument("--kills", type=int, default=None, help="operator SIGKILLs (default 20, quick 3)")
    parser.add_argument("--node-failure-share", type=float, default=0.10)
    parser.add_argument("--fault-rate", type=float, default=0.05, help="share of API requests given a fault")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--kubeconfig", type=Path, default=None, help="a running KWOK cluster (default: make one)")
    parser.add_argument("--keep", action="store_true", help="leave the cluster it made running")
    args = parser.parse_args()
    config = FaultConfig.quick_config(args.seed) if args.quick else FaultConfig(seed=args.seed)
    if args.kills is not None:
        config.kills = args.kills
    config.node_failure_share, config.fault_rate = args.node_failure_share, args.fault_rate
    down: Callable[[], None] = lambda: None  # noqa: E731
    if args.kubeconfig:
        kube = Kube(args.kubeconfig, bin_dir())
    else:
        kube, down = cluster(args.keep)
    try:
        prepare(kube)
        result = {"config": asdict(config), **run_faults(kube, config)}
    finally:
        down()
    if args.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print(f"{k:<28}  {v}")
    failed = [k for k in ("split_groups", "overbooked_gpus", "duplicate_ranks", "orphans", "stuck_jobs") if result[k]]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
