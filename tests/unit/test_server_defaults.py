"""The API server's structural defaulting, as the operator applies it to what it writes
(model/server_defaults.py); the real server's is checked in tests/cluster/test_status_versions.py."""

from __future__ import annotations

import copy

from tidal.model.server_defaults import status_as_stored, with_defaults

SCHEMA = {
    "type": "object",
    "properties": {
        "phase": {"type": "string", "default": "Pending"},
        "eviction": {
            "type": "object",
            "properties": {"mode": {"type": "string", "default": "Restart"}, "by": {"type": "string"}},
        },
        "limits": {
            "type": "object",
            "default": {},
            "properties": {"gpus": {"type": "integer", "default": 8}},
        },
        "groups": {
            "type": "array",
            "items": {"type": "object", "properties": {"nodes": {"type": "array", "default": []}}},
        },
        "byZone": {
            "type": "object",
            "additionalProperties": {"type": "object", "properties": {"spares": {"type": "integer", "default": 0}}},
        },
    },
}


def test_defaults_fill_missing_fields_at_every_depth_and_inside_what_they_filled():
    value = {"eviction": {"by": "x"}, "groups": [{}, {"nodes": ["n1"]}], "byZone": {"a": {}}}
    before = copy.deepcopy(value)
    assert with_defaults(SCHEMA, value) == {
        "phase": "Pending",
        "eviction": {"by": "x", "mode": "Restart"},
        "limits": {"gpus": 8},  # the default {} is defaulted inside too, as the server does
        "groups": [{"nodes": []}, {"nodes": ["n1"]}],
        "byZone": {"a": {"spares": 0}},
    }
    assert value == before, "what was passed is not changed"


def test_present_fields_and_objects_without_defaults_are_left_as_they_are():
    value = {"phase": "Running", "eviction": {"mode": "Live"}}
    assert with_defaults(SCHEMA, value) == {**value, "limits": {"gpus": 8}}
    assert with_defaults({"type": "object"}, {"x": 1}) == {"x": 1}


def test_unknown_fields_are_pruned_and_nulls_defaulted_as_the_server_does():
    value = {"phase": None, "eviction": {"by": None, "extra": 1}, "unknown": {"x": 1}}
    assert with_defaults(SCHEMA, value) == {"phase": "Pending", "eviction": {"mode": "Restart"}, "limits": {"gpus": 8}}
    open_schema = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
        "properties": {"a": {"type": "integer"}},
    }
    assert with_defaults(open_schema, {"a": 1, "b": 2}) == {"a": 1, "b": 2}, "preserved where the schema says so"


def test_a_training_job_status_gets_the_defaults_of_its_crd():
    stored = status_as_stored("TrainingJob", {"phase": "Running", "eviction": {"reason": "Preempted"}})
    assert stored["eviction"]["mode"] == "Restart"
    assert stored["phase"] == "Running" and stored["restarts"] == 0
