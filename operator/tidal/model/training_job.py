"""TrainingJob: a gang of tp*ep*pp*dp GPUs whose every tp*ep group sits inside one supernode."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import Field, model_validator

from tidal.model.common import ApiModel, Condition, deprecated_priority_field, priority_class_name_field
from tidal.model.pod_template import MAX_RESOURCE_NAME, PodTemplate, template_problems, template_rules

DEFAULT_ACCELERATOR = "nvidia.com/gpu"
ASSIGNMENT_NODES_MAX = 786_432
"""Characters of status.assignment.nodes (768 KiB): with groups, the schema's bound on a placement."""
ASSIGNMENT_GROUPS_MAX = 262_144
"""Characters of status.assignment.groups (256 KiB)."""


class ElasticSpec(ApiModel):
    """Range the data-parallel degree may move in when capacity is shrunk or grown."""

    min_dp: int = Field(alias="minDP", ge=1, le=100_000, description="Fewest DP replicas the job may run with.")
    max_dp: int = Field(alias="maxDP", ge=1, le=100_000, description="Most DP replicas the job may grow to.")
    resize: Literal["Restart", "Live"] = Field(
        default="Restart",
        description="How the trainer changes its DP membership. Restart (torchrun elastic): every worker restarts "
        "and reloads a checkpoint, so a shrink is checkpoint-first. Live (torchft, HSDP replica groups): survivors "
        "rebuild their communicators in place; a shrink announces the new membership and deletes the leaving pods "
        "once every surviving pod acknowledges it (annotation tidal.dev/world-ack=<generation>), with no "
        "checkpoint; without every acknowledgement within liveTimeoutSeconds it falls back to checkpoint-first. "
        "A whole-job suspension is always checkpoint-first.",
    )
    # The kubelet refreshes the downward API files within its sync period (about a minute, more
    # under load): a trainer answers after that, so 120 s would often fall back for nothing.
    live_timeout_seconds: int = Field(
        default=300,
        ge=1,
        le=3_600,
        description="Live only: how long a shrink waits for every surviving pod's acknowledgement before it falls "
        "back to the checkpoint-first path.",
    )


class CheckpointSpec(ApiModel):
    """How tidal asks the job to checkpoint before it evicts any of its pods.

    tidal sets the annotation tidal.dev/checkpoint-requested=<timestamp> on the job and its pods;
    the job answers by setting tidal.dev/checkpoint-done=<same timestamp> on the TrainingJob.
    """

    grace_period_seconds: int = Field(
        default=300, ge=0, le=86_400, description="How long to wait for checkpoint-done before evicting anyway."
    )


class RestartPolicySpec(ApiModel):
    """What to restart when a node or pod of the job fails."""

    scope: Literal["Group", "Gang"] = Field(
        default="Group",
        description="Group re-places only the broken HBD groups (spares of the same supernode first); "
        "Gang re-places the whole job.",
    )
    max_restarts: int = Field(default=3, ge=0, le=1000, description="Restarts allowed before the job Fails.")


