"""Make sure kopf's peering object exists before kopf starts, or say plainly why it cannot.

Given a peering name, kopf treats peering as mandatory: while the object is missing it keeps the
operator paused and logs only a debug line per keep-alive, so an operator started without it
does nothing and says nothing. tidal creates the object when its identity may, and otherwise
stops with an error that names the object and the two ways out. tidal always runs kopf
cluster-wide (`--namespace` filters what it serves), so the object is a ClusterKopfPeering.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import urllib3
from kubernetes.client.exceptions import ApiException

GROUP, VERSION, PLURAL = "kopf.dev", "v1", "clusterkopfpeerings"
WAYS_OUT = (
    "create it (kubectl apply -f examples/peering.yaml with its name, or install the Helm chart), "
    "or run a single replica with --standalone"
)


class PeeringUnavailable(RuntimeError):
    """The peering object is missing and cannot be created: the operator must not start idle."""


def ensure_peering(
    custom_objects: Any, name: str, attempts: int = 6, sleep: Callable[[float], None] = time.sleep
) -> bool:
    """True when this call created the ClusterKopfPeering, False when it existed. Raises
    PeeringUnavailable when it is missing and cannot be made (no CRD, or no permission).

    A transient answer (5xx, 429, a dropped connection) is retried with backoff: exiting on one,
    as it did, made the operator crash-loop at start-up whenever the API server hiccuped
    (found by bench.faults)."""
    for attempt in range(attempts):
        try:
            return _ensure_once(custom_objects, name)
        except (ApiException, OSError, urllib3.exceptions.HTTPError) as exc:
            transient = (
                not isinstance(exc, ApiException) or exc.status is None or exc.status >= 500 or exc.status == 429
            )
            if not transient or attempt == attempts - 1:
                raise
            sleep(min(2**attempt, 10))
    raise AssertionError("unreachable")


def _ensure_once(custom_objects: Any, name: str) -> bool:
    try:
        custom_objects.get_cluster_custom_object(GROUP, VERSION, PLURAL, name)
        return False
    except ApiException as exc:
        if exc.status not in (403, 404):  # 403: may not read it; creating it says if we may write it
            raise
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ClusterKopfPeering", "metadata": {"name": name}}
    try:
        custom_objects.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    except ApiException as exc:
        if exc.status == 409:  # another replica made it first
            return False
        if exc.status is not None and (exc.status >= 500 or exc.status == 429):
            raise  # transient: ensure_peering tries again
        raise PeeringUnavailable(_explain(name, exc)) from exc
    return True


def _explain(name: str, exc: ApiException) -> str:
    missing = f"the ClusterKopfPeering {name!r} is missing"
    if exc.status == 404:
        crds = "kopf's peering CRDs are not installed: apply crds/kopf.dev_peerings.yaml"
        return f"{missing} and {crds}, then {WAYS_OUT}"
    if exc.status == 403:
        return f"{missing} and this operator's identity may not create it: {WAYS_OUT}"
    return f"{missing} and creating it failed ({exc.status} {exc.reason}): {WAYS_OUT}"
