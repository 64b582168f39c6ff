"""Which of a namespace's lower-priority jobs go so that a job fits the namespace's quota
(placement/quota_eviction.py): the fewest GPUs that cover the shortfall, then the fewest victims,
then the lowest priorities; elastic gangs give back their top replicas rather than go whole."""

from __future__ import annotations

import itertools
import random

from tidal.placement import quota_eviction
from tidal.placement.preemption import RunningGang
from tidal.placement.quota_eviction import plan_quota_eviction


def gang(name: str, priority: int, *replica_gpus: int, min_replicas: int | None = None) -> RunningGang:
    replicas = tuple(((f"{name}-n{i}", gpus),) for i, gpus in enumerate(replica_gpus))
    return RunningGang(name, priority, True, replicas, min_replicas)


def test_nothing_short_evicts_nothing_and_too_little_is_none():
    gangs = [gang("a", 0, 8), gang("b", 0, 8)]
    assert plan_quota_eviction(gangs, 0) == ()
    assert plan_quota_eviction(gangs, 17) is None, "16 GPUs in all cannot cover 17"


def test_the_fewest_gpus_win_over_the_lowest_priority():
    """32 short: the 32-GPU job of priority 5 goes, not the 64-GPU job of priority 0."""
    plan = plan_quota_eviction([gang("big", 0, 64), gang("fit", 5, 32)], 32)
    assert [e.gang for e in plan] == ["fit"]
    plan = plan_quota_eviction([gang("big", 0, 64), gang("a", 0, 8), gang("b", 0, 8)], 16)
    assert sorted(e.gang for e in plan) == ["a", "b"], "16 GPUs of two jobs rather than 64 of one"


def test_fewer_victims_win_at_equal_gpus_then_lower_priorities():
    plan = plan_quota_eviction([gang("one", 3, 16), gang("a", 0, 8), gang("b", 0, 8)], 16)
    assert [e.gang for e in plan] == ["one"], "one victim of 16 rather than two of 8"
    plan = plan_quota_eviction([gang("hi", 3, 16), gang("lo", 1, 16)], 16)
    assert [e.gang for e in plan] == ["lo"]


def test_an_elastic_gang_gives_back_its_top_replicas_down_to_its_minimum():
    plan = plan_quota_eviction([gang("e", 0, 16, 16, 16, 16, min_replicas=2)], 20)
    assert len(plan) == 1 and (plan[0].replicas, plan[0].whole, plan[0].gpus) == ((2, 3), False, 32)
    plan = plan_quota_eviction([gang("e", 0, 16, 16, 16, 16, min_replicas=2)], 40)
    assert plan[0].whole and plan[0].gpus == 64, "below its minimum: the whole job"


def _brute_force(gangs: list[RunningGang], shortfall: int) -> tuple | None:
    options = []
    for g in gangs:
        n = len(g.replicas)
        levels = [0, n]
        if g.min_replicas is not None:
            levels += list(range(1, n - g.min_replicas + 1))
        options.append(sorted(set(levels)))
    best = None
    for levels in itertools.product(*options):
        gpus = sum(
            sum(gpus for replica in g.replicas[len(g.replicas) - level :] for _, gpus in replica)
            for g, level in zip(gangs, levels, strict=True)
        )
        if gpus < shortfall:
            continue
        chosen = [g for g, level in zip(gangs, levels, strict=True) if level]
        key = (gpus, len(chosen), tuple(sorted((g.priority for g in chosen), reverse=True)))
        best = key if best is None or key < best else best
    return best


def test_exact_against_brute_force_on_random_namespaces():
    rng = random.Random(5)
    for _ in range(400):
        gangs = []
        for i in range(rng.randint(1, 6)):
            replicas = [rng.choice([4, 8, 16, 32])] * rng.randint(1, 4)
            elastic = rng.random() < 0.5 and len(replicas) > 1
            gangs.append(gang(f"g{i}", rng.randint(0, 3), *replicas, min_replicas=1 if elastic else None))
        shortfall = rng.randint(1, sum(g.gpus for g in gangs) + 8)
        plan = plan_quota_eviction(gangs, shortfall)
        expected = _brute_force(gangs, shortfall)
        if expected is None:
            assert plan is None
            continue
        priority = {g.name: g.priority for g in gangs}
        got = (
            sum(e.gpus for e in plan),
            len(plan),
            tuple(sorted((priority[e.gang] for e in plan), reverse=True)),
        )
        assert got == expected, (gangs, shortfall, plan)
        assert len({e.gang for e in plan}) == len(plan)


def test_the_greedy_above_the_exact_bound_covers_with_whole_gangs_dropped_and_shrunk(monkeypatch):
    """Past EXACT_MAX_WORK: every plan covers the shortfall with distinct victims (None only when
    all of them would not), and drops or shrinks what the cover does not need."""
    monkeypatch.setattr(quota_eviction, "EXACT_MAX_WORK", 0)
    plan = plan_quota_eviction([gang("lo", 0, 64), gang("hi", 5, 8)], 8)
    assert [(e.gang, e.gpus) for e in plan] == [("lo", 64)], "lowest priority first, even when larger"
    plan = plan_quota_eviction([gang("a", 0, 8), gang("b", 0, 64)], 8)
    assert [(e.gang, e.gpus) for e in plan] == [("b", 64)], "largest first at equal priority"
    plan = plan_quota_eviction([gang("e", 0, 16, 16, 16, 16, min_replicas=1), gang("f", 1, 64)], 20)
    assert [(e.gang, e.gpus, e.whole) for e in plan] == [("e", 32, False)], "shrunk to what still covers"
    rng = random.Random(9)
    for _ in range(300):
        gangs = [
            gang(f"g{i}", rng.randint(0, 3), *[rng.choice([1, 3, 8])] * rng.randint(1, 3), min_replicas=1)
            for i in range(rng.randint(1, 6))
        ]
        shortfall = rng.randint(1, sum(g.gpus for g in gangs) + 4)
        plan = plan_quota_eviction(gangs, shortfall)
        if shortfall > sum(g.gpus for g in gangs):
            assert plan is None
            continue
        assert plan and sum(e.gpus for e in plan) >= shortfall
        assert len({e.gang for e in plan}) == len(plan)
        for dropped in range(len(plan)):
            rest = sum(e.gpus for i, e in enumerate(plan) if i != dropped)
            assert rest < shortfall, "every victim kept is needed"