class TrainingJobSpec(ApiModel):
    """A distributed training job placed as one gang: all pods start together or none do."""

    model_config = ApiModel.model_config | {
        "json_schema_extra": {
            "x-kubernetes-validations": [
                {
                    "rule": "self.gpusPerPod % (self.tp * self.ep) == 0 || (self.tp * self.ep) % self.gpusPerPod == 0",
                    "message": "spec.gpusPerPod: must divide tp*ep or be a multiple of it",
                    "fieldPath": ".gpusPerPod",
                },
                {
                    "rule": "!has(self.elastic) || (self.tp * self.ep * self.pp) % self.gpusPerPod == 0",
                    "message": "spec.gpusPerPod: must divide tp*ep*pp in an elastic job (a pod may not hold ranks "
                    "of two DP replicas)",
                    "fieldPath": ".gpusPerPod",
                },
                {
                    "rule": "(self.tp * self.ep * self.pp * self.dp) % self.gpusPerPod == 0",
                    "message": "spec.gpusPerPod: must divide the world size tp*ep*pp*dp",
                    "fieldPath": ".gpusPerPod",
                },
                {
                    "rule": "!has(self.elastic) || (self.elastic.minDP <= self.dp && self.dp <= self.elastic.maxDP)",
                    "message": "spec.dp: must lie within elastic.minDP..elastic.maxDP",
                    "fieldPath": ".dp",
                },
                *template_rules(),
            ]
        }
    }

    tp: int = Field(default=1, ge=1, le=1024, description="Tensor-parallel degree.")
    ep: int = Field(default=1, ge=1, le=1024, description="Expert-parallel degree.")
    pp: int = Field(default=1, ge=1, le=1024, description="Pipeline-parallel degree (stages).")
    dp: int = Field(default=1, ge=1, le=100_000, description="Data-parallel degree (replicas).")
    gpus_per_pod: int = Field(
        ge=1,
        le=128,
        description="Accelerators per pod; must divide tp*ep or be a multiple of it (and divide tp*ep*pp "
        "in an elastic job).",
    )
    accelerator: str = Field(
        default=DEFAULT_ACCELERATOR,
        min_length=1,
        max_length=MAX_RESOURCE_NAME,
        description="Extended resource name, e.g. nvidia.com/gpu.",
    )
    template: PodTemplate = Field(description="Pod template (a PodTemplateSpec) for every rank of the job.")
    priority_class_name: str | None = priority_class_name_field()
    priority: int = deprecated_priority_field(0)
    preemptible: bool = Field(default=False, description="Whether higher-priority work may suspend or shrink it.")
    elastic: ElasticSpec | None = Field(default=None, description="Allowed DP range for shrink/expand.")
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec, description="Checkpoint contract.")
    restart_policy: RestartPolicySpec = Field(default_factory=RestartPolicySpec, description="Failure handling.")
    suspend: bool = Field(default=False, description="Set true to checkpoint and release all GPUs.")
    compute_domain: Literal["Auto", "Enabled", "Disabled"] = Field(
        default="Auto",
        description="NVIDIA ComputeDomain (IMEX channel for multi-node NVLink, GB200 NVL72) per supernode the job "
        "uses: Auto follows each Supernode's spec.computeDomain; Enabled always; Disabled never.",
    )

    @model_validator(mode="after")
    def _check_shape(self) -> TrainingJobSpec:
        hbd = self.tp * self.ep
        if self.gpus_per_pod % hbd and hbd % self.gpus_per_pod:
            raise ValueError(
                f"spec.gpusPerPod: {self.gpus_per_pod} does not divide tp*ep={hbd} and is not a multiple of it"
            )
        if self.world_size % self.gpus_per_pod:
            raise ValueError(
                f"spec.gpusPerPod: {self.gpus_per_pod} does not divide the world size tp*ep*pp*dp={self.world_size}"
            )
        if self.elastic is not None:
            replica = hbd * self.pp
            if replica % self.gpus_per_pod:
                raise ValueError(
                    f"spec.gpusPerPod: {self.gpus_per_pod} does not divide tp*ep*pp={replica} in an elastic job: a "
                    "pod would hold ranks of two DP replicas, so no replica could be given back alone"
                )
            e = self.elastic
            if e.min_dp > e.max_dp:
                raise ValueError(f"spec.elastic.minDP: {e.min_dp} is greater than maxDP={e.max_dp}")
            if not e.min_dp <= self.dp <= e.max_dp:
                raise ValueError(f"spec.dp: {self.dp} is outside elastic.minDP..maxDP={e.min_dp}..{e.max_dp}")
        problems = template_problems(self.template, self.accelerator)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def world_size(self) -> int:
        return self.tp * self.ep * self.pp * self.dp

    @property
    def hbd_group_gpus(self) -> int:
        """GPUs of one tensor/expert-parallel group: they must share one supernode."""
        return self.tp * self.ep

    @property
    def placement_group_gpus(self) -> int:
        """The unit placed inside one supernode: an HBD group, or a whole pod when a pod holds several."""
        return max(self.hbd_group_gpus, self.gpus_per_pod)

    def placement_groups(self, dp: int | None = None) -> int:
        return self.tp * self.ep * self.pp * (dp or self.dp) // self.placement_group_gpus


