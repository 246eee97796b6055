"""The PromQL source: signals from the cluster's Prometheus, for what no probe on
this node can see (GPU utilisation from dcgm-exporter, a rank's step time
against its whole job's).

Every ``interval`` of the controller's clock (15 s by default, not every tick)
``poll`` asks a worker thread for a round: each query of the configuration
(``promql_config.py``) is evaluated with ``GET {prometheus}/api/v1/query`` and
each sample of its result vector becomes a sample of the query's signal. Its
labels are the result's labels the query maps (``labels: {signal label: result
label}``; the others are dropped) and ``node``, this node's name, unless mapped.
A poll hands over the samples of the last round that finished and never waits
for Prometheus, so an outage cannot hold up the loop, its rules or a SIGTERM.

Bounds, whatever the server does:

- ``timeout`` is the deadline of one request as a whole, on the monotonic
  clock: connecting (every address of the name, TLS included), sending, the
  status line, the headers and the body, redirects too. Before each read the
  socket's timeout is set to the time left, so a server that trickles its reply
  a byte at a time or accepts and never answers is given up at the deadline
  (``timeout``). Only resolving the host name is left to the resolver's own
  timeouts;
- a reply body is at most ``MAX_REPLY`` bytes (a larger one is ``bad_reply``,
  refused by its Content-Length before it is read where it declares one);
- a reply that is not JSON, or nested deeper than the parser's recursion limit,
  is ``bad_reply``, as is a result whose samples are unreadable (a label value
  that is not a string, a value that is not a number);
- a value its signal's unit cannot have (``values.value_fault``, the rule the
  intake applies: NaN, infinities, a negative duration or percentage, a ratio
  above 1) is ``out_of_range``: that sample is dropped, the query's other
  samples are kept;
- the text a server puts in an error (its reason, ``error``, ``errorType``) is
  kept to ``MAX_MESSAGE`` printable characters on one line.

Failures are typed (``Failure``): a connection refused, reset or not made in
time (``unreachable``) and HTTP 5xx/429 (``server_error``) are retried with
tenacity, ``attempts`` in all with exponential backoff, then reported; a reply
not complete by the deadline (``timeout``), a query Prometheus refuses (HTTP
4xx: ``bad_query``), a result that is no instant vector (``not_a_vector``), a
reply that is not Prometheus's (``bad_reply``), two samples the mapping makes
one series (``duplicate_series``) and values out of range (``out_of_range``)
are never retried. Each is counted in
``reflexarc_promql_errors_total{signal,kind}`` every round it happens
(retries in ``reflexarc_promql_retries_total``) and logged once per query and
kind until that query works again; the query's signal gets no sample that
round (its rules see the data age) and the other queries go on. Once
Prometheus is unreachable, the rest of the round is counted so without trying;
a timeout is the query's own, and the next query is tried. A round therefore
ends within about ``queries x attempts x (timeout + backoff)``; a round that
runs past that bound (a resolver that never answers) is logged once by
``poll``, which still never waits for it.

``check_queries`` asks Prometheus once for each query when the configuration
is loaded (``reflexarc validate|run --promql-config``), under the same bounds:
a query it refuses, whose result is no vector, or a reply that is not
Prometheus's is an error there, located at the query; a server that does not
answer in time is a warning, and the queries after it are not asked.

Example::

    checked = load_checked("promql.yaml")        # Checked(config, diagnostics)
    src = PromqlSource(checked.config, registry=metrics.registry)
    src.poll(now)      # [("gpu_utilization_pct", {"node": "gpu-node-07", "gpu": "0"}, 87.0), ...]
    src.close()

Overhead: per interval, one HTTP request per query on the worker thread
(Prometheus answers an instant query of one node's series in ~1-5 ms; the
deadline costs a clock read and a ``settimeout`` per read of 64 KiB); a poll
takes a lock, swaps a list and reads the clock.
"""
from __future__ import annotations

import functools
import http.client
import io
import json
import logging
import math
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from enum import StrEnum
from typing import NamedTuple

