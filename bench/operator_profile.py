"""The profile `bench.operator` reports: where a gang's seconds to Running and a restart's warm-up go.

Three sources, all read on this machine's own clocks:
- watches (kubernetes client, started before the submit): when each gang pod was first seen
  created, with its scheduling gate gone, bound, Running, and when each job's phase changed;
- /proc: CPU-seconds (utime+stime) of every cluster process and the operator over a window, and
  the whole machine's busy time (other users' load included);
- the operator's JSON log: its "cycle done" lines, the startup gate's lines (k8s/kopf_startup.py),
  its first tick, and kopf's peering pause and resume.

Everything here is pure (files and dicts in, dicts out) but the watch thread, so the CI smoke
test runs it on recorded inputs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kubernetes import watch

CLK_TCK = os.sysconf("SC_CLK_TCK")
STAGES = ("created", "ungated", "bound", "running")
"""A gang pod's life up to Running: made by the operator (gated), gate lifted by the operator,
bound by kube-scheduler, Running once KWOK has "started" it."""
COMPONENTS = ("kube-apiserver", "etcd", "kube-scheduler", "kube-controller-manager", "kwok")


def pod_stages(pod: dict[str, Any]) -> list[str]:
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    stages = ["created"]
    if not spec.get("schedulingGates"):
        stages.append("ungated")
    if spec.get("nodeName"):
        stages.append("bound")
    if status.get("phase") == "Running":
        stages.append("running")
    return stages


def job_stages(job: dict[str, Any]) -> list[str]:
    return [(job.get("status") or {}).get("phase") or "Pending"]


class Watch:
    """One watch from a listing's resourceVersion (so nothing after the listing is missed, however
    late the connection is made): for each object, when each of its stages was first seen, on
    time.monotonic(), and its latest stages. Raw JSON, not the client's models: 4,096 pods make
    ~16,000 events, and the models' deserialisation would load the cores being measured."""

    def __init__(self, list_fn: Callable[..., Any], stages: Callable[[dict[str, Any]], list[str]], **kwargs: Any):
        self.list_fn, self.stages, self.kwargs = list_fn, stages, kwargs
        self.first: dict[str, dict[str, float]] = {}
        self.latest: dict[str, list[str]] = {}
        self.changed = threading.Condition()
        self.error: BaseException | None = None
        self.resumed = 0
        self._stopped = False
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Watch:
        listing = self.list_fn(**self.kwargs, limit=1, _preload_content=False)
        self.resource_version = json.loads(listing.data)["metadata"]["resourceVersion"]
        self._thread.start()
        return self

    def _run(self) -> None:
        # The API server closes a watch whose reader falls behind (this bench shares the cores it
        # loads): resume from the last resourceVersion seen, and count it (`resumed`).
        try:
            while not self._stopped:
                try:
                    for event in self._watch.stream(
                        self.list_fn,
                        **self.kwargs,
                        resource_version=self.resource_version,
                        timeout_seconds=3600,
                        deserialize=False,
                    ):
                        self.record(event, time.monotonic())
                        version = ((event.get("object") or {}).get("metadata") or {}).get("resourceVersion")
                        if version:
                            self.resource_version = version
                except KeyError:
                    # An ERROR event (410: the resourceVersion expired) in raw mode: the client reads
                    # event["raw_object"], which raw events lack. List again, seeing every object
                    # as of now, and watch on from the listing.
                    self.relist()
                if not self._stopped:
                    self.resumed += 1
        except BaseException as exc:  # reported by wait(); a stopped watch ends here too
            self.error = exc
        with self.changed:
            self.changed.notify_all()

    def relist(self) -> None:
        listing = json.loads(self.list_fn(**self.kwargs, _preload_content=False).data)
        now = time.monotonic()
        for item in listing.get("items") or []:
            self.record({"type": "MODIFIED", "object": item}, now)
        self.resource_version = listing["metadata"]["resourceVersion"]

    def record(self, event: dict[str, Any], now: float) -> None:
        obj = event.get("object") or {}
        name = (obj.get("metadata") or {}).get("name")
        if not name or event.get("type") not in ("ADDED", "MODIFIED", "DELETED"):
            return
        if event["type"] == "DELETED":  # a kept cluster's earlier run: its names come back, new
            with self.changed:
                self.first.pop(name, None)
                self.latest.pop(name, None)
            return
        stages = self.stages(obj)
        with self.changed:
            marks = self.first.setdefault(name, {})
            for stage in stages:
                marks.setdefault(stage, now)
            self.latest[name] = stages
            self.changed.notify_all()

    def wait(self, check: Callable[[dict[str, list[str]]], bool], timeout: float, what: str) -> float:
        """Block until `check(latest)` holds; returns the monotonic time it first did."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while not check(self.latest):
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive():
                    why = f"the watch ended: {self.error!r}" if self.error else "timed out"
                    raise AssertionError(f"waiting for {what}: {why}")
                self.changed.wait(min(left, 1.0))
        return time.monotonic()

    def stop(self) -> None:
        self._stopped = True
        self._watch.stop()


def phase_is(names: Iterable[str], *phases: str) -> Callable[[dict[str, list[str]]], bool]:
    wanted = tuple(names)
    return lambda latest: all(latest.get(n, [""])[0] in phases for n in wanted)


# -- the gang's timeline --------------------------------------------------------------------------


def gang_timeline(t0: float, job: dict[str, float], pods: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Seconds after the submit (t0) of the gang's job phases and of its pods' first and last
    arrival at each stage, from the watches' marks."""

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 3)

    admitted = min((job[p] for p in ("Admitted", "Running") if p in job), default=None)
    out: dict[str, Any] = {"job_admitted": rel(admitted), "job_running": rel(job.get("Running"))}
    for stage in STAGES:
        times = sorted(marks[stage] for marks in pods.values() if stage in marks)
        out[f"pods_{stage}"] = len(times)
        out[f"first_pod_{stage}"] = rel(times[0]) if times else None
        out[f"last_pod_{stage}"] = rel(times[-1]) if times else None
    return out