class JobPhase(StrEnum):
    PENDING = "Pending"
    ADMITTED = "Admitted"
    RUNNING = "Running"
    SUSPENDED = "Suspended"
    RESTARTING = "Restarting"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"


class PodPlacement(ApiModel):
    """Where one rank runs."""

    rank: int = Field(ge=0, description="Global rank of the pod's first GPU / process.")
    node: str = Field(description="Node the pod is pinned to.")


class GroupPlacement(ApiModel):
    """One HBD group and the supernode that holds it whole."""

    group: int = Field(ge=0, description="Index of the group within the job.")
    supernode: str = Field(description="Supernode holding every GPU of the group.")
    nodes: list[str] = Field(default_factory=list, description="Nodes of the group's pods, in rank order.")


class PlacementAssignment(ApiModel):
    """Where every pod runs, compactly: each node once, groups as runs of indices into it.

    Together the two strings are at most 1 MiB (their maxLength), which keeps the whole status well
    under etcd's 1.5 MiB object limit; a placement that would not fit is refused at admission.
    """

    nodes: str = Field(
        max_length=ASSIGNMENT_NODES_MAX,
        description="Every node the job uses, once, in order of first use, as hostlists: "
        "nvl72-0000-n[00-17],nvl72-0001-n[00-03,05].",
    )
    groups: str = Field(
        max_length=ASSIGNMENT_GROUPS_MAX,
        description="Runs of consecutive HBD groups on one supernode, ';'-separated: "
        "first-last@supernode=pods, pods being node indices in rank order (a-b each once, a-b*k each k times).",
    )


class EvictionStatus(ApiModel):
    """A checkpoint-first eviction in progress: pods are deleted once the job confirms its checkpoint
    (annotation tidal.dev/checkpoint-done) or the grace period runs out."""

    reason: str = Field(description="Preempted, Rebalanced or Suspended.")
    by: str = Field(default="", description="Who asked, e.g. the preempting job namespace/name.")
    requested_at: str = Field(description="Value of the tidal.dev/checkpoint-requested annotation.")
    asked_at: str | None = Field(
        default=None,
        description="When the operator first sent the annotation to the job and its pods; the grace period "
        "starts here.",
    )
    deadline: str | None = Field(
        default=None, description="When pods are deleted even without checkpoint-done: askedAt plus the grace period."
    )
    replicas: list[int] = Field(
        default_factory=list, description="DP replicas to give back; empty means the whole job."
    )
    mode: Literal["Restart", "Live"] = Field(
        default="Restart",
        description="Live: a live shrink (no checkpoint request; the survivors acknowledge the new membership "
        "`generation`); Restart: checkpoint-first.",
    )
    generation: int | None = Field(
        default=None,
        ge=1,
        description="Live: the membership generation announced to the pods (tidal.dev/world-generation).",
    )
    return_to: PlacementAssignment | None = Field(
        default=None,
        description="A defragmentation move's way back: where the moved work (the whole job, or the given-back "
        "replicas' groups) was verified to fit again. Kept from every other workload while the eviction lasts, and "
        "taken as it is when the job is placed again in the cycle that ends the eviction (else it is planned afresh).",
    )


class EvictionRecord(ApiModel):
    """A past eviction, kept so the disruption budget survives operator restarts."""

    at: str = Field(description="When the pods were evicted.")
    gpus: int = Field(ge=0, description="GPUs given back.")
    reason: str = Field(description="Preempted, Rebalanced or Suspended.")
    by: str = Field(default="", description="Who asked, as status.eviction.by said.")


