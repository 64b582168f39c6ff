"""A fault-injecting proxy on 127.0.0.1 between the operator and a real Kubernetes API server.

The operator talks plain HTTP to the proxy (its kubeconfig from `operator_kubeconfig()` carries no
credentials); the proxy forwards every request over HTTPS with the client certificate, key and CA
of the cluster's own kubeconfig. Per request a seeded RNG decides, at the set rate, to inject one
fault instead of (or around) the real answer:

- latency: the request is held 0.2-1.5 s, then forwarded;
- hang: no answer at all for `hang_seconds`, then the connection is dropped (a stuck apiserver);
- 409 where a real API server can answer it: Conflict for a write that carries a precondition (an
  update, a JSON patch with a test op, a patch or delete naming a resourceVersion), nothing written;
  AlreadyExists for a create after it was committed (what a client retrying a create sees). A merge
  patch without resourceVersion never conflicts on a real server (it retries internally), so it
  gets no 409 here either: kopf's peering keepalive, for one, dies on a 409 it can never really get;
- 429 Too Many Requests with Retry-After: 1 (API priority and fairness throttling);
- 500 before the write, and for writes also 500 *after* it was committed: the client must not
  trust its own view of whether a write happened.

`PathRule`s single out requests by method and path, for deterministic tests: one call that always
hangs, one kind of write always throttled, a request held for a while and then forwarded (delay),
or only the first `first` arrivals of each distinct request (same method, path and body, which is
what a client retrying one call sends) faulted, the arrival times of each kept in `arrivals`; a
"record" rule only keeps the arrival times of what it matches, and injects nothing.

Watches are streamed chunk by chunk (never buffered) and never get a synthetic status; instead a
watch is cut mid-stream at the same rate, as when an apiserver restarts or a load balancer drops it.
Everything injected is counted in `injected`. Only loopback addresses are used on either side.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import random
import socket
import ssl
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# Hop-by-hop headers are the proxy's own business on each side, never forwarded.
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection", "content-length"}
)


@dataclass(frozen=True)
class PathRule:
    """A fault for every request of `method` whose path contains `path_part` (at `rate`): one
    call that always hangs, one kind of write that is always throttled, or one held a while.

    With `first` > 0 the rate is ignored: the first `first` arrivals of each distinct request
    (method, path, body) get the fault, later ones pass, so every retry of every call can be timed."""

    method: str
    path_part: str
    fault: str  # "hang", "throttle_429", "conflict_409", "delay" (held hang_seconds, then forwarded), "record"
    rate: float = 1.0
    hang_seconds: float = 600.0
    first: int = 0
    retry_after: str | None = "1"
    """Retry-After of a throttle_429 (None: none sent, the client's own backoff alone decides)."""
    body_part: bytes = b""
    """Only requests whose body contains this (say, one kind of JSON patch among a path's writes)."""
    times: int = 0
    """At most this many faults from this rule in all (0: no limit): one refused call, then calm."""


@dataclass
class FaultRates:
    """`rate` is the share of requests that get a fault; the kind is drawn uniformly among those that
    apply to the request (409 and after-commit 500 only to writes). `rules` come first."""

    rate: float = 0.05
    watch_cut_rate: float | None = None  # default: `rate`
    hang_seconds: float = 10.0
    seed: int = 0
    rules: tuple[PathRule, ...] = ()


@dataclass
class Upstream:
    host: str
    port: int
    ssl_context: ssl.SSLContext
    files: list[Path] = field(default_factory=list)  # temporary PEM files made from *-data fields

    @classmethod
    def from_kubeconfig(cls, path: Path) -> Upstream:
        config = yaml.safe_load(Path(path).read_text())
        context_name = config.get("current-context") or config["contexts"][0]["name"]
        context = next(c["context"] for c in config["contexts"] if c["name"] == context_name)
        cluster = next(c["cluster"] for c in config["clusters"] if c["name"] == context["cluster"])
        user = next(u["user"] for u in config["users"] if u["name"] == context["user"])
        url = urllib.parse.urlsplit(cluster["server"])
        host = url.hostname or ""
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the fault proxy only forwards to a loopback API server, not {host!r}")
        files: list[Path] = []

        def pem(item: dict[str, Any], key: str) -> str | None:
            if item.get(key):
                return str(item[key])
            if item.get(f"{key}-data"):
                with tempfile.NamedTemporaryFile(prefix="tidal-proxy-", suffix=".pem", delete=False) as tmp:
                    tmp.write(base64.b64decode(item[f"{key}-data"]))
                files.append(Path(tmp.name))
                return tmp.name
            return None

        ctx = ssl.create_default_context(cafile=pem(cluster, "certificate-authority"))
        cert, key = pem(user, "client-certificate"), pem(user, "client-key")
        if cert:
            ctx.load_cert_chain(cert, key)
        return cls(host, url.port or 443, ctx, files)

    def connect(self, timeout: float) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.ssl_context, timeout=timeout)


