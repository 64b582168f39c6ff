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
