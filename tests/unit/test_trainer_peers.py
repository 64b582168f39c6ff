"""The example trainer's weight averaging (examples/trainer/peers.py) over real sockets on
127.0.0.1, threads standing in for replicas: a round leaves every member that took part with the
same weights, a member that does not answer delays a round but never stops it, and a joining
replica gets the leader's latest state."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "trainer"))
from peers import Peers


@pytest.fixture
def replicas(tmp_path: Path):
    made = [Peers(tmp_path, rank, round_timeout_s=0.3) for rank in range(3)]
    yield made
    for peers in made:
        peers.close()


def one_round(replicas: list[Peers], weights: list[list[float]], members: list[int], step: int) -> list:
    results: list = [None] * len(weights)

    def run(i: int) -> None:
        results[i] = replicas[i].average(step, weights[i], members)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(weights))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    return results


def test_a_round_gives_every_member_the_mean_and_the_leaders_step(replicas):
    results = one_round(replicas, [[0.0, 3.0], [3.0, 6.0], [6.0, 0.0]], [0, 1, 2], step=7)
    assert results == [(7, [3.0, 3.0], 3)] * 3


def test_a_member_that_does_not_answer_delays_the_round_only(replicas):
    # Replica 2 is a member but sends nothing (its trainer hangs): 0 and 1 average without it.
    results = one_round(replicas[:2], [[1.0], [3.0]], [0, 1, 2], step=1)
    assert results == [(1, [2.0], 2), (1, [2.0], 2)]


def test_a_leaving_replicas_weights_are_not_counted(replicas):
    # After a shrink to [0, 1], replica 2 (leaving, still stepping) sends but is not averaged in.
    results = one_round(replicas, [[0.0], [2.0], [100.0]], [0, 1], step=4)
    assert results[:2] == [(4, [1.0], 2), (4, [1.0], 2)]


def test_weights_sent_for_another_step_are_not_averaged_in_and_their_sender_takes_the_rounds(replicas):
    # Replica 2 fell behind (it stepped alone, or restarted from an older checkpoint): step 3.
    results: list = [None] * 3

    def run(i: int, step: int, w: float) -> None:
        results[i] = replicas[i].average(step, [w], [0, 1, 2])

    threads = [threading.Thread(target=run, args=a) for a in ((0, 5, 0.0), (1, 5, 2.0), (2, 3, 100.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert results[:2] == [(5, [1.0], 2), (5, [1.0], 2)]
    assert results[2] == (5, [1.0], 2), "it takes on the round's mean and step"


def test_a_joining_replica_fetches_the_leaders_latest_state(replicas):
    one_round(replicas[:2], [[1.0, 2.0], [3.0, 4.0]], [0, 1], step=9)
    assert replicas[2].fetch([0, 1]) == (9, [2.0, 3.0])


def test_nothing_to_fetch_before_the_first_round(replicas):
    assert replicas[2].fetch([0]) is None
