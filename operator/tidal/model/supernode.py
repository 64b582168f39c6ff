"""Supernode: one high-bandwidth domain (NVL72 rack, CloudMatrix384, 8-GPU server)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from tidal.model.common import ApiModel, Condition
from tidal.model.training_job import DEFAULT_ACCELERATOR

SUPERNODE_LABEL = "tidal.dev/supernode"


class ScaleOutPosition(ApiModel):
    """Where the supernode sits in the scale-out network; jobs are kept in as few blocks as possible."""

    block: str | None = Field(default=None, description="Scale-out block (leaf group) name.")
    spine: str | None = Field(default=None, description="Spine name.")
    zone: str | None = Field(default=None, description="Zone name.")


class SpareSpec(ApiModel):
    """Hot spares kept free for recovery of failed groups inside this supernode."""

    count: int = Field(default=0, ge=0, le=1024, description="Number of member nodes to hold as spares.")
    nodes: list[str] = Field(default_factory=list, description="Explicit spare node names (override count).")


class SupernodeSpec(ApiModel):
    """Members and properties of one high-bandwidth domain."""

    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description="Labels selecting member Nodes; empty means tidal.dev/supernode=<name>.",
    )
    accelerator: str = Field(default=DEFAULT_ACCELERATOR, min_length=1, description="Extended resource name.")
    topology: ScaleOutPosition = Field(default_factory=ScaleOutPosition, description="Scale-out position.")
    spares: SpareSpec = Field(default_factory=SpareSpec, description="Hot-spare policy.")
    compute_domain: Literal["Auto", "Enabled", "Disabled"] = Field(
        default="Auto",
        description="Whether jobs on this supernode get an NVIDIA ComputeDomain (multi-node NVLink): Auto when "
        "its nodes carry the nvidia.com/gpu.clique label (GB200 NVL72); a job's own spec.computeDomain wins.",
    )


class SupernodeGpus(ApiModel):
    """GPU accounting of the supernode."""

    total: int = Field(default=0, ge=0, description="Accelerators on all member nodes.")
    allocated: int = Field(default=0, ge=0, description="Requested by bound or pinned pods.")
    free: int = Field(default=0, ge=0, description="On healthy, schedulable, non-spare nodes and unrequested.")
    failed: int = Field(default=0, ge=0, description="On NotReady or missing nodes.")
    spare: int = Field(default=0, ge=0, description="Held on hot-spare nodes.")


class SupernodeStatus(ApiModel):
    """Observed state of a Supernode."""

    nodes: list[str] = Field(default_factory=list, description="Member node names.")
    ready_nodes: int = Field(default=0, ge=0, description="Members that are Ready and schedulable.")
    failed_nodes: list[str] = Field(default_factory=list, description="Members that are NotReady.")
    spare_nodes: list[str] = Field(default_factory=list, description="Members held as hot spares.")
    gpus: SupernodeGpus = Field(default_factory=SupernodeGpus, description="GPU accounting.")
    largest_free_slice: int = Field(default=0, ge=0, description="Free GPUs usable by one HBD group.")
    conditions: list[Condition] = Field(default_factory=list, description="Healthy, Degraded...")
