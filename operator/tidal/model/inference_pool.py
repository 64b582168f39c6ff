"""InferencePool: replicas of tp*ep GPUs, each replica's group inside one supernode."""

from __future__ import annotations

import difflib
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from pydantic import Field, field_validator, model_validator

from tidal.model.common import ApiModel, Condition, deprecated_priority_field, priority_class_name_field
from tidal.model.pod_template import MAX_RESOURCE_NAME, PodTemplate, template_problems, template_rules
from tidal.model.training_job import DEFAULT_ACCELERATOR, GroupPlacement

HHMM = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"


EMPTY_WINDOW = (
    "spec.schedule.windows[].end: must differ from start (such a window is never open); "
    "for a floor all day long set spec.minReplicas"
)


class ScheduleWindow(ApiModel):
    """A daily time window with a replica floor; an end before the start wraps past midnight."""

    # The API server refuses an empty window (start == end); one stored before is never open.
    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {"rule": "self.start != self.end", "message": EMPTY_WINDOW, "fieldPath": ".end"}
            ]
        }
    }

    # maxLength bounds the CEL rule's cost estimate (a pattern does not).
    start: str = Field(pattern=HHMM, max_length=5, description="Local start time, HH:MM.")
    end: str = Field(pattern=HHMM, max_length=5, description="Local end time, HH:MM (exclusive).")
    min_replicas: int = Field(ge=0, le=100_000, description="Replica floor while the window is open.")


class ScheduleSpec(ApiModel):
    """Time-of-day replica floors; outside every window the pool's minReplicas applies."""

    timezone: str = Field(default="UTC", description="IANA time zone of the windows, e.g. Asia/Shanghai.")
    # maxItems, like the empty-window rule, is the API server's check alone: it refuses new
    # objects, while a pool stored before keeps being served (not frozen as InvalidSpec).
    windows: list[ScheduleWindow] = Field(
        default_factory=list, json_schema_extra={"maxItems": 48}, description="Daily windows."
    )

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, tz: str) -> str:
        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError) as e:
            raise ValueError(unknown_zone(tz)) from e
        return tz


def unknown_zone(tz: str) -> str:
    """Why a time zone is refused, with the names nearest to it: the operator's status says it (the
    API server cannot check an IANA name) and a user should not have to guess the spelling."""
    near = difflib.get_close_matches(tz, sorted(available_timezones()), n=3, cutoff=0.6)
    hint = f"did you mean {', '.join(near)}? " if near else ""
    return (
        f"unknown time zone {tz!r}: {hint}valid names are IANA tz database names such as UTC, "
        "Europe/Paris, America/New_York or Asia/Shanghai (the full list: `timedatectl list-timezones`)"
    )


LOAD_SOURCE_NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"

URL_REFUSED = (
    "spec.load.prometheus.url: no longer accepted (the operator fetched any URL a tenant wrote): "
    "set spec.load.prometheus.server to the name of a Prometheus load source the cluster admin "
    "configured (Helm value loadSources, operator flag --load-source NAME=URL)"
)