def gang_phases(timeline: dict[str, Any]) -> list[tuple[str, float | None]]:
    """The critical path, one span per hand-off (each ends when the last pod is through)."""
    steps = [
        ("operator: submit to placement written (job Admitted)", None, "job_admitted"),
        ("operator: admission cycle writes its pods (to last pod created)", "job_admitted", "last_pod_created"),
        ("operator: next cycle sees every pod, lifts the first gate", "last_pod_created", "first_pod_ungated"),
        ("operator: gate removals (first to last)", "first_pod_ungated", "last_pod_ungated"),
        ("kube-scheduler: last gate lifted to last pod bound", "last_pod_ungated", "last_pod_bound"),
        ("KWOK: last pod bound to last pod Running", "last_pod_bound", "last_pod_running"),
        ("operator: last pod Running to job Running", "last_pod_running", "job_running"),
    ]
    spans: list[tuple[str, float | None]] = []
    for label, start, end in steps:
        a = 0.0 if start is None else timeline.get(start)
        b = timeline.get(end)
        spans.append((label, None if a is None or b is None else round(b - a, 3)))
    return spans


# -- CPU per process --------------------------------------------------------------------------------


def cpu_seconds(stat_line: str) -> float:
    """utime+stime of a /proc/<pid>/stat line (the command may hold spaces and parentheses)."""
    fields = stat_line.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_cpu(stat_text: str) -> tuple[float, float]:
    """(busy, total) CPU-seconds of the whole machine since boot, from /proc/stat's cpu line."""
    values = [int(v) for v in stat_text.splitlines()[0].split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)  # idle + iowait
    total = sum(values[:8])  # guest time is counted in user already
    return (total - idle) / CLK_TCK, total / CLK_TCK


