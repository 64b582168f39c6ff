"""A Live shrink (spec.elastic.resize: Live): the survivors take on a new membership in place.

No checkpoint is asked for. The shrink's eviction carries a membership `generation`; every pod of
the job is annotated with it, the new world size and dp, and the leaving DP replicas
(labels.WORLD_GENERATION, WORLD_SIZE, CURRENT_DP, WORLD_LEAVING); each surviving pod answers
with labels.WORLD_ACK=<generation> (tidal.workload does, after the trainer's resize hook) and the
leaving pods are deleted once all have (training._continue_eviction). Without every answer
within spec.elastic.liveTimeoutSeconds the eviction becomes a checkpoint-first one (`fall_back`):
a trainer that never answers is treated as the Restart kind it behaves like.

Why acknowledgements rather than deleting at once: a survivor still in a collective with a
leaving rank would hang or crash when that pod goes; it says it has rebuilt its communicators.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from tidal.clock import parse_time, rfc3339
from tidal.k8s import labels
from tidal.k8s.cycle import Cycle
from tidal.k8s.manifests import world_annotations
from tidal.k8s.state import PodView, ResourceView
from tidal.k8s.status import set_condition
from tidal.model.training_job import ElasticSpec
from tidal.placement import GangShape
from tidal.rebalance.resize_cost import ResizeKind

LIVE_CONDITION = "LiveResize"
LIVE_RESIZE_FALLBACKS = "live_resize_fallbacks"
"""Counter key: Live shrinks fallen back to checkpoint-first (tidal_live_resize_fallbacks_total)."""
LIVE_RESIZES = "live_resizes:"
"""Counter key prefix of live shrinks started (an eviction started, as checkpoint requests are)."""


def resize_kind(view: ResourceView) -> ResizeKind:
    """How the job's trainer resizes (spec.elastic.resize; the model's default when unset)."""
    elastic = view.spec.get("elastic") or {}
    return ResizeKind(elastic.get("resize", ElasticSpec.model_fields["resize"].default))


def live_timeout_seconds(view: ResourceView) -> int:
    elastic = view.spec.get("elastic") or {}
    return int(elastic.get("liveTimeoutSeconds", ElasticSpec.model_fields["live_timeout_seconds"].default))


def next_generation(cyc: Cycle, view: ResourceView, status: dict[str, Any]) -> int:
    """One above every generation the job has used: its status's, its eviction's, and every one
    its pods show or acknowledged. A generation used twice would be acknowledged by the answers
    to the first (`acknowledged` reads "this one or later"), and a lower one ignored by trainers."""
    shown = [int(status.get("worldGeneration") or 0), int((status.get("eviction") or {}).get("generation") or 0)]
    for pod in cyc.state.pods_of("TrainingJob", view.namespace, view.name):
        for key in (labels.WORLD_GENERATION, labels.WORLD_ACK):
            value = pod.annotations.get(key, "")
            if value.isdigit():
                shown.append(int(value))
    return max(shown) + 1


def start(cyc: Cycle, view: ResourceView, status: dict[str, Any], *, reason: str, by: str, replicas: list[int]) -> dict:
    """Record a Live shrink of `replicas`: a new generation, announced from this cycle on."""
    generation = next_generation(cyc, view, status)
    timeout = live_timeout_seconds(view)
    message = f"{reason} by {by}: DP replicas {replicas} leave live, generation {generation} (timeout {timeout}s)"
    cyc.event(view, "LiveResizeRequested", message)
    cyc.count(f"{LIVE_RESIZES}{reason}")
    return {
        **status,
        "worldGeneration": generation,
        "worldJoining": [],
        "eviction": {
            "reason": reason,
            "by": by,
            "requestedAt": cyc.stamp,
            "deadline": rfc3339(cyc.now + dt.timedelta(seconds=timeout)),  # a placeholder, as for a checkpoint
            "replicas": replicas,
            "mode": ResizeKind.LIVE.value,
            "generation": generation,
        },
        "conditions": set_condition(status.get("conditions", []), LIVE_CONDITION, True, reason, message, cyc.stamp),
    }


def announcement(shape: GangShape, replicas: list[int], generation: int) -> dict[str, str]:
    """The annotations every pod of the job gets for that generation."""
    smaller = GangShape(shape.tp, shape.ep, shape.pp, shape.dp - len(replicas), shape.gpus_per_pod)
    return {
        **world_annotations(smaller),
        labels.WORLD_GENERATION: str(generation),
        labels.WORLD_LEAVING: ",".join(str(r) for r in sorted(replicas)),
        labels.WORLD_JOINING: "",
    }


def current(view: ResourceView, status: dict[str, Any], shape: GangShape) -> dict[str, str]:
    """What every pod of a job shows between resizes: its size, and for a Live job the last
    generation, no one leaving, and who joined in it (a grow-back's new replicas)."""
    notes = world_annotations(shape)
    if resize_kind(view) == ResizeKind.LIVE and status.get("worldGeneration"):
        notes[labels.WORLD_GENERATION] = str(status["worldGeneration"])
        notes[labels.WORLD_LEAVING] = ""
        notes[labels.WORLD_JOINING] = ",".join(str(r) for r in status.get("worldJoining") or [])
    return notes


def grown(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], shape: GangShape, bigger: GangShape
) -> dict[str, Any]:
    """A Live job's grow-back is a new generation: the survivors take on the larger membership
    and the new replicas' pods, told they are joining, fetch the state from the others."""
    if resize_kind(view) != ResizeKind.LIVE:
        return status
    return {
        **status,
        "worldGeneration": next_generation(cyc, view, status),
        "worldJoining": list(range(shape.dp, bigger.dp)),
    }


