"""tidal_workload.Contract, one round at a time, against what a pod's world files show (a dict
here; tests/cluster/test_workload_trainer.py runs it in real processes against the API server)."""

from __future__ import annotations

import contextlib

from tidal_workload import CHECKPOINT_DONE, FILES, WORLD_ACK, Contract, World


class Files:
    def __init__(self, **seen: str):
        self.seen = dict.fromkeys(FILES, "") | {k.replace("_", "-"): v for k, v in seen.items()}

    def read(self) -> dict[str, str]:
        return dict(self.seen)


class Writes:
    def __init__(self, done: str = "") -> None:
        self.made: list[tuple[str, dict[str, str]]] = []
        self.done = done
        """The job's checkpoint-done, as a GET of the TrainingJob shows it."""

    def get(self, path: str) -> dict:
        assert path == "/apis/tidal.dev/v1alpha1/namespaces/ml/trainingjobs/job", path
        return {"metadata": {"annotations": {CHECKPOINT_DONE: self.done} if self.done else {}}}

    def annotate(self, path: str, annotations: dict[str, str]) -> None:
        self.made.append((path, annotations))


def contract(files: Files, reports: bool = True, dp_rank: int = 0) -> tuple[Contract, list, Writes]:
    calls: list = []
    writes = Writes()
    c = Contract(
        save=lambda request: calls.append(("save", request)),
        resize=lambda world: calls.append(("resize", world)),
        cancelled=lambda request: calls.append(("cancelled", request)),
        source=files,
        client=writes,  # type: ignore[arg-type]
        namespace="ml",
        pod="job-3",
        job="job",
        dp_rank=dp_rank,
        reports=reports,
    )
    return c, calls, writes


def test_a_checkpoint_request_is_saved_once_and_reported_by_rank_0_only():
    files = Files(checkpoint_requested="2026-05-01T08:00:00Z")
    c, calls, writes = contract(files)
    assert c.poll() == "saved" and c.poll() == ""
    assert calls == [("save", "2026-05-01T08:00:00Z")]
    assert writes.made == [
        ("/apis/tidal.dev/v1alpha1/namespaces/ml/trainingjobs/job", {CHECKPOINT_DONE: "2026-05-01T08:00:00Z"})
    ]
    other, calls, writes = contract(files, reports=False)
    assert other.poll() == "saved" and calls and not writes.made, "the other ranks save without reporting"


def test_a_cancelled_request_is_not_saved_for():
    files = Files(checkpoint_requested="t1", checkpoint_cancelled="t1")
    c, calls, writes = contract(files)
    assert c.poll() == "cancelled" and c.poll() == ""
    assert calls == [("cancelled", "t1")] and not writes.made
    files.seen["checkpoint-requested"] = "t2"  # a later request is a new one
    assert c.poll() == "saved"


def test_a_new_membership_is_taken_on_and_acknowledged_and_a_leaving_replica_leaves():
    files = Files()
    c, calls, writes = contract(files, dp_rank=1)
    assert c.poll() == ""
    files.seen.update({"generation": "1", "world-size": "8", "dp": "2", "leaving": "2"})
    assert c.poll() == "resized" and c.poll() == ""
    assert calls == [("resize", World(1, 8, 2, (2,)))]
    assert writes.made == [("/api/v1/namespaces/ml/pods/job-3", {WORLD_ACK: "1"})]
    files.seen.update({"generation": "2", "world-size": "4", "dp": "1", "leaving": "1"})
    assert c.poll() == "leaving" and c.poll() == "", "told once; it keeps going until its pod is deleted"
    assert len(writes.made) == 1, "a leaving pod acknowledges nothing"


def test_a_trainer_started_after_an_announcement_takes_it_on_and_acknowledges():
    # Review: a process that starts in a pod already told a generation (a slow start) must answer,
    # or the shrink falls back for nothing.
    c, _calls, writes = contract(Files(generation="3", world_size="12", dp="3", leaving="3"), dp_rank=0)
    assert c.poll() == "resized"
    assert writes.made == [("/api/v1/namespaces/ml/pods/job-3", {WORLD_ACK: "3"})]


class Flaky(Writes):
    def __init__(self, fails: int) -> None:
        super().__init__()
        self.fails = fails

    def annotate(self, path: str, annotations: dict[str, str]) -> None:
        if self.fails:
            self.fails -= 1
            raise OSError("503")
        super().annotate(path, annotations)


def test_a_failed_answer_is_sent_again_without_running_the_hook_again():
    files = Files(checkpoint_requested="t1")
    c, calls, _ = contract(files)
    c.client = flaky = Flaky(fails=1)
    with contextlib.suppress(OSError):
        c.poll()
    assert c.poll() == "saved"
    assert calls == [("save", "t1")], "saved once"
    assert flaky.made and flaky.made[0][1] == {CHECKPOINT_DONE: "t1"}
    files.seen.update({"generation": "1", "world-size": "8", "dp": "2", "leaving": "2"})
    flaky.fails = 1
    with contextlib.suppress(OSError):
        c.poll()
    assert c.poll() == "resized"
    assert [k for k, _ in calls].count("resize") == 1, "rebuilt once"


def test_a_new_replica_of_a_grow_back_learns_it_joins():
    c, calls, writes = contract(Files(generation="2", world_size="16", dp="4", leaving="", joining="3"), dp_rank=3)
    assert c.poll() == "resized"
    assert calls == [("resize", World(2, 16, 4, (), (3,)))], "it fetches the state from replicas 0-2"
    assert writes.made == [("/api/v1/namespaces/ml/pods/job-3", {WORLD_ACK: "2"})]


def test_a_request_the_job_already_reported_is_not_saved_for_again_by_a_restarted_trainer():
    """tidal leaves a served request on the pods; a trainer that starts afterwards in such a pod
    (a container restart, a survivor's trainer restarted) must not enter a collective save alone."""
    files = Files(checkpoint_requested="2026-05-01T08:00:00Z")
    c, calls, writes = contract(files)
    writes.done = "2026-05-01T08:00:05Z"
    assert c.poll() == "" and c.poll() == ""
    assert calls == [] and writes.made == []
    files.seen["checkpoint-requested"] = "2026-05-01T09:00:00Z"  # a new request is saved for
    assert c.poll() == "saved" and calls == [("save", "2026-05-01T09:00:00Z")]
