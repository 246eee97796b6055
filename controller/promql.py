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

Failures are typed (``Failure``): a connection refused or reset, a timeout
(``unreachable``) and HTTP 5xx/429 (``server_error``) are retried with tenacity,
``attempts`` in all with exponential backoff, then reported; a query
Prometheus refuses (HTTP 4xx: ``bad_query``), a result that is no instant
vector (``not_a_vector``), a reply that is not Prometheus's (``bad_reply``) or
two samples the mapping makes one series (``duplicate_series``) are never
retried. Each is counted in ``reflexarc_promql_errors_total{signal,kind}``
(retries in ``reflexarc_promql_retries_total``) and logged once per distinct
error until the query works again; the query's signal gets no sample that
round (its rules see the data age) and the other queries go on. Once
Prometheus is unreachable, the rest of the round is counted so without trying.

``check_queries`` asks Prometheus once for each query when the configuration
is loaded (``reflexarc validate|run --promql-config``): a query it refuses or
whose result is no vector is an error there, located at the query.

Example::

    checked = load_checked("promql.yaml")        # Checked(config, diagnostics)
    src = PromqlSource(checked.config, registry=metrics.registry)
    src.poll(now)      # [("gpu_utilization_pct", {"node": "gpu-node-07", "gpu": "0"}, 87.0), ...]
    src.close()

