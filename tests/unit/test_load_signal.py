"""The pool's load signal: an annotation any autoscaler can write, or a Prometheus instant query
(served here by a real HTTP server on 127.0.0.1 speaking the Prometheus query API)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from tidal.k8s.pools import LOAD_ANNOTATION, read_load
from tidal.k8s.state import ResourceView


def pool(load: dict, annotations: dict | None = None) -> ResourceView:
    spec = {"maxReplicas": 10, "gpusPerPod": 1, "template": {}, "load": load}
    return ResourceView("InferencePool", "ns", "p", "uid", 1, "", spec, {}, annotations or {}, "1", False)


def test_annotation_source():
    assert read_load(pool({"targetPerReplica": 5}, {LOAD_ANNOTATION: "42.5"})) == (42.5, None)
    assert read_load(pool({"targetPerReplica": 5})) == (None, None)
    rate, error = read_load(pool({"targetPerReplica": 5}, {LOAD_ANNOTATION: "lots"}))
    assert rate is None and "not a number" in error


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "1e400"])
def test_a_non_finite_annotation_is_an_error_not_a_rate(raw: str):
    # NaN passed max(nan, 0.0) and reached math.ceil, which raised and failed every cycle.
    rate, error = read_load(pool({"targetPerReplica": 5}, {LOAD_ANNOTATION: raw}))
    assert rate is None and error == f"annotation {LOAD_ANNOTATION}={raw!r} is not a finite number"


@pytest.fixture
def prometheus():
    queries = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urlparse(self.path)
            query = parse_qs(url.query)["query"][0]
            queries.append((url.path, query))
            # 0/0 in a ratio: Prometheus answers NaN; a deriv() or a difference can dip below 0.
            value = "NaN" if "ratio" in query else "-3.5" if "deriv" in query else "17.25"
            result = [] if "empty" in query else [{"metric": {}, "value": [1700000000, value]}]
            body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}", queries
    server.shutdown()


def test_prometheus_instant_query_goes_to_the_named_source(prometheus):
    url, queries = prometheus
    sources = {"main": url}
    load = {
        "targetPerReplica": 5,
        "source": "Prometheus",
        "prometheus": {"server": "main", "query": 'sum(rate(requests_total{pool="p"}[1m]))'},
    }
    assert read_load(pool(load), sources) == (17.25, None)
    assert queries == [("/api/v1/query", 'sum(rate(requests_total{pool="p"}[1m]))')]
    rate, error = read_load(pool({**load, "prometheus": {"server": "main", "query": "empty"}}), sources)
    assert rate is None and "failed (ValueError)" in error
    rate, error = read_load(pool({**load, "prometheus": {"server": "main", "query": "ratio"}}), sources)
    assert rate is None and "failed (ValueError)" in error, "NaN is no rate"
    below = read_load(pool({**load, "prometheus": {"server": "main", "query": "deriv(x[5m])"}}), sources)
    assert below == (0.0, None), "no load, as for the annotation (status.load.currentRate must be >= 0)"
    rate, error = read_load(pool(load), {"main": "http://127.0.0.1:9"})
    assert rate is None and error.startswith("query to Prometheus load source 'main' failed")


def test_an_unconfigured_source_is_named_and_nothing_is_fetched(prometheus):
    url, queries = prometheus
    load = {"targetPerReplica": 5, "source": "Prometheus", "prometheus": {"server": "other", "query": "up"}}
    rate, error = read_load(pool(load), {"main": url})
    assert rate is None and error == "load source 'other' is not configured in the operator (configured: main)"
    assert queries == []


def test_the_status_error_never_echoes_the_remote_answer():
    """Issue 13: the error went into the pool's status verbatim, so a tenant could read whatever
    an address answered through tidal."""
    secret = "internal-admin-token-0xdeadbeef"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(500)
            self.end_headers()
            self.wfile.write(secret.encode())

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        load = {"targetPerReplica": 5, "source": "Prometheus", "prometheus": {"server": "main", "query": "up"}}
        rate, error = read_load(pool(load), {"main": f"http://127.0.0.1:{server.server_port}"})
    finally:
        server.shutdown()
    assert rate is None and error and secret not in error and "500" not in error
