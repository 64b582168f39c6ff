"""Weight averaging among a job's DP replicas over TCP on 127.0.0.1, standard library only.

Every replica serves on a port it writes to `<peers>/<dp rank>`; in a cluster that would be the
pod's address behind the job's headless Service. The lowest DP rank of the current membership
leads: each round, every member sends it its weights after a local SGD step, and it answers all
of them with the mean once every member has sent, or after `round_timeout_s` with those that did
(a replica that does not answer slows the others down but never stops them, as torchft's quorum
does). The leader also hands a joining replica its latest (step, weights): the state a new DP
replica fetches from its peers on a Live grow-back.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
from pathlib import Path

Weights = list[float]


def _send(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message).encode() + b"\n")


def _receive(sock: socket.socket) -> dict:
    data = b""
    while not data.endswith(b"\n"):
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("peer closed")
        data += chunk
    return json.loads(data)


class Peers:
    def __init__(self, directory: Path, dp_rank: int, round_timeout_s: float = 0.5):
        self.directory, self.dp_rank, self.round_timeout_s = directory, dp_rank, round_timeout_s
        self.directory.mkdir(parents=True, exist_ok=True)
        self.changed = threading.Condition()
        self.sent: dict[int, tuple[Weights, socket.socket]] = {}
        """Members' weights for the round the leader is in, with the connection to answer on."""
        self.latest: tuple[int, Weights] | None = None
        """The leader's (step, weights) after its last round: what a joining replica gets."""
        peers = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                message = _receive(self.request)
                if message.get("join"):
                    with peers.changed:
                        latest = peers.latest
                    _send(self.request, {"step": latest[0], "w": latest[1]} if latest else {"error": "no state yet"})
                    return
                with peers.changed:
                    peers.sent[message["dp_rank"]] = (message["w"], self.request)
                    peers.changed.notify_all()
                    # Answered by the round (`_lead`); the connection stays open until then. A
                    # sender whose leader never leads (it no longer thinks it leads) gives up, and
                    # its weights are taken back so no later round counts them stale.
                    answered = peers.changed.wait_for(lambda: message["dp_rank"] not in peers.sent, timeout=5)
                    if not answered and peers.sent.get(message["dp_rank"], (None, None))[1] is self.request:
                        del peers.sent[message["dp_rank"]]

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        (self.directory / str(dp_rank)).write_text(str(self.server.server_address[1]))

    def _port(self, dp_rank: int) -> int:
        return int((self.directory / str(dp_rank)).read_text())

    def average(self, step: int, weights: Weights, members: list[int]) -> tuple[int, Weights, int]:
        """One round: (step, the members' mean weights, how many took part). The leader's step
        is everyone's, so replicas that answered stay in lockstep with identical weights."""
        leader = min(members)
        if leader == self.dp_rank:
            return self._lead(step, weights, [m for m in members if m != self.dp_rank])
        try:
            with socket.create_connection(("127.0.0.1", self._port(leader)), timeout=2 * self.round_timeout_s + 1) as s:
                _send(s, {"dp_rank": self.dp_rank, "w": weights})
                answer = _receive(s)
            return answer["step"], answer["w"], answer["took_part"]
        except (OSError, ValueError, KeyError):
            return step, weights, 1  # the leader is away (restarting, or its pod is gone): alone this round

    def _lead(self, step: int, weights: Weights, others: list[int]) -> tuple[int, Weights, int]:
        with self.changed:
            self.changed.wait_for(lambda: all(m in self.sent for m in others), timeout=self.round_timeout_s)
            taking_part = [w for rank, (w, _) in self.sent.items() if rank in others]
            mean = [sum(ws) / (1 + len(taking_part)) for ws in zip(weights, *taking_part, strict=True)]
            for _, conn in self.sent.values():
                with contextlib.suppress(OSError):  # the sender gave up on this round
                    _send(conn, {"step": step, "w": mean, "took_part": 1 + len(taking_part)})
            self.sent.clear()
            self.latest = (step, mean)
            self.changed.notify_all()
        return step, mean, 1 + len(taking_part)

    def fetch(self, members: list[int]) -> tuple[int, Weights] | None:
        """A joining replica's state: the leader's latest (step, weights), or None if no member
        answered (then it starts from its own checkpoint, as a restart would)."""
        for rank in sorted(members):
            try:
                with socket.create_connection(("127.0.0.1", self._port(rank)), timeout=5) as s:
                    _send(s, {"join": True})
                    answer = _receive(s)
                if "w" in answer:
                    return answer["step"], answer["w"]
            except (OSError, ValueError):
                continue
        return None

    def close(self) -> None:
        self.server.shutdown()