def acknowledged(pod: PodView, generation: int) -> bool:
    ack = pod.annotations.get(labels.WORLD_ACK, "")
    return ack.isdigit() and int(ack) >= generation


def announce(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], pods: dict[str, PodView], shape: GangShape
) -> tuple[dict[str, Any], list[str]]:
    """Send the generation's annotations where they are not yet seen; start the timeout at the
    first cycle that sends them. Returns the status and the surviving pods yet to acknowledge."""
    eviction = status["eviction"]
    generation, replicas = int(eviction["generation"]), list(eviction["replicas"])
    wanted = announcement(shape, replicas, generation)
    waiting = []
    for pod in sorted(pods.values(), key=lambda p: p.name):
        if pod.terminating:
            continue
        if any(pod.annotations.get(k) != v for k, v in wanted.items()):
            cyc.annotate("Pod", pod.namespace, pod.name, wanted)
        leaving = pod.group is not None and shape.replica_of_group(pod.group) in replicas
        if not leaving and not acknowledged(pod, generation):
            waiting.append(pod.name)
    if not eviction.get("askedAt"):
        deadline = rfc3339(cyc.now + dt.timedelta(seconds=live_timeout_seconds(view)))
        status = {**status, "eviction": {**eviction, "askedAt": cyc.stamp, "deadline": deadline}}
    return status, waiting


def timed_out(cyc: Cycle, eviction: dict[str, Any]) -> bool:
    deadline = parse_time(eviction.get("deadline"))
    return bool(eviction.get("askedAt")) and deadline is not None and cyc.now >= deadline


def fall_back(
    cyc: Cycle, view: ResourceView, status: dict[str, Any], waiting: list[str], grace_deadline: str
) -> dict[str, Any]:
    """No answer from every survivor in time: the same shrink, checkpoint-first from this cycle on."""
    eviction = status["eviction"]
    names = ", ".join(waiting[:10]) + (" ..." if len(waiting) > 10 else "")
    message = (
        f"no acknowledgement of generation {eviction['generation']} from {names} within "
        f"{live_timeout_seconds(view)}s: falling back to checkpoint-first for DP replicas {eviction['replicas']}"
    )
    cyc.event(view, "LiveResizeTimedOut", message, warning=True)
    cyc.count(LIVE_RESIZE_FALLBACKS)
    cyc.count(f"checkpoint_requests:{eviction['reason']}")
    # The same eviction, checkpoint-first: its way back (a defragmentation move's returnTo) and
    # its generation kept. The generation marks it as announced: not called off from here on.
    restart = {
        **{k: v for k, v in eviction.items() if k not in ("mode", "askedAt")},
        "requestedAt": cyc.stamp,
        "deadline": grace_deadline,
    }
    conditions = set_condition(status.get("conditions", []), LIVE_CONDITION, False, "TimedOut", message, cyc.stamp)
    conditions = set_condition(
        conditions,
        "CheckpointRequested",
        True,
        eviction["reason"],
        f"{eviction['reason']} by {restart['by']}",
        cyc.stamp,
    )
    return {**status, "eviction": restart, "conditions": conditions}
