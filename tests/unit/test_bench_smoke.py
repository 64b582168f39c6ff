"""CI smoke of `python -m bench.placement --quick`: every section runs and its safety figures hold.

Figures (times, refusals) are for the README, not asserted here; what is asserted cannot depend
on the machine: no split group for planners that keep groups whole, preemption never above the
brute-force minimum on the quick instances.
"""

import pytest
from bench.placement import run_all
from bench.preemption_cap import SETTINGS, SHIPPED
from bench.preemption_cap import run as run_preemption_cap

import tidal.placement.preemption as preemption

pytestmark = pytest.mark.timeout(300)


def test_placement_bench_quick_prints_every_field():
    result = run_all(repeats=20, seed=7, quick=True)
    for field in (
        "churn_refused_jobs",
        "churn_refused_jobs_constrained_first_fit",
        "churn_stranded_gpus",
        "churn_stranded_gpus_constrained_first_fit",
        "preemption_instances",
        "preemption_at_minimum_share",
        "preemption_worst_excess_ratio",
        "plan_gang_p50_ms_100k",
        "preemption_many_small_at_minimum_share",
        "preemption_many_small_worst_excess_ratio",
        "plan_capacity_budget_p50_ms_100k",
    ):
        assert field in result, field
    assert result["churn_split_groups"] == [0]
    for suffix in ("", "_constrained_first_fit"):  # the per-shape breakdown accounts for every refusal
        assert result[f"churn_refused_jobs{suffix}"][0] > 0  # else the next line holds vacuously
        by_shape = [sum(shapes.values()) for shapes in result[f"churn_refused_jobs_by_shape{suffix}"]]
        assert by_shape == result[f"churn_refused_jobs{suffix}"]
    assert result["churn_split_groups_constrained_first_fit"] == [0]
    assert result["preemption_worst_excess_ratio"] == 1.0
    assert result["preemption_many_small_instances"] > 0
    assert result["preemption_many_small_worst_excess_ratio"] == 1.0, "many small victims: the exact minimum"
    assert result["hbd_split_groups"] == 0


def test_preemption_cap_bench_quick_runs_and_puts_the_caps_back():
    result = run_preemption_cap([1], 8)
    assert result["instances"] > 0
    assert (preemption._EXACT_MAX_NODES, preemption._EXACT_MAX_WORK) == SHIPPED
    for name in SETTINGS:
        assert result[f"{name}_worst_ratio"] >= 1.0, "no capped plan below the uncapped search's minimum"
        assert result[f"{name}_max_ms"] >= result[f"{name}_p50_ms"]


def test_defrag_shrinks_bench_quick_runs_and_is_never_worse_with_partial_shrinks():
    # Deterministic instances (seed 7): the partial shrink option saves GPUs in at least one plan,
    # and with the exact search it never costs a plan or GPUs (the README's figure is 40 seeds).
    from bench.defrag_shrinks import compare

    exact = compare([7], 300, exact=True)
    assert exact["fewer_gpus"] >= 1 and exact["gpus_moved"] < exact["gpus_moved_without_partial"]
    assert exact["more_gpus"] == 0 and exact["found_only_without_partial"] == 0
    greedy = compare([7], 40, exact=False)
    assert greedy["blocked"] > 0 and greedy["plans"] > 0
    from bench.defrag_shrinks import option_seconds

    _, options = option_seconds(64)
    assert options == 8, "one option per rack the gang holds (clearing it gains the whole rack)"


def test_quota_eviction_bench_quick_never_evicts_more_than_kueues_order():
    from bench.quota_eviction import run as run_quota_eviction

    result = run_quota_eviction([1], 50)
    (row,) = result["seeds"]
    assert row["tidal_more"] == 0, "the exact cover never takes more GPUs than Kueue's order"
    assert row["tidal_fewer"] + row["same"] == row["instances"] == 50
    assert [c["shortfall"] for c in result["cost"]] == [64, 512, 2048, 8192]
