"""What resizing or suspending a training job costs, in GPU-seconds of no progress, by how the job
resizes. One pure source for the capacity planner (which way of making room is cheapest), the
simulator's tidal policy (whether a grow-back pays) and the simulator's engine (what it charges).

Two kinds (`spec.elastic.resize` in the operator, default Restart; the simulator draws the kind
per job):
- Restart (torchrun elastic, and any trainer that re-forms its world from a checkpoint): a shrink
  or grow writes a checkpoint, then every worker restarts and reloads it at the new size.
- Live (torchft, HSDP replica groups): every data-parallel replica holds the whole state, so the
  leaving replicas go at once and the survivors only rebuild their communicators; a joining
  replica starts its container, fetches the state from a peer over the network, then the world
  rebuilds its communicators once.
A whole-job suspension is checkpoint-first whatever the kind (nothing else survives it).

Defaults and their sources (the simulator's `Costs` extends this class, so both read the same):
- bytes_per_param 14 and params_per_model_gpu 2e9: ZeRO (SC '20) mixed-precision Adam keeps 16 bytes
  per parameter, a checkpoint all but the gradients; Llama 3 405B ran 3.2 B params per GPU of a
  TP8 x PP16 replica.
- write / read bandwidth per GPU: Llama 3 (arXiv:2407.21783, sec. 3.3.1), 2 TB/s sustained and
  7 TB/s peak for 24K GPUs: 81 and 285 MB/s per GPU, a sharded checkpoint written by all GPUs.
- restart_s 180: rescheduling, container start, NCCL init and compilation before the load
  (Huawei MindCluster's T1+T2+T4; MegaScale, NSDI '24).
- rebuild_s 30: a Live membership change re-creates the data-parallel communicators
  (torchft's ProcessGroup.configure blocks until the new NCCL communicator exists). Public
  figures bracket it: 5-6 s per NCCL communicator init on 16 machines (NVIDIA/nccl issue 534),
  2.5 minutes for the default init of every communicator above a few thousand GPUs (NVIDIA/nccl
  issue 1156, reported by a PyTorch engineer). A Live change rebuilds only the data-parallel
  ones, so 30 s sits between: an assumption, not a measurement of torchft.
- peer_bytes_s_per_gpu 40e9: a joining replica's GPU fetches its shard of the state from the
  same-rank GPU of a survivor over the scale-out network: one 400 Gb/s NIC per GPU (DGX H100,
  GB200 NVL72 compute trays) at 80% of line rate.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class ResizeKind(StrEnum):
    RESTART = "Restart"
    LIVE = "Live"


@dataclass(frozen=True)
class ResizeCosts:
    bytes_per_param: float = 14.0
    params_per_model_gpu: float = 2.0e9
    write_bytes_s_per_gpu: float = 2e12 / 24_576
    read_bytes_s_per_gpu: float = 7e12 / 24_576
    restart_s: float = 180.0
    rebuild_s: float = 30.0
    peer_bytes_s_per_gpu: float = 40e9

    # -- the parts ----------------------------------------------------------------------------
    def state_bytes(self, model_gpus: int) -> float:
        """Bytes of one model replica's checkpoint (model_gpus = tp * ep * pp)."""
        return self.bytes_per_param * self.params_per_model_gpu * model_gpus

    def save_seconds(self, model_gpus: int, gpus: int) -> float:
        """A checkpoint written in parallel by all `gpus` of the job."""
        return self.state_bytes(model_gpus) / (max(gpus, 1) * self.write_bytes_s_per_gpu)

    def restore_seconds(self, model_gpus: int, gpus: int) -> float:
        """A restart and the checkpoint read by all `gpus` at the new size."""
        return self.restart_s + self.state_bytes(model_gpus) / (max(gpus, 1) * self.read_bytes_s_per_gpu)

    def transfer_seconds(self, model_gpus: int) -> float:
        """A joining replica's GPU fetches its shard (one model GPU's state) from a peer."""
        return self.state_bytes(model_gpus) / max(model_gpus, 1) / self.peer_bytes_s_per_gpu

    # -- GPU-seconds of no progress ----------------------------------------------------------
    def suspend_gpu_s(self, gpus: int, model_gpus: int) -> float:
        """Suspension: the whole job writes a checkpoint, and reloads it when it comes back."""
        return gpus * (self.save_seconds(model_gpus, gpus) + self.restore_seconds(model_gpus, gpus))

    def shrink_gpu_s(self, kind: ResizeKind | str, gpus: int, leaving: int, model_gpus: int) -> float:
        """Giving back `leaving` of a job's `gpus`: Restart writes a checkpoint with every GPU
        and reloads it with the survivors; Live stalls only the survivors' communicator rebuild."""
        staying = max(gpus - leaving, 0)
        if kind == ResizeKind.LIVE:
            return staying * self.rebuild_s
        return gpus * self.save_seconds(model_gpus, gpus) + staying * self.restore_seconds(model_gpus, staying)

    def grow_gpu_s(self, kind: ResizeKind | str, gpus: int, added: int, model_gpus: int) -> float:
        """Adding `added` GPUs to a job running on `gpus`: Restart saves with the old size and
        reloads with the new, every GPU held through both; Live holds the new GPUs through their
        start and peer transfer and stalls everyone for one rebuild."""
        after = gpus + added
        if kind == ResizeKind.LIVE:
            return added * (self.restart_s + self.transfer_seconds(model_gpus)) + after * self.rebuild_s
        # The new GPUs are booked when the grow-back is decided: they wait through the save too.
        return after * (self.save_seconds(model_gpus, gpus) + self.restore_seconds(model_gpus, after))

    def grow_pays(
        self,
        kind: ResizeKind | str,
        gpus: int,
        added: int,
        model_gpus: int,
        expected_s: float,
        shrunk_again: bool = False,
    ) -> bool:
        """Whether `added` GPUs working for `expected_s` (until they are likely wanted back, or the
        job ends) do more than the grow-back stalls, and, with `shrunk_again` (they will be
        wanted back before the job ends), the shrink that gives them back."""
        cost = self.grow_gpu_s(kind, gpus, added, model_gpus)
        if shrunk_again:
            cost += self.shrink_gpu_s(kind, gpus + added, added, model_gpus)
        return added * expected_s > cost

    def room_lead_s(self, decision_period_s: float, cold_start_s: float) -> float:
        """How long making room for a replica can take: the slowest checkpoint write (one model
        replica's state written by its own GPUs), a decision period, then the cold start. A
        forecast needs no longer a lead than this."""
        return self.state_bytes(1) / self.write_bytes_s_per_gpu + decision_period_s + cold_start_s
