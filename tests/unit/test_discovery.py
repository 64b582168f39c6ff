"""Supernode discovery (`supernodes.Discovery`): the node informer's hook notes, its own thread
creates; what it knows comes from one LIST, kopf's Supernode events and the audit's LIST."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import structlog

from tidal.k8s.state import NodeView
from tidal.k8s.supernodes import Discovery

LABEL = "tidal.dev/supernode"


def node(name: str, rack: str, gpus: int = 8) -> NodeView:
    return NodeView(name, {LABEL: rack}, {"nvidia.com/gpu": gpus}, ready=True, unschedulable=False)


class Api:
    """What discovery calls, recorded; `existing` Supernodes answer a create with 409."""

    def __init__(self, existing: set[str] = frozenset()):
        self.existing = set(existing)
        self.calls: list[tuple[Any, ...]] = []
        self.fail_lists = 0

    def list_keys(self, kind: str) -> set[str]:
        self.calls.append(("list_keys", kind))
        if self.fail_lists:
            self.fail_lists -= 1
            raise ConnectionError("API server away")
        return set(self.existing)

    def create_supernode(self, name: str, spec: dict[str, Any]) -> bool:
        self.calls.append(("create_supernode", name, spec["nodeSelector"], spec["accelerator"]))
        if name in self.existing:
            return False
        self.existing.add(name)
        return True

    def event(self, kind, namespace, name, uid, reason, message, warning=False, api_version=None) -> None:
        self.calls.append(("event", kind, namespace, name, uid, reason, message, api_version))


def test_the_hook_calls_no_api_and_notes_each_rack_once():
    api = Api()
    discovery = Discovery(api, LABEL)  # type: ignore[arg-type]
    for i in range(50):
        discovery.node(f"uid-{i}", node(f"n{i}", f"rack-{i % 3}"))
    discovery.node("uid-x", NodeView("x", {}, {}, ready=True, unschedulable=False))  # no label: nothing
    assert api.calls == [] and list(discovery.pending) == ["rack-0", "rack-1", "rack-2"]
    assert discovery.wake.is_set()


def test_work_seeds_once_creates_what_is_missing_and_tells_the_node_that_named_it():
    api = Api(existing={"rack-1"})
    discovery = Discovery(api, LABEL)  # type: ignore[arg-type]
    for i in range(6):
        discovery.node(f"uid-{i}", node(f"n{i}", f"rack-{i % 2}"))
    with structlog.testing.capture_logs() as logs:
        assert discovery.work() == ["rack-0"]
    assert api.calls == [
        ("list_keys", "supernode"),
        ("create_supernode", "rack-0", {LABEL: "rack-0"}, "nvidia.com/gpu"),
        ("event", "Node", None, "n0", "uid-0", "SupernodeDiscovered", f"created Supernode rack-0 from {LABEL}", "v1"),
    ]
    assert [e["supernode"] for e in logs if e["event"] == "supernode discovered"] == ["rack-0"]
    discovery.node("uid-9", node("n9", "rack-0"))
    assert discovery.pending == {} and discovery.work() == [] and len(api.calls) == 3, "known now: nothing more"


def test_a_failed_seeding_list_is_tried_again_by_the_next_work_not_once_per_node():
    api = Api()
    api.fail_lists = 1
    discovery = Discovery(api, LABEL)  # type: ignore[arg-type]
    for i in range(40):
        discovery.node(f"uid-{i}", node(f"n{i}", "rack-0"))
    with pytest.raises(ConnectionError):
        discovery.work()
    assert api.calls == [("list_keys", "supernode")] and list(discovery.pending) == ["rack-0"]
    assert discovery.work() == ["rack-0"]
    assert [c[0] for c in api.calls] == ["list_keys", "list_keys", "create_supernode", "event"]


def test_the_thread_backs_off_after_a_failure_and_retries_what_is_pending():
    api = Api()
    api.fail_lists = 2
    waits: list[float] = []
    done = threading.Event()

    def wait(seconds: float) -> bool:
        waits.append(seconds)
        return False

    discovery = Discovery(api, LABEL, wait=wait)  # type: ignore[arg-type]
    original = discovery.work

    def work() -> list[str]:
        created = original()
        done.set()
        discovery.stop()
        return created

    discovery.work = work  # type: ignore[method-assign]
    discovery.node("uid-0", node("n0", "rack-0"))
    discovery.start()
    assert done.wait(10)
    assert waits == [1.0, 2.0] and "rack-0" in api.existing


def test_a_deletion_heard_while_the_audits_list_was_served_is_not_undone():
    """kopf's DELETED arrives after the audit's LIST was served but before it is read: pruning
    only takes names out, so the deleted Supernode stays unknown and its next node re-makes it."""
    api = Api(existing={"rack-0", "rack-1"})
    discovery = Discovery(api, LABEL)  # type: ignore[arg-type]
    discovery.work()
    listed = {"rack-0", "rack-1"}  # served while rack-0 still existed
    discovery.seen("rack-0", gone=True)
    discovery.prune(listed)
    assert discovery.known == {"rack-1"}
    api.existing.discard("rack-0")
    discovery.node("uid-0", node("n0", "rack-0"))
    assert discovery.work() == ["rack-0"]


def test_a_deletion_heard_while_the_seeding_list_was_out_is_not_undone():
    api = Api(existing={"rack-0"})
    discovery = Discovery(api, LABEL)  # type: ignore[arg-type]
    list_keys = api.list_keys

    def racing(kind: str) -> set[str]:
        listed = list_keys(kind)
        discovery.seen("rack-0", gone=True)  # kopf's event while the LIST's answer was on its way
        api.existing.discard("rack-0")
        return listed

    api.list_keys = racing  # type: ignore[method-assign]
    discovery.node("uid-0", node("n0", "rack-0"))
    assert discovery.work() == ["rack-0"]
