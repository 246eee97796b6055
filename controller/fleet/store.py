"""The fleet's consistent store: etcd v3 through its gRPC gateway (``etcd3gw``).

A node keeps the list of the cluster's client URLs and talks to one member at a
time; a member it cannot reach (connection refused or reset, a timeout, a 503
while the cluster has no leader) sends it to the next one, and the call is
retried there: endpoints + 1 attempts, 50 ms apart (tenacity, by error type).
While some member is up but leaderless (it answers 503 or lets the request time
out: the cluster is electing, ~1-2 s after a leader dies) the attempts go on for
up to ``ELECTION_WAIT_S`` (3 s) in all, so a routine election does not refuse a
change; a cluster whose every member refuses connections is told in ~150 ms.
What none of them answers is ``StoreUnavailable``; an answer that is an error
(a request etcd refuses, a lease it does not know) is ``StoreError`` and is never
retried: the same request would get the same answer. Members that refuse
connections are told in ~150 ms (the waits between attempts); members that
accept and never answer (frozen, partitioned behind a proxy) cost each
attempt its timeout, ``TIMEOUT_S`` (1 s): endpoints + 1 seconds in all.

Every write that decides something is a transaction, so a call retried after a
lost answer cannot do it twice: ``create`` compares the key's create revision
with 0 (it does not exist yet), ``delete_if_leased`` and ``move`` the key's
lease with the caller's. ``grant`` retried may leave one lease unused; it expires with its TTL.

etcd 3.4 (Debian 12's ``etcd-server``, 3.4.23) serves the gateway under both
``/v3/`` and the deprecated ``/v3beta/`` (gone in 3.5); this module asks ``/v3/``,
so the client never spends a request on discovering it.

Example::

    store = EtcdStore(["http://10.0.0.1:2379", "http://10.0.0.2:2379"])
    lease = store.grant(15)
    store.create("/reflexarc/pools/p/slots/0", "node-a", lease)   # True: it was free
    store.prefix("/reflexarc/pools/p/")    # [Entry(key, value, lease, created), ...] by key
    store.count("/reflexarc/nodes/")       # 1 with a node registered
    store.keepalive(lease)                 # the TTL left; 0 once the lease is gone
    store.requests                         # HTTP requests sent so far (the bench reads it)

Overhead: one HTTP request per call on a kept-alive connection (~1-3 ms on
loopback); each transaction is one raft round in etcd.
"""
from __future__ import annotations

import base64
import logging
import re
import threading
import urllib.parse
from dataclasses import dataclass

import requests
from etcd3gw import client as etcd_client
from etcd3gw import exceptions as etcd_errors
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_fixed

log = logging.getLogger("reflexarc.fleet.store")

API_PATH = "/v3/"        # etcd 3.4's gateway; /v3beta/ also answers there but is gone in 3.5
DEFAULT_PORT = 2379
RETRY_WAIT_S = 0.05
ELECTION_WAIT_S = 3.0    # how long a call waits out a cluster that is up but has no leader yet
LEASE_GONE = "lease not found"   # etcd's answer about a lease it no longer knows (expired, revoked)
TIMEOUT_S = 1.0          # one request; a member without a leader answers 503 within ~1 s itself, and a hung one
                         # costs endpoints + 1 of these before the refusal (bench/fleet.py measures it)


@dataclass(frozen=True)
class ClientTls:
    """How the node proves itself to an etcd that asks for client certificates
    (``--client-cert-auth``) and checks the members' certificates: ``ca`` the
    CA file the members' certificates are checked against (None: the system's
    store), ``cert`` and ``key`` the node's certificate and key (both, or neither)."""

    ca: str | None = None
    cert: str | None = None
    key: str | None = None


class StoreUnavailable(Exception):
    """No endpoint answered: every member refused, reset or timed out."""


class StoreError(Exception):
    """The store answered with an error (a refused request, an unknown lease)."""


class _Unreachable(Exception):
    """One endpoint did not answer; the call moves to the next one. ``listening``:
    something is there (a 503, a timeout), not a refused or reset connection."""

    def __init__(self, text: str, listening: bool) -> None:
        super().__init__(text)
        self.listening = listening


