"""Throttled API calls back off on the real cluster, timed by the fault proxy that throttles them."""

from __future__ import annotations

import statistics

from bench.fault_proxy import PathRule

from .kube import Kube
from .operator_process import OperatorProcess
from .proxied import operator_behind_proxy
from .test_operator import assert_gangs_sound, job, submit, wait_phase

THROTTLED = 3
"""429s before each pod create passes: with tidal's 4 attempts per call, the last one passes."""
PODS = 32
# RetryPolicy: base 0.2 s, so retry k waits uniform in [0, 0.2 * 2**(k-1)]: [0, 0.2], [0, 0.4], [0, 0.8].
NO_JITTER_THIRD = 0.8
"""Without jitter the wait before the third retry is the whole bound; a sleep never ends early."""


def test_throttled_calls_back_off_exponentially_with_full_jitter(
    kube: Kube, operator: OperatorProcess, namespace: str, tmp_path
):
    """Issue 13, 'Coexistence and faults': retries on 429/5xx back off with jitter, honouring
    Retry-After. Every pod create of a 32-pod gang is answered 429 (no Retry-After) three times,
    every first PATCH of a pod 429 with Retry-After: 1; the proxy times each retry of each request.
    Fails with a fixed retry delay (the waits do not grow, Retry-After is not waited out) and with
    backoff without jitter (no wait before a third retry is shorter than its bound)."""
    rules = (
        PathRule("POST", f"/namespaces/{namespace}/pods", "throttle_429", first=THROTTLED, retry_after=None),
        PathRule("PATCH", f"/namespaces/{namespace}/pods/", "throttle_429", first=1, retry_after="1"),
    )
    with operator_behind_proxy(kube, operator, namespace, tmp_path, rules) as (proxy, _):
        submit(kube, namespace, job("throttled", tp=4, ep=4, pp=2, dp=4))  # 8 groups of 4 pods
        wait_phase(kube, namespace, "throttled", "Running", timeout=240)
        assert_gangs_sound(kube)
        arrivals = {key: list(times) for key, times in proxy.arrivals.items()}

    creates = [times for (method, _, _), times in arrivals.items() if method == "POST"]
    assert len(creates) == PODS, f"{len(creates)} distinct pod creates seen, wanted {PODS}"
    assert all(len(t) > THROTTLED for t in creates), "a create was given up before it passed"
    # gaps[k]: the wait before retry k+1 of each create, as the proxy saw the attempts arrive.
    gaps = [[t[k + 1] - t[k] for t in creates] for k in range(THROTTLED)]
    means = [statistics.fmean(g) for g in gaps]
    third = sorted(round(x, 2) for x in gaps[2])
    summary = f"mean waits before retries 1-3: {[round(m, 3) for m in means]}; before the 3rd: {third}"
    print(summary)  # shown with -s, and on failure
    # Exponential: the bound doubles per retry, so the mean wait does (0.1, 0.2, 0.4 s plus the
    # round trip); a fixed delay keeps them equal. 0.12 s is under half the expected 0.3 s growth.
    assert means[2] - means[0] >= 0.12, f"the waits do not grow: {summary}"
    # Full jitter: a third of the third waits should fall under 0.7 s (about 85% do: uniform in
    # [0, 0.8] plus the round trip); with no jitter not one can.
    short = [g for g in gaps[2] if g < NO_JITTER_THIRD - 0.1]
    assert len(short) >= PODS // 3, f"no jitter: {len(short)} of {PODS} third waits under 0.7 s; {summary}"

    patches = [times for (method, _, _), times in arrivals.items() if method == "PATCH"]
    assert len(patches) >= PODS, f"only {len(patches)} distinct pod patches seen (the gates of {PODS} pods)"
    assert all(len(t) >= 2 for t in patches), "a throttled patch was never retried"
    waits = sorted(t[1] - t[0] for t in patches)
    print(f"waits after a 429 with Retry-After: 1: {[round(w, 2) for w in waits]}")
    assert waits[0] >= 1.0, f"Retry-After: 1 not waited out: waits {[round(w, 2) for w in waits]}"
