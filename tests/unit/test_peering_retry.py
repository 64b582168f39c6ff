"""ensure_peering rides out a transient API answer instead of stopping the operator at start-up
(bench.faults saw `tidal run` exit on one injected 500 from the peering check)."""

import pytest
from kubernetes.client.exceptions import ApiException

from tidal.k8s.peering import PeeringUnavailable, ensure_peering


class FlakyCustomObjects:
    def __init__(self, get_errors: list[int], create_errors: list[int] = ()):
        self.get_errors, self.create_errors = list(get_errors), list(create_errors)
        self.created = False

    def get_cluster_custom_object(self, group, version, plural, name):
        if self.get_errors:
            raise ApiException(status=self.get_errors.pop(0))
        if not self.created:
            raise ApiException(status=404)
        return {"metadata": {"name": name}}

    def create_cluster_custom_object(self, group, version, plural, body):
        if self.create_errors:
            raise ApiException(status=self.create_errors.pop(0))
        self.created = True


def test_a_500_or_429_on_the_peering_check_is_retried():
    api = FlakyCustomObjects(get_errors=[500, 429, 503])
    api.created = True
    waits: list[float] = []
    assert ensure_peering(api, "tidal", sleep=waits.append) is False
    assert waits == [1, 2, 4]


def test_a_500_on_creating_it_is_retried_then_it_is_created():
    api = FlakyCustomObjects(get_errors=[], create_errors=[500])
    assert ensure_peering(api, "tidal", sleep=lambda _: None) is True and api.created


def test_forbidden_still_stops_at_once_with_the_reason():
    api = FlakyCustomObjects(get_errors=[], create_errors=[403])
    waits: list[float] = []
    with pytest.raises(PeeringUnavailable, match="may not create it"):
        ensure_peering(api, "tidal", sleep=waits.append)
    assert waits == []


def test_an_api_server_that_keeps_failing_is_given_up_on():
    api = FlakyCustomObjects(get_errors=[500] * 10)
    with pytest.raises(ApiException):
        ensure_peering(api, "tidal", attempts=3, sleep=lambda _: None)
