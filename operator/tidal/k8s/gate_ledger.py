"""The gate removals this operator sent, so that a cycle whose watch has not yet shown them does
not send them again.

Under load the watch shows a pod's lifted gate seconds after the patch went out; the cycles in
between saw the pod still gated and removed its gate again (bench.operator at 1,008 nodes: 487
gate removals for a 256-pod gang, 3.9 API writes a pod; each repeat fails harmlessly with 422
but costs the API server a request). Removals the write budget skipped were never sent, so
they are not in the ledger: the next cycle sends them. A removal is not sent again for
`resend_seconds` while the pod stays gated in the cache; after that it is sent again, since a
patch the API server took without lifting the gate (a 409 or 422 the client treats as done) must
not leave the gang gated for good. Kept per pod uid: a pod made again under the same name is a
new pod, gated anew.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

RESEND_SECONDS = 30.0
"""The watch lags by seconds to tens of seconds under load (at 5,004 nodes a cycle sends removals
for 60 s); a removal that did not lift the gate is rare (its test failed: the gates changed), so
waiting longer before sending it again costs little."""


@dataclass
class GateLedger:
    resend_seconds: float = RESEND_SECONDS
    monotonic: Callable[[], float] = time.monotonic
    _sent: dict[str, float] = field(default_factory=dict)

    def recent(self, gated_uids: Iterable[str]) -> frozenset[str]:
        """The pods still gated in the cache whose removal went out within `resend_seconds`; every
        other entry is forgotten (lifted, gone, or due to be sent again)."""
        if not self._sent:  # the usual case: no pod's cache is read on the cycle's path
            return frozenset()
        now = self.monotonic()
        gated = set(gated_uids)
        self._sent = {uid: at for uid, at in self._sent.items() if uid in gated and now - at < self.resend_seconds}
        return frozenset(self._sent)

    def sent(self, uids: Iterable[str]) -> None:
        now = self.monotonic()
        self._sent.update((uid, now) for uid in uids)