@dataclass(frozen=True)
class Entry:
    """A key under a prefix: its value, its lease (0: none), its create and its last modification revision."""

    key: str
    value: str
    lease: int
    created: int
    modified: int = 0


def parse_endpoint(text: str) -> tuple[str, str, int]:
    """``(protocol, host, port)`` of ``http://HOST:PORT``, ``https://...`` or
    ``HOST[:PORT]`` (port 2379); ValueError naming what is wrong."""
    text = text.strip()
    if not text:
        raise ValueError("an empty endpoint (two commas in a row, or one at an end)")
    parsed = urllib.parse.urlsplit(text if "://" in text else f"http://{text}")
    if parsed.scheme not in ("http", "https"):
        raise ValueError(f"{text}: not an http:// or https:// URL")
    if parsed.path not in ("", "/") or parsed.query or parsed.fragment or parsed.username:
        raise ValueError(f"{text}: an endpoint is SCHEME://HOST:PORT, nothing after it")
    try:
        port = parsed.port or DEFAULT_PORT
    except ValueError:
        raise ValueError(f"{text}: the port is not a number 1-65535") from None
    if not parsed.hostname:
        raise ValueError(f"{text}: no host")
    return parsed.scheme, parsed.hostname, port


def _why(exc: Exception) -> str:
    """A connection failure in a few words: ``[Errno 111] Connection refused``, ``read timeout``..."""
    text = exc.detail_text if isinstance(exc, etcd_errors.Etcd3Exception) and exc.detail_text else str(exc)
    errno = re.search(r"\[Errno -?\d+\][^'\")]*", text)
    if errno:
        return errno.group(0).strip()
    if "timed out" in text.lower():
        return "timed out"
    return text[:160]


def _tls_why(text: str) -> str:
    """A TLS failure in a few words: the certificate refused, or the handshake's alert."""
    refused = ("EOF occurred in violation of protocol", "SSLEOFError", "alert bad certificate",
               "alert certificate required", "alert unknown ca")
    if any(words in text for words in refused):       # how a member that refuses it ends the handshake varies
        return ("the member refused this node's client certificate: it asks for one its CA signed, and this "
                "node gave none or another (--fleet-cert, --fleet-key)")
    for pattern in (r"certificate verify failed: [^'\")(]*", r"tlsv1 alert [a-z ]+", r"sslv3 alert [a-z ]+",
                    r"No such file or directory[^'\")]*", r"PEM lib"):
        found = re.search(pattern, text)
        if found:
            return found.group(0).strip()
    return text[:200]


def _b64(data: str | bytes) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _text(data: str | None) -> str:
    return base64.b64decode(data or "").decode(errors="replace")