from prometheus_client import CollectorRegistry, Counter
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, stop_when_event_set, wait_exponential

from reflexarc.core.diagnostics import Diagnostic

from ..signals.catalogue import CATALOGUE
from ..signals.values import value_fault
from .promql_config import PromqlConfig, PromqlConfigError, Query, load_config

log = logging.getLogger("reflexarc.promql")

MAX_REPLY = 8 << 20           # bytes of one reply body; a larger one is a bad reply
READ_CHUNK = 64 << 10         # bytes asked of the socket per read of a reply body
MAX_ERROR_BODY = 64 << 10     # bytes of an HTTP error reply read for Prometheus's own words
MAX_MESSAGE = 500             # characters of a failure's message (a server's words included)
LOGGED_LIMIT = 4096           # (query, kind) pairs remembered for logging once


class Kind(StrEnum):
    UNREACHABLE = "unreachable"            # refused, reset, no connection in time, no route: retried
    SERVER_ERROR = "server_error"          # HTTP 5xx or 429: retried
    TIMEOUT = "timeout"                    # connected, but the reply was not complete by the deadline
    BAD_QUERY = "bad_query"                # HTTP 4xx: Prometheus refuses the query
    NOT_A_VECTOR = "not_a_vector"          # a matrix, scalar or string
    BAD_REPLY = "bad_reply"                # not Prometheus's JSON, too large or too deeply nested
    DUPLICATE_SERIES = "duplicate_series"  # the label mapping folds two result series into one
    OUT_OF_RANGE = "out_of_range"          # a value its signal's unit cannot have (values.py)


RETRIED = frozenset({Kind.UNREACHABLE, Kind.SERVER_ERROR})


class Failure(NamedTuple):
    signal: str
    kind: Kind
    message: str


class Round(NamedTuple):
    """What one pass over the queries gave: samples, and each query's failure."""
    samples: list[tuple[str, dict, float]]
    failures: list[Failure]


class QueryError(Exception):
    def __init__(self, kind: Kind, message: str) -> None:
        self.kind, self.message = kind, _clean(message)
        super().__init__(f"{kind}: {self.message}")


def _clean(text: str) -> str:
    """``text`` on one line of printable characters, at most ``MAX_MESSAGE`` of them."""
    text = "".join(c if c.isprintable() else " " for c in str(text)[:MAX_MESSAGE + 1])
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[:MAX_MESSAGE - 3] + "..."


def _words(value) -> str:
    """A field of a server's JSON as text: a string as it is, anything else by its type."""
    return value if isinstance(value, str) else f"<{type(value).__name__}>"


# --- one request, held to one deadline -----------------------------------------------------
class _Deadline:
    """``seconds`` from now on the monotonic clock; ``left`` raises TimeoutError
    once it has passed."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def left(self) -> float:
        left = self.at - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"the {self.seconds:g}s deadline passed")
        return left


class _DeadlineReader(io.RawIOBase):
    """A socket's reads, each given only the time left before the deadline."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        super().__init__()
        self._sock, self._deadline = sock, deadline
        self._raw = sock.makefile("rb", buffering=0)     # holds the socket open until closed, as makefile does

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int | None:
        self._sock.settimeout(self._deadline.left())
        return self._raw.readinto(buffer)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _Timed:
    """What ``http.client.HTTPResponse`` reads a reply from: the socket, through a ``_DeadlineReader``."""

    def __init__(self, sock: socket.socket, deadline: _Deadline) -> None:
        self._sock, self._deadline = sock, deadline

    def makefile(self, mode: str = "rb", *args, **kwargs) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))


