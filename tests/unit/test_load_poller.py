"""Pools' Prometheus loads are queried by a poller thread, never inside the controller cycle; the
cycle reads the last sample, and a sample older than the staleness bound is no signal at all.

The Prometheus servers here are real HTTP servers on 127.0.0.1: one that answers, one that hangs."""

from __future__ import annotations

import datetime as dt
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tidal.clock import FixedClock
from tidal.k8s.controller import Controller, ControllerSettings
from tidal.k8s.pools import LoadPoller, pool_load, prometheus_instant
from tidal.k8s.rebalancing import RebalanceSettings
from tidal.k8s.state import ResourceView

from .fake_cluster import FakeCluster
from .test_rebalance import TEMPLATE

NOON = dt.datetime(2026, 5, 1, 12, tzinfo=dt.UTC)


def serve(answer: Callable[[BaseHTTPRequestHandler], None]) -> tuple[str, Callable[[], None]]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            answer(self)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def close() -> None:
        server.shutdown()
        server.server_close()

    return f"http://127.0.0.1:{server.server_port}", close


@pytest.fixture
def hung() -> Iterator[str]:
    """A Prometheus that accepts the connection and never answers (until the test ends)."""
    done = threading.Event()
    url, close = serve(lambda handler: done.wait(30))
    yield url
    done.set()
    close()


@pytest.fixture
def prometheus() -> Iterator[str]:
    def answer(handler: BaseHTTPRequestHandler) -> None:
        result = [{"metric": {}, "value": [1700000000, "17.25"]}]
        body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    url, close = serve(answer)
    yield url
    close()


LOAD = {"targetPerReplica": 5, "source": "Prometheus", "prometheus": {"server": "main", "query": "rps"}}


def pool_cluster(url: str, pools: int = 2) -> tuple[FakeCluster, Controller]:
    cluster = FakeCluster("nvl72", 2)
    for i in range(pools):
        spec = {"minReplicas": 1, "maxReplicas": 6, "gpusPerPod": 1, "template": TEMPLATE, "load": LOAD}
        cluster.add("InferencePool", "ns", f"p{i}", spec)
    settings = ControllerSettings(rebalance=RebalanceSettings(load_sources={"main": url}))
    return cluster, Controller(cluster, FixedClock(NOON), settings)


def eventually(check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.05)


def test_a_prometheus_that_never_answers_does_not_hold_up_the_cycle(hung):
    cluster, controller = pool_cluster(hung, pools=3)
    try:
        for _ in range(3):
            controller._last_start = 0.0
            started = time.monotonic()
            assert controller.cycle(cluster.state()) is not None
            assert time.monotonic() - started < 1.0, "the cycle waited for Prometheus"
        status = cluster.status("InferencePool", "ns", "p0")
        assert status["load"]["error"] == "no sample from Prometheus load source 'main' yet"
        assert "currentRate" not in status["load"]
        assert status["placedReplicas"] == 1, "load unknown: the floor still holds"
    finally:
        controller.loads.stop()


def test_a_query_that_times_out_is_reported_without_what_the_remote_said(hung):
    loads = LoadPoller({"main": hung})
    loads._thread = threading.current_thread()  # polled by hand here, not by its thread
    view = pool_view()
    loads.read(view)
    started = time.monotonic()
    loads.poll_once()
    assert time.monotonic() - started < 5.0, "each query has a timeout"
    rate, error = loads.read(view)
    assert rate is None and error.startswith("query to Prometheus load source 'main' failed (")


def test_the_cycle_scales_by_the_sample_the_poller_took(prometheus):
    cluster, controller = pool_cluster(prometheus, pools=1)
    try:
        controller.cycle(cluster.state())  # asks the poller for p0's load: it starts
        eventually(lambda: controller.loads.read(cluster.get("InferencePool", "ns", "p0"))[0] == 17.25)
        controller._last_start = 0.0
        controller.cycle(cluster.state())
        status = cluster.status("InferencePool", "ns", "p0")
        assert status["load"]["currentRate"] == 17.25 and "error" not in status["load"]
        assert status["desiredReplicas"] == 4, "ceil(17.25 / 5)"
    finally:
        controller.loads.stop()


def pool_view(query: str = "rps", source: str = "main", name: str = "p") -> ResourceView:
    spec = {
        "maxReplicas": 6,
        "gpusPerPod": 1,
        "template": {},
        "load": {**LOAD, "prometheus": {"server": source, "query": query}},
    }
    return ResourceView("InferencePool", "ns", name, f"uid-{name}", 1, "", spec, {}, {}, "1", False)


def test_a_sample_older_than_the_bound_is_no_signal():
    now = [100.0]
    loads = LoadPoller({"main": "http://127.0.0.1:9"}, query=lambda url, q: 12.0, monotonic=lambda: now[0])
    loads._thread = threading.current_thread()  # polled by hand here, not by its thread
    view = pool_view()
    assert loads.read(view) == (None, "no sample from Prometheus load source 'main' yet")
    loads.poll_once()
    now[0] += 59
    assert loads.read(view) == (12.0, None)
    now[0] += 2
    rate, error = loads.read(view)
    assert rate is None and error == "no sample from Prometheus load source 'main' for 61s; see the operator log"


def test_a_changed_query_waits_for_its_own_sample():
    loads = LoadPoller({"main": "http://127.0.0.1:9"}, query=lambda url, q: 12.0)
    loads._thread = threading.current_thread()
    loads.read(pool_view("old"))
    loads.poll_once()
    assert loads.read(pool_view("old")) == (12.0, None)
    assert loads.read(pool_view("new"))[0] is None


def test_an_unconfigured_source_is_reported_without_polling():
    loads = LoadPoller({"main": "http://127.0.0.1:9"})
    view = pool_view()
    other = ResourceView(
        "InferencePool",
        "ns",
        "q",
        "uid-q",
        1,
        "",
        {**view.spec, "load": {**LOAD, "prometheus": {"server": "other", "query": "up"}}},
        {},
        {},
        "1",
        False,
    )
    rate, error = pool_load(other, loads.sources, loads)
    assert rate is None and error == "load source 'other' is not configured in the operator (configured: main)"
    assert loads._thread is None, "nothing to poll"


def test_a_hung_source_delays_only_its_own_pools_and_a_shared_query_is_asked_once(hung, prometheus):
    # Review finding: one round asked every pool in turn, so pools behind a hung source went stale.
    asked: list[tuple[str, str]] = []

    def query(url: str, q: str) -> float:
        asked.append((url, q))
        return prometheus_instant(url, q)

    loads = LoadPoller({"dead": hung, "main": prometheus}, query=query)
    loads._thread = threading.current_thread()  # polled by hand here, not by its thread
    dead = [pool_view(f"q{i}", "dead", f"d{i}") for i in range(3)]
    live = [pool_view("rps", "main", f"m{i}") for i in range(3)]
    for view in dead + live:
        loads.read(view)
    round_done = threading.Event()
    threading.Thread(target=lambda: (loads.poll_once(), round_done.set()), daemon=True).start()
    deadline = time.monotonic() + 1.5  # under one timeout of the hung source (2 s)
    while time.monotonic() < deadline and any(loads.read(v)[0] is None for v in live):
        time.sleep(0.05)
    assert [loads.read(v)[0] for v in live] == [17.25] * 3, "the healthy source's pools waited for the hung one"
    assert asked.count((prometheus, "rps")) == 1, "three pools, one (source, query): asked once"
    loads.stop()
    round_done.wait(10)
