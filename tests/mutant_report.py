"""A pytest plugin for tests/unit/test_quality_mutants.py, loaded into each mutant's test run.

It records which `tidal` that run imported, its exit status, and how each test ended (passed,
skipped, failed on an assertion of the test, or failed otherwise: an error, a crash, an assert
inside `tidal` itself, a flaky Hypothesis failure), so the meta-test reads outcomes rather than
console text. It also makes Hypothesis deterministic and database-free there: two runs of one
mutant agree, and a mutant's failing examples are never saved where the unmutated suite would
replay them.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Generator
from pathlib import Path
from typing import Any

import hypothesis
import hypothesis.errors
import pytest

_outcomes: dict[str, str] = {}
_collection_errors: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    hypothesis.settings.register_profile("tidal-mutants", database=None, derandomize=True)
    hypothesis.settings.load_profile("tidal-mutants")


def _only_assertions(exc: BaseException) -> bool:
    if isinstance(exc, hypothesis.errors.Flaky):
        return False
    if isinstance(exc, BaseExceptionGroup):  # Hypothesis reports several distinct failures as a group
        return all(_only_assertions(e) for e in exc.exceptions)
    return isinstance(exc, AssertionError)


def _raised_in_tidal(excinfo: pytest.ExceptionInfo[BaseException]) -> bool:
    source = Path(os.environ["PYTHONPATH"]).resolve()
    return Path(str(excinfo.traceback[-1].path)).resolve().is_relative_to(source)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        excinfo = call.excinfo
        assertion = (
            report.when == "call"
            and excinfo is not None
            and _only_assertions(excinfo.value)
            and not _raised_in_tidal(excinfo)
        )
        _outcomes[item.nodeid] = "assertion" if assertion else f"error in {report.when}"
    elif report.skipped:
        _outcomes.setdefault(item.nodeid, "skipped")
    elif report.when == "call":
        _outcomes.setdefault(item.nodeid, "passed")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _collection_errors.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    tidal = sys.modules.get("tidal")
    with open(os.environ["TIDAL_MUTANT_REPORT"], "w") as out:
        json.dump(
            {
                "tidal": getattr(tidal, "__file__", None),
                "exit_status": int(exitstatus),
                "outcomes": _outcomes,
                "collection_errors": _collection_errors,
            },
            out,
        )
