"""A monotonic clock a test moves by hand (for the modules that take one: deletions, cycle_log,
gate_ledger)."""


class ManualClock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