def is_watch(path: str) -> bool:
    url = urllib.parse.urlsplit(path)
    query = urllib.parse.parse_qs(url.query)
    return query.get("watch", ["false"])[0].lower() in ("true", "1") or "/watch/" in url.path


def status_body(code: int, reason: str, message: str) -> bytes:
    return json.dumps(
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        }
    ).encode()


class FaultProxy:
    def __init__(self, kubeconfig: Path, rates: FaultRates, port: int = 0):
        self.upstream = Upstream.from_kubeconfig(kubeconfig)
        self.rates = rates
        self.injected: Counter[str] = Counter()
        self.requests = 0
        self.arrivals: defaultdict[tuple[str, str, str], list[float]] = defaultdict(list)
        """(method, path, body digest) -> monotonic arrival times of the requests a `first` or
        "record" rule matched."""
        self.rule_faults: Counter[PathRule] = Counter()
        """Faults each rule injected (for its `times`), kept by the rule itself: rules may be
        replaced while the proxy runs."""
        self.enabled = True  # off while the harness settles, so the final state is judged without noise
        self._rng = random.Random(rates.seed)
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        proxy = self

        class Handler(ProxyHandler):
            owner = proxy

        self.server = QuietServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return self.server.server_address[1]

    @property
    def faults_injected(self) -> int:
        with self._lock:
            return sum(self.injected.values())

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self.server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:  # shutdown() waits for serve_forever, which never ran otherwise
            self.server.shutdown()
        self.server.server_close()
        for f in self.upstream.files:
            f.unlink(missing_ok=True)

    def operator_kubeconfig(self, path: Path) -> Path:
        """A kubeconfig pointing at the proxy over plain HTTP: the proxy holds the credentials."""
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "fault-proxy",
                    "clusters": [{"name": "fault-proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
                    "users": [{"name": "fault-proxy", "user": {}}],
                    "contexts": [{"name": "fault-proxy", "context": {"cluster": "fault-proxy", "user": "fault-proxy"}}],
                }
            )
        )
        return path

    def decide(
        self, method: str, watch: bool, preconditioned: bool = False, path: str = "", body: bytes | None = None
    ) -> tuple[str | None, float]:
        """(fault kind or None, its parameter: a hang's or delay's seconds, else a random number),
        from the seeded RNG. A throttle_429 from a rule comes as "throttle_429:<rule index>"."""
        with self._lock:
            self.requests += 1
            roll, pick, param = self._rng.random(), self._rng.random(), self._rng.random()
            if not self.enabled:
                return None, param
            for index, rule in enumerate(self.rates.rules):
                if rule.method != method or rule.path_part not in path or watch:
                    continue
                if rule.body_part and rule.body_part not in (body or b""):
                    continue
                if rule.first or rule.fault == "record":
                    key = (method, path, hashlib.sha256(body or b"").hexdigest())
                    self.arrivals[key].append(time.monotonic())
                    if rule.fault == "record" or len(self.arrivals[key]) > rule.first:
                        return None, param
                elif roll >= rule.rate:
                    continue
                if rule.times and self.rule_faults[rule] >= rule.times:
                    continue
                self.rule_faults[rule] += 1
                if rule.fault == "throttle_429":
                    return f"throttle_429:{index}", param
                return rule.fault, rule.hang_seconds if rule.fault in ("hang", "delay") else param
            if watch:
                cut_rate = self.rates.rate if self.rates.watch_cut_rate is None else self.rates.watch_cut_rate
                return ("watch_cut" if roll < cut_rate else None), param
            if roll >= self.rates.rate:
                return None, param
            kinds = ["latency", "hang", "throttle_429", "error_500"]
            if method in WRITES:
                kinds.append("error_500_after_commit")
            if preconditioned:
                kinds.append("conflict_409")
            elif method == "POST":
                kinds.append("exists_409_after_commit")
            kind = kinds[int(pick * len(kinds))]
            return kind, self.rates.hang_seconds if kind == "hang" else param

    def count(self, kind: str) -> None:
        with self._lock:
            self.injected[kind] += 1

    def wait(self, seconds: float) -> None:
        self._stopping.wait(seconds)


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A SIGKILLed operator resets its connections: expected here, not worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ProxyHandler(BaseHTTPRequestHandler):
    owner: FaultProxy
    protocol_version = "HTTP/1.1"  # keep-alive and chunked streaming toward the operator
    _conn: http.client.HTTPSConnection | None = None

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown the harness output

    def do_GET(self) -> None:
        self._serve()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _send_status(self, code: int, reason: str, message: str, extra: dict[str, str] | None = None) -> None:
        body = status_body(code, reason, message)
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _serve(self) -> None:
        proxy = self.owner
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        watch = is_watch(self.path)
        content_type = self.headers.get("Content-Type", "")
        preconditioned = self.command == "PUT" or (
            self.command in ("PATCH", "DELETE")
            and ("json-patch" in content_type or b'"resourceVersion"' in (body or b""))
        )
        fault, param = proxy.decide(self.command, watch, preconditioned, self.path, body)
        retry_after: str | None = "1"
        if fault and fault.startswith("throttle_429:"):
            retry_after = proxy.rates.rules[int(fault.split(":")[1])].retry_after
            fault = "throttle_429"
        if fault == "latency":
            proxy.count(fault)
            proxy.wait(0.2 + 1.3 * param)
        elif fault == "delay":
            proxy.count(fault)
            proxy.wait(param)  # then forwarded below, late
        elif fault == "hang":
            proxy.count(fault)
            proxy.wait(param)  # decide() gave the hang's length
            self.close_connection = True  # no answer at all: the client sees the connection drop
            return
        elif fault == "conflict_409":
            proxy.count(fault)
            self._send_status(409, "Conflict", "injected: the object has been modified; please apply your changes")
            return
        elif fault == "throttle_429":
            proxy.count(fault)
            extra = {"Retry-After": retry_after} if retry_after is not None else {}
            self._send_status(429, "TooManyRequests", "injected: too many requests", extra)
            return
        elif fault == "error_500":
            proxy.count(fault)
            self._send_status(500, "InternalError", "injected: etcdserver: request timed out")
            return
        try:
            self._forward(body, watch, fault, param)
        except (OSError, http.client.HTTPException):
            self._drop_upstream()
            self.close_connection = True

    def _drop_upstream(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _forward(self, body: bytes | None, watch: bool, fault: str | None, param: float) -> None:
        proxy = self.owner
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP and k.lower() != "host"}
        if watch:
            conn = proxy.upstream.connect(timeout=3600)  # a watch gets its own connection: it is long
        else:
            if self._conn is None:
                self._conn = proxy.upstream.connect(timeout=60)
            conn = self._conn
        try:
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException):
            # A kept-alive upstream connection the apiserver closed: one fresh try.
            conn.close()
            conn = proxy.upstream.connect(timeout=3600 if watch else 60)
            if not watch:
                self._conn = conn
            conn.request(self.command, self.path, body=body, headers=headers)
            resp = conn.getresponse()
        if fault == "error_500_after_commit":
            resp.read()
            proxy.count(fault)
            self._send_status(500, "InternalError", "injected after commit: etcdserver: leader changed")
            return
        if fault == "exists_409_after_commit":
            resp.read()
            proxy.count(fault)
            self._send_status(409, "AlreadyExists", "injected after commit: the object already exists")
            return
        streamed = resp.getheader("Content-Length") is None and self.command != "HEAD"
        self.send_response(resp.status, resp.reason)
        for k, v in resp.getheaders():
            if k.lower() not in HOP_BY_HOP:
                self.send_header(k, v)
        if not streamed:
            data = resp.read()
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        cut = None
        if fault == "watch_cut":
            # Cut from a timer, so that a quiet watch is cut on time too: both sockets are shut, the
            # operator sees its stream end without the terminating chunk, as with a dropped connection.
            def cut_now() -> None:
                proxy.count("watch_cut")
                self.close_connection = True
                for sock in (conn.sock, self.connection):
                    with contextlib.suppress(OSError, AttributeError):
                        sock.shutdown(socket.SHUT_RDWR)

            cut = threading.Timer(1 + 9 * param, cut_now)
            cut.daemon = True
            cut.start()
        try:
            while True:
                chunk = resp.read1(65536)
                if not chunk:
                    break
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
        finally:
            if cut is not None:
                cut.cancel()
            if watch:
                conn.close()
