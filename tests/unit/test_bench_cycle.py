"""`python -m bench.cycle --quick` runs the operator's cycle in-process (a smoke test: no timings asserted)."""

import logging

import bench.cycle
import pytest
import structlog
from bench.cycle import main

from tidal.logging import configure


@pytest.fixture
def restored_logging(monkeypatch):
    """The benchmark configures logging onto this test's captured stderr, with loggers cached on
    first use: the module loggers it touched would write to that closed file in later tests (a
    ValueError out of the log call). Configure without the cache, and put everything back."""

    def uncached(level: str, json: bool = True) -> None:
        configure(level, json=json)
        structlog.configure(cache_logger_on_first_use=False)

    monkeypatch.setattr(bench.cycle, "configure_logging", uncached)
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield
    structlog.reset_defaults()
    root.handlers, root.level = saved


def test_bench_cycle_quick_runs_and_reports_its_fields(capsys, restored_logging):
    result = main(["--quick", "--json"])
    for field in ("nodes", "gpus", "pods", "queued_jobs", "cycle_p50_ms", "cycle_p99_ms", "admit_16k_gang_ms",
                  "peak_rss_mb", "old_cycle_ms", "cycle_cpu_p50_ms", "api_requests_steady_by_kind"):  # fmt: skip
        assert field in result, field
    assert result["big_gang_admitted"] is True
    assert result["pods"] > 2000 and result["queued_jobs"] == 20
    assert sum(result["api_requests_steady_by_kind"].values()) == result["api_requests_steady"]
    assert '"cycle_p50_ms"' in capsys.readouterr().out