class EtcdStore:
    """One node's client of the etcd cluster at ``endpoints`` (URLs, see ``parse_endpoint``)."""

    def __init__(self, endpoints: list[str], timeout: float = TIMEOUT_S, tls: ClientTls | None = None) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint")
        self.endpoints = [parse_endpoint(e) for e in endpoints]
        if tls is not None and (tls.cert is None) != (tls.key is None):
            raise ValueError("a client certificate needs its key, and a key its certificate")
        if tls is not None and any(proto != "https" for proto, _, _ in self.endpoints):
            raise ValueError("TLS options with an http:// endpoint: give every endpoint as https://")
        tls = tls or ClientTls()
        # per request: a session's CA gives way to $REQUESTS_CA_BUNDLE (requests' merge of the environment)
        self._verify = {"verify": tls.ca} if tls.ca else {}
        self._clients = [etcd_client(host=host, port=port, protocol=proto, timeout=timeout, api_path=API_PATH,
                                     ca_cert=tls.ca, cert_cert=tls.cert, cert_key=tls.key)
                         for proto, host, port in self.endpoints]
        self._current = 0
        self._lock = threading.Lock()   # the member asked and the count; requests go out in parallel (the
                                        # loop's and the renewal thread's), on each member's pooled session
        self.requests = 0

    @property
    def endpoint(self) -> str:
        """The URL of the member asked now."""
        proto, host, port = self.endpoints[self._current]
        return f"{proto}://{host}:{port}"

    # --- one request, retried on another member ----------------------------------------
    def _post(self, path: str, payload: dict) -> dict:
        listening = False       # a member of this call's attempts was up (leaderless, or slow)

        def stop(state: RetryCallState) -> bool:
            nonlocal listening
            listening = listening or getattr(state.outcome.exception(), "listening", False)
            if state.attempt_number < len(self._clients) + 1:
                return False
            return not listening or state.seconds_since_start >= ELECTION_WAIT_S

        retrying = Retrying(stop=stop, wait=wait_fixed(RETRY_WAIT_S),
                            retry=retry_if_exception_type(_Unreachable), reraise=True)
        try:
            return retrying(self._once, path, payload)
        except _Unreachable as exc:
            raise StoreUnavailable(f"no etcd endpoint answers ({len(self._clients)} tried): {exc}") from None

    def _once(self, path: str, payload: dict) -> dict:
        with self._lock:
            index = self._current
            self.requests += 1
        cli = self._clients[index]
        where = "{}://{}:{}".format(*self.endpoints[index])
        try:
            return cli.post(cli.get_url(path), json=payload, **self._verify)
        except (etcd_errors.ConnectionFailedError, etcd_errors.ConnectionTimeoutError,
                requests.exceptions.RequestException) as exc:
            text = exc.detail_text or str(exc) if isinstance(exc, etcd_errors.Etcd3Exception) else str(exc)
            if isinstance(exc, requests.exceptions.SSLError) or "SSLError" in text:
                # the same handshake fails the same way (a certificate refused): not retried, not "unreachable"
                raise StoreError(f"{where}: TLS: {_tls_why(text)}") from None
            with self._lock:
                if self._current == index:      # not moved on already by another thread's failure
                    self._current = (index + 1) % len(self._clients)
            why = _why(exc)
            raise _Unreachable(f"{where}: {why}", listening=not why.startswith("[Errno")) from None
        except etcd_errors.Etcd3Exception as exc:
            raise StoreError(f"{where}: {exc.detail_text or exc}") from None
        except ValueError as exc:       # an answer that is not JSON
            raise StoreError(f"{where}: not an etcd answer: {exc}") from None
        except OSError as exc:          # a CA, certificate or key file that cannot be read
            raise StoreError(f"{where}: TLS: {exc}") from None

    # --- leases ---------------------------------------------------------------------------
    def grant(self, ttl: int) -> int:
        """A new lease of ``ttl`` seconds; its id."""
        return int(self._post("/lease/grant", {"TTL": int(ttl), "ID": 0})["ID"])

    def keepalive(self, lease: int) -> int:
        """Renew ``lease``; the TTL it has again, 0 when etcd no longer knows it
        (it expired: its keys are gone)."""
        result = self._post("/lease/keepalive", {"ID": lease}).get("result", {})
        return max(0, int(result.get("TTL", 0)))

    def revoke(self, lease: int) -> None:
        """End ``lease`` now: its keys go with it. A lease etcd no longer knows is not an error."""
        try:
            self._post("/kv/lease/revoke", {"ID": lease})
        except StoreError as exc:
            if LEASE_GONE not in str(exc):
                raise

    # --- keys -----------------------------------------------------------------------------
    def put(self, key: str, value: str, lease: int | None = None) -> None:
        """Write ``key`` (a key that exists keeps its create revision)."""
        payload = {"key": _b64(key), "value": _b64(value)}
        if lease:
            payload["lease"] = lease
        self._post("/kv/put", payload)

    def create(self, key: str, value: str, lease: int | None, and_delete: str | None = None) -> bool:
        """In one transaction: write ``key`` only if it does not exist (create
        revision 0), and then delete ``and_delete`` (absent or not); whether it did."""
        put = {"key": _b64(key), "value": _b64(value)}
        if lease:
            put["lease"] = lease
        success = [{"request_put": put}]
        if and_delete:
            success.append({"request_delete_range": {"key": _b64(and_delete)}})
        txn = {"compare": [{"key": _b64(key), "result": "EQUAL", "target": "CREATE", "create_revision": 0}],
               "success": success, "failure": []}
        return bool(self._post("/kv/txn", txn).get("succeeded", False))

    def delete_if_leased(self, key: str, lease: int) -> bool:
        """Delete ``key`` only while it is held by ``lease`` (a key another node
        wrote since is left alone); whether it did."""
        txn = {"compare": [{"key": _b64(key), "result": "EQUAL", "target": "LEASE", "lease": lease}],
               "success": [{"request_delete_range": {"key": _b64(key)}}], "failure": []}
        return bool(self._post("/kv/txn", txn).get("succeeded", False))

    def move(self, key: str, value: str, held_by: int, lease: int) -> bool:
        """Rewrite ``key`` with ``value`` under ``lease``, only while it is
        held by ``held_by`` (a key freed or taken since is left alone); whether
        it did."""
        txn = {"compare": [{"key": _b64(key), "result": "EQUAL", "target": "LEASE", "lease": held_by}],
               "success": [{"request_put": {"key": _b64(key), "value": _b64(value), "lease": lease}}],
               "failure": []}
        return bool(self._post("/kv/txn", txn).get("succeeded", False))

    def prefix(self, prefix: str) -> list[Entry]:
        """Every key under ``prefix``, by key."""
        result = self._post("/kv/range", {"key": _b64(prefix), "range_end": _b64(_end_of(prefix))})
        return [Entry(_text(kv.get("key")), _text(kv.get("value")), int(kv.get("lease", 0)),
                      int(kv.get("create_revision", 0)), int(kv.get("mod_revision", 0)))
                for kv in result.get("kvs", [])]

    def swap(self, key: str, modified: int, value: str, also: tuple[tuple[str, str, int | None], ...] = (),
             absent: tuple[str, ...] = (), clear: tuple[str, ...] = ()) -> bool:
        """In one transaction, only while ``key`` was last modified at revision
        ``modified`` (0: it does not exist) and the keys in ``absent`` do not
        exist: delete every key under the prefixes of ``clear``, write ``key``
        and each ``(key, value, lease)`` of ``also``; whether it did. A
        compare-and-swap: two writers that read the same revision cannot both
        succeed."""
        compare = [{"key": _b64(key), "result": "EQUAL", "target": "MOD", "mod_revision": modified}]
        compare += [{"key": _b64(k), "result": "EQUAL", "target": "CREATE", "create_revision": 0} for k in absent]
        success = [{"request_delete_range": {"key": _b64(p), "range_end": _b64(_end_of(p))}} for p in clear]
        success.append({"request_put": {"key": _b64(key), "value": _b64(value)}})
        for k, v, lease in also:
            put = {"key": _b64(k), "value": _b64(v)}
            if lease:
                put["lease"] = lease
            success.append({"request_put": put})
        txn = {"compare": compare, "success": success, "failure": []}
        return bool(self._post("/kv/txn", txn).get("succeeded", False))

    def delete_prefix(self, prefix: str) -> int:
        """Delete every key under ``prefix``; how many there were."""
        result = self._post("/kv/deleterange", {"key": _b64(prefix), "range_end": _b64(_end_of(prefix))})
        return int(result.get("deleted", 0))

    def count(self, prefix: str) -> int:
        """How many keys are under ``prefix``."""
        result = self._post("/kv/range", {"key": _b64(prefix), "range_end": _b64(_end_of(prefix)),
                                          "count_only": True})
        return int(result.get("count", 0))

    def close(self) -> None:
        for cli in self._clients:
            cli.session.close()


def _end_of(prefix: str) -> bytes:
    """The range end that covers every key starting with ``prefix``."""
    data = bytearray(prefix.encode())
    while data and data[-1] == 0xFF:
        data.pop()
    if not data:
        return b"\0"
    data[-1] += 1
    return bytes(data)