class PrometheusSource(ApiModel):
    """A Prometheus instant query, run against a load source the operator is configured with.

    Sources are named by the cluster admin (`tidal run --load-source NAME=URL`, Helm value
    loadSources); a pool names one, never a URL, so no tenant can make the operator fetch an
    address of its choosing."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {"rule": "!has(self.url)", "message": URL_REFUSED, "fieldPath": ".url"},
                {
                    "rule": "has(self.server)",
                    "message": "spec.load.prometheus.server: is required: the name of a configured load source",
                    "fieldPath": ".server",
                },
            ]
        }
    }

    server: str | None = Field(
        default=None,
        max_length=63,
        pattern=LOAD_SOURCE_NAME,
        description="Name of a Prometheus load source configured in the operator (Helm value loadSources).",
    )
    query: str = Field(min_length=1, max_length=4096, description="PromQL returning one sample: requests per second.")
    url: str | None = Field(
        default=None,
        description="Refused (kept only to name it in the error): a free URL let any tenant make the operator "
        "fetch any address. Use `server`.",
    )

    @model_validator(mode="after")
    def _named_source(self) -> PrometheusSource:
        if self.url is not None:
            raise ValueError(URL_REFUSED)
        if self.server is None:
            raise ValueError("spec.load.prometheus.server: is required: the name of a configured load source")
        return self


PROMETHEUS_REQUIRED = "spec.load.prometheus: is required when source is Prometheus"


class LoadSpec(ApiModel):
    """Live load signal: replicas = ceil(current rate / target rate per replica)."""

    # The API server refuses it too: stored, such a pool could never read its load.
    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "!has(self.source) || self.source != 'Prometheus' || has(self.prometheus)",
                    "message": PROMETHEUS_REQUIRED,
                    "fieldPath": ".prometheus",
                }
            ]
        }
    }

    target_per_replica: float = Field(gt=0, description="Requests per second one replica should serve.")
    source: Literal["Annotation", "Prometheus"] = Field(
        default="Annotation",
        description="Annotation: read the pool's tidal.dev/load-rps annotation (any autoscaler or "
        "gateway may write it); Prometheus: run the instant query in `prometheus`.",
    )
    prometheus: PrometheusSource | None = Field(default=None, description="Query for source=Prometheus.")

    @model_validator(mode="after")
    def _source_configured(self) -> LoadSpec:
        if self.source == "Prometheus" and self.prometheus is None:
            raise ValueError(PROMETHEUS_REQUIRED)
        return self


class InferencePoolSpec(ApiModel):
    """A pool of inference replicas whose size follows a day/night schedule and live load."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.minReplicas <= self.maxReplicas",
                    "message": "spec.minReplicas: must be <= maxReplicas",
                    "fieldPath": ".minReplicas",
                },
                {
                    "rule": "(self.tp * self.ep) % self.gpusPerPod == 0",
                    "message": "spec.gpusPerPod: must divide tp*ep",
                    "fieldPath": ".gpusPerPod",
                },
                {
                    "rule": "!has(self.schedule) || self.schedule.windows.all(w, w.minReplicas <= self.maxReplicas)",
                    "message": "spec.schedule.windows: minReplicas must be <= maxReplicas",
                    "fieldPath": ".schedule",
                },
                *template_rules(),
            ]
        }
    }

    min_replicas: int = Field(default=0, ge=0, le=100_000, description="Replica floor outside schedule windows.")
    replicas: int = Field(
        default=0,
        ge=0,
        le=100_000,
        description="Replicas requested by an autoscaler (HPA, KEDA, kubectl scale) through the scale "
        "subresource. A request like the schedule floor and the load signal: desired = "
        "max(schedule floor, replicas, load), bounded by minReplicas and maxReplicas; the default 0 "
        "asks for nothing. An HPA leaves a target whose replicas are 0 alone, so set it (say to 1) "
        "when one drives the pool.",
    )
    max_replicas: int = Field(ge=0, le=100_000, description="Replica ceiling.")
    tp: int = Field(default=1, ge=1, le=1024, description="Tensor-parallel degree of one replica.")
    ep: int = Field(default=1, ge=1, le=1024, description="Expert-parallel degree of one replica.")
    gpus_per_pod: int = Field(ge=1, le=128, description="Accelerators per pod; must divide tp*ep.")
    accelerator: str = Field(
        default=DEFAULT_ACCELERATOR, min_length=1, max_length=MAX_RESOURCE_NAME, description="Extended resource name."
    )
    template: PodTemplate = Field(description="Pod template (a PodTemplateSpec) for every replica pod.")
    priority_class_name: str | None = priority_class_name_field()
    priority: int = deprecated_priority_field(1000)
    schedule: ScheduleSpec | None = Field(default=None, description="Time-of-day replica floors.")
    load: LoadSpec | None = Field(default=None, description="Load signal that may raise replicas above the floor.")

    @model_validator(mode="after")
    def _check_shape(self) -> InferencePoolSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"spec.minReplicas: {self.min_replicas} is greater than maxReplicas={self.max_replicas}")
        if (self.tp * self.ep) % self.gpus_per_pod:
            raise ValueError(f"spec.gpusPerPod: {self.gpus_per_pod} does not divide tp*ep={self.tp * self.ep}")
        for i, w in enumerate(self.schedule.windows if self.schedule else []):
            if w.min_replicas > self.max_replicas:
                raise ValueError(
                    f"spec.schedule.windows[{i}].minReplicas: {w.min_replicas} is greater than "
                    f"maxReplicas={self.max_replicas}"
                )
        problems = template_problems(self.template, self.accelerator)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def replica_gpus(self) -> int:
        return self.tp * self.ep


class LoadStatus(ApiModel):
    """Load as last observed by the operator."""

    current_rate: float | None = Field(default=None, ge=0, description="Requests per second across the pool.")
    observed_at: str | None = Field(default=None, description="When the rate was observed.")
    error: str | None = Field(default=None, description="Why the last read of the load signal failed.")


class ReplicaPlacement(GroupPlacement):
    """One replica (its own gang) and the supernode that holds it whole."""

    placed_at: str | None = Field(
        default=None,
        description="When its pods began to be awaited: a replica whose pods are not all bound and Running "
        "by then plus the operator's --admission-timeout is placed again (condition PodsReady).",
    )
    served_at: str | None = Field(
        default=None,
        description="When all its pods were first seen Running: a pod deleted after that is made again "
        "with a fresh admission timeout.",
    )


class InferencePoolStatus(ApiModel):
    """Observed state of an InferencePool."""

    desired_replicas: int = Field(
        default=0, ge=0, description="max(schedule floor, spec.replicas, load) within bounds."
    )
    placed_replicas: int = Field(default=0, ge=0, description="Replicas with all pods created and pinned.")
    ready_replicas: int = Field(default=0, ge=0, description="Replicas whose pods are all Running.")
    replicas: int = Field(default=0, ge=0, description="Placed replicas: the scale subresource's status.replicas.")
    selector: str = Field(
        default="",
        description="Label selector of the replicas' leader pods, one pod per replica (the scale "
        "subresource's selector: an HPA counts each selected pod as one replica).",
    )
    reason: str = Field(default="", description="Why desired and placed differ, with numbers.")
    placement: list[ReplicaPlacement] = Field(default_factory=list, description="Replica -> supernode -> nodes.")
    refused_nodes: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Nodes a replica's pods waited on in vain until the admission timeout: replicas placed "
        "again go elsewhere if they fit. Cleared once every replica runs.",
    )
    load: LoadStatus | None = Field(default=None, description="Load signal.")
    scaled_at: str | None = Field(default=None, description="When replicas were last added or removed.")
    compute_domains: list[str] = Field(
        default_factory=list,
        description="ComputeDomains (resource.nvidia.com) of replicas spanning several nodes of an NVLink supernode.",
    )
    stale_compute_domains: list[str] = Field(
        default_factory=list,
        description="ComputeDomains of removed replicas whose delete is not yet confirmed (retried every cycle).",
    )
    floor: int | None = Field(default=None, description="Replica floor from the schedule now.")
    conditions: list[Condition] = Field(default_factory=list, description="Conditions.")
    observed_generation: int | None = Field(default=None, description="Spec generation last acted on.")
