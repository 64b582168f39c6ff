"""The trainer's side of tidal's contract, standard library only.

tidal talks to a training pod through annotations, which the pod reads as files of its downward
API volume (/etc/tidal/world, refreshed by the kubelet) and answers by writing annotations back
with its service account:

- checkpoint: `checkpoint-requested=<time>` on the pod; the trainer saves and the job is annotated
  `tidal.dev/checkpoint-done=<the same time>`; `checkpoint-cancelled=<that time>` calls it off.
- live membership (spec.elastic.resize: Live): `generation`, `world-size`, `dp` and `leaving`
  (the DP replicas leaving); each surviving pod rebuilds its communicators and answers
  `tidal.dev/world-ack=<generation>` on itself; a leaving pod stops.

    from tidal_workload import Contract

    contract = Contract(save=lambda request: trainer.save(), resize=lambda world: trainer.rebuild(world))
    while training:
        step()
        contract.poll()   # a leaving replica keeps going until tidal deletes its pod

The job's service account needs `patch` on `trainingjobs` (its job) and `get` and `patch` on
`pods` in its namespace: examples/workload-rbac.yaml is such a Role and RoleBinding. Only the pod
of global rank 0 reports checkpoint-done (a checkpoint is collective: when its save returns, every
rank's has); every surviving pod acknowledges a membership for itself.
"""

from __future__ import annotations

import datetime
import json
import os
import ssl
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ANNOTATION = "tidal.dev/"
CHECKPOINT_DONE = ANNOTATION + "checkpoint-done"
WORLD_ACK = ANNOTATION + "world-ack"
FILES = {
    "world-size": ANNOTATION + "world-size",
    "dp": ANNOTATION + "dp",
    "generation": ANNOTATION + "world-generation",
    "leaving": ANNOTATION + "world-leaving",
    "joining": ANNOTATION + "world-joining",
    "checkpoint-requested": ANNOTATION + "checkpoint-requested",
    "checkpoint-cancelled": ANNOTATION + "checkpoint-cancelled",
}
"""File of the downward API volume -> the annotation it shows (as tidal mounts them)."""
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")


@dataclass(frozen=True)
class World:
    """A membership generation as tidal announced it."""

    generation: int
    world_size: int
    dp: int
    leaving: tuple[int, ...]
    """DP replicas that leave in this generation."""
    joining: tuple[int, ...] = ()
    """DP replicas that joined in this generation (a grow-back): a joining replica fetches the
    state from one of the others (any DP replica not listed holds a full copy)."""


