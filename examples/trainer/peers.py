"""Weight averaging among a job's DP replicas over TCP on 127.0.0.1, standard library only.

Every replica serves on a port it writes to `<peers>/<dp rank>` (replicas in separate pods
would need each other's addresses instead, e.g. behind the job's headless Service). The
lowest DP rank of the current membership leads: each round, every member sends it its weights
after a local SGD step, and it answers all of them with the mean once every member has sent,
or after `round_timeout_s` with those that did (a member that does not answer delays a round by
that timeout, as a replica left out of torchft's quorum does; if the leader does not answer,
each member steps alone after ANSWER_WAIT_S). Weights sent for another step than the leader's
are not averaged in: their sender takes on the round's mean and step. The leader also hands a
joining replica its latest (step, weights): the state a new DP replica fetches from its peers
on a Live grow-back. All on 127.0.0.1: the example runs its replicas on one machine.
"""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
from pathlib import Path

Weights = list[float]
ANSWER_WAIT_S = 10.0
"""How long a member waits for the leader's answer before it steps alone (the leader's own
training loop, with its API calls, sits between two rounds)."""


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
        self.sent: dict[int, tuple[int, Weights, socket.socket]] = {}
        """What each member sent and is waiting on an answer for: (its step, weights, connection)."""
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
                rank = message["dp_rank"]
                with peers.changed:
                    peers.sent[rank] = (message["step"], message["w"], self.request)
                    peers.changed.notify_all()
                    # Answered by a round (`_lead`); the connection stays open until then. If no
                    # round comes (this replica no longer leads), the entry is taken back so no
                    # later round answers a sender that has gone on alone.
                    if not peers.changed.wait_for(
                        lambda: peers.sent.get(rank, (0, 0, None))[2] is not self.request, timeout=ANSWER_WAIT_S
                    ):
                        del peers.sent[rank]

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        (self.directory / str(dp_rank)).write_text(str(self.server.server_address[1]))

    def _port(self, dp_rank: int) -> int:
        return int((self.directory / str(dp_rank)).read_text())

    def average(self, step: int, weights: Weights, members: list[int]) -> tuple[int, Weights, int]:
        """One round: (step, the mean weights of the members that took part, how many did). The
        leader's step is everyone's, so the replicas that took part leave the round in lockstep
        with identical weights."""
        leader = min(members)
        if leader == self.dp_rank:
            return self._lead(step, weights, [m for m in members if m != self.dp_rank])
        try:
            with socket.create_connection(("127.0.0.1", self._port(leader)), timeout=ANSWER_WAIT_S + 1) as s:
                _send(s, {"dp_rank": self.dp_rank, "step": step, "w": weights})
                answer = _receive(s)
            return answer["step"], answer["w"], answer["took_part"]
        except (OSError, ValueError, KeyError):
            return step, weights, 1  # the leader is away (restarting, or its pod is gone): alone this round

    def _lead(self, step: int, weights: Weights, others: list[int]) -> tuple[int, Weights, int]:
        """Weights sent for another step (a member that fell behind, or one that restarted from
        an older checkpoint) are not averaged in: that member is answered with the round's mean and
        step, and takes them on."""
        with self.changed:
            self.changed.wait_for(
                lambda: all(self.sent.get(m, (None,))[0] == step for m in others), timeout=self.round_timeout_s
            )
            taking_part = [w for rank, (at, w, _) in self.sent.items() if rank in others and at == step]
            mean = [sum(ws) / (1 + len(taking_part)) for ws in zip(weights, *taking_part, strict=True)]
            for _, _, conn in self.sent.values():
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
