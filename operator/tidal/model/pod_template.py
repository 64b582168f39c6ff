"""The pod template of a TrainingJob or InferencePool: free-form, except the fields tidal owns.

tidal pins every pod to the node it chose (required node affinity on metadata.name), gates it
until the whole gang exists, puts the GPU request on the first container and gives it the
workload's PriorityClass. A template that sets
any of those itself breaks the gang: `nodeName` makes every pod create fail (422) while the GPUs
stay booked, a foreign scheduling gate is never lifted, a nodeSelector that misses the chosen node
leaves the pod unschedulable, and a GPU request on another container (or a DRA resource claim)
takes devices tidal never booked. Those fields are therefore declared here (so the API server's
CEL rules can see them; the rest of the template stays free-form) and refused, each message naming
the field.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, WithJsonSchema
from pydantic.alias_generators import to_camel

MAX_CONTAINERS = 32
"""Bounds the lists the CEL rules walk: the API server refuses a CRD whose rules' cost is unbounded."""
MAX_RESOURCES = 32
"""Resource names per requests/limits map (the same reason)."""
MAX_RESOURCE_NAME = 317
"""A qualified resource name: a 253-character DNS prefix, '/', a 63-character name. The CEL cost of
comparing strings grows with their bound, so the accelerator is bounded too."""
MAX_CONTAINER_NAME = 63
"""Container names are DNS labels."""

Quantity = Annotated[
    int | str,
    WithJsonSchema({"x-kubernetes-int-or-string": True, "description": "A quantity, e.g. 4 or '500m'."}),
]


class PassThrough(BaseModel):
    """Declared fields are typed; any other field is kept as written (x-kubernetes-preserve-unknown-fields)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="allow")


class ResourceRequirements(PassThrough):
    """A container's resources."""

    requests: dict[str, Quantity] | None = Field(
        default=None, max_length=MAX_RESOURCES, description="Resource name -> quantity requested."
    )
    limits: dict[str, Quantity] | None = Field(
        default=None, max_length=MAX_RESOURCES, description="Resource name -> quantity limit."
    )
    claims: list[dict[str, Any]] | None = Field(
        default=None,
        max_length=MAX_RESOURCES,
        description="Must not be set: it names a pod resourceClaim, and those are refused.",
    )


class Container(PassThrough):
    """A container of the template; tidal adds the rank environment to each."""

    name: str = Field(min_length=1, max_length=MAX_CONTAINER_NAME, description="Container name, unique within the pod.")
    resources: ResourceRequirements | None = Field(
        default=None,
        description="Requests and limits; only the first container may name the job's accelerator "
        "(tidal sets its count there).",
    )


class NodeAffinity(PassThrough):
    """Node affinity: tidal writes the required terms (the node it chose)."""

    required_during_scheduling_ignored_during_execution: dict[str, Any] | None = Field(
        default=None, description="Must not be set: tidal pins each pod to its node here."
    )


class Affinity(PassThrough):
    """Pod affinity; preferred terms and pod (anti-)affinity pass through."""

    node_affinity: NodeAffinity | None = Field(default=None, description="Node affinity.")


DEADLINE_WHY = (
    "the kubelet would kill the gang's pods at the deadline, and a ResourceQuota scoped Terminating "
    "would count them where tidal's whole-gang quota check does not"
)


class PodSpecFields(PassThrough):
    """The pod spec; only the fields tidal owns or reads are declared."""

    containers: list[Container] | None = Field(
        default=None,
        max_length=MAX_CONTAINERS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="Containers; the first gets the accelerator request (a pause container when empty).",
    )
    init_containers: list[Container] | None = Field(
        default=None,
        max_length=MAX_CONTAINERS,
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
        description="Init containers (sidecars included); must not request the accelerator.",
    )
    node_name: str | None = Field(default=None, description="Must not be set: tidal chooses the node.")
    node_selector: dict[str, str] | None = Field(
        default=None, description="Must not be set: tidal chooses the node (one that misses it never schedules)."
    )
    scheduling_gates: list[dict[str, Any]] | None = Field(
        default=None, description="Must not be set: tidal lifts only its own gate, once the whole gang exists."
    )
    affinity: Affinity | None = Field(default=None, description="Affinity; no required node affinity.")
    priority_class_name: str | None = Field(
        default=None, description="Must not be set: tidal gives every pod the workload's spec.priorityClassName."
    )
    priority: int | None = Field(default=None, description="Must not be set: the API server derives it from the class.")
    resource_claims: list[dict[str, Any]] | None = Field(
        default=None,
        description="Must not be set: a DRA claim takes devices tidal never booked; tidal adds the "
        "ComputeDomain channel claim itself.",
    )
    active_deadline_seconds: int | None = Field(default=None, description=f"Must not be set: {DEADLINE_WHY}.")


class PodTemplate(PassThrough):
    """A PodTemplateSpec: labels and annotations are kept, the spec is copied into every pod."""

    metadata: dict[str, Any] | None = Field(default=None, description="Labels and annotations of every pod.")
    spec: PodSpecFields | None = Field(default=None, description="Pod spec of every pod.")


def _has_accelerator(resources: ResourceRequirements | None, accelerator: str) -> bool:
    return resources is not None and (
        accelerator in (resources.requests or {}) or accelerator in (resources.limits or {})
    )


