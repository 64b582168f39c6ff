"""A pytest plugin for tests/unit/test_quality_mutants.py, loaded into each mutant's test run.

It records which `tidal` that run imported and how each test ended (passed, failed on an
assertion, or failed otherwise), so the meta-test reads outcomes rather than console text, and
it makes Hypothesis deterministic and database-free there: two runs of one mutant agree, and a
mutant's failing examples are never saved where the unmutated suite would replay them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Generator
from typing import Any

import hypothesis
import pytest

_outcomes: dict[str, str] = {}
_collection_errors: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    hypothesis.settings.register_profile("tidal-mutants", database=None, derandomize=True)
    hypothesis.settings.load_profile("tidal-mutants")


def _only_assertions(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):  # Hypothesis reports several distinct failures as a group
        return all(_only_assertions(e) for e in exc.exceptions)
    return isinstance(exc, AssertionError)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        assertion = report.when == "call" and call.excinfo is not None and _only_assertions(call.excinfo.value)
        _outcomes[item.nodeid] = "assertion" if assertion else f"error in {report.when}"
    elif report.when == "call":
        _outcomes.setdefault(item.nodeid, "passed" if report.passed else "skipped")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:
        _collection_errors.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session) -> None:
    import tidal

    with open(os.environ["TIDAL_MUTANT_REPORT"], "w") as out:
        json.dump({"tidal": tidal.__file__, "outcomes": _outcomes, "collection_errors": _collection_errors}, out)
