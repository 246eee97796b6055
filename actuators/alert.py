"""The ``alert`` actuator: raises an alert in Alertmanager (v2 API) and/or posts
it to a generic JSON webhook; revert resolves it. It notifies, it changes
nothing on the node (``changes_system`` is False).

``plan`` builds the alert, ``apply`` sends it, ``revert`` sends the same alert
(same labels, hence the same Alertmanager fingerprint) with ``endsAt`` set to
now, which resolves it. Alertmanager receives ``POST {url}/api/v2/alerts`` with
a one-element list; the webhook receives the alert object itself (resolved
when ``endsAt`` is present and past). A firing alert carries no ``endsAt``, so
Alertmanager resolves it by itself after its ``resolve_timeout`` (5 m by
default) unless it is sent again: ``refresh`` re-sends it every
``resend_interval`` seconds while the change is active, as Prometheus does
(counted from when it was queued, delivered or not, so a receiver that is down
gets one copy per interval, not one per tick).

Labels: the target's labels, then ``alertname`` (``reflexarc_<policy>_<rule>``),
``severity``, ``policy``, ``rule``, ``target`` (the target key), ``node``, then
``params.labels`` (which may override any of them). The policy and rule names
come from ``Target.selector["policy"]``/``["rule"]``, else from
``Target.labels``; the controller puts them there when it builds the target.
Annotations: ``summary`` (``params.summary`` or a default), ``description``
(``params.description`` if given, then one line per evidence item from
``params.evidence``: the items of the audit format, or plain text) and, given
the controller's ``audit_path``, ``audit`` (that path) and ``report`` (the
command that writes the report of it), so whoever is paged can read the
whole decision.

Delivery: ``apply``, ``revert`` and ``refresh`` never wait for a receiver.
They check what they can at once (no receiver configured, bad label names:
``PermanentActuatorError``) and put the alert on a bounded queue
(``queue_size``, 256 by default); one daemon thread, started with the first
alert, takes the alerts in order and delivers each to every configured
receiver on its own, so Alertmanager failing does not keep the alert from the
webhook, nor the other way round. A full queue raises ``PermanentActuatorError``
naming how many alerts are undelivered (the executor does not retry it) and
counts the alert ``dropped``.

Bounds, per alert and receiver: all attempts end within ``deadline`` seconds
(10 by default); each request waits at most ``min(timeout, time left)`` for
each socket operation, and the deadline is checked again between reads.
Connection errors, timeouts, HTTP 5xx and 429 are retried (at most
``attempts`` in all, exponential backoff from ``backoff`` seconds, never past
the deadline); other HTTP 4xx are not retried. At most ``REPLY_LIMIT`` bytes
(64 KiB) of any reply body are read, success or error; the connection is then
closed.

Counters: ``deliveries`` (a ``collections.Counter``) keyed ``(receiver,
outcome)``, receiver ``"alertmanager"`` or ``"webhook"``, outcome ``"sent"``,
``"failed"`` (the receiver refused it or the deadline passed; one error line
each on the ``reflexarc.actuators.alert`` logger, naming the receiver and why)
or ``"dropped"`` (never tried to the end: the queue was full, or ``close``
came first); ``last_error`` maps a receiver to the reason of its latest
failure. ``pending`` is the number of alerts queued or being delivered.

``flush(timeout)`` waits until every queued alert has been delivered or has
failed. ``close(timeout=CLOSE_WAIT)`` waits at most ``timeout`` seconds (1 s)
for that, then stops the thread, dropping (and counting) what is still queued;
it never waits on a receiver that hangs, so a shutdown that closes the
registry stays within its bound. A stopping controller resolves its firing
alerts and first waits with ``flush(deadline)`` (``Executor.deliver_notices``):
the resolutions go out before the process exits, within one ``deadline`` more.
An alert sent after ``close`` starts a new thread.

Example::

    act = AlertActuator(alertmanager_url="http://127.0.0.1:9093")
    target = Target({"job": "llama"}, {"policy": "numa", "rule": "loader_slow"})
    change = act.plan(target, {"severity": "warning", "summary": "loader P99 3x baseline"})
    act.apply(change)     # queued; firing once delivered
    act.revert(change)    # queued; resolved once delivered
    act.flush(10)         # True: both delivered or failed
    act.deliveries        # Counter({('alertmanager', 'sent'): 2})

Overhead: on the caller's thread a queue put per apply, revert and due
resend (microseconds); one thread that sleeps on the queue, and one small
HTTP POST per receiver per alert; memory at most ``queue_size`` alerts
(about 1 KB each).
"""
from __future__ import annotations