def cluster_pids(cluster_dir: Path, proc: Path = Path("/proc")) -> dict[str, list[int]]:
    """Component name (its binary's name) -> pids of the processes kwokctl started for this
    cluster: each names the cluster's directory on its command line (`cluster.sh down` finds
    them the same way)."""
    marker = str(cluster_dir).rstrip("/") + "/"
    found: dict[str, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if not any(marker in a.decode(errors="replace") for a in argv):
            continue
        found.setdefault(Path(argv[0].decode(errors="replace")).name, []).append(int(entry.name))
    return found


class CpuMeter:
    """CPU-seconds of named processes, of this bench (with the kubectl it ran) and of the machine
    between `start()` and `stop()`."""

    def __init__(self, pids: dict[str, list[int]], proc: Path = Path("/proc")):
        self.pids, self.proc = pids, proc
        self.last: dict[int, float] = {}

    def sample(self) -> tuple[dict[str, float], float, float, float]:
        per: dict[str, float] = {}
        for name, pids in self.pids.items():
            for pid in pids:
                # A process gone (the killed operator) counts up to its last sample.
                with contextlib.suppress(OSError):
                    self.last[pid] = cpu_seconds((self.proc / str(pid) / "stat").read_text())
                per[name] = per.get(name, 0.0) + self.last.get(pid, 0.0)
        t = os.times()
        busy, _ = machine_cpu((self.proc / "stat").read_text())
        return per, t.user + t.system + t.children_user + t.children_system, busy, time.monotonic()

    def start(self) -> None:
        self._start = self.sample()

    def stop(self) -> dict[str, Any]:
        return cpu_report(self._start, self.sample())


def cpu_report(
    start: tuple[dict[str, float], float, float, float], end: tuple[dict[str, float], float, float, float]
) -> dict[str, Any]:
    (per0, bench0, busy0, t0), (per1, bench1, busy1, t1) = start, end
    wall = t1 - t0
    per = {name: round(per1.get(name, 0.0) - per0.get(name, 0.0), 2) for name in per1}
    per["bench (watches, kubectl)"] = round(bench1 - bench0, 2)
    listed = sum(per.values())
    cores = os.cpu_count() or 1
    return {
        "wall_seconds": round(wall, 2),
        "cores": cores,
        "cpu_seconds": per,
        "sum_cpu_seconds": round(listed, 2),
        "machine_busy_cpu_seconds": round(busy1 - busy0, 2),
        "machine_capacity_cpu_seconds": round(wall * cores, 2),
        "machine_busy_share": round((busy1 - busy0) / (wall * cores), 2) if wall > 0 else None,
        "others_cpu_seconds": round(busy1 - busy0 - listed, 2),
    }


def load_average(path: Path = Path("/proc/loadavg")) -> str:
    return " ".join(path.read_text().split()[:3])


# -- the operator's log -------------------------------------------------------------------------------


def log_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of an operator log (anything else, say a traceback's lines, skipped)."""
    lines: list[dict[str, Any]] = []
    for raw in path.read_text(errors="replace").splitlines():
        if not raw.startswith("{"):
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            continue
        if isinstance(line, dict) and "timestamp" in line:
            lines.append(line)
    return lines


def wall_time(line: dict[str, Any]) -> float:
    return dt.datetime.fromisoformat(str(line["timestamp"]).replace("Z", "+00:00")).timestamp()


def cycles(lines: list[dict[str, Any]], wall0: float) -> list[dict[str, Any]]:
    """The operator's "cycle done" lines (first cycle, and each that admitted or made pod calls:
    bench.operator runs it with --cycle-log-seconds 0), each ending `ended` seconds after `wall0`."""
    out = []
    for line in lines:
        if line.get("event") != "cycle done":
            continue
        keys = (
            "seconds",
            "decide_seconds",
            "write_seconds",
            "supernodes_seconds",
            "admitted",
            "pod_creates",
            "ungates",
        )
        out.append({"ended": round(wall_time(line) - wall0, 3), **{k: line.get(k) for k in keys}})
    return out


WARM_UP_MARKS = (
    # kopf 1.45 says "Possibly conflicting operators" when it pauses for a peer of the same priority.
    ("peering_paused", lambda e: e.startswith(("Possibly conflicting operators", "Pausing"))),
    ("peering_resumed", lambda e: e.startswith("Resuming operations after the pause")),
    ("last_listing_received", lambda e: e == "startup gate: listing received"),
    ("startup_gate_open", lambda e: e == "startup gate open: every listed object indexed"),
    ("pods_listed", lambda e: e == "pods listed"),  # the informers' first listings (k8s/informer.py)
    ("nodes_listed", lambda e: e == "nodes listed"),
    ("first_tick", lambda e: e == "first tick: timers running"),
)


def warm_up_marks(lines: list[dict[str, Any]], wall0: float) -> dict[str, Any]:
    """Seconds after `wall0` (the restarted process's start) of each warm-up moment in its log; the
    listing mark is the last kind's, the others the first line of their kind."""
    out: dict[str, Any] = {name: None for name, _ in WARM_UP_MARKS}
    for line in lines:
        event = str(line.get("event", ""))
        for name, match in WARM_UP_MARKS:
            if match(event) and (out[name] is None or name == "last_listing_received"):
                out[name] = round(wall_time(line) - wall0, 3)
    done = cycles(lines, wall0)
    first = done[0] if done else None
    out["first_cycle_done"] = first["ended"] if first else None
    out["first_cycle_seconds"] = first["seconds"] if first else None
    admitting = next((c for c in done if c["admitted"]), None)
    out["admitting_cycle_done"] = admitting["ended"] if admitting else None
    out["admitting_cycle_seconds"] = admitting["seconds"] if admitting else None
    return out


def peer_deadline(peering: dict[str, Any]) -> float | None:
    """When (wall clock) the last live record of a ClusterKopfPeering expires: a restarted replica
    of the same priority waits for it."""
    deadlines = []
    for record in (peering.get("status") or {}).values():
        if not isinstance(record, dict) or "lastseen" not in record:
            continue
        seen = dt.datetime.fromisoformat(str(record["lastseen"]).replace("Z", "+00:00"))
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=dt.UTC)
        deadlines.append(seen.timestamp() + float(record.get("lifetime", 60)))
    return max(deadlines, default=None)


# -- py-spy ------------------------------------------------------------------------------------------


class PySpy:
    """`py-spy record` of one process in raw (collapsed stacks) format, sampling without pausing
    it; stopped with SIGINT, which makes py-spy write its file. Only the thread holding the GIL
    is sampled (`--gil`): a thread blocked on a socket read counts as busy to py-spy otherwise,
    and the operator's Python runs on one core's worth of GIL anyway."""

    def __init__(self, binary: str, pid: int, out: Path, rate: int = 100):
        self.out = out
        command = [binary, "record", "--pid", str(pid), "--output", str(out), "--format", "raw"]
        self.proc = subprocess.Popen(
            [*command, "--rate", str(rate), "--nonblocking", "--gil"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err.decode(errors="replace")


def _frame_name(frame: str) -> str:
    # py-spy raw frames read "function (file.py:line)": keep the function and its file, not the line.
    name, _, where = frame.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0]})" if where else name


