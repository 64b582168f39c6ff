"""The fault proxy's deterministic path rules (bench.fault_proxy.PathRule), without a cluster."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from bench.fault_proxy import FaultProxy, FaultRates, PathRule


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "current-context": "c",
                "clusters": [{"name": "k", "cluster": {"server": "https://127.0.0.1:6443"}}],
                "users": [{"name": "u", "user": {}}],
                "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
            }
        )
    )
    return path


def proxy_with(kubeconfig: Path, *rules: PathRule) -> FaultProxy:
    return FaultProxy(kubeconfig, FaultRates(rate=0.0, watch_cut_rate=0.0, rules=rules))


def test_a_first_rule_faults_the_first_arrivals_of_each_distinct_request_and_times_them(kubeconfig: Path):
    proxy = proxy_with(kubeconfig, PathRule("POST", "/ns/pods", "throttle_429", first=2, retry_after=None))
    try:
        a, b = b'{"metadata":{"name":"a"}}', b'{"metadata":{"name":"b"}}'
        seen = [proxy.decide("POST", False, path="/api/v1/ns/pods", body=body)[0] for body in (a, b, a, a, b, b)]
        # The rule's index rides along, so the handler finds its Retry-After.
        assert seen == ["throttle_429:0", "throttle_429:0", "throttle_429:0", None, "throttle_429:0", None]
        assert sorted(len(t) for t in proxy.arrivals.values()) == [3, 3]
        assert proxy.decide("GET", False, path="/api/v1/ns/pods", body=a)[0] is None
    finally:
        proxy.stop()


def test_delay_and_record_rules(kubeconfig: Path):
    proxy = proxy_with(
        kubeconfig,
        PathRule("PATCH", "/pods/", "delay", first=1, hang_seconds=7.0),
        PathRule("DELETE", "/pods/", "record"),
    )
    try:
        assert proxy.decide("PATCH", False, path="/pods/x", body=b"{}") == ("delay", 7.0)
        assert proxy.decide("PATCH", False, path="/pods/x", body=b"{}")[0] is None
        assert proxy.decide("DELETE", False, path="/pods/x")[0] is None
        proxy.enabled = False  # the harness settling: nothing injected, nothing timed
        assert proxy.decide("DELETE", False, path="/pods/y")[0] is None
        assert [k[1] for k in proxy.arrivals if k[0] == "DELETE"] == ["/pods/x"]
    finally:
        proxy.stop()


def test_a_body_rule_faults_only_requests_whose_body_contains_its_part_and_only_its_times(kubeconfig: Path):
    rule = PathRule("PATCH", "/trainingjobs/doomed", "conflict_409", body_part=b'"remove"', times=1)
    proxy = proxy_with(kubeconfig, rule)
    try:
        path = "/apis/tidal.dev/v1alpha1/namespaces/n/trainingjobs/doomed"
        removal = b'[{"op": "test"}, {"op": "remove", "path": "/metadata/finalizers"}]'
        assert proxy.decide("PATCH", False, True, path=path, body=removal)[0] == "conflict_409"
        assert proxy.decide("PATCH", False, path=path + "/status", body=b'{"status": {}}')[0] is None
        assert proxy.decide("PATCH", False, path=path, body=None)[0] is None
        assert proxy.decide("PATCH", False, True, path=path, body=removal)[0] is None  # its one fault was spent
    finally:
        proxy.stop()
