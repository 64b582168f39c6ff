"""tidal_workload.Contract, one round at a time, against what a pod's world files show (a dict
here; tests/cluster/test_workload_trainer.py runs it in real processes against the API server)."""

from __future__ import annotations

from tidal_workload import CHECKPOINT_DONE, FILES, WORLD_ACK, Contract, World


class Files:
    def __init__(self, **seen: str):
        self.seen = dict.fromkeys(FILES, "") | {k.replace("_", "-"): v for k, v in seen.items()}

    def read(self) -> dict[str, str]:
        return dict(self.seen)


class Writes:
    def __init__(self) -> None:
        self.made: list[tuple[str, dict[str, str]]] = []

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
    assert c.poll() == "leave"
    assert len(writes.made) == 1, "a leaving pod acknowledges nothing"


def test_a_pod_made_in_a_generation_starts_in_it():
    c, calls, writes = contract(Files(generation="3", world_size="12", dp="3", leaving=""))
    assert c.poll() == "" and not calls and not writes.made
