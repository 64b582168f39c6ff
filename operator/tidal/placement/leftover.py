"""What a supernode's free GPUs are worth to the work that is coming, by HBD-group size.

Placement keeps the leftover that the pending queue and recent arrivals can use: a rack with 36
free GPUs is worth one 36-GPU group or one 24-GPU group (12 stranded), so a 3x24 job is better
put into an empty 72-GPU rack than spread over two 36-GPU holes when 36-GPU groups are queued.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache

QUEUE_WEIGHT = 4.0
"""A queued workload's group size counts four times an arrival's: it is waiting now."""
HISTORY_DECAY = 0.98
"""Per arrival: the history of group sizes forgets half of itself over ~35 arrivals."""


@dataclass
class GroupDemand:
    """Weights of HBD-group sizes (GPUs) per accelerator: the queue plus a decaying history."""

    weights: dict[str, dict[int, float]] = field(default_factory=lambda: defaultdict(dict))

    def observe(self, accelerator: str, group_gpus: int, weight: float = 1.0) -> None:
        sizes = self.weights.setdefault(accelerator, {})
        sizes[group_gpus] = sizes.get(group_gpus, 0.0) + weight

    def decay(self, factor: float) -> None:
        """Age the history so the leftover follows what arrives now, not what arrived last week."""
        for sizes in self.weights.values():
            for size in list(sizes):
                sizes[size] *= factor
                if sizes[size] < 1e-3:
                    del sizes[size]

    def merged(self, other: GroupDemand) -> GroupDemand:
        out = GroupDemand()
        for source in (self, other):
            for accelerator, sizes in source.weights.items():
                for size, weight in sizes.items():
                    out.observe(accelerator, size, weight)
        return out

    def sizes(self, accelerator: str) -> dict[int, float]:
        return self.weights.get(accelerator, {})


class ArrivalHistory:
    """Group sizes of recent arrivals (each workload counted once, by key), aged per arrival, and
    the demand placement weighs: the queue's sizes (QUEUE_WEIGHT each) on top of that history."""

    def __init__(self) -> None:
        self.history = GroupDemand()
        self._seen: set[object] = set()

    def seen(self, key: object) -> bool:
        return key in self._seen

    def arrive(self, key: object, accelerator: str, group_gpus: int) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        self.history.decay(HISTORY_DECAY)
        self.history.observe(accelerator, group_gpus)

    def forget(self, live: Iterable[object]) -> None:
        """Drop the keys of workloads that are gone (their sizes stay in the aged history)."""
        self._seen.intersection_update(live)

    def demand(self, queued: Iterable[tuple[str, int]]) -> GroupDemand:
        """(accelerator, group GPUs) of each queued workload, weighed on top of the history."""
        out = GroupDemand()
        for accelerator, group_gpus in queued:
            out.observe(accelerator, group_gpus, QUEUE_WEIGHT)
        return out.merged(self.history)


def leftover_value(free: int, sizes: dict[int, float]) -> float:
    """GPUs of `free` that demanded group sizes can use, weighted by how often each size comes."""
    return sum(weight * (free - free % size) for size, weight in sizes.items())


def stranded_gpus(free: int, sizes: dict[int, float] | list[int] | set[int]) -> int:
    """Free GPUs of one supernode that no mix of demanded group sizes can use."""
    return free - _largest_sum(free, tuple(sorted(set(sizes))))


@lru_cache(maxsize=65536)
def _largest_sum(free: int, sizes: tuple[int, ...]) -> int:
    """The largest total <= free made of any number of groups of the given sizes (unbounded knapsack)."""
    reachable = [False] * (free + 1)
    reachable[0] = True
    for total in range(1, free + 1):
        reachable[total] = any(size <= total and reachable[total - size] for size in sizes)
    return max(t for t in range(free + 1) if reachable[t])
