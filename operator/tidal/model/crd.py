"""Generate CustomResourceDefinitions from the pydantic models (the one source of truth).

pydantic emits JSON Schema; Kubernetes wants a *structural* OpenAPI v3 subset: no $ref, no
anyOf-with-null, no `additionalProperties: false` beside `properties`, boolean exclusive bounds.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from tidal import API_GROUP, API_VERSION
from tidal.model.inference_pool import InferencePoolSpec, InferencePoolStatus
from tidal.model.supernode import SupernodeSpec, SupernodeStatus
from tidal.model.training_job import TrainingJobSpec, TrainingJobStatus

_DROPPED_KEYS = {"title"}


@dataclass(frozen=True)
class ResourceKind:
    kind: str
    plural: str
    scope: str
    short_names: list[str]
    description: str
    spec_model: type[BaseModel]
    status_model: type[BaseModel]
    printer_columns: list[dict[str, Any]] = field(default_factory=list)
    scale: dict[str, str] | None = None
    """The scale subresource (HPA, KEDA and `kubectl scale` read and write it), if the kind has one."""

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{API_GROUP}"


def _age() -> dict[str, Any]:
    return {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


RESOURCE_KINDS: list[ResourceKind] = [
    ResourceKind(
        kind="TrainingJob",
        plural="trainingjobs",
        scope="Namespaced",
        short_names=["tj", "tjob"],
        description="A gang-scheduled distributed training job whose tp*ep groups each sit in one supernode.",
        spec_model=TrainingJobSpec,
        status_model=TrainingJobStatus,
        printer_columns=[
            {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
            {"name": "World", "type": "integer", "jsonPath": ".status.worldSize"},
            {"name": "TP", "type": "integer", "jsonPath": ".spec.tp", "priority": 1},
            {"name": "EP", "type": "integer", "jsonPath": ".spec.ep", "priority": 1},
            {"name": "PP", "type": "integer", "jsonPath": ".spec.pp", "priority": 1},
            {"name": "DP", "type": "integer", "jsonPath": ".status.currentDP"},
            {"name": "Supernodes", "type": "integer", "jsonPath": ".status.supernodes"},
            {"name": "Restarts", "type": "integer", "jsonPath": ".status.restarts"},
            {"name": "Priority-Class", "type": "string", "jsonPath": ".spec.priorityClassName", "priority": 1},
            {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
            _age(),
        ],
    ),
    ResourceKind(
        kind="InferencePool",
        plural="inferencepools",
        scope="Namespaced",
        # Gateway API's Inference Extension has an InferencePool too: no generic short name.
        short_names=["tpool", "tidalpool"],
        description="Inference replicas sized by a time-of-day schedule and live load.",
        spec_model=InferencePoolSpec,
        status_model=InferencePoolStatus,
        # One replica per selected pod: the selector names the leader pods (see manifests.py).
        scale={
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
        printer_columns=[
            {"name": "Desired", "type": "integer", "jsonPath": ".status.desiredReplicas"},
            {"name": "Placed", "type": "integer", "jsonPath": ".status.placedReplicas"},
            {"name": "Ready", "type": "integer", "jsonPath": ".status.readyReplicas"},
            {"name": "Min", "type": "integer", "jsonPath": ".spec.minReplicas", "priority": 1},
            {"name": "Max", "type": "integer", "jsonPath": ".spec.maxReplicas", "priority": 1},
            {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
            _age(),
        ],
    ),
    ResourceKind(
        kind="Supernode",
        plural="supernodes",
        scope="Cluster",
        short_names=["sn", "snode"],
        description="One high-bandwidth domain (NVL72 rack, CloudMatrix384, NVLink server) and its GPUs.",
        spec_model=SupernodeSpec,
        status_model=SupernodeStatus,
        printer_columns=[
            {"name": "Accelerator", "type": "string", "jsonPath": ".spec.accelerator", "priority": 1},
            {"name": "Block", "type": "string", "jsonPath": ".spec.topology.block"},
            {"name": "Ready", "type": "integer", "jsonPath": ".status.readyNodes"},
            {"name": "GPUs", "type": "integer", "jsonPath": ".status.gpus.total"},
            {"name": "Free", "type": "integer", "jsonPath": ".status.gpus.free"},
            {"name": "Failed", "type": "integer", "jsonPath": ".status.gpus.failed"},
            {"name": "Largest-Slice", "type": "integer", "jsonPath": ".status.largestFreeSlice"},
            _age(),
        ],
    ),
]


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "$ref" in node:
        target = copy.deepcopy(defs[node.pop("$ref").split("/")[-1]])
        target.update(node)  # sibling keys (description, default) win over the definition's
        node = target
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        non_null = [a for a in any_of if a.get("type") != "null"]
        if len(non_null) != 1:
            raise ValueError(f"cannot express anyOf {any_of} structurally")
        merged = dict(non_null[0])
        merged.update({k: v for k, v in node.items() if k != "default" or v is not None})
        node = merged
        if "$ref" in node:
            return _structural(node, defs)
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS or key == "$defs":
            continue
        if key == "default" and value is None:
            continue
        if key == "additionalProperties":
            if value is False:
                continue
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
                continue
        if key == "exclusiveMinimum" and not isinstance(value, bool):
            out["minimum"], out["exclusiveMinimum"] = value, True
            continue
        if key == "exclusiveMaximum" and not isinstance(value, bool):
            out["maximum"], out["exclusiveMaximum"] = value, True
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
            continue
        out[key] = _structural(value, defs)
    if out.get("x-kubernetes-preserve-unknown-fields") and "type" not in out:
        out["type"] = "object"
    return out


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _structural(raw, raw.get("$defs", {}))


def crd_for(kind: ResourceKind) -> dict[str, Any]:
    spec_schema = openapi_schema(kind.spec_model)
    status_schema = openapi_schema(kind.status_model)
    status_schema["description"] = f"Observed state, written by the operator. {status_schema.get('description', '')}"
    root = {
        "type": "object",
        "description": kind.description,
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "API version: tidal.dev/v1alpha1."},
            "kind": {"type": "string", "description": f"Kind: {kind.kind}."},
            "metadata": {"type": "object"},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": kind.crd_name, "labels": {"app.kubernetes.io/part-of": "tidal"}},
        "spec": {
            "group": API_GROUP,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.kind.lower(),
                "shortNames": kind.short_names,
                "categories": ["tidal"],
            },
            "scope": kind.scope,
            "versions": [
                {
                    "name": API_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}, **({"scale": dict(kind.scale)} if kind.scale else {})},
                    "additionalPrinterColumns": kind.printer_columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


HEADER = "# Generated by `tidal crds` from operator/tidal/model; do not edit by hand.\n"


def kopf_peering_crds() -> list[dict[str, Any]]:
    """kopf's peering resources: replicas of the operator use them so that only one acts."""
    crds = []
    for kind, plural, scope in (
        ("ClusterKopfPeering", "clusterkopfpeerings", "Cluster"),
        ("KopfPeering", "kopfpeerings", "Namespaced"),
    ):
        crds.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.kopf.dev", "labels": {"app.kubernetes.io/part-of": "tidal"}},
                "spec": {
                    "group": "kopf.dev",
                    "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
                    "scope": scope,
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {
                                "openAPIV3Schema": {
                                    "type": "object",
                                    "description": "Operator replicas announce themselves here (kopf peering).",
                                    "properties": {
                                        "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                        "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                                    },
                                }
                            },
                        }
                    ],
                },
            }
        )
    return crds


def _dump(*docs: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump_all(list(docs), sort_keys=False, width=100, allow_unicode=True)


def render_crds() -> dict[str, str]:
    """File name -> YAML text of every CRD."""
    files = {f"{API_GROUP}_{k.plural}.yaml": _dump(crd_for(k)) for k in RESOURCE_KINDS}
    files["kopf.dev_peerings.yaml"] = _dump(*kopf_peering_crds())
    return files


def write_crds(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_crds().items():
        path = directory / name
        path.write_text(text)
        written.append(path)
    return written
