"""The churn benchmark's refusal accounting: the per-shape breakdown counts the same jobs as the
total, and only those that arrived after the warm-up cut."""

from __future__ import annotations

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