Overhead: per interval, one HTTP request per query on the worker thread
(Prometheus answers an instant query of one node's series in ~1-5 ms); a poll
takes a lock and swaps a list.
"""
from __future__ import annotations

import http.client
import json
import logging
import math
import threading
import urllib.error
import urllib.parse
import urllib.request
from enum import StrEnum
from typing import Callable, NamedTuple

from prometheus_client import CollectorRegistry, Counter
from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, stop_when_event_set, wait_exponential

from .policy.diagnostics import Diagnostic
from .promql_config import PromqlConfig, PromqlConfigError, Query, load_config
from .signals import CATALOGUE

log = logging.getLogger("reflexarc.promql")

MAX_REPLY = 16 << 20          # bytes of one reply; a larger one is a bad reply
LOGGED_LIMIT = 4096           # distinct errors remembered for logging once


class Kind(StrEnum):
    UNREACHABLE = "unreachable"            # refused, reset, timed out, no route: retried
    SERVER_ERROR = "server_error"          # HTTP 5xx or 429: retried
    BAD_QUERY = "bad_query"                # HTTP 4xx: Prometheus refuses the query
    NOT_A_VECTOR = "not_a_vector"          # a matrix, scalar or string
    BAD_REPLY = "bad_reply"                # not Prometheus's JSON
    DUPLICATE_SERIES = "duplicate_series"  # the label mapping folds two result series into one


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
        self.kind, self.message = kind, message
        super().__init__(f"{kind}: {message}")


def instant_query(url: str, expr: str, timeout: float, opener: Callable = urllib.request.urlopen) -> list[dict]:
    """The result vector of ``expr`` evaluated now (``[{"metric": {...}, "value": [ts, "v"]}, ...]``);
    QueryError otherwise, its kind saying whether another attempt could help."""
    # the API reads a timeout as float seconds ("0.9"; "0.9s" would be refused)
    request = f"{url}/api/v1/query?" + urllib.parse.urlencode({"query": expr, "timeout": f"{timeout:g}"})
    try:
        with opener(request, timeout=timeout) as response:
            body = response.read(MAX_REPLY + 1)
    except urllib.error.HTTPError as exc:
        detail = _error_text(exc)
        if exc.code >= 500 or exc.code == 429:
            raise QueryError(Kind.SERVER_ERROR, f"HTTP {exc.code}: {detail}") from None
        raise QueryError(Kind.BAD_QUERY, f"HTTP {exc.code}: {detail}") from None
    except urllib.error.URLError as exc:
        raise QueryError(Kind.UNREACHABLE, str(getattr(exc, "reason", exc))) from None
    except (OSError, http.client.HTTPException) as exc:     # timeouts and resets while reading
        raise QueryError(Kind.UNREACHABLE, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None
    if len(body) > MAX_REPLY:
        raise QueryError(Kind.BAD_REPLY, f"the reply is larger than {MAX_REPLY} bytes")
    try:
        reply = json.loads(body)
        status, data = reply["status"], reply.get("data")
        if status != "success":
            raise QueryError(Kind.BAD_QUERY, f"{reply.get('errorType', 'error')}: {reply.get('error', '')}")
        kind, result = data["resultType"], data["result"]
    except (ValueError, KeyError, TypeError) as exc:
        raise QueryError(Kind.BAD_REPLY, f"not a Prometheus query reply ({type(exc).__name__}: {exc})") from None
    if kind != "vector":
        raise QueryError(Kind.NOT_A_VECTOR, f"the result is a {kind}, not an instant vector")
    if not isinstance(result, list):
        raise QueryError(Kind.BAD_REPLY, "the result vector is not a list")
    return result


def _error_text(exc: urllib.error.HTTPError) -> str:
    """Prometheus's own words for an error reply, else the HTTP reason."""
    try:
        reply = json.loads(exc.read(64 << 10))
        return f"{reply.get('errorType', 'error')}: {reply.get('error', '')}"
    except (ValueError, OSError, AttributeError):
        return str(exc.reason)
    finally:
        exc.close()


class _Retry(Exception):
    def __init__(self, error: QueryError) -> None:
        self.error = error


class PromqlSource:
    """Rounds of the configuration's queries on a worker thread, paced by
    ``poll``'s ``now``; ``opener`` (``urllib.request.urlopen``) injectable."""

    name = "promql"

    def __init__(self, config: PromqlConfig, registry: CollectorRegistry | None = None, attempts: int = 3,
                 backoff: float = 0.5, opener: Callable = urllib.request.urlopen) -> None:
        self.config = config
        self.attempts, self.backoff, self.opener = attempts, backoff, opener
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
        self._logged: set[Failure] = set()

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
        with self._lock:
            samples, self._ready = self._ready, []
        return samples

    def close(self) -> None:
        self._stop.set()
        self._wanted.set()
        if self._thread is not None:
            # a round in flight is abandoned, not awaited: shutdown must not wait
            # for a hanging Prometheus (the thread is a daemon; it publishes nothing more)
            self._thread.join(timeout=0.2)

    def _work(self) -> None:
        while True:
            self._wanted.wait()
            if self._stop.is_set():
                return
            self._wanted.clear()
            try:
                result = self.evaluate()
            except Exception:    # noqa: BLE001 - a bug here must not end the source silently
                log.exception("PromQL round failed; the next round tries again")
                continue
            with self._lock:
                self._ready = result.samples

    # --- one round ------------------------------------------------------------------------
    def evaluate(self) -> Round:
        """One pass over every query, now, on the calling thread; failures are
        counted and logged (once per distinct error) before they are returned."""
        samples: list[tuple[str, dict, float]] = []
        failures: list[Failure] = []
        down: QueryError | None = None
        for query in self.config.queries:
            if self._stop.is_set():          # closing: the rest of the round would only delay it
                break
            if down is not None:
                failures.append(self._failed(Failure(query.signal, down.kind, f"not tried: {down.message}")))
                continue
            try:
                got, duplicate = self._samples(query, self._query(query.expr))
            except QueryError as exc:
                down = exc if exc.kind is Kind.UNREACHABLE else None
                failures.append(self._failed(Failure(query.signal, exc.kind, exc.message)))
                continue
            samples += got
            if duplicate:
                failures.append(self._failed(Failure(query.signal, Kind.DUPLICATE_SERIES, duplicate)))
            else:
                self._worked(query.signal)
        return Round(samples, failures)

    def _query(self, expr: str) -> list[dict]:
        def attempt() -> list[dict]:
            try:
                return instant_query(self.config.url, expr, self.config.timeout, self.opener)
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

    def _samples(self, query: Query, result: list[dict]) -> tuple[list[tuple[str, dict, float]], str]:
        """The signal's samples of a result vector, and what was folded, if anything."""
        spec = CATALOGUE[query.signal]
        base = {"node": self.config.node} if "node" in spec.labels else {}
        out, seen, folded = [], set(), ""
        try:
            for item in result:
                metric = item.get("metric") or {}
                labels = dict(base)
                labels.update({label: str(metric[source]) for label, source in query.labels.items()
                               if source in metric})
                key = tuple(sorted(labels.items()))
                if key in seen:
                    folded = folded or (f"result series {_series(metric)} maps onto {_series(labels)} as another "
                                        "does: aggregate by the mapped labels in the query")
                    continue
                seen.add(key)
                out.append((query.signal, labels, float(item["value"][1])))
        except (AttributeError, KeyError, IndexError, TypeError, ValueError) as exc:
            raise QueryError(Kind.BAD_REPLY, f"a sample of the result is unreadable ({type(exc).__name__}: "
                                             f"{exc})") from None
        return out, folded

    def _failed(self, failure: Failure) -> Failure:
        self.errors.labels(failure.signal, failure.kind).inc()
        if failure not in self._logged:
            if len(self._logged) >= LOGGED_LIMIT:
                self._logged.clear()
            self._logged.add(failure)
            log.warning("PromQL query for %s against %s failed (%s): %s", failure.signal, self.config.url,
                        failure.kind, failure.message)
        return failure

    def _worked(self, signal: str) -> None:
        cleared = {f for f in self._logged if f.signal == signal}
        if cleared:
            self._logged -= cleared
            log.warning("PromQL query for %s against %s works again", signal, self.config.url)


def _series(labels: dict) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"


# --- at load ----------------------------------------------------------------------------
class Checked(NamedTuple):
    config: PromqlConfig | None          # None without a file, or when it has errors
    diagnostics: list[Diagnostic]


def check_queries(config: PromqlConfig, opener: Callable = urllib.request.urlopen) -> list[Diagnostic]:
    """What Prometheus says of each query, asked once: errors for a query it
    refuses, a result that is no vector or a server that is not Prometheus; a
    warning when it cannot be reached (the source keeps trying at run time);
    a note for a query that matches no series now."""
    out = []
    for query in config.queries:
        loc = query.loc
        try:
            result = instant_query(config.url, query.expr, config.timeout, opener)
        except QueryError as exc:
            if exc.kind in RETRIED:
                out.append(Diagnostic(loc.file, loc.line, loc.col, "warning",
                                      f"the queries are not checked: {config.url} did not answer ({exc.message}); "
                                      f"the source keeps trying every {config.interval:g}s"))
                break
            words = {Kind.BAD_QUERY: "Prometheus refuses the query", Kind.NOT_A_VECTOR: "the query is not usable",
                     Kind.BAD_REPLY: f"{config.url} does not answer like Prometheus"}[exc.kind]
            out.append(Diagnostic(loc.file, loc.line, loc.col, "error", f"{words}: {exc.message}"))
            continue
        if not result:
            out.append(Diagnostic(loc.file, loc.line, loc.col, "note",
                                  f"the query matches no series now (at {config.url}); '{query.signal}' gets "
                                  f"samples once it does"))
    return out


def load_checked(path: str | None, opener: Callable = urllib.request.urlopen) -> Checked:
    """The configuration ``--promql-config`` names, checked (``check_queries``)
    when it loads; ``Checked(None, [])`` without a path."""
    if not path:
        return Checked(None, [])
    try:
        config = load_config(path)
    except PromqlConfigError as exc:
        return Checked(None, exc.diagnostics)
    findings = check_queries(config, opener)
    return Checked(None if any(d.is_error for d in findings) else config, findings)
