"""kopf's peering identity (runner.peering_id): the pod's name for the container's own process
only, so a restarted container takes its own record back while a second operator exec'd into the
same pod keeps an identity of its own (the cluster test in tests/cluster/test_peering.py shows
what kopf does with each)."""

from tidal.k8s.runner import peering_id

POD = {"POD_NAME": "tidal-7d4f-abcde"}


def test_the_containers_own_process_is_the_pod():
    assert peering_id(POD, pid=1) == "tidal-7d4f-abcde"


def test_any_other_process_in_the_pod_keeps_kopfs_own_id():
    assert peering_id(POD, pid=4242) is None, "a `kubectl exec`'d tidal run must not pass for the pod"


def test_without_a_pod_name_or_with_pod_id_set_kopf_decides():
    assert peering_id({}, pid=1) is None
    assert peering_id({**POD, "POD_ID": "set-by-hand"}, pid=1) is None