class _Bounded:
    """An ``http.client`` connection held to a deadline: connecting, sending and
    each read of a reply (a proxy's CONNECT reply included) get the time left."""

    def __init__(self, *args, deadline: _Deadline, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.deadline = deadline
        self._create_connection = self._open_socket

    def _open_socket(self, address, timeout=None, source_address=None) -> socket.socket:
        """``socket.create_connection``, every address of the name sharing the one deadline."""
        host, port = address
        error: OSError | None = None
        for family, kind, proto, _, sockaddr in socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM):
            left = self.deadline.left()
            sock = socket.socket(family, kind, proto)
            try:
                sock.settimeout(left)
                if source_address:
                    sock.bind(source_address)
                sock.connect(sockaddr)
                sock.settimeout(self.deadline.left())      # the TLS handshake, if any, gets what is left
                return sock
            except OSError as exc:
                sock.close()
                error = exc
        raise error if error is not None else OSError(f"no address for {host}")

    def connect(self) -> None:
        self.timeout = self.deadline.left()
        super().connect()

    def send(self, data) -> None:
        if self.sock is not None:
            self.sock.settimeout(self.deadline.left())
        super().send(data)

    def response_class(self, sock, *args, **kwargs) -> http.client.HTTPResponse:
        return http.client.HTTPResponse(_Timed(sock, self.deadline), *args, **kwargs)


class _HTTPConnection(_Bounded, http.client.HTTPConnection):
    pass


class _HTTPSConnection(_Bounded, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req):
        return self.do_open(functools.partial(_HTTPConnection, deadline=self.deadline), req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: _Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req):
        return self.do_open(functools.partial(_HTTPSConnection, deadline=self.deadline), req,
                            context=self._context)


def _get(url: str, timeout: float) -> bytes:
    """The body of ``GET url``, all of it (redirects included) within ``timeout``
    seconds and ``MAX_REPLY`` bytes. urllib's errors and TimeoutError otherwise:
    a URLError when no connection was made (in time), a bare TimeoutError when
    one was but the reply was not complete by the deadline."""
    deadline = _Deadline(timeout)
    opener = urllib.request.build_opener(_HTTPHandler(deadline), _HTTPSHandler(deadline))
    with opener.open(url, timeout=deadline.left()) as response:
        declared = (response.headers.get("Content-Length") or "").strip()
        if declared.isdigit() and int(declared) > MAX_REPLY:
            raise QueryError(Kind.BAD_REPLY, f"the reply is larger than {MAX_REPLY} bytes "
                                             f"(Content-Length {declared[:20]})")
        chunks, size = [], 0
        while True:
            deadline.left()
            chunk = response.read(READ_CHUNK)
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_REPLY:
                raise QueryError(Kind.BAD_REPLY, f"the reply is larger than {MAX_REPLY} bytes")
            chunks.append(chunk)


