"""The workload library (tidal_workload) in the example trainer, one real process per pod of a
Live TrainingJob on the KWOK cluster (issue 35). Each process reads its pod's annotations through
the API server, as its downward API volume would show them, and writes back with the job's
service account token (examples/workload-rbac.yaml), as a pod would.

The evictions are planted as the rebalancer records them (tests/evictions.py does so for the
checkpoint path): what is under test is the contract, not which job the planner picks."""

from __future__ import annotations

import base64
import datetime as dt
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from .kube import REPO, Kube, eventually
from .operator_process import OperatorProcess
from .test_operator import TEMPLATE, pods_of, status, submit, wait_phase

TRAINER = REPO / "examples" / "trainer" / "trainer.py"
sys.path.insert(0, str(TRAINER.parent))
from trainer import sgd_step, shard  # noqa: E402  (the example is a script directory, not a package)


def live_job(name: str) -> dict:
    return {
        "apiVersion": "tidal.dev/v1alpha1",
        "kind": "TrainingJob",
        "metadata": {"name": name},
        "spec": {
            "tp": 4,
            "dp": 3,
            "gpusPerPod": 4,
            "preemptible": True,
            "elastic": {"minDP": 1, "maxDP": 3, "resize": "Live", "liveTimeoutSeconds": 15},
            "template": TEMPLATE,
        },
    }


class Trainers:
    """One trainer process per pod, as the job's service account."""

    def __init__(self, kube: Kube, namespace: str, job: str, workdir: Path):
        self.kube, self.namespace, self.job, self.workdir = kube, namespace, job, workdir
        token = kube.run("create", "token", "tidal-trainer", "-n", namespace, "--duration=1h").stdout.strip()
        (workdir / "token").write_text(token)
        cluster = yaml.safe_load(kube.kubeconfig.read_text())["clusters"][0]["cluster"]
        self.server = cluster["server"]
        if "certificate-authority-data" in cluster:
            (workdir / "ca.crt").write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        else:
            (workdir / "ca.crt").write_text(Path(cluster["certificate-authority"]).read_text())
        self.procs: dict[int, subprocess.Popen] = {}

    def start(self, index: int) -> None:
        pod = f"{self.job}-{index}"
        env = {p["name"]: p.get("value") for p in self.pod(pod)["spec"]["containers"][0]["env"]}
        self.procs[index] = subprocess.Popen(
            [
                sys.executable,
                str(TRAINER),
                "--state",
                str(self.workdir / f"replica-{env['TIDAL_DP_RANK']}"),
                "--namespace",
                self.namespace,
                "--pod",
                pod,
                "--job",
                self.job,
                "--dp-rank",
                env["TIDAL_DP_RANK"],
                "--rank",
                env["RANK"],
                "--server",
                self.server,
                "--token-file",
                str(self.workdir / "token"),
                "--ca",
                str(self.workdir / "ca.crt"),
                "--peers",
                str(self.workdir / "peers"),
                "--dp",
                env["TIDAL_DP"],
                "--step-seconds",
                "0.1",
            ],
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / f"trainer-{index}.err").open("w"),
        )

    def pod(self, name: str) -> dict:
        return self.kube.get("pod", name, "-n", self.namespace)

    def log(self, replica: int, steps: bool = False) -> list[dict]:
        """The replica's trainer records, its "step" records only with `steps`."""
        path = self.workdir / f"replica-{replica}" / "log.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        return [r for r in records if steps or r["event"] != "step"]

    def steps(self, replica: int) -> list[dict]:
        return [r for r in self.log(replica, steps=True) if r["event"] == "step"]

    def weights_at(self, replica: int) -> dict[int, list[float]]:
        """Step -> the replica's weights after it (its last record of that step)."""
        return {r["step"]: r["w"] for r in self.log(replica, steps=True) if r["event"] == "step"}

    def pause(self, index: int) -> None:
        self.procs[index].send_signal(signal.SIGSTOP)

    def resume(self, index: int) -> None:
        self.procs[index].send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.wait()


