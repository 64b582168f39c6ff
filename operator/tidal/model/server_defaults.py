"""What the API server stores for a status the operator sends: the CRD schema's defaults filled in.

The API server fills every field its structural schema gives a `default`, at any depth, when the
field is missing from an object that is present, and then defaults inside what it filled
(apiextensions structural defaulting, on every write and read). The operator compares what it
wrote with what it reads back (k8s/status.py): without the same defaults a nested one
(status.eviction.mode) makes its own write look like another writer's, and a write retried after
an annotation moved the object's version was refused as if someone else had changed the status.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

from tidal.model.crd import RESOURCE_KINDS, openapi_schema


def with_defaults(schema: dict[str, Any], value: Any) -> Any:
    """`value` as the API server holds it under `schema`: fields the schema does not know are
    pruned (unless it preserves unknown fields), a null field is dropped (tidal's schemas have no
    nullable field: the server defaults a null one, and a merge patch's null deletes), and missing
    fields that have a default get it, inside objects, map values (additionalProperties) and list
    items alike. `value` is not changed; what is returned shares its unchanged parts."""
    if isinstance(value, dict):
        properties = schema.get("properties")
        if properties:
            keep_unknown = schema.get("x-kubernetes-preserve-unknown-fields")
            out = {k: v for k, v in value.items() if v is not None and (k in properties or keep_unknown)}
            for name, sub in properties.items():
                if name in out:
                    out[name] = with_defaults(sub, out[name])
                elif "default" in sub:
                    out[name] = with_defaults(sub, copy.deepcopy(sub["default"]))
            return out
        values = schema.get("additionalProperties")
        if isinstance(values, dict):
            return {k: with_defaults(values, v) for k, v in value.items()}
        return value
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, dict):
        return [with_defaults(items, v) for v in value]
    return value


@functools.cache
def status_schema(kind: str) -> dict[str, Any]:
    """The status schema of a tidal kind, as the generated CRD carries it."""
    model = next(k.status_model for k in RESOURCE_KINDS if k.kind == kind)
    return openapi_schema(model)


def status_as_stored(kind: str, wire_status: dict[str, Any]) -> dict[str, Any]:
    """A status in its wire form as the API server will hold it once written, under the CRD the
    models generate. The operator also reads every status through this (k8s/status.py): when the
    installed CRD is older or newer than the operator (Helm never upgrades CRDs), a default or a
    field only one side knows must not make our own write look like another writer's. An empty
    status is an object never given one (the server defaults inside present objects only: a new
    object's status has no defaults until a write makes it), and stays empty."""
    if not wire_status:
        return wire_status
    return with_defaults(status_schema(kind), wire_status)
