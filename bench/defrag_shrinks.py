"""What giving back only the replicas a group needs is worth to defragmentation.

    python -m bench.defrag_shrinks [--json] [--seeds 0 1 ...] [--count 300]

On the unit tests' fragmented clusters (`tests/unit/test_defrag.py` `fragmented`: 3-6 NVL72 racks,
30-75% held by small, mostly elastic gangs, a request for 36-72-GPU groups, a budget in a third of
them), the defragmenter is run twice on each cluster the request is blocked on: with every option
it has, and without the partial shrinks (an elastic gang giving back the fewest top replicas that
give the request a group on a supernode, short of clearing it off that supernode), with the exact
search (up to 24 options) and with the greedy alone. Printed: plans found, plans moving fewer /
more GPUs at the same number of moves, moves changed, GPUs moved in all on the clusters both
solve, plans found only one way. Then the CPU time to build the options of one elastic gang of
64 to 1,024 one-group replicas (8 per NVL72 rack) for a whole-rack request: every blocked gang the
queue tries pays it.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from tests.unit.test_defrag import fragmented

from tidal.placement import GangRequest, PlacementPlan, RunningGang, apply_plan, defrag, plan_gang
from tidal.placement.defrag import MovableGang, is_fragmentation_blocked, plan_defrag
from tidal.topology import build_fleet, snapshot_from_fleet


@contextmanager
def _search(exact: bool, partial: bool) -> Iterator[None]:
    saved = defrag.EXACT_MAX_OPTIONS, defrag.PARTIAL_SHRINKS
    defrag.EXACT_MAX_OPTIONS = saved[0] if exact else 0
    defrag.PARTIAL_SHRINKS = partial
    try:
        yield
    finally:
        defrag.EXACT_MAX_OPTIONS, defrag.PARTIAL_SHRINKS = saved


def _plans(seeds: list[int], count: int) -> list[tuple[int, int] | None]:
    out: list[tuple[int, int] | None] = []
    for seed in seeds:
        rng = random.Random(seed)
        for _ in range(count):
            snap, running, request, budget = fragmented(rng)
            if is_fragmentation_blocked(snap, request) is None:
                continue
            plan = plan_defrag(snap, request, running, budget)
            out.append(None if plan is None else (len(plan.moves), plan.moved_gpus))
    return out


def compare(seeds: list[int], count: int, exact: bool) -> dict[str, int]:
    with _search(exact, partial=True):
        new = _plans(seeds, count)
    with _search(exact, partial=False):
        old = _plans(seeds, count)
    both = [(a, b) for a, b in zip(old, new, strict=True) if a and b]
    return {
        "blocked": len(new),
        "plans_without_partial": sum(1 for a in old if a),
        "plans": sum(1 for b in new if b),
        "fewer_gpus": sum(1 for a, b in both if a[0] == b[0] and b[1] < a[1]),
        "more_gpus": sum(1 for a, b in both if a[0] == b[0] and b[1] > a[1]),
        "moves_changed": sum(1 for a, b in both if a[0] != b[0]),
        "gpus_moved_without_partial": sum(a[1] for a, _ in both),
        "gpus_moved": sum(b[1] for _, b in both),
        "found_only_with_partial": sum(1 for a, b in zip(old, new, strict=True) if b and not a),
        "found_only_without_partial": sum(1 for a, b in zip(old, new, strict=True) if a and not b),
    }


def option_seconds(replicas: int) -> tuple[float, int]:
    """(CPU seconds, options) to build the defragmenter's options for one elastic gang."""
    snap = snapshot_from_fleet(build_fleet("nvl72", replicas // 8 + 1))
    racks = sorted(snap.supernodes)
    held = []
    for r in range(replicas):
        plan = plan_gang(snap, GangRequest(f"el-{r}", 1, 8, 4, prefer_supernodes=(racks[r // 8],)))
        assert isinstance(plan, PlacementPlan)
        apply_plan(snap, plan)
        held.append(tuple(sorted(Counter({n: 4 for g in plan.groups for n in g.nodes}).items())))
    gang = MovableGang(RunningGang("el", 0, True, tuple(held), 1), GangRequest("el", replicas, 8, 4))
    started = time.process_time()
    planner = defrag._Planner(snap, GangRequest("big", 1, 72, 4, priority=1), [gang], None, 0)
    return time.process_time() - started, len(planner.options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(40)))
    parser.add_argument("--count", type=int, default=300, help="clusters drawn per seed")
    parser.add_argument("--replicas", type=int, nargs="+", default=[64, 256, 1024])
    args = parser.parse_args()
    result: dict[str, object] = {
        "seeds": args.seeds,
        "count": args.count,
        "exact": compare(args.seeds, args.count, exact=True),
        "greedy_alone": compare(args.seeds, args.count, exact=False),
        "option_seconds": {n: round(option_seconds(n)[0], 4) for n in args.replicas},
    }
    if args.json:
        print(json.dumps(result))
        return
    exact, greedy = result["exact"], result["greedy_alone"]
    assert isinstance(exact, dict) and isinstance(greedy, dict)
    print(f"{'':28}" + "".join(f"{k:>14}" for k in ("exact", "greedy alone")))
    for field in exact:
        print(f"{field:28}{exact[field]:>14}{greedy[field]:>14}")
    print(f"\n{'replicas':>10}{'CPU s to build the options':>30}")
    for n, seconds in dict(result["option_seconds"]).items():  # type: ignore[call-overload]
        print(f"{n:>10}{seconds:>30}")


if __name__ == "__main__":
    main()