def plant_live_shrink(kube: Kube, namespace: str, job: str, replicas: list[int], generation: int) -> None:
    """What start_eviction records for a Live job's shrink (k8s/live_resize.py: start)."""
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    eviction = {
        "reason": "Rebalanced",
        "by": "test",
        "requestedAt": now,
        "deadline": now,
        "replicas": replicas,
        "mode": "Live",
        "generation": generation,
    }
    # The eviction alone: the operator holds its own last status write until the server shows
    # every key of it (k8s/status.py), so planting a key it wrote (worldGeneration) would be
    # ignored for a minute. The announcement reads the eviction's generation.
    patch = json.dumps({"status": {"eviction": eviction}})
    kube.run("patch", "trainingjob", job, "-n", namespace, "--subresource=status", "--type=merge", "-p", patch)


def annotations(pod: dict) -> dict[str, str]:
    return pod["metadata"].get("annotations") or {}


def test_live_resize_fallback_grow_back_cancel_and_suspension_with_real_trainer_processes(
    kube: Kube, running_operator: OperatorProcess, namespace: str, tmp_path: Path
):
    kube.run("apply", "-n", namespace, "-f", str(REPO / "examples" / "workload-rbac.yaml"))
    submit(kube, namespace, live_job("live"))
    wait_phase(kube, namespace, "live", "Running")
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods_of(kube, namespace, "live")}
    trainers = Trainers(kube, namespace, "live", tmp_path)
    own: OperatorProcess | None = None
    try:
        for i in range(3):
            trainers.start(i)
        eventually(
            lambda: all(any(r.get("took_part") == 3 for r in trainers.log(i, steps=True)) for i in range(3)),
            timeout=30,
            what="three trainers averaging their weights",
        )

        # 1. A survivor that never answers (replica 1's trainer is gone, its pod runs on): after
        # liveTimeoutSeconds the shrink of replica 2 falls back to checkpoint-first; rank 0 saves
        # and reports, and replica 2's pod goes.
        trainers.procs[1].kill()
        trainers.procs[1].wait()
        planted = time.monotonic()
        plant_live_shrink(kube, namespace, "live", [2], generation=1)
        request = eventually(
            lambda: annotations(trainers.pod("live-0")).get("tidal.dev/checkpoint-requested"),
            timeout=60,
            what="the fallback's checkpoint request",
        )
        fell_back_after = time.monotonic() - planted
        eventually(
            lambda: status(kube, namespace, "live").get("currentDP") == 2, timeout=60, what="replica 2 given back"
        )
        assert fell_back_after >= 15 - 2, "not before the live timeout"
        events = kube.get("events", "-n", namespace, "--field-selector", "involvedObject.name=live")["items"]
        timed_out = [e for e in events if e["reason"] == "LiveResizeTimedOut"]
        assert timed_out and "live-1" in timed_out[0]["message"], [e["reason"] for e in events]
        assert [e["request"] for e in trainers.log(0) if e["event"] == "saved"] == [request], "rank 0 saved for it"
        assert sorted(p["metadata"]["name"] for p in pods_of(kube, namespace, "live")) == ["live-0", "live-1"]
        assert trainers.procs[2].wait(timeout=30) == 0, "replica 2's trainer stopped once its pod was deleted"
        events_2 = [e["event"] for e in trainers.log(2)]
        # Told it leaves, it kept going: it took part in the fallback's (collective) checkpoint.
        assert "leaving" in events_2 and events_2[-2:] == ["saved", "stopped"], events_2

        # 2. A Live shrink of replica 1 with every survivor answering: no new checkpoint request,
        # the survivor keeps its pod and its weights, replica 1's trainer leaves and its pod goes.
        trainers.start(1)  # started in generation 1: it takes it on and answers again
        eventually(lambda: trainers.log(1)[-1]["event"] == "started", timeout=30, what="trainer 1 back")
        resized_before = len([e for e in trainers.log(0) if e["event"] == "resized"])
        plant_live_shrink(kube, namespace, "live", [1], generation=2)
        eventually(
            lambda: (
                status(kube, namespace, "live").get("currentDP") == 1
                and "eviction" not in status(kube, namespace, "live")
            ),
            timeout=60,
            what="the live shrink done",
        )
        pods = {p["metadata"]["name"]: p for p in pods_of(kube, namespace, "live")}
        assert sorted(pods) == ["live-0"], "only the leaving replica's pod went"
        assert pods["live-0"]["metadata"]["uid"] == uids["live-0"], "the survivor was not replaced"
        assert annotations(pods["live-0"]).get("tidal.dev/world-ack") == "2"
        assert annotations(pods["live-0"]).get("tidal.dev/checkpoint-requested") == request, "no new checkpoint request"
        job_notes = kube.get("trainingjob", "live", "-n", namespace)["metadata"].get("annotations") or {}
        assert job_notes.get("tidal.dev/checkpoint-requested") == request, "a live shrink asks for no checkpoint"
        assert len([e for e in trainers.log(0) if e["event"] == "saved"]) == 1, "and rank 0 saved nothing more"
        resized = [e for e in trainers.log(0) if e["event"] == "resized"]
        assert len(resized) == resized_before + 1 and resized[-1]["dp"] == 1 and resized[-1]["generation"] == 2
        # Training went on from the weights it had: its first step after the resize is its own SGD
        # step from them (alone now, so the mean is that step), and it never reloaded.
        at = resized[-1]["step"]
        eventually(lambda: at in trainers.weights_at(0), timeout=10, what="a step after the resize")
        assert trainers.weights_at(0)[at] == sgd_step(resized[-1]["w"], shard(0), at)[0], "the resize kept the weights"
        assert [e["event"] for e in trainers.log(0)].count("started") == 1, "the survivor never restarted"
        # Restarted in a pod that still carries the fallback's served request, trainer 1 did not
        # enter that (collective) checkpoint alone.
        restarted = max(i for i, e in enumerate(trainers.log(1)) if e["event"] == "started")
        assert not [e for e in trainers.log(1)[restarted:] if e["event"] == "saved"], trainers.log(1)[restarted:]
        events_1 = [e["event"] for e in trainers.log(1)]
        assert "leaving" in events_1 and events_1[-1] == "stopped", "it left once its pod was deleted"
        assert trainers.procs[1].wait(timeout=30) == 0

        # 3. A Live grow-back: an operator of the test's own with a grow-back cooldown of 1 s (the
        # session operator's is 10 min) grows the job back to dp 3 in a new generation; the new
        # replicas' pods say who joins, their trainers fetch the survivor's state, and from then on
        # all three hold the same weights.
        running_operator.stop()
        own = OperatorProcess(
            kube.kubeconfig, tmp_path, "--discover-supernodes", "tidal.dev/supernode", "--grow-back-cooldown", "1"
        )
        own.start()
        eventually(
            lambda: (
                status(kube, namespace, "live").get("currentDP") == 3
                and status(kube, namespace, "live").get("phase") == "Running"
            ),
            timeout=90,
            what="the grow-back to dp 3",
        )
        grown = status(kube, namespace, "live")
        assert grown["worldGeneration"] == 3 and grown["worldJoining"] == [1, 2], grown
        pods = {p["metadata"]["name"]: p for p in pods_of(kube, namespace, "live")}
        assert pods["live-0"]["metadata"]["uid"] == uids["live-0"], "the survivor was not replaced"
        for name in ("live-1", "live-2"):
            assert annotations(pods[name]).get("tidal.dev/world-joining") == "1,2", annotations(pods[name])
        trainers.start(1)
        trainers.start(2)
        eventually(
            lambda: annotations(trainers.pod("live-0")).get("tidal.dev/world-ack") == "3",
            timeout=30,
            what="the survivor to take on generation 3",
        )
        for replica in (1, 2):
            joined = eventually(
                lambda r=replica: [e for e in trainers.log(r) if e["event"] == "joined" and e["generation"] == 3],
                timeout=30,
                what=f"replica {replica} to join",
            )[-1]
            survivor = eventually(
                lambda j=joined: trainers.weights_at(0).get(j["step"]), timeout=10, what="the survivor's step logged"
            )
            assert survivor == joined["w"], "it fetched the survivor's weights at that step"
            first = eventually(
                lambda r=replica, j=joined: [s for s in trainers.steps(r) if s["local_step"] > j["step"]],
                timeout=30,
                what=f"replica {replica}'s first step after joining",
            )[0]
            assert first["local"] == sgd_step(joined["w"], shard(replica), first["local_step"])[0], (
                "and trained on from them"
            )
        eventually(
            lambda: any(r.get("took_part") == 3 for r in trainers.log(1, steps=True)[-5:]),
            timeout=30,
            what="the three averaging",
        )
        both = sorted(set(trainers.weights_at(0)) & set(trainers.weights_at(1)) & set(trainers.weights_at(2)))
        assert both and all(
            trainers.weights_at(0)[s] == trainers.weights_at(1)[s] == trainers.weights_at(2)[s] for s in both[-3:]
        ), "three replicas in lockstep with the same weights"

        # 4. A cancelled checkpoint request: the request went out (annotated as the operator sends
        # it) for a pool that is then gone; the operator calls it off and every pod learns it. The
        # trainers were paused meanwhile, so they see the request and its cancellation together:
        # none saves, and the job keeps its pods.
        for i in range(3):
            trainers.pause(i)
        saved_before = len([e for e in trainers.log(0) if e["event"] == "saved"])
        asked = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        for obj in ("trainingjob/live", "pod/live-0", "pod/live-1", "pod/live-2"):
            kube.run("annotate", "-n", namespace, obj, f"tidal.dev/checkpoint-requested={asked}", "--overwrite")
        eviction = {
            "reason": "Rebalanced",
            "by": f"InferencePool {namespace}/gone",
            "requestedAt": asked,
            "askedAt": asked,
            "deadline": "2100-01-01T00:00:00Z",
            "replicas": [],
        }
        patch = json.dumps({"status": {"eviction": eviction}})
        kube.run("patch", "trainingjob", "live", "-n", namespace, "--subresource=status", "--type=merge", "-p", patch)
        eventually(
            lambda: all(
                annotations(trainers.pod(f"live-{i}")).get("tidal.dev/checkpoint-cancelled") == asked for i in range(3)
            ),
            timeout=30,
            what="the cancellation on every pod",
        )
        for i in range(3):
            trainers.resume(i)
        eventually(
            lambda: [e["request"] for e in trainers.log(0) if e["event"] == "cancelled"] == [asked],
            timeout=30,
            what="the trainer to notice the cancellation",
        )
        assert len([e for e in trainers.log(0) if e["event"] == "saved"]) == saved_before, "nothing saved for it"
        job_notes = kube.get("trainingjob", "live", "-n", namespace)["metadata"].get("annotations") or {}
        assert job_notes.get("tidal.dev/checkpoint-done") != asked
        assert sorted(p["metadata"]["name"] for p in pods_of(kube, namespace, "live")) == ["live-0", "live-1", "live-2"]
        assert "eviction" not in status(kube, namespace, "live")

        # 5. A checkpoint-first suspension: the saved step and weights are where training resumes.
        kube.run("patch", "trainingjob", "live", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":true}}')
        wait_phase(kube, namespace, "live", "Suspended", timeout=90)
        suspension = kube.get("trainingjob", "live", "-n", namespace)["metadata"]["annotations"]
        saved = [e for e in trainers.log(0) if e["event"] == "saved"][-1]
        assert saved["request"] == suspension["tidal.dev/checkpoint-requested"] != asked, "saved for the suspension"
        assert suspension["tidal.dev/checkpoint-done"] == saved["request"], "and reported it"
        assert all(trainers.procs[i].wait(timeout=30) == 0 for i in range(3)), "trainers stop once their pods go"
        kube.run("patch", "trainingjob", "live", "-n", namespace, "--type=merge", "-p", '{"spec":{"suspend":false}}')
        wait_phase(kube, namespace, "live", "Running", timeout=90)
        starts = len([e for e in trainers.log(0) if e["event"] == "started"])
        trainers.start(0)
        eventually(
            lambda: len([e for e in trainers.log(0) if e["event"] == "started"]) > starts,
            timeout=30,
            what="the trainer restarted",
        )
        started = [e for e in trainers.log(0) if e["event"] == "started"][-1]
        assert (started["step"], started["w"]) == (saved["step"], saved["w"]), "resumed from what it saved"
        pod = trainers.pod("live-0")
        assert annotations(pod).get("tidal.dev/world-joining") == "", "a restart from the checkpoint: nobody joins"
        assert annotations(pod).get("tidal.dev/world-generation") == "3", "the generation never goes back"
    finally:
        trainers.stop()
        if own is not None:
            kube.run("delete", "trainingjobs", "--all", "-n", namespace, "--timeout=60s", check=False)
            own.stop()
            running_operator.start()
