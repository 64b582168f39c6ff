"""A toy trainer that keeps tidal's contract through tidal_workload: one process per pod.

It counts steps, saves its step to <state>/checkpoint on a checkpoint request, starts from that
step when it finds one, takes on a new membership when told (and says so), and stops when its
pod is deleted (its DP replica left once the survivors answered, or the job was evicted). In a
pod it reads /etc/tidal/world and its service account; outside one
(tests/cluster/test_workload_trainer.py), --server/--token-file/--ca read the pod's
annotations through the API server as its downward API volume would show them.

    python examples/trainer/trainer.py --state /tmp/rank0 [--namespace NS --pod POD --job JOB
        --dp-rank N --rank N --server URL --token-file F --ca F]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
from pathlib import Path

from tidal_workload import ApiSource, Contract, FileSource, KubeClient, World


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--state", type=Path, required=True)
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
    step = int(checkpoint.read_text()) if checkpoint.exists() else 0

    def record(**what: object) -> None:
        with log.open("a") as out:
            out.write(json.dumps({"step": step, **what}) + "\n")

    def save(request: str) -> None:
        checkpoint.write_text(str(step))
        record(event="saved", request=request)

    def resize(world: World) -> None:
        record(event="resized", generation=world.generation, dp=world.dp, leaving=list(world.leaving))

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
    record(event="started")
    while True:
        outcome = ""
        try:
            outcome = contract.poll()
        except urllib.error.HTTPError as e:
            if e.code == 404:  # its pod is gone (a leaving replica, or after a checkpoint): done
                record(event="stopped", why="pod deleted")
                return 0
            record(event="error", why=str(e))  # e.g. 403 without the Role, a 5xx: tried again
        except OSError as e:
            record(event="error", why=str(e))
        if outcome == "leaving":
            record(event="leaving")  # keeps stepping until tidal deletes its pod
        step += 1
        time.sleep(args.step_seconds)


if __name__ == "__main__":
    sys.exit(main())