def instant_query(url: str, expr: str, timeout: float) -> list[dict]:
    """The result vector of ``expr`` evaluated now (``[{"metric": {...}, "value": [ts, "v"]}, ...]``),
    within ``timeout`` seconds in all; QueryError otherwise, its kind saying
    whether another attempt could help."""
    # the API reads a timeout as float seconds ("0.9"; "0.9s" would be refused)
    request = f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "timeout": f"{timeout:g}"})
    try:
        body = _get(request, timeout)
    except urllib.error.HTTPError as exc:
        detail = _error_text(exc)
        if exc.code >= 500 or exc.code == 429:
            raise QueryError(Kind.SERVER_ERROR, f"HTTP {exc.code}: {detail}") from None
        if exc.code < 400:                          # a redirect not followed (a loop, or to another scheme)
            raise QueryError(Kind.BAD_REPLY, f"HTTP {exc.code}: {detail}") from None
        raise QueryError(Kind.BAD_QUERY, f"HTTP {exc.code}: {detail}") from None
    except urllib.error.URLError as exc:
        reason = getattr(exc, "reason", exc)
        if isinstance(reason, TimeoutError):
            raise QueryError(Kind.UNREACHABLE, f"no connection within {timeout:g}s") from None
        raise QueryError(Kind.UNREACHABLE, str(reason)) from None
    except TimeoutError:
        raise QueryError(Kind.TIMEOUT, f"no complete reply within {timeout:g}s") from None
    except (http.client.RemoteDisconnected, http.client.IncompleteRead) as exc:   # closed mid-reply
        raise QueryError(Kind.UNREACHABLE, f"{type(exc).__name__}: {exc}") from None
    except http.client.HTTPException as exc:        # a status line or headers that are not HTTP's
        raise QueryError(Kind.BAD_REPLY, f"not an HTTP reply ({type(exc).__name__}: {exc})") from None
    except OSError as exc:                          # resets while reading
        raise QueryError(Kind.UNREACHABLE, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
    try:
        reply = json.loads(body)
    except RecursionError:
        raise QueryError(Kind.BAD_REPLY, "not a Prometheus query reply (JSON nested too deeply)") from None
    except ValueError as exc:
        raise QueryError(Kind.BAD_REPLY, f"not a Prometheus query reply ({type(exc).__name__}: {exc})") from None
    try:
        status, data = reply["status"], reply.get("data")
        if status != "success":
            raise QueryError(Kind.BAD_QUERY, f"{_words(reply.get('errorType', 'error'))}: "
                                             f"{_words(reply.get('error', ''))}")
        kind, result = data["resultType"], data["result"]
    except (KeyError, TypeError, AttributeError) as exc:
        raise QueryError(Kind.BAD_REPLY, f"not a Prometheus query reply ({type(exc).__name__}: {exc})") from None
    if not isinstance(kind, str):
        raise QueryError(Kind.BAD_REPLY, "not a Prometheus query reply (resultType is not a string)")
    if kind != "vector":
        raise QueryError(Kind.NOT_A_VECTOR, f"the result is a {kind}, not an instant vector")
    if not isinstance(result, list):
        raise QueryError(Kind.BAD_REPLY, "the result vector is not a list")
    return result


def _error_text(exc: urllib.error.HTTPError) -> str:
    """Prometheus's own words for an error reply, else the HTTP reason."""
    try:
        reply = json.loads(exc.read(MAX_ERROR_BODY))
        return f"{_words(reply.get('errorType', 'error'))}: {_words(reply.get('error', ''))}"
    except (ValueError, OSError, AttributeError, RecursionError, http.client.HTTPException):
        return _words(exc.reason)
    finally:
        exc.close()


def read_samples(query: Query, node: str, result: list[dict]) -> tuple[list[tuple[str, dict, float]], str, str]:
    """The signal's samples of a result vector; what the mapping folded (the
    first such series, or ""); the values out of their unit's range (or "").
    QueryError (``bad_reply``) when a sample cannot be read."""
    spec = CATALOGUE[query.signal]
    base = {"node": node} if "node" in spec.labels else {}
    out, seen, folded, refused, first_refused = [], set(), "", 0, ""
    try:
        for item in result:
            metric = item.get("metric") or {}
            if not isinstance(metric, dict):
                raise TypeError("'metric' is not an object")
            labels = dict(base)
            for label, source in query.labels.items():
                if source in metric:
                    if not isinstance(metric[source], str):
                        raise TypeError(f"label '{source}' is not a string")
                    labels[label] = metric[source]
            value = float(item["value"][1])
            key = tuple(sorted(labels.items()))
            if key in seen:
                folded = folded or (f"result series {_series(metric)} maps onto {_series(labels)} as another "
                                    "does: aggregate by the mapped labels in the query")
                continue
            seen.add(key)
            fault = value_fault(query.signal, value)
            if fault is not None:
                refused += 1
                first_refused = first_refused or f"{_series(labels)} = {value:g} ({fault})"
                continue
            out.append((query.signal, labels, value))
    except (AttributeError, KeyError, IndexError, TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise QueryError(Kind.BAD_REPLY, f"a sample of the result is unreadable ({type(exc).__name__}: "
                                         f"{exc})") from None
    out_of_range = (f"{refused} value(s) out of range for unit '{spec.unit}' of {query.signal}, dropped; "
                    f"the first: {first_refused}") if refused else ""
    return out, folded, out_of_range


def _series(labels: dict) -> str:
    return "{" + ",".join(f'{k}="{_words(v)}"' for k, v in sorted(labels.items())) + "}"


class _Retry(Exception):
    def __init__(self, error: QueryError) -> None:
        self.error = error


class PromqlSource:
    """Rounds of the configuration's queries on a worker thread, paced by ``poll``'s ``now``."""

    name = "promql"

    def __init__(self, config: PromqlConfig, registry: CollectorRegistry | None = None, attempts: int = 3,
                 backoff: float = 0.5) -> None:
        self.config = config
        self.attempts, self.backoff = attempts, backoff
        registry = registry if registry is not None else CollectorRegistry()
        self.errors = Counter("reflexarc_promql_errors_total", "PromQL queries that gave no samples, by kind",
                              ["signal", "kind"], registry=registry)
        self.retries = Counter("reflexarc_promql_retries_total",
                               "PromQL requests tried again after a failure worth retrying", ["kind"],
                               registry=registry)
        self._stop = threading.Event()
        self._wanted = threading.Event()
        self._lock = threading.Lock()
        self._ready: list[tuple[str, dict, float]] = []
        self._asked = -math.inf
        self._thread: threading.Thread | None = None
        self._logged: set[tuple[int, Kind]] = set()
        self._round_error = ""
        # the longest a round can take: every query tried ``attempts`` times to its deadline, with backoff
        self.round_bound = len(config.queries) * attempts * (config.timeout + backoff * 8) + config.timeout
        self._started: float | None = None       # monotonic start of the round in flight
        self._stall_logged = False

    # --- the live loop's side ------------------------------------------------------------
    def poll(self, now: float) -> list[tuple[str, dict, float]]:
        """The samples of the last round that finished since the previous poll;
        asks for a new round once ``interval`` has passed since the last one was asked."""
        if now - self._asked >= self.config.interval:
            self._asked = now
            if self._thread is None:
                self._thread = threading.Thread(target=self._work, name="reflexarc-promql", daemon=True)
                self._thread.start()
            self._wanted.set()
        started = self._started
        if started is not None and not self._stall_logged and time.monotonic() - started > self.round_bound:
            self._stall_logged = True
            log.warning("a PromQL round against %s has run for over %gs (its bound): the PromQL signals are "
                        "not refreshed until it ends", self.config.url, self.round_bound)
        with self._lock:
            samples, self._ready = self._ready, []
        return samples

    def close(self) -> None:
        self._stop.set()
        self._wanted.set()
        if self._thread is not None:
            # a round in flight is abandoned, not awaited: its request ends at its deadline
            # (the thread is a daemon; it publishes nothing more)
            self._thread.join(timeout=0.2)

    def _work(self) -> None:
        while True:
            self._wanted.wait()
            if self._stop.is_set():
                return
            self._wanted.clear()
            self._started = time.monotonic()
            try:
                result = self.evaluate()
            except Exception as exc:    # noqa: BLE001 - a bug here must not end the source silently
                if repr(exc) != self._round_error:       # logged once, not every round
                    self._round_error = repr(exc)
                    log.exception("PromQL round failed; the next round tries again")
                continue
            finally:
                self._started, self._stall_logged = None, False
            self._round_error = ""
            with self._lock:
                self._ready = result.samples

    # --- one round ------------------------------------------------------------------------
    def evaluate(self) -> Round:
        """One pass over every query, now, on the calling thread; failures are
        counted and logged (once per query and kind) before they are returned."""
        samples: list[tuple[str, dict, float]] = []
        failures: list[Failure] = []
        down: QueryError | None = None
        for index, query in enumerate(self.config.queries):
            if self._stop.is_set():          # closing: the rest of the round would only delay it
                break
            if down is not None:
                failures.append(self._failed(index, Failure(query.signal, down.kind, f"not tried: {down.message}")))
                continue
            try:
                got, folded, out_of_range = read_samples(query, self.config.node, self._query(query.expr))
            except QueryError as exc:
                down = exc if exc.kind is Kind.UNREACHABLE else None
                failures.append(self._failed(index, Failure(query.signal, exc.kind, exc.message)))
                continue
            samples += got
            found = [Failure(query.signal, kind, message) for kind, message in
                     ((Kind.DUPLICATE_SERIES, folded), (Kind.OUT_OF_RANGE, out_of_range)) if message]
            failures += [self._failed(index, failure) for failure in found]
            if not found:
                self._worked(index, query.signal)
        return Round(samples, failures)

    def _query(self, expr: str) -> list[dict]:
        def attempt() -> list[dict]:
            try:
                return instant_query(self.config.url, expr, self.config.timeout)
            except QueryError as exc:
                if exc.kind in RETRIED:
                    raise _Retry(exc) from None
                raise

        retrying = Retrying(stop=stop_after_attempt(self.attempts) | stop_when_event_set(self._stop),
                            wait=wait_exponential(multiplier=self.backoff, max=self.backoff * 8),
                            retry=retry_if_exception_type(_Retry), reraise=True, sleep=self._stop.wait,
                            before_sleep=lambda state: self.retries.labels(state.outcome.exception().error.kind).inc())
        try:
            return retrying(attempt)
        except _Retry as exc:
            error = exc.error
            raise QueryError(error.kind, f"{error.message} (gave up after {self.attempts} attempts)") from None

    def _failed(self, index: int, failure: Failure) -> Failure:
        failure = failure._replace(message=_clean(failure.message))
        self.errors.labels(failure.signal, failure.kind).inc()
        if (index, failure.kind) not in self._logged:
            if len(self._logged) >= LOGGED_LIMIT:
                self._logged.clear()
            self._logged.add((index, failure.kind))
            log.warning("PromQL query for %s against %s failed (%s): %s", failure.signal, self.config.url,
                        failure.kind, failure.message)
        return failure

    def _worked(self, index: int, signal: str) -> None:
        cleared = {key for key in self._logged if key[0] == index}
        if cleared:
            self._logged -= cleared
            log.warning("PromQL query for %s against %s works again", signal, self.config.url)


# --- at load ----------------------------------------------------------------------------
class Checked(NamedTuple):
    config: PromqlConfig | None          # None without a file, or when it has errors
    diagnostics: list[Diagnostic]


_LOAD_ERRORS = {Kind.BAD_QUERY: "Prometheus refuses the query", Kind.NOT_A_VECTOR: "the query is not usable"}


def check_queries(config: PromqlConfig) -> list[Diagnostic]:
    """What Prometheus says of each query, asked once under the source's bounds:
    errors for a query it refuses, a result that is no vector or a server that
    is not Prometheus; a warning when it cannot be reached or does not answer
    in time (the source keeps trying at run time), or when the query's values
    are out of range now; a note for a query that matches no series now."""
    out = []
    for query in config.queries:
        loc = query.loc
        try:
            result = instant_query(config.url, query.expr, config.timeout)
            _, _, out_of_range = read_samples(query, config.node, result)
        except QueryError as exc:
            if exc.kind in RETRIED or exc.kind is Kind.TIMEOUT:
                out.append(Diagnostic(loc.file, loc.line, loc.col, "warning",
                                      f"the queries are not checked: {config.url} did not answer ({exc.message}); "
                                      f"the source keeps trying every {config.interval:g}s"))
                break
            words = _LOAD_ERRORS.get(exc.kind, f"{config.url} does not answer like Prometheus")
            out.append(Diagnostic(loc.file, loc.line, loc.col, "error", f"{words}: {exc.message}"))
            continue
        if out_of_range:
            out.append(Diagnostic(loc.file, loc.line, loc.col, "warning",
                                  f"the query gives {_clean(out_of_range)} (at {config.url})"))
        if not result:
            out.append(Diagnostic(loc.file, loc.line, loc.col, "note",
                                  f"the query matches no series now (at {config.url}); '{query.signal}' gets "
                                  f"samples once it does"))
    return out


def load_checked(path: str | None) -> Checked:
    """The configuration ``--promql-config`` names, checked (``check_queries``)
    when it loads; ``Checked(None, [])`` without a path."""
    if not path:
        return Checked(None, [])
    try:
        config = load_config(path)
    except PromqlConfigError as exc:
        return Checked(None, exc.diagnostics)
    findings = check_queries(config)
    return Checked(None if any(d.is_error for d in findings) else config, findings)