def _time(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def _replicas(listed: str) -> tuple[int, ...]:
    return tuple(int(r) for r in listed.split(",") if r.strip().isdigit())


class FileSource:
    """What the pod's downward API volume shows (in a pod)."""

    def __init__(self, path: str | Path = "/etc/tidal/world"):
        self.path = Path(path)

    def read(self) -> dict[str, str]:
        """Every file from one snapshot: the kubelet swaps the volume's `..data` link to a new
        directory on an update, so reading through it file by file could pair an old world size
        with a new generation."""
        data = self.path / "..data"
        root = data.resolve() if data.exists() else self.path
        out = {}
        for name in FILES:
            try:
                out[name] = (root / name).read_text().strip()
            except OSError:
                out[name] = ""
        return out


class ApiSource:
    """The same, read from the pod's annotations through the API server (outside a kubelet)."""

    def __init__(self, client: KubeClient, namespace: str, pod: str):
        self.client, self.namespace, self.pod = client, namespace, pod

    def read(self) -> dict[str, str]:
        body = self.client.get(f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}")
        notes = (body.get("metadata") or {}).get("annotations") or {}
        return {name: notes.get(key, "") for name, key in FILES.items()}


class KubeClient:
    """JSON GET and merge-PATCH against the API server: in a pod from its service account, else
    from `server`, `token` and `ca_file` (None: no TLS verification only for http:// servers)."""

    def __init__(self, server: str | None = None, token: str | None = None, ca_file: str | None = None):
        if server is None:
            host, port = os.environ["KUBERNETES_SERVICE_HOST"], os.environ["KUBERNETES_SERVICE_PORT"]
            server = f"https://{host}:{port}"
            token = token or (SERVICE_ACCOUNT / "token").read_text().strip()
            ca_file = ca_file or str(SERVICE_ACCOUNT / "ca.crt")
        self.server, self.token = server.rstrip("/"), token
        self.context = ssl.create_default_context(cafile=ca_file) if ca_file else None

    def _call(self, method: str, path: str, body: dict | None = None, content_type: str = "") -> dict:
        request = urllib.request.Request(self.server + path, method=method)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            request.add_header("Content-Type", content_type)
        with urllib.request.urlopen(request, data=data, timeout=10, context=self.context) as answer:
            return json.loads(answer.read() or b"{}")

    def get(self, path: str) -> dict:
        return self._call("GET", path)

    def annotate(self, path: str, annotations: dict[str, str]) -> None:
        self._call("PATCH", path, {"metadata": {"annotations": annotations}}, "application/merge-patch+json")


@dataclass
class Contract:
    """Watches for tidal's requests and keeps the contract: `poll()` does one round.

    save(request_time): write a checkpoint (then tidal is told checkpoint-done);
    resize(world): take on a new membership (then this pod acknowledges it);
    cancelled(request_time): a checkpoint request was called off (optional)."""

    save: Callable[[str], None]
    resize: Callable[[World], None] = lambda world: None
    cancelled: Callable[[str], None] = lambda request: None
    leaving: Callable[[World], None] = lambda world: None
    """Called once when this pod's DP replica leaves: it keeps running (stepping, or idle) until
    tidal deletes its pod, which happens once every survivor has acknowledged; leaving earlier
    could break a collective a survivor is still in."""
    source: FileSource | ApiSource | None = None
    client: KubeClient | None = None
    namespace: str = ""
    pod: str = field(default_factory=lambda: os.environ.get("TIDAL_POD_NAME") or os.environ.get("HOSTNAME", ""))
    job: str = field(default_factory=lambda: os.environ.get("TIDAL_JOB", ""))
    dp_rank: int = field(default_factory=lambda: int(os.environ.get("TIDAL_DP_RANK", "0")))
    reports: bool = field(default_factory=lambda: os.environ.get("RANK", "0") == "0")
    """Whether this pod tells tidal checkpoint-done (global rank 0's does)."""
    saved: str = ""
    """The last request this pod saved for (and reported)."""
    acked: int = 0
    """The last generation this pod acknowledged."""

    taken: int = 0
    """The last generation whose resize hook ran (acknowledged once the PATCH succeeds)."""
    saving: str = ""
    """The last request whose save hook ran (reported once the PATCH succeeds)."""

    def __post_init__(self) -> None:
        if not self.namespace:
            ns = os.environ.get("TIDAL_NAMESPACE")
            self.namespace = ns or (SERVICE_ACCOUNT / "namespace").read_text().strip()
        self.source = self.source or FileSource()
        self.client = self.client or KubeClient()

    def poll(self) -> str:
        """One round: "saved", "resized", "cancelled", "leaving" (once: this pod's DP replica
        leaves; keep going until the pod is deleted) or "". A hook runs once per request or
        generation; a failed PATCH after it is retried at the next poll without running it again."""
        seen = self.source.read()
        generation = int(seen["generation"]) if seen["generation"].isdigit() else 0
        if generation > self.acked:
            leaving = _replicas(seen["leaving"])
            world = World(
                generation, int(seen["world-size"] or 0), int(seen["dp"] or 0), leaving, _replicas(seen["joining"])
            )
            if self.dp_rank in leaving:
                self.acked = generation
                self.leaving(world)
                return "leaving"
            if self.taken < generation:
                self.resize(world)
                self.taken = generation
            self.client.annotate(f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}", {WORLD_ACK: str(generation)})
            self.acked = generation
            return "resized"
        request = seen["checkpoint-requested"]
        if request and request != self.saved:
            if seen["checkpoint-cancelled"] == request:
                self.saved = request  # handled: never saved for
                self.cancelled(request)
                return "cancelled"
            if self.saving != request:
                if self._reported(request):
                    self.saved = request  # served before this process started: a lone save would hang
                    return ""
                self.save(request)
                self.saving = request
            if self.reports:
                path = f"/apis/tidal.dev/v1alpha1/namespaces/{self.namespace}/trainingjobs/{self.job}"
                self.client.annotate(path, {CHECKPOINT_DONE: request})
            self.saved = request
            return "saved"
        return ""

    def _reported(self, request: str) -> bool:
        """Whether the job already shows checkpoint-done for `request` (or later). A trainer that
        restarts in a pod that still carries a served request (tidal leaves it in place) must not
        save for it: a checkpoint is collective, and the other ranks are not in it."""
        path = f"/apis/tidal.dev/v1alpha1/namespaces/{self.namespace}/trainingjobs/{self.job}"
        done = ((self.client.get(path).get("metadata") or {}).get("annotations") or {}).get(CHECKPOINT_DONE, "")
        try:
            return bool(done) and _time(done) >= _time(request)
        except ValueError:
            return False

    def run(self, interval_s: float = 1.0, stop: Callable[[], bool] = lambda: False) -> None:
        """poll() every `interval_s` until `stop()` (for a thread beside the training loop)."""
        while not stop():
            self.poll()
            time.sleep(interval_s)


__all__ = ["ApiSource", "Contract", "FileSource", "KubeClient", "World"]
