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


@pytest.fixture
def prometheus():
    queries = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            url = urlparse(self.path)
            query = parse_qs(url.query)["query"][0]
            queries.append((url.path, query))
            result = [] if "empty" in query else [{"metric": {}, "value": [1700000000, "17.25"]}]
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


def test_prometheus_instant_query(prometheus):
    url, queries = prometheus
    load = {
        "targetPerReplica": 5,
        "source": "Prometheus",
        "prometheus": {"url": url, "query": 'sum(rate(requests_total{pool="p"}[1m]))'},
    }
    assert read_load(pool(load)) == (17.25, None)
    assert queries == [("/api/v1/query", 'sum(rate(requests_total{pool="p"}[1m]))')]
    rate, error = read_load(pool({**load, "prometheus": {"url": url, "query": "empty"}}))
    assert rate is None and "no sample" in error
    rate, error = read_load(pool({**load, "prometheus": {"url": "http://127.0.0.1:9", "query": "x"}}))
    assert rate is None and error.startswith("prometheus query failed")
