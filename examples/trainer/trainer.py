"""A toy data-parallel trainer that keeps tidal's contract through tidal_workload: one process per pod.

Each DP replica fits a linear model to its own shard of data by SGD, and the replicas average
their weights every step over sockets (peers.py: the lowest DP rank leads each round). The
contract: on a checkpoint request it saves (step, weights) to <state>/checkpoint; it starts from
that checkpoint when it finds one; on a new membership it averages with the new members from then
on, and a replica that joins (a Live grow-back) first fetches the others' (step, weights); it
stops when its pod is deleted (its DP replica left once the survivors answered, or the job was
evicted). Every event goes to <state>/log.jsonl, one JSON object a line, a "step" line each step.

In a pod it reads /etc/tidal/world and its service account; outside one
(tests/cluster/test_workload_trainer.py), --server/--token-file/--ca read the pod's annotations
through the API server as its downward API volume would show them.

    python examples/trainer/trainer.py --state /tmp/rank0 --peers /tmp/peers --dp 3 [--namespace NS
        --pod POD --job JOB --dp-rank N --rank N --server URL --token-file F --ca F]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import urllib.error
from pathlib import Path

from peers import Peers, Weights

from tidal_workload import ApiSource, Contract, FileSource, KubeClient, World

TRUE_WEIGHTS = [1.0, -2.0, 3.0, 0.5]
LEARNING_RATE = 0.05
BATCH = 8


def shard(dp_rank: int, size: int = 256) -> list[tuple[list[float], float]]:
    """This replica's data: its own samples of y = x . TRUE_WEIGHTS."""
    rng = random.Random(dp_rank)
    samples = []
    for _ in range(size):
        x = [rng.uniform(-1, 1) for _ in TRUE_WEIGHTS]
        samples.append((x, sum(a * b for a, b in zip(x, TRUE_WEIGHTS, strict=True))))
    return samples


def sgd_step(weights: Weights, data: list[tuple[list[float], float]], step: int) -> tuple[Weights, float]:
    """One minibatch step of least squares: (new weights, the batch's loss before it)."""
    batch = [data[(step * BATCH + i) % len(data)] for i in range(BATCH)]
    grad, loss = [0.0] * len(weights), 0.0
    for x, y in batch:
        error = sum(w * a for w, a in zip(weights, x, strict=True)) - y
        loss += error * error / len(batch)
        for i, a in enumerate(x):
            grad[i] += 2 * error * a / len(batch)
    return [w - LEARNING_RATE * g for w, g in zip(weights, grad, strict=True)], loss


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", type=Path, required=True)
    parser.add_argument("--peers", type=Path, required=True, help="where each replica writes its port")
    parser.add_argument("--dp", type=int, default=int(os.environ.get("TIDAL_DP", "1")), help="DP at start")
    parser.add_argument("--namespace", default=os.environ.get("TIDAL_NAMESPACE", ""))
    parser.add_argument("--pod", default=os.environ.get("HOSTNAME", ""))
    parser.add_argument("--job", default=os.environ.get("TIDAL_JOB", ""))
    parser.add_argument("--dp-rank", type=int, default=int(os.environ.get("TIDAL_DP_RANK", "0")))
    parser.add_argument("--rank", type=int, default=int(os.environ.get("RANK", "0")))
    parser.add_argument("--server")
    parser.add_argument("--token-file")
    parser.add_argument("--ca")
    parser.add_argument("--step-seconds", type=float, default=0.2)
    args = parser.parse_args()
    args.state.mkdir(parents=True, exist_ok=True)
    checkpoint, log = args.state / "checkpoint", args.state / "log.jsonl"
    saved = json.loads(checkpoint.read_text()) if checkpoint.exists() else {"step": 0, "w": [0.0] * len(TRUE_WEIGHTS)}
    step, weights = saved["step"], saved["w"]
    members = list(range(args.dp))
    data = shard(args.dp_rank)
    peers = Peers(args.peers, args.dp_rank)

    def record(**what: object) -> None:
        with log.open("a") as out:
            out.write(json.dumps({"step": step, **what}) + "\n")

    def save(request: str) -> None:
        checkpoint.write_text(json.dumps({"step": step, "w": weights}))
        record(event="saved", request=request, w=weights)

    def resize(world: World) -> None:
        nonlocal members, step, weights
        # tidal's DP replicas are numbered 0..dp-1: a shrink gives back the highest.
        members = [r for r in range(world.dp + len(world.leaving)) if r not in world.leaving][: world.dp]
        record(event="resized", generation=world.generation, dp=world.dp, leaving=list(world.leaving), w=weights)
        if args.dp_rank in world.joining:
            fetched = peers.fetch([r for r in members if r not in world.joining])
            if fetched is not None:
                step, weights = fetched
                record(event="joined", generation=world.generation, w=weights)
                step += 1  # the fetched state is the one after that step

    if args.server:
        client = KubeClient(args.server, Path(args.token_file).read_text().strip(), args.ca)
        source = ApiSource(client, args.namespace, args.pod)
    else:
        client, source = KubeClient(), FileSource()
    contract = Contract(
        save=save,
        resize=resize,
        cancelled=lambda request: record(event="cancelled", request=request),
        source=source,
        client=client,
        namespace=args.namespace,
        pod=args.pod,
        job=args.job,
        dp_rank=args.dp_rank,
        reports=args.rank == 0,
    )
    record(event="started", w=weights)
    while True:
        outcome = ""
        try:
            outcome = contract.poll()
        except urllib.error.HTTPError as e:
            if e.code == 404:  # its pod is gone (a leaving replica, or after a checkpoint): done
                record(event="stopped", why="pod deleted")
                peers.close()
                return 0
            record(event="error", why=str(e))  # e.g. 403 without the Role, a 5xx: tried again
        except OSError as e:
            record(event="error", why=str(e))
        if outcome == "leaving":
            record(event="leaving")  # keeps stepping until tidal deletes its pod
        local, loss = sgd_step(weights, data, step)
        at = step
        step, weights, took_part = peers.average(step, local, members)
        # `local`: this replica's own SGD step from the weights it had, before averaging.
        record(event="step", w=weights, local=local, local_step=at, loss=loss, took_part=took_part)
        step += 1
        time.sleep(args.step_seconds)


if __name__ == "__main__":
    sys.exit(main())