class TrainingJobStatus(ApiModel):
    """Observed state of a TrainingJob."""

    phase: JobPhase = Field(default=JobPhase.PENDING, description="Lifecycle phase.")
    reason: str = Field(default="", description="Why the job is in this phase (for Pending: the numbers).")
    world_size: int | None = Field(default=None, description="tp*ep*pp*dp of the running shape.")
    current_dp: int | None = Field(default=None, alias="currentDP", description="DP degree it runs with now.")
    world_generation: int = Field(
        default=0,
        ge=0,
        description="Membership generation last announced to the pods of a Live job (tidal.dev/world-generation); "
        "each live resize adds one.",
    )
    world_joining: list[int] = Field(
        default_factory=list,
        description="Live: the DP replicas that joined in that generation (a grow-back); their pods fetch the "
        "state from the other replicas (tidal.dev/world-joining).",
    )
    assignment: PlacementAssignment | None = Field(
        default=None,
        description="Group -> supernode -> nodes of every pod (compact form; `tidal placement` expands it).",
    )
    placement: list[GroupPlacement] = Field(
        default_factory=list,
        description="Old form of the placement (one entry per group, every node listed), read from objects "
        "written before `assignment`; replaced by `assignment` on the next status write.",
    )
    supernodes: int | None = Field(default=None, description="Number of supernodes the job spans.")
    restarts: int = Field(
        default=0,
        ge=0,
        description="Restarts after failures of the job's own pods so far (not counted: a lost or NotReady node, "
        "a pod marked DisruptionTarget by a drain, the taint manager, preemption or node shutdown, and further "
        "groups failing before the job runs again, unless a group fails twice).",
    )
    restarting_groups: list[int] | None = Field(
        default=None,
        max_length=100_000,
        description="Groups re-placed since the job last ran whole: one of them failing again is a new restart.",
    )
    admitted_at: str | None = Field(default=None, description="When the gang was last admitted.")
    placed_at: str | None = Field(
        default=None,
        description="When the pods of the current placement began to be awaited (admission, a group placed "
        "again, growth): pods not all bound and Running by then plus the operator's --admission-timeout "
        "get their groups placed again (condition PodsReady, reason AdmissionTimeout).",
    )
    pending_since: str | None = Field(default=None, description="When the job last started waiting for GPUs.")
    refused_nodes: list[str] = Field(
        default_factory=list,
        max_length=256,
        description="Nodes its pods waited on in vain until the admission timeout queued the whole gang again, "
        "or failed on before a whole-gang restart: the next admission places it off them if it fits elsewhere. "
        "Cleared at admission.",
    )
    recover_on: list[str] = Field(
        default_factory=list,
        max_length=100_000,
        description="Supernodes of the broken groups when the whole gang was given back to restart: the "
        "recovery is placed on them first (their hot spares before other supernodes' free nodes). Cleared at "
        "admission.",
    )
    eviction: EvictionStatus | None = Field(default=None, description="Checkpoint-first eviction in progress.")
    eviction_history: list[EvictionRecord] = Field(
        default_factory=list,
        description="Every eviction of the last hour (the disruption budget counts them), at least the "
        "last 10, newest last.",
    )
    compute_domains: list[str] = Field(
        default_factory=list,
        description="ComputeDomains (resource.nvidia.com) tidal made for the job, one per supernode it uses.",
    )
    stale_compute_domains: list[str] = Field(
        default_factory=list,
        description="ComputeDomains the job no longer needs whose delete is not yet confirmed (retried every cycle).",
    )
    conditions: list[Condition] = Field(default_factory=list, description="Admitted, Running, Preempted...")
    observed_generation: int | None = Field(default=None, description="Spec generation last acted on.")
