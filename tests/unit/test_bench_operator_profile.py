"""CI smoke of `bench.operator`'s profile on recorded inputs (the benchmark itself needs a KWOK
cluster): the gang timeline and its critical path, CPU from /proc files, the warm-up marks from an
operator log, py-spy's collapsed stacks, and the tables. No timings are asserted."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import bench.operator  # noqa: F401  (the benchmark's wiring imports)
from bench.operator_profile import (
    CLK_TCK,
    CpuMeter,
    Watch,
    cluster_pids,
    cpu_report,
    cpu_seconds,
    cycles,
    gang_phases,
    gang_timeline,
    job_stages,
    log_lines,
    machine_cpu,
    peer_deadline,
    phase_is,
    pod_stages,
    render,
    top_functions,
    warm_up_marks,
)

WALL0 = dt.datetime(2026, 11, 24, 7, 0, tzinfo=dt.UTC).timestamp()


def stamp(seconds: float) -> str:
    return dt.datetime.fromtimestamp(WALL0 + seconds, dt.UTC).isoformat().replace("+00:00", "Z")


def pod(name: str, gated: bool = True, node: str | None = None, phase: str = "Pending") -> dict:
    spec: dict = {"schedulingGates": [{"name": "tidal.dev/gang"}] if gated else []}
    if node:
        spec["nodeName"] = node
    return {"metadata": {"name": name}, "spec": spec, "status": {"phase": phase}}


def test_watch_marks_each_stage_when_first_seen_and_waits_on_the_latest():
    pods = Watch(lambda **_: None, pod_stages)
    pods.record({"type": "ADDED", "object": pod("p0")}, 10.0)
    pods.record({"type": "MODIFIED", "object": pod("p0", gated=False)}, 11.0)
    pods.record({"type": "MODIFIED", "object": pod("p0", gated=False, node="n1")}, 12.0)
    pods.record({"type": "MODIFIED", "object": pod("p0", gated=False, node="n1", phase="Running")}, 13.0)
    pods.record({"type": "MODIFIED", "object": pod("p0", gated=False, node="n1", phase="Running")}, 14.0)
    pods.record({"type": "BOOKMARK", "object": {"metadata": {}}}, 15.0)
    assert pods.first["p0"] == {"created": 10.0, "ungated": 11.0, "bound": 12.0, "running": 13.0}

    jobs = Watch(lambda **_: None, job_stages)
    jobs.record({"type": "ADDED", "object": {"metadata": {"name": "j"}, "status": {}}}, 1.0)
    jobs.record({"type": "MODIFIED", "object": {"metadata": {"name": "j"}, "status": {"phase": "Admitted"}}}, 2.0)
    assert jobs.first["j"] == {"Pending": 1.0, "Admitted": 2.0}
    jobs.record({"type": "DELETED", "object": {"metadata": {"name": "j"}, "status": {"phase": "Admitted"}}}, 2.5)
    assert "j" not in jobs.first and "j" not in jobs.latest, "a name deleted and made again starts over"
    jobs.record({"type": "ADDED", "object": {"metadata": {"name": "j"}, "status": {"phase": "Admitted"}}}, 3.0)
    assert phase_is(["j"], "Admitted", "Running")(jobs.latest)
    assert not phase_is(["j", "other"], "Admitted")(jobs.latest)
    jobs._thread = type("Alive", (), {"is_alive": staticmethod(lambda: True)})()  # type: ignore[assignment]
    assert jobs.wait(phase_is(["j"], "Admitted"), 1, "j") > 0


def test_a_watch_whose_resource_version_expired_lists_again_and_goes_on():
    # kubernetes' client raises KeyError on a raw-mode ERROR event (410 Gone); the bench's watch
    # once ended there, and the wait on it failed a 200-second run.
    listing = {"metadata": {"resourceVersion": "42"}, "items": [pod("p0", gated=False)]}
    reply = type("Reply", (), {"data": json.dumps(listing).encode()})()
    pods = Watch(lambda **_: reply, pod_stages)
    calls = []

    def stream(list_fn, **kwargs):
        calls.append(kwargs["resource_version"])
        if len(calls) == 1:
            raise KeyError("raw_object")
        pods._stopped = True
        yield {"type": "MODIFIED", "object": pod("p0", gated=False, node="n1")}

    pods._watch = type("FakeWatch", (), {"stream": staticmethod(stream), "stop": lambda self: None})()
    pods.resource_version = "1"
    pods._run()
    assert calls == ["1", "42"], "the second watch starts from the new listing"
    assert pods.error is None and pods.resumed == 1
    assert set(pods.first["p0"]) == {"created", "ungated", "bound"}


def test_gang_timeline_and_its_critical_path():
    t0 = 100.0
    job = {"Pending": 100.2, "Admitted": 101.0, "Running": 106.0}
    pods = {
        f"p{i}": {"created": 101.1 + i / 10, "ungated": 102.5 + i / 10, "bound": 103.0 + i, "running": 104.0 + i}
        for i in range(2)
    }
    timeline = gang_timeline(t0, job, pods)
    assert timeline["job_admitted"] == 1.0 and timeline["job_running"] == 6.0
    assert timeline["first_pod_created"] == 1.1 and timeline["last_pod_running"] == 5.0
    assert timeline["pods_bound"] == 2
    spans = dict(gang_phases(timeline))
    assert len(spans) == 7 and all(v is not None for v in spans.values())
    assert round(sum(spans.values()), 3) == timeline["job_running"], "the spans add up to submit -> Running"
    assert gang_timeline(t0, {}, {})["first_pod_bound"] is None


def test_cpu_from_proc_files(tmp_path: Path):
    # A command with a space and a parenthesis: the fields are counted after the last ")".
    line = "42 (kube (api) server) S 1 42 42 0 -1 4194560 0 0 0 0 {u} {s} 0 0 20 0 9 0 100 0 0"
    assert cpu_seconds(line.format(u=3 * CLK_TCK, s=CLK_TCK)) == 4.0
    busy, total = machine_cpu(f"cpu  {CLK_TCK} 0 {CLK_TCK} {2 * CLK_TCK} 0 0 0 0 0 0\ncpu0 1 2 3 4\n")
    assert (busy, total) == (2.0, 4.0)

    cluster = tmp_path / "clusters" / "bench"
    proc = tmp_path / "proc"
    for pid, argv in ((11, ["/bin/kube-apiserver", f"--cert-dir={cluster}/pki"]), (12, ["/bin/bash", "-c", "x"])):
        (proc / str(pid)).mkdir(parents=True)
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (proc / str(pid) / "stat").write_text(line.format(u=CLK_TCK, s=0))
    (proc / "stat").write_text(f"cpu  {CLK_TCK} 0 0 0 0 0 0 0\n")
    pids = cluster_pids(cluster, proc)
    assert pids == {"kube-apiserver": [11]}

    meter = CpuMeter({**pids, "operator": [12, 99]}, proc)
    meter.start()
    (proc / "11" / "stat").write_text(line.format(u=3 * CLK_TCK, s=CLK_TCK))
    (proc / "12").joinpath("stat").unlink()  # killed inside the window: counts up to its last sample
    (proc / "stat").write_text(f"cpu  {6 * CLK_TCK} 0 0 0 0 0 0 0\n")
    report = meter.stop()
    assert report["cpu_seconds"]["kube-apiserver"] == 3.0 and report["cpu_seconds"]["operator"] == 0.0
    assert report["machine_busy_cpu_seconds"] == 5.0
    assert set(cpu_report(({}, 0.0, 0.0, 0.0), ({"x": 1.0}, 0.5, 2.0, 1.0))["cpu_seconds"]) == {
        "x",
        "bench (watches, kubectl)",
    }


def test_warm_up_marks_and_cycles_from_an_operator_log(tmp_path: Path):
    events = [
        (0.5, {"event": "Possibly conflicting operators with the same priority: [...]", "level": "warning"}),
        (0.5, {"event": "Pausing all operators, including self: [...]", "level": "warning"}),
        (14.0, {"event": "Resuming operations after the pause. Conflicting operators ... are gone."}),
        (15.0, {"event": "startup gate: listing received", "resource": "nodes.v1@None", "objects_not_indexed": 9}),
        (16.0, {"event": "startup gate: listing received", "resource": "pods.v1@None", "objects_not_indexed": 7}),
        (20.0, {"event": "startup gate open: every listed object indexed"}),
        (20.5, {"event": "first tick: timers running"}),
        (21.0, {"event": "cycle done", "first": True, "seconds": 0.4, "decide_seconds": 0.3, "write_seconds": 0.1}),
        (22.0, {"event": "cycle done", "seconds": 0.2, "decide_seconds": 0.1, "write_seconds": 0.1, "admitted": 1}),
    ]
    log = tmp_path / "operator-2.log"
    text = "\n".join(json.dumps({**e, "timestamp": stamp(t)}) for t, e in events)
    log.write_text("Traceback (most recent call last):\n" + text + "\n{not json\n")
    lines = log_lines(log)
    assert len(lines) == len(events)
    marks = warm_up_marks(lines, WALL0)
    assert marks["peering_paused"] == 0.5 and marks["peering_resumed"] == 14.0
    assert marks["last_listing_received"] == 16.0 and marks["startup_gate_open"] == 20.0
    assert marks["first_tick"] == 20.5 and marks["first_cycle_done"] == 21.0 and marks["first_cycle_seconds"] == 0.4
    assert marks["admitting_cycle_done"] == 22.0
    assert [c["ended"] for c in cycles(lines, WALL0)] == [21.0, 22.0]
    assert warm_up_marks([], WALL0)["first_tick"] is None


def test_peer_deadline_is_the_last_live_record_to_expire():
    peering = {
        "status": {
            "a": {"priority": 0, "lastseen": stamp(1.0), "lifetime": 15},
            "b": {"priority": 0, "lastseen": stamp(3.0).removesuffix("Z"), "lifetime": 15},
        }
    }
    assert peer_deadline(peering) == WALL0 + 18.0
    assert peer_deadline({}) is None


def test_py_spy_top_functions_and_the_tables():
    collapsed = "\n".join(
        [
            "run (kopf/run.py:10);cycle (tidal/k8s/controller.py:150);admit (tidal/k8s/admission.py:90) 30",
            "run (kopf/run.py:10);cycle (tidal/k8s/controller.py:151);write (tidal/k8s/write.py:60) 10",
            "run (kopf/run.py:11) 10",
        ]
    )
    spy = top_functions(collapsed)
    assert spy["samples"] == 50
    assert spy["own"][0] == ("admit (tidal/k8s/admission.py)", 0.6)
    assert ("cycle (tidal/k8s/controller.py)", 0.8) in spy["inclusive"]
    assert ("run (kopf/run.py)", 1.0) in spy["inclusive"], "a function is counted once per stack"

    cpu = cpu_report(({"etcd": 1.0}, 0.0, 0.0, 0.0), ({"etcd": 2.0}, 0.5, 3.0, 2.0))
    profile = {
        "gang": gang_timeline(0.0, {"Admitted": 1.0, "Running": 5.0}, {"p": {"created": 1.5}}),
        "gang_cpu": cpu,
        "warm_up_cpu": cpu,
        "gang_cycles": [
            {"ended": 1.0, "seconds": 0.5, "decide_seconds": 0.2, "write_seconds": 0.3, "admitted": 1}
            | {"pod_creates": 1, "ungates": 0}
        ],
        "warm_up": {"health_port_open": 2.0, "peering_resumed": None},
        "py_spy": spy,
    }
    text = render(profile)
    for heading in ("gang timeline", "critical path", "CPU over the gang", "CPU over the warm-up", "py-spy", "warm-up"):
        assert heading in text