def template_problems(template: PodTemplate, accelerator: str) -> list[str]:
    """The same refusals as `template_rules` (for objects the API server admitted before them)."""
    spec = template.spec
    if spec is None:
        return []
    out = []
    if spec.node_name is not None:
        out.append("spec.template.spec.nodeName: must not be set: tidal chooses each pod's node")
    if spec.node_selector:
        out.append("spec.template.spec.nodeSelector: must not be set: tidal chooses each pod's node")
    if spec.scheduling_gates:
        out.append("spec.template.spec.schedulingGates: must not be set: tidal gates and ungates its pods")
    for field, value in (("priorityClassName", spec.priority_class_name), ("priority", spec.priority)):
        if value is not None:
            out.append(
                f"spec.template.spec.{field}: must not be set: set spec.priorityClassName; tidal gives it to every pod"
            )
    if spec.resource_claims:
        out.append(f"spec.template.spec.resourceClaims: must not be set: {CLAIMS_WHY}")
    if spec.active_deadline_seconds is not None:
        out.append(f"spec.template.spec.activeDeadlineSeconds: must not be set: {DEADLINE_WHY}")
    node_affinity = spec.affinity.node_affinity if spec.affinity else None
    if node_affinity and node_affinity.required_during_scheduling_ignored_during_execution:
        out.append(
            "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: "
            "must not be set: tidal pins each pod to its node there"
        )
    for field, containers in (("containers", spec.containers), ("initContainers", spec.init_containers)):
        for i, c in enumerate(containers or []):
            if c.resources is not None and c.resources.claims:
                out.append(f"spec.template.spec.{field}[{i}].resources.claims: must not be set: {CLAIMS_WHY}")
    for i, c in enumerate((spec.containers or [])[1:], start=1):
        if _has_accelerator(c.resources, accelerator):
            out.append(f"spec.template.spec.containers[{i}].resources: {NOT_FIRST.format(acc=accelerator)}")
    for i, c in enumerate(spec.init_containers or []):
        if _has_accelerator(c.resources, accelerator):
            out.append(f"spec.template.spec.initContainers[{i}].resources: {NOT_INIT.format(acc=accelerator)}")
    return out


CLAIMS_WHY = (
    "a DRA claim takes devices (GPUs, IMEX channels) tidal never booked; request the accelerator "
    "on the first container, and tidal adds the ComputeDomain claim where NVLink needs one"
)
NOT_FIRST = "only the first container may request {acc}: tidal books and sets that count, no other"
NOT_INIT = "init containers must not request {acc}: tidal books only the first container's"

_NO_ACC = (
    "!has({c}.resources) || ((!has({c}.resources.requests) || !(self.accelerator in {c}.resources.requests)) "
    "&& (!has({c}.resources.limits) || !(self.accelerator in {c}.resources.limits)))"
)
_T = "self.template.spec"


def template_rules() -> list[dict[str, str]]:
    """CEL rules on a spec with `template` and `accelerator`, each naming the refused field."""

    def absent(field: str, why: str, empty: str = "") -> dict[str, str]:
        # `empty`: the field's empty value passes, as Helm charts render `nodeSelector: {}` and
        # `schedulingGates: []` by default and the operator's own check treats empty as unset.
        unset = f"!has({_T}) || !has({_T}.{field})" + (f" || {empty.format(f=f'{_T}.{field}')}" if empty else "")
        return {
            "rule": unset,
            "message": f"spec.template.spec.{field}: must not be set: {why}",
            "fieldPath": f".template.spec.{field}",
        }

    return [
        absent("nodeName", "tidal chooses each pod's node", '{f} == ""'),
        absent("nodeSelector", "tidal chooses each pod's node", "size({f}) == 0"),
        absent("schedulingGates", "tidal gates and ungates its pods", "size({f}) == 0"),
        absent("priorityClassName", "set spec.priorityClassName; tidal gives it to every pod", '{f} == ""'),
        absent("priority", "set spec.priorityClassName; tidal gives it to every pod"),
        absent("resourceClaims", CLAIMS_WHY, "size({f}) == 0"),
        absent("activeDeadlineSeconds", DEADLINE_WHY),
        {
            "rule": f"!has({_T}) || !has({_T}.affinity) || !has({_T}.affinity.nodeAffinity) || "
            f"!has({_T}.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution)",
            "message": "spec.template.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution: "
            "must not be set: tidal pins each pod to its node there",
            "fieldPath": ".template.spec.affinity",
        },
        {
            # Container names are unique (a list-map), so "every container but the first" is
            # "every container not named like the first".
            "rule": f"!has({_T}) || !has({_T}.containers) || {_T}.containers.all(c, "
            f"c.name == {_T}.containers[0].name || {_NO_ACC.format(c='c')})",
            "message": "spec.template.spec.containers: " + NOT_FIRST.format(acc="spec.accelerator"),
            "fieldPath": ".template.spec.containers",
        },
        *(
            {
                "rule": f"!has({_T}) || !has({_T}.{field}) || {_T}.{field}.all(c, "
                "!has(c.resources) || !has(c.resources.claims) || size(c.resources.claims) == 0)",
                "message": f"spec.template.spec.{field}[].resources.claims: must not be set: {CLAIMS_WHY}",
                "fieldPath": f".template.spec.{field}",
            }
            for field in ("containers", "initContainers")
        ),
        {
            "rule": f"!has({_T}) || !has({_T}.initContainers) || {_T}.initContainers.all(c, {_NO_ACC.format(c='c')})",
            "message": "spec.template.spec.initContainers: " + NOT_INIT.format(acc="spec.accelerator"),
            "fieldPath": ".template.spec.initContainers",
        },
    ]