def top_functions(collapsed: str, n: int = 12) -> dict[str, Any]:
    """From py-spy's collapsed stacks: the samples, and the top functions by own (leaf) samples and
    by inclusive samples (each function counted once per stack), as shares of all samples."""
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    total = 0
    for line in collapsed.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        total += k
        frames = [_frame_name(f) for f in stack.split(";")]
        own[frames[-1]] += k
        for frame in set(frames):
            inclusive[frame] += k

    def share(c: Counter[str]) -> list[tuple[str, float]]:
        return [(f, round(v / total, 3)) for f, v in c.most_common(n)] if total else []

    return {"samples": total, "own": share(own), "inclusive": share(inclusive)}


# -- the readable tables -------------------------------------------------------------------------------


def render(profile: dict[str, Any]) -> str:
    """The profile as plain-text tables (the JSON holds the same figures)."""
    out: list[str] = []
    gang = profile.get("gang")
    if gang:
        out.append("gang timeline (seconds after submit, as the bench's watches saw it):")
        for stage in STAGES:
            first, last = _s(gang.get(f"first_pod_{stage}")), _s(gang.get(f"last_pod_{stage}"))
            out.append(f"  pods {stage:<8} first {first}  last {last}  ({gang.get(f'pods_{stage}')} pods)")
        out.append(f"  job Admitted {_s(gang.get('job_admitted'))}   job Running {_s(gang.get('job_running'))}")
        out.append("critical path:")
        for label, seconds in gang_phases(gang):
            out.append(f"  {_s(seconds)}  {label}")
    for key, title in (("gang_cpu", "CPU over the gang's window"), ("warm_up_cpu", "CPU over the warm-up")):
        cpu = profile.get(key)
        if not cpu:
            continue
        capacity = f"{cpu['wall_seconds']} s wall x {cpu['cores']} cores = {cpu['machine_capacity_cpu_seconds']} CPU-s"
        out.append(f"{title} ({capacity}):")
        for name, seconds in sorted(cpu["cpu_seconds"].items(), key=lambda kv: -kv[1]):
            out.append(f"  {seconds:8.2f}  {name}")
        out.append(f"  {cpu['sum_cpu_seconds']:8.2f}  sum of the above")
        out.append(f"  {cpu['others_cpu_seconds']:8.2f}  everything else on the machine")
        share = cpu["machine_busy_share"] or 0.0
        out.append(f"  {cpu['machine_busy_cpu_seconds']:8.2f}  machine busy ({share:.0%} of capacity)")
    acting = profile.get("gang_cycles")
    if acting:
        out.append(
            "operator cycles that acted during the gang"
            " (ended s after submit; seconds: decide + write + Supernode statuses + the rest):"
        )
        for c in acting:
            out.append(
                f"  {_s(c['ended'])}  {c['seconds']:.3f} s: {c['decide_seconds']:.3f} + {c['write_seconds']:.3f}"
                f" + {c.get('supernodes_seconds') or 0.0:.3f}"
                f"  admitted {c['admitted']}, pod creates {c['pod_creates']}, ungates {c['ungates']}"
            )
    warm = profile.get("warm_up")
    if warm:
        out.append("warm-up (seconds after the fresh process started):")
        for key, value in warm.items():
            out.append(f"  {_s(value) if isinstance(value, (int, float)) or value is None else value}  {key}")
    spy = profile.get("py_spy")
    if spy and spy.get("samples"):
        out.append(f"py-spy, operator during the gang ({spy['samples']} samples of the GIL holder):")
        for title in ("own", "inclusive"):
            out.append(f"  top by {title} samples:")
            for frame, share in spy[title]:
                out.append(f"    {share:6.1%}  {frame}")
    return "\n".join(out)


def _s(value: float | None) -> str:
    return f"{value:7.2f}" if isinstance(value, (int, float)) else "      -"
