"""The churn benchmark's refusal accounting: the per-shape breakdown counts the same jobs as the
total, and only those that arrived after the warm-up cut."""

from __future__ import annotations

import pytest
from bench.churn import run_churn

from tidal.placement.workload_mix import TRAINING_MIX

SHAPE_KEYS = {f"{shape.groups}x{shape.group_gpus}" for shape in TRAINING_MIX}


def _gpus(by_shape: dict[str, int]) -> int:
    total = 0
    for key, jobs in by_shape.items():
        groups, group_gpus = key.split("x")
        total += int(groups) * int(group_gpus) * jobs
    return total


def test_refusals_by_shape_account_for_every_refused_job_and_gpu_after_the_warm_up():
    # Overloaded and impatient, so jobs are refused before the cut as well as after it (~0.2 s).
    measured = run_churn("tidal", 1, 2_592, 600, 1.5, patience=600.0, warmup=0.5)
    everything = run_churn("tidal", 1, 2_592, 600, 1.5, patience=600.0, warmup=0.0)
    assert everything["refused_jobs"] > measured["refused_jobs"] > 0  # the cut matters here
    for result in (measured, everything):
        by_shape = result["refused_jobs_by_shape"]
        assert len(by_shape) >= 2, by_shape  # keys of different shapes must not collapse
        assert set(by_shape) <= SHAPE_KEYS, by_shape  # groups x GPUs per group, in that order
        assert sum(by_shape.values()) == result["refused_jobs"]
        assert _gpus(by_shape) == result["refused_gpus"]


def test_without_a_queue_an_arrival_that_does_not_fit_is_refused_at_once():
    queued = run_churn("best_fit", 1, 2_592, 600, 1.5, patience=6 * 3600.0, warmup=0.0)
    at_once = run_churn("best_fit", 1, 2_592, 600, 1.5, patience=6 * 3600.0, warmup=0.0, queue_jobs=False)
    assert at_once["left_in_queue"] == 0, "nothing waits without a queue"
    assert at_once["refused_jobs"] > queued["refused_jobs"] > 0, "a job that would have waited is refused"
    assert sum(at_once["refused_jobs_by_shape"].values()) == at_once["refused_jobs"]


def test_regimes_hold_per_seed_refusals_of_each_planner_in_both_regimes():
    from bench.churn import REGIME_PLANNERS, regimes, run

    flat = run([1, 2], 2_592, 300, 1.5)
    out = regimes(flat, [1, 2], 2_592, 300, 1.5)
    for regime in ("queue", "no_queue"):
        assert set(out[regime]) == set(REGIME_PLANNERS)
        for figures in out[regime].values():
            assert len(figures["refused_jobs"]) == len(figures["refused_gpus"]) == 2
    assert out["queue"]["tidal"]["refused_jobs"] == flat["churn_refused_jobs"]


def test_regime_wins_count_seeds_where_tidal_refused_fewer_than_both_baselines():
    from bench.churn import regime_wins

    figures = {
        "tidal": {"refused_jobs": [5, 5, 9], "refused_gpus": [50, 70, 10]},
        "best_fit": {"refused_jobs": [6, 6, 6], "refused_gpus": [60, 60, 60]},
        "constrained_first_fit": {"refused_jobs": [7, 5, 9], "refused_gpus": [55, 80, 90]},
    }
    figures["tidal_fill"] = {"refused_jobs": [1, 1, 1], "refused_gpus": [1, 1, 1]}
    wins = regime_wins({"queue": figures})
    # seed 1: fewer than both on both counts; seed 2: a tie on jobs with CFF and more GPUs than
    # best-fit; seed 3: fewer GPUs only. tidal_fill: fewer everywhere.
    assert wins["tidal"] == {
        "queue": {"seeds": 3, "fewer_jobs": 1, "fewer_gpus": 2, "fewer_both": 1, "every_seed_both": False}
    }
    assert wins["tidal_fill"] == {
        "queue": {"seeds": 3, "fewer_jobs": 3, "fewer_gpus": 3, "fewer_both": 3, "every_seed_both": True}
    }
    figures["best_fit"]["refused_gpus"].pop()
    with pytest.raises(ValueError, match="different seeds"):
        regime_wins({"queue": figures})
