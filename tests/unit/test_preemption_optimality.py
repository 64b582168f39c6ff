"""plan_preemption against brute force on seeded random small clusters.

Brute force (`bench.preemption.brute_force`, the oracle the benchmark reports against)
enumerates every combination of options (untouched, shrink by the top 1..K replicas of an elastic
gang, suspend whole) and counts room node by node, without the planner's code.
The planner must evict the fewest GPUs on every instance (its exact search covers such small
candidate sets), and its heuristic alone must stay close, so a broken heuristic rule
shows up here as well as in the targeted tests of test_preemption.py.
"""

from __future__ import annotations

import random

import pytest
from bench.preemption import brute_force, random_instance
from bench.preemption_cap import SHIPPED, instances
from bench.preemption_small import instances as many_small_instances
from bench.preemption_small import milp_minimum

import tidal.placement.preemption as preemption
from tidal.placement import PreemptionPlan, Unplaceable, plan_gang, plan_preemption

from .test_placement_properties import check_plan


def check_placement_after_evictions(snap, req, running, result: PreemptionPlan) -> None:
    """The plan's placement is valid on the snapshot with its victims' GPUs given back."""
    scratch = snap.copy()
    by_name = {g.name: g for g in running}
    for e in result.evictions:
        for r in e.replicas:
            for node, gpus in by_name[e.gang].replicas[r]:
                scratch.release(node, gpus)
    check_plan(scratch, req, result.placement)


def compare(count: int, seed: int) -> tuple[list[float], int, int]:
    """Evicted / minimum per instance that needs evictions; instances where it found none wrongly; and
    instances at the fewest GPUs but not the fewest victims."""
    rng = random.Random(seed)
    ratios: list[float] = []
    missed = more_victims = 0
    while len(ratios) + missed < count:
        snap, req, running = random_instance(rng)
        if not isinstance(plan_gang(snap, req), Unplaceable):
            continue
        before = {n: v.allocated for n, v in snap.nodes.items()}
        minimum = brute_force(snap, req, running)
        result = plan_preemption(snap, req, running)
        assert {n: v.allocated for n, v in snap.nodes.items()} == before, "plan_preemption mutated the snapshot"
        if minimum is None:
            assert isinstance(result, Unplaceable), "evicted although nothing makes room"
            continue
        if not isinstance(result, PreemptionPlan):
            missed += 1
            continue
        check_placement_after_evictions(snap, req, running, result)
        ratios.append(result.evicted_gpus / minimum[0])
        more_victims += result.evicted_gpus == minimum[0] and len(result.evictions) > minimum[1]
    return ratios, missed, more_victims


def test_exact_minimum_on_200_seeded_instances():
    ratios, missed, more_victims = compare(200, seed=11)
    assert missed == 0
    assert all(r == 1.0 for r in ratios), f"{sum(r > 1 for r in ratios)} of {len(ratios)} above the minimum"
    assert more_victims == 0, "fewest victims among the cheapest plans"


