"""A training gang's shape and rank arithmetic: pure (no Kubernetes), built once for every caller.

Ranks follow Megatron's convention with TP fastest: rank = tp + TP*(ep + EP*(pp + PP*dp)). Every
tp*ep group is therefore a run of adjacent ranks (one HBD group, one supernode), and giving back
the highest DP replicas leaves every surviving rank's number unchanged.

`GangShape.request` is the one place a shape becomes a placement request: admission, a group
re-placed after a failure, an elastic job growing back and a defragmentation mover's re-placement
check all ask for the same groups of the same size.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from tidal.placement.types import GangRequest, Packing


@dataclass(frozen=True)
class GangShape:
    tp: int
    ep: int
    pp: int
    dp: int
    gpus_per_pod: int

    @classmethod
    def of(cls, spec: dict[str, Any], dp: int | None = None) -> GangShape:
        return cls(spec.get("tp", 1), spec.get("ep", 1), spec.get("pp", 1), dp or spec.get("dp", 1), spec["gpusPerPod"])

    @property
    def replica_gpus(self) -> int:
        """GPUs of one model replica (tp*ep*pp): what one DP replica's state is sharded over."""
        return self.tp * self.ep * self.pp

    @property
    def world_size(self) -> int:
        return self.replica_gpus * self.dp

    @property
    def group_gpus(self) -> int:
        return max(self.tp * self.ep, self.gpus_per_pod)

    @property
    def pods_per_group(self) -> int:
        return self.group_gpus // self.gpus_per_pod

    @property
    def groups(self) -> int:
        return self.world_size // self.group_gpus

    @property
    def pods_span_replicas(self) -> bool:
        """A pod holds ranks of two DP replicas (gpusPerPod does not divide tp*ep*pp; plain data
        parallelism with 8 GPUs a pod): no replica can be given back alone, so the gang is taken
        whole or not at all (the schema refuses the shape in an elastic job)."""
        return self.replica_gpus % self.gpus_per_pod != 0

    @property
    def groups_per_replica(self) -> int:
        return self.groups // self.dp

    def replica_of_group(self, group: int) -> int:
        return group // self.groups_per_replica

    def rank_of(self, group: int, pod_in_group: int) -> int:
        return group * self.group_gpus + pod_in_group * self.gpus_per_pod

    def parallel_ranks(self, rank: int) -> dict[str, int]:
        return {
            "TP": rank % self.tp,
            "EP": (rank // self.tp) % self.ep,
            "PP": (rank // (self.tp * self.ep)) % self.pp,
            "DP": rank // self.replica_gpus,
        }

    def request(
        self,
        name: str,
        *,
        accelerator: str = "nvidia.com/gpu",
        priority: int = 0,
        recovery: bool = False,
        group_ids: Sequence[int] | None = None,
        prefer_supernodes: Sequence[str] = (),
        resident_on: Iterable[str] = (),
        packing: Packing = Packing.KEEP_WHOLE,
    ) -> GangRequest:
        """Every group of the gang, or only `group_ids` (groups re-placed or added), as one request."""
        return GangRequest(
            name,
            groups=self.groups if group_ids is None else len(group_ids),
            group_gpus=self.group_gpus,
            gpus_per_pod=self.gpus_per_pod,
            accelerator=accelerator,
            priority=priority,
            recovery=recovery,
            prefer_supernodes=tuple(prefer_supernodes),
            resident_on=frozenset(resident_on),
            group_ids=None if group_ids is None else tuple(group_ids),
            packing=packing,
        )
