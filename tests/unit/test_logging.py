import json
import logging

import structlog

from tidal.logging import configure


def test_kopf_object_logs_become_json_with_namespace_and_name():
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        configure("INFO", json=True)
        formatter = root.handlers[0].formatter
        record = logging.LogRecord("kopf.objects", logging.INFO, __file__, 1, "Timer 'tick' succeeded.", (), None)
        record.k8s_ref = {"kind": "TrainingJob", "namespace": "ml", "name": "moe"}
        line = json.loads(formatter.format(record))
    finally:
        structlog.reset_defaults()
        root.handlers, root.level = saved
    assert line["event"] == "Timer 'tick' succeeded."
    assert (line["kind"], line["namespace"], line["name"]) == ("TrainingJob", "ml", "moe")
    assert line["level"] == "info" and line["logger"] == "kopf.objects"


class _Writes:
    """A stream that keeps each write() call apart."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_each_tidal_line_is_one_write_with_its_newline(monkeypatch):
    """kopf logs through the stdlib handler from the event loop while the cycle thread logs
    through structlog: a line written in two parts (print's message, then its newline) let a
    kopf line in between, and the log had two JSON objects on one line (found by bench.operator)."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    stream = _Writes()
    monkeypatch.setattr("sys.stderr", stream)
    try:
        configure("INFO", json=True)
        structlog.get_logger("tidal").info("cycle done", seconds=0.1)
        logging.getLogger("kopf.objects").info("Timer 'tick' succeeded.")
    finally:
        structlog.reset_defaults()
        root.handlers, root.level = saved
    assert len(stream.writes) == 2
    for text in stream.writes:
        assert text.endswith("\n") and text.count("\n") == 1
        json.loads(text)


def test_kopf_successes_go_at_debug_and_failures_keep_their_level():
    # Issue 36: every timer tick and watch event logged "... succeeded." at INFO.
    from tidal.k8s.handlers import _QuietFeeds

    def record(level: int, message: str) -> logging.LogRecord:
        return logging.LogRecord("kopf.objects", level, __file__, 1, message, (), None)

    root = logging.getLogger()
    saved = root.level
    quiet = _QuietFeeds()
    try:
        root.setLevel(logging.INFO)
        assert not quiet.filter(record(logging.INFO, "Timer 'tick_jobs' succeeded."))
        assert not quiet.filter(record(logging.INFO, "Indexer 'tidal_pods' succeeded."))
        assert quiet.filter(record(logging.ERROR, "Handler 'feed_pods' failed with an exception."))
        assert quiet.filter(record(logging.INFO, "Resuming operations after the pause."))
        root.setLevel(logging.DEBUG)
        shown = record(logging.INFO, "Timer 'tick_jobs' succeeded.")
        assert quiet.filter(shown) and shown.levelname == "DEBUG"
    finally:
        root.setLevel(saved)
