"""The one clock the operator reads, so tests can run a compressed day.

`SystemClock` is wall time. `FileClock` reads an RFC 3339 instant from a file when one is there
(written by a test or an operator running a drill) and otherwise falls back to wall time.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Protocol


class Clock(Protocol):
    def now(self) -> dt.datetime: ...


class SystemClock:
    def now(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC)


class FixedClock:
    """For unit tests: a clock that only moves when told to."""

    def __init__(self, at: dt.datetime):
        self.at = at

    def now(self) -> dt.datetime:
        return self.at

    def advance(self, **delta: float) -> None:
        self.at += dt.timedelta(**delta)


class FileClock:
    def __init__(self, path: Path):
        self.path = path

    def now(self) -> dt.datetime:
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return dt.datetime.now(dt.UTC)
        if not text:
            return dt.datetime.now(dt.UTC)
        at = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
        return at if at.tzinfo else at.replace(tzinfo=dt.UTC)


def rfc3339(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> dt.datetime | None:
    if not text:
        return None
    try:
        at = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return at if at.tzinfo else at.replace(tzinfo=dt.UTC)
