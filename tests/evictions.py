"""Eviction statuses the tests plant, in the operator's own format."""

PAST = "2020-01-01T00:00:00Z"


def rebalanced_past_grace(replicas: list[int]) -> dict:
    """What the rebalancer records to give back DP `replicas` (k8s/training.py: start_eviction,
    then the cycle that sent the checkpoint request), with its grace period long over."""
    return {
        "reason": "Rebalanced",
        "by": "test",
        "requestedAt": PAST,
        "askedAt": PAST,
        "deadline": PAST,
        "replicas": replicas,
    }