def heuristic_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The path of a large cluster whose victims span nodes: no branch and bound, no node DP."""
    monkeypatch.setattr(preemption, "_EXACT_MAX_GANGS", -1)
    monkeypatch.setattr(preemption, "single_node", lambda search, relevant: False)


def test_heuristic_alone_stays_close_to_the_minimum(monkeypatch: pytest.MonkeyPatch):
    heuristic_only(monkeypatch)
    ratios, missed, _ = compare(200, seed=11)
    assert missed == 0
    at_minimum = sum(r == 1.0 for r in ratios) / len(ratios)
    assert at_minimum >= 0.95, f"at the minimum in {at_minimum:.0%}"
    assert max(ratios) <= 1.5


def pooled_heuristic(monkeypatch: pytest.MonkeyPatch, everyone: bool) -> list[float]:
    """Evicted / minimum of the heuristic alone over seeds 1-5 (1,000 instances), its improvement
    pass drawing replacements from every candidate or, as on large clusters, from neighbours."""
    heuristic_only(monkeypatch)
    if not everyone:
        monkeypatch.setattr(preemption, "_IMPROVE_EVERYONE_GANGS", -1)
    ratios: list[float] = []
    for seed in range(1, 6):
        seed_ratios, missed, _ = compare(200, seed=seed)
        assert missed == 0
        ratios += seed_ratios
    return ratios


def test_the_improvement_pass_brings_the_heuristic_to_the_minimum_almost_always(monkeypatch: pytest.MonkeyPatch):
    # Seeded, so exact figures: at the minimum in 99.6% (worst 1.5x); without the improvement pass
    # (_IMPROVE_ATTEMPTS* = 0) in 95.0% (worst 3.5x), which the single-seed test above, at the
    # issue's 95% target, lets through.
    ratios = pooled_heuristic(monkeypatch, everyone=True)
    at_minimum = sum(r == 1.0 for r in ratios) / len(ratios)
    assert at_minimum >= 0.98, f"at the minimum in {at_minimum:.1%}"
    assert max(ratios) <= 1.5


def test_the_improvement_pass_from_neighbours_alone_still_lifts_the_heuristic(monkeypatch: pytest.MonkeyPatch):
    # The path above 100 candidates: 98.1% at the minimum (worst 1.6x); with no attempts from
    # neighbours (_IMPROVE_ATTEMPTS_NEIGHBOURS = 0) 95.0% (worst 3.5x).
    ratios = pooled_heuristic(monkeypatch, everyone=False)
    at_minimum = sum(r == 1.0 for r in ratios) / len(ratios)
    assert at_minimum >= 0.97, f"at the minimum in {at_minimum:.1%}"
    assert max(ratios) <= 2.0


@pytest.mark.parametrize(("index", "cap"), [(65, "nodes"), (90, "nodes"), (54, "work")])
def test_the_shipped_search_caps_reach_the_minimum_where_a_quarter_of_one_stops_short(
    monkeypatch: pytest.MonkeyPatch, index: int, cap: str
):
    # Medium instances of bench.preemption_cap (seed 1) on which one cap as it was before the 4x
    # raise (5,000 search nodes, or 50,000 node updates) stopped at a plan above the minimum; the
    # shipped caps find the minimum. The uncapped search is the reference. Reverting either raise
    # turns this red.
    snap, request, running = instances([1], 150)[index]

    def evicted(nodes: int, work: int) -> int:
        monkeypatch.setattr(preemption, "_EXACT_MAX_NODES", nodes)
        monkeypatch.setattr(preemption, "_EXACT_MAX_WORK", work)
        plan = plan_preemption(snap, request, running)
        assert isinstance(plan, PreemptionPlan)
        return plan.evicted_gpus

    minimum = evicted(10**9, 10**12)
    shipped = evicted(SHIPPED[0], SHIPPED[1])
    quarter = evicted(SHIPPED[0] // 4, SHIPPED[1]) if cap == "nodes" else evicted(SHIPPED[0], SHIPPED[1] // 4)
    assert quarter > minimum, "the instance no longer needs that raised cap: pick another"
    assert shipped == minimum


def many_small_ratios(count: int, seed: int) -> tuple[list[float], int]:
    """Evicted / the MILP's minimum on bench.preemption_small's family (every gang on one node,
    15-200 candidates), and the instances at the fewest GPUs but not the fewest victims."""
    ratios: list[float] = []
    more_victims = 0
    for snap, req, running in many_small_instances(count, seed):
        minimum = milp_minimum(snap, req, running)
        result = plan_preemption(snap, req, running)
        if minimum is None:
            assert isinstance(result, Unplaceable), "evicted although nothing makes room"
            continue
        assert isinstance(result, PreemptionPlan)
        check_placement_after_evictions(snap, req, running, result)
        ratios.append(result.evicted_gpus / minimum[0])
        more_victims += result.evicted_gpus == minimum[0] and len(result.evictions) > minimum[1]
    return ratios, more_victims


def test_many_small_victims_get_the_exact_minimum():
    # The node/supernode DP (preemption_dp) on every instance; before it the greedy decided past 40
    # candidates: 62.8% at the minimum on 200 instances of seed 7, worst 3.0x (bench.preemption_small).
    ratios, more_victims = many_small_ratios(80, seed=7)
    assert len(ratios) >= 75
    assert all(r == 1.0 for r in ratios), f"{sum(r > 1 for r in ratios)} of {len(ratios)} above the minimum"
    assert more_victims == 0, "fewest victims among the cheapest plans"


def test_the_many_small_family_is_one_the_heuristic_alone_misses(monkeypatch: pytest.MonkeyPatch):
    # The family above is hard: without the DP the same instances are not all at the minimum, so
    # the test above cannot pass by the family being easy.
    monkeypatch.setattr(preemption, "single_node", lambda search, relevant: False)
    ratios, _ = many_small_ratios(80, seed=7)
    assert sum(r > 1 for r in ratios) >= 10
