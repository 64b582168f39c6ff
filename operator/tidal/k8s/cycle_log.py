"""The operator's "cycle done" INFO line: a summary of the cycles that acted, at most every
`every_seconds` (operator flag --cycle-log-seconds).

A busy cluster runs a cycle every half second; one line each buries the lines a person needs.
Each decision already has its own INFO line (the write room logs every event it sends), so the
summary only says how much the cycles did and how long they took. The first cycle is logged at
once (the operator is up and has seen the cluster); with `every_seconds` 0 every cycle that
admitted or made pod calls has its own line, as `bench.operator_profile` reads them.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger("tidal")

SUMS = ("admitted", "statuses", "pod_creates", "ungates", "pod_deletes")
ACTIONS = ("admitted", "pod_creates", "ungates", "pod_deletes")
"""A cycle acted if it did any of these (a status write alone is bookkeeping)."""
SECONDS = ("seconds", "decide_seconds", "write_seconds", "supernodes_seconds")


@dataclass
class CycleLog:
    every_seconds: float
    monotonic: Callable[[], float] = time.monotonic
    _pending: Counter[str] = field(default_factory=Counter)
    _cycles: int = 0
    _last_line: float | None = None

    def record(self, first: bool, counts: dict[str, int], seconds: dict[str, float], nodes: int, pods: int) -> bool:
        """Add one cycle; log the summary if it is due. Returns whether a line was logged."""
        if first or any(counts.get(k, 0) for k in ACTIONS):
            self._pending.update({k: counts.get(k, 0) for k in SUMS})
            self._pending.update({k: seconds.get(k, 0.0) for k in SECONDS})
            self._cycles += 1
        due = self._last_line is None or self.monotonic() - self._last_line >= self.every_seconds
        if not self._cycles or not (first or due):
            return False
        self.flush(first, nodes, pods)
        return True

    def flush(self, first: bool = False, nodes: int | None = None, pods: int | None = None) -> None:
        """Log what is pending now, due or not: before a failed cycle's error and at shutdown,
        so that the cycles summed since the last line are not lost."""
        if not self._cycles:
            return
        log.info(
            "cycle done",
            first=first,
            cycles=self._cycles,
            **{k: round(self._pending[k], 3) for k in SECONDS},
            **{k: int(self._pending[k]) for k in SUMS},
            nodes=nodes,
            pods=pods,
        )
        self._pending.clear()
        self._cycles = 0
        self._last_line = self.monotonic()
