"""A calibrated mix of training-gang shapes for fills, benchmarks and the simulator.

Calibration (documented in README "Workload model"): AcmeTrace (NSDI '24) and Helios (SC '21)
report that most GPU jobs are small (<= 8 GPUs) while a few percent of multi-node jobs hold
most GPU time; LLM pre-training gangs reach thousands of GPUs. The weights below give ~45% of
jobs at <= 8 GPUs and ~6% at >= 1,024 GPUs; group sizes are the tp*ep of common Megatron
settings for dense (tp=8) and MoE (tp*ep = 32..64) models.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from tidal.placement.shape import GangShape


@dataclass(frozen=True)
class JobShape(GangShape):
    """A gang shape with its weight in the mix (the rank arithmetic is GangShape's, defined once)."""

    weight: float = 1.0

    @property
    def gpus(self) -> int:
        return self.world_size


TRAINING_MIX: tuple[JobShape, ...] = (
    JobShape(4, 1, 1, 1, 4, 25),  # single-node fine-tune
    JobShape(8, 1, 1, 1, 4, 20),  # one tp=8 replica
    JobShape(4, 1, 1, 8, 4, 14),  # 32-GPU DP
    JobShape(8, 1, 2, 4, 4, 12),  # 64-GPU dense
    JobShape(8, 4, 1, 2, 4, 8),  # 64-GPU MoE, 32-GPU groups
    JobShape(4, 16, 1, 4, 4, 7),  # 256-GPU MoE, 64-GPU groups (tp=4, ep=16)
    JobShape(8, 1, 8, 16, 4, 6),  # 1,024-GPU dense
    JobShape(8, 8, 4, 4, 4, 4),  # 1,024-GPU MoE
    JobShape(8, 8, 4, 16, 4, 2),  # 4,096-GPU MoE
    JobShape(72, 1, 1, 8, 4, 2),  # whole-rack tensor parallel, 576 GPUs
)


def sample_shapes(rng: random.Random, count: int, mix: tuple[JobShape, ...] = TRAINING_MIX) -> list[JobShape]:
    return rng.choices(mix, weights=[s.weight for s in mix], k=count)
