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
``resend_interval`` seconds while the change is active, as Prometheus does.

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

Failures: connection refused, timeouts, HTTP 5xx and 429 are retried with
tenacity (``attempts``, exponential backoff from ``backoff`` seconds) and end
in ``TemporaryActuatorError``; other HTTP 4xx raise ``PermanentActuatorError``
at once, as do a missing destination and bad label names.

Example::

    act = AlertActuator(alertmanager_url="http://127.0.0.1:9093")
    target = Target({"job": "llama"}, {"policy": "numa", "rule": "loader_slow"})
    change = act.plan(target, {"severity": "warning", "summary": "loader P99 3x baseline"})
    act.apply(change)     # firing
    act.revert(change)    # resolved

Overhead: one small HTTP POST per destination on apply, revert and resend;
nothing between.
"""
from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone

from tenacity import Retrying, retry_if_exception_type, stop_after_attempt, wait_exponential

from .base import EVIDENCE_PARAM, Actuator, Change, PermanentActuatorError, Target, TemporaryActuatorError
from .specs import SPECS

LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class _Retryable(Exception):
    """A failure worth another attempt."""


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


class AlertActuator(Actuator):
    spec = SPECS["alert"]

    def __init__(self, alertmanager_url: str | None = None, webhook_url: str | None = None,
                 node: str | None = None, timeout: float = 5.0, attempts: int = 4, backoff: float = 0.25,
                 resend_interval: float = 60.0, audit_path: str | None = None) -> None:
        self.audit_path = audit_path
        self.alertmanager_url = alertmanager_url.rstrip("/") if alertmanager_url else None
        self.webhook_url = webhook_url
        self.node = node or os.uname().nodename
        self.timeout = timeout
        self.attempts = attempts
        self.backoff = backoff
        self.resend_interval = resend_interval
        self._sent: dict[str, float] = {}       # alert identity -> last time it was sent

    def read_current(self, target: Target) -> None:
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

    @staticmethod
    def _identity(alert: dict) -> str:
        return json.dumps(alert["labels"], sort_keys=True)

    def _send(self, alert: dict) -> None:
        if not (self.alertmanager_url or self.webhook_url):
            raise PermanentActuatorError("no alert receiver is configured: give --alertmanager-url or --webhook-url "
                                         "(or REFLEXARC_ALERTMANAGER_URL, REFLEXARC_WEBHOOK_URL)")
        if self.alertmanager_url:
            self._post(f"{self.alertmanager_url}/api/v2/alerts", [alert])
        if self.webhook_url:
            self._post(self.webhook_url, alert)
        if "endsAt" in alert:
            self._sent.pop(self._identity(alert), None)
        else:
            self._sent[self._identity(alert)] = time.monotonic()

    def _post(self, url: str, payload) -> None:
        body = json.dumps(payload).encode()

        def attempt() -> None:
            request = urllib.request.Request(url, data=body, method="POST",
                                             headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    response.read()
            except urllib.error.HTTPError as exc:
                detail = exc.read()[:300].decode(errors="replace").strip()
                if exc.code >= 500 or exc.code == 429:
                    raise _Retryable(f"{url}: HTTP {exc.code} {detail}") from exc
                raise PermanentActuatorError(f"{url} refused the alert: HTTP {exc.code} {detail}") from exc
            except (urllib.error.URLError, OSError) as exc:
                raise _Retryable(f"{url}: {getattr(exc, 'reason', exc)}") from exc

        retrying = Retrying(stop=stop_after_attempt(self.attempts), reraise=True,
                            wait=wait_exponential(multiplier=self.backoff, max=8 * self.backoff),
                            retry=retry_if_exception_type(_Retryable))
        try:
            retrying(attempt)
        except _Retryable as exc:
            raise TemporaryActuatorError(f"{exc} (gave up after {self.attempts} attempts)") from exc
