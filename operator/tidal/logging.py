"""Logging: JSON lines (structlog) for tidal's own logs and for kopf's, with the resource's
kind, namespace and name on every line about one object."""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog


def _kopf_object(_: Any, __: str, event: dict[str, Any]) -> dict[str, Any]:
    """kopf attaches the object it logs about as `k8s_ref`; lift it to top-level fields."""
    record = event.get("_record")
    ref = getattr(record, "k8s_ref", None)
    if isinstance(ref, dict):
        for key in ("kind", "namespace", "name"):
            if ref.get(key):
                event.setdefault(key, ref[key])
    return event


def configure(level: str = "INFO", json: bool = True) -> None:
    numeric = getattr(logging, level.upper(), logging.INFO)
    renderer = structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer()
    shared = [
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[*shared, structlog.stdlib.add_logger_name, _kopf_object],
        )
    )
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(numeric)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        # One write per line, newline included: print() writes the newline apart, and kopf's lines
        # (the stdlib handler, another thread) landed in between, two JSON objects on one line.
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