import http.client
import json
import logging
import os
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from datetime import datetime, timezone

from tenacity import (Retrying, retry_if_exception_type, stop_after_attempt, stop_after_delay, stop_when_event_set,
                      wait_exponential)

from .base import EVIDENCE_PARAM, Actuator, Change, PermanentActuatorError, Target
from .specs import SPECS

log = logging.getLogger("reflexarc.actuators.alert")

LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
REPLY_LIMIT = 64 * 1024    # bytes of a reply body read at most
READ_CHUNK = 16 * 1024
CLOSE_WAIT = 1.0           # seconds close() waits for the queue to drain
QUEUE_SIZE = 256
DEADLINE = 10.0            # seconds for all attempts of one delivery to one receiver


class _Retryable(Exception):
    """A failure worth another attempt."""


class _Refused(Exception):
    """A failure no other attempt would change (HTTP 4xx other than 429)."""


class _Stopped(Exception):
    """``close`` came while the delivery was under way."""


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _parse_iso(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _evidence_line(item) -> str:
    if not isinstance(item, dict):
        return f"- {item}"
    value, threshold, baseline = item.get("value"), item.get("threshold"), item.get("baseline")
    text = f"- {item.get('condition') or item.get('signal', '?')}: value "
    text += "no data" if value is None else f"{value:g}"
    if threshold is not None:
        text += f", threshold {threshold:g}"
    if baseline is not None:
        text += f", baseline {baseline:g}"
    return text


def _read_capped(stream, end: float) -> bytes:
    """At most ``REPLY_LIMIT`` bytes of a reply body, read in chunks, none
    started after ``end`` (a monotonic time)."""
    read = getattr(stream, "read1", None) or stream.read
    data = b""
    while len(data) < REPLY_LIMIT and time.monotonic() < end:
        chunk = read(min(READ_CHUNK, REPLY_LIMIT - len(data)))
        if not chunk:
            break
        data += chunk
    return data


def _describe(alert: dict) -> str:
    state = "resolved" if "endsAt" in alert else "firing"
    return f"{alert['labels'].get('alertname', '?')} ({state}, target {alert['labels'].get('target', '?')})"


class _Worker:
    """One queue and the thread that empties it; ``close`` retires it whole, so a
    thread still stuck in a request never touches the queue of the next one."""

    def __init__(self, owner: "AlertActuator", size: int) -> None:
        self.owner = owner
        self.queue: queue.Queue = queue.Queue(maxsize=size)
        self.stop = threading.Event()
        self.idle = threading.Condition()
        self.pending = 0           # queued or being delivered
        self.thread = threading.Thread(target=self._run, name="reflexarc-alert", daemon=True)
        self.thread.start()

    def put(self, deliveries: list) -> bool:
        with self.idle:
            try:
                self.queue.put_nowait(deliveries)
            except queue.Full:
                return False
            self.pending += 1
        return True

    def flush(self, timeout: float | None) -> bool:
        with self.idle:
            return self.idle.wait_for(lambda: self.pending == 0, timeout)

    def _done(self, count: int = 1) -> None:
        with self.idle:
            self.pending -= count
            if self.pending <= 0:
                self.idle.notify_all()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            try:
                for receiver, url, payload, what in item:
                    if self.stop.is_set():
                        self.owner._count(receiver, "dropped")
                    else:
                        self.owner._deliver(receiver, url, payload, what, self.stop)
            except Exception:        # the thread outlives any one alert
                log.exception("alert delivery failed unexpectedly")
            finally:
                self._done()
            if self.stop.is_set():
                return

    def retire(self, timeout: float) -> list:
        """Wait up to ``timeout`` s for the queue to drain, then stop; the
        deliveries still queued, which will not be made."""
        self.flush(timeout)
        self.stop.set()
        left = []
        while True:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                left.append(item)
        if left:
            self._done(len(left))
        self.queue.put_nowait(None)      # wakes a thread waiting for work; one stuck in a request exits after it
        self.thread.join(0.05)
        return left


class AlertActuator(Actuator):
    spec = SPECS["alert"]

    def __init__(self, alertmanager_url: str | None = None, webhook_url: str | None = None,
                 node: str | None = None, timeout: float = 5.0, attempts: int = 4, backoff: float = 0.25,
                 resend_interval: float = 60.0, audit_path: str | None = None, deadline: float = DEADLINE,
                 queue_size: int = QUEUE_SIZE) -> None:
        self.audit_path = audit_path
        self.alertmanager_url = alertmanager_url.rstrip("/") if alertmanager_url else None
        self.webhook_url = webhook_url
        self.node = node or os.uname().nodename
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.deadline = deadline
        self.queue_size = queue_size
        self.resend_interval = resend_interval
        self.deliveries: Counter = Counter()   # (receiver, "sent" | "failed" | "dropped") -> alerts
        self.last_error: dict[str, str] = {}   # receiver -> why its latest delivery failed
        self._sent: dict[str, float] = {}       # alert identity -> last time it was queued
        self._worker: _Worker | None = None
        self._lock = threading.Lock()           # guards _worker
        self._counts_lock = threading.Lock()    # guards deliveries

    def read_current(self, target: Target, params: dict | None = None) -> None:
        return None

    def plan(self, target: Target, params: dict) -> Change:
        def context(key: str) -> str:
            return str(target.selector.get(key) or target.labels.get(key) or "unknown")

        policy, rule = context("policy"), context("rule")
        severity = str(params.get("severity") or "warning")
        labels = {str(k): str(v) for k, v in target.labels.items()}
        labels.update(alertname=re.sub(r"[^A-Za-z0-9_]", "_", f"reflexarc_{policy}_{rule}"),
                      severity=severity, policy=policy, rule=rule, target=target.key(), node=self.node)
        labels.update({str(k): str(v) for k, v in (params.get("labels") or {}).items()})
        bad = sorted(k for k in labels if not LABEL_NAME.match(k))
        if bad:
            raise PermanentActuatorError(f"alert label names must match {LABEL_NAME.pattern}: {', '.join(bad)}")
        summary = str(params.get("summary") or f"{policy}/{rule} fired for {target.key()}")
        evidence = params.get(EVIDENCE_PARAM) or []
        lines = [str(params["description"])] if params.get("description") else []
        lines += [_evidence_line(item) for item in (evidence if isinstance(evidence, list) else [evidence])]
        annotations = {"summary": summary, "description": "\n".join(lines)}
        if self.audit_path:
            annotations.update(audit=self.audit_path, report=f"reflexarc report {self.audit_path} --out DIR")
        alert = {"labels": labels, "annotations": annotations, "startsAt": _iso(time.time())}
        return Change("alert", target, dict(params), None, alert, f"alert {severity}: {summary} [{target.key()}]")

    def apply(self, change: Change) -> None:
        self._send(change.after)

    def revert(self, change: Change) -> None:
        ends = max(time.time(), _parse_iso(change.after["startsAt"]) + 0.001)
        self._send(dict(change.after, endsAt=_iso(ends)))

    def refresh(self, change: Change) -> None:
        """Re-send the firing alert once ``resend_interval`` has passed; never grows the change."""
        last = self._sent.get(self._identity(change.after))
        if last is None or time.monotonic() - last >= self.resend_interval:
            self._send(change.after)
        return None

    @property
    def pending(self) -> int:
        """Alerts queued or being delivered."""
        worker = self._worker
        return worker.pending if worker else 0

    def flush(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` s (None: as long as it takes, at most about
        ``deadline`` per queued alert and receiver) until every queued alert was
        delivered or failed; whether it came to that."""
        worker = self._worker
        return worker.flush(timeout) if worker else True

    def close(self, timeout: float = CLOSE_WAIT) -> None:
        """Wait up to ``timeout`` s for the queued alerts to go out, then stop the
        delivery thread without waiting for a receiver; what is still queued is
        dropped and counted."""
        with self._lock:
            worker, self._worker = self._worker, None
        if worker is None:
            return
        left = worker.retire(timeout)
        for item in left:
            for receiver, *_ in item:
                self._count(receiver, "dropped")
        if left:
            log.warning("closing: %d alert(s) not delivered, dropped (%s)", len(left),
                        ", ".join(_describe(item[0][3]) for item in left[:5]) + (", ..." if len(left) > 5 else ""))

    @staticmethod
    def _identity(alert: dict) -> str:
        return json.dumps(alert["labels"], sort_keys=True)

    def _count(self, receiver: str, outcome: str) -> None:
        with self._counts_lock:
            self.deliveries[(receiver, outcome)] += 1

    def _send(self, alert: dict) -> None:
        deliveries = []
        if self.alertmanager_url:
            deliveries.append(("alertmanager", f"{self.alertmanager_url}/api/v2/alerts", [alert], alert))
        if self.webhook_url:
            deliveries.append(("webhook", self.webhook_url, alert, alert))
        if not deliveries:
            raise PermanentActuatorError("no alert receiver is configured: give --alertmanager-url or --webhook-url "
                                         "(or REFLEXARC_ALERTMANAGER_URL, REFLEXARC_WEBHOOK_URL)")
        with self._lock:          # a concurrent close() retires the worker before or after, never during
            if self._worker is None:
                self._worker = _Worker(self, self.queue_size)
            worker = self._worker
            queued = worker.put(deliveries)
        if not queued:
            for receiver, *_ in deliveries:
                self._count(receiver, "dropped")
            raise PermanentActuatorError(f"alert {_describe(alert)} dropped: {worker.pending} alerts are still "
                                         f"undelivered (queue of {self.queue_size} full; "
                                         f"receivers failing: {', '.join(sorted(self.last_error)) or 'none yet'})")
        if "endsAt" in alert:
            self._sent.pop(self._identity(alert), None)
        else:
            self._sent[self._identity(alert)] = time.monotonic()

    def _deliver(self, receiver: str, url: str, payload, what: dict, stop: threading.Event) -> None:
        """Deliver one alert to one receiver within ``deadline``; counted and,
        when it fails, logged."""
        body = json.dumps(payload).encode()
        end = time.monotonic() + self.deadline
        tries = 0
        last: list[str] = []

        def attempt() -> None:
            nonlocal tries
            if stop.is_set():
                raise _Stopped("closed")
            left = end - time.monotonic()
            if left <= 0:
                raise _Refused(f"deadline of {self.deadline:g} s passed")
            tries += 1
            request = urllib.request.Request(url, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=min(self.timeout, left)) as response:
                    _read_capped(response, end)
            except urllib.error.HTTPError as exc:
                try:
                    detail = _read_capped(exc, end)[:300].decode(errors="replace").strip()
                except (OSError, http.client.HTTPException):
                    detail = ""
                finally:
                    exc.close()
                reason = f"HTTP {exc.code} {detail}".strip()
                if exc.code >= 500 or exc.code == 429:
                    last[:] = [reason]
                    raise _Retryable(reason) from exc
                raise _Refused(f"refused: {reason}") from exc
            except (urllib.error.URLError, OSError, http.client.HTTPException) as exc:
                last[:] = [str(getattr(exc, "reason", None) or exc or type(exc).__name__)]
                raise _Retryable(last[0]) from exc

        def sleep(seconds: float) -> None:
            stop.wait(max(0.0, min(seconds, end - time.monotonic())))

        retrying = Retrying(stop=stop_after_attempt(self.attempts) | stop_after_delay(self.deadline)
                            | stop_when_event_set(stop),
                            wait=wait_exponential(multiplier=self.backoff, max=8 * self.backoff),
                            retry=retry_if_exception_type(_Retryable), sleep=sleep, reraise=True)
        try:
            retrying(attempt)
        except _Stopped:
            self._count(receiver, "dropped")
            return
        except (_Retryable, _Refused) as exc:
            if stop.is_set():
                self._count(receiver, "dropped")
                return
            reason = str(exc)
            if not isinstance(exc, _Refused) or reason.startswith("deadline"):
                reason = f"{last[0] if last else reason} (gave up after {tries} attempt(s) in " \
                         f"{self.deadline - max(0.0, end - time.monotonic()):.1f} s)"
            self.last_error[receiver] = reason
            self._count(receiver, "failed")
            log.error("alert %s not delivered to %s %s: %s", _describe(what), receiver, url, reason)
            return
        self._count(receiver, "sent")
