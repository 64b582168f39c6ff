"""`python -m bench.cycle --quick` runs the operator's cycle in-process (a smoke test: no timings asserted)."""

from bench.cycle import main


def test_bench_cycle_quick_runs_and_reports_its_fields(capsys):
    result = main(["--quick", "--json"])
    for field in ("nodes", "gpus", "pods", "queued_jobs", "cycle_p50_ms", "cycle_p99_ms", "admit_16k_gang_ms",
                  "peak_rss_mb", "old_cycle_ms"):  # fmt: skip
        assert field in result, field
    assert result["big_gang_admitted"] is True
    assert result["pods"] > 2000 and result["queued_jobs"] == 20
    assert '"cycle_p50_ms"' in capsys.readouterr().out
