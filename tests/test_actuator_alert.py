"""The alert actuator against a real Alertmanager and a local JSON webhook."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import require

from reflexarc.actuators.alert import AlertActuator
from reflexarc.actuators.base import Change, PermanentActuatorError, Target, TemporaryActuatorError
from reflexarc.simulations.testbed.alertmanager import BINARY, Alertmanager, free_port

TARGET = Target({"job": "llama", "rank": "3"}, {"policy": "numa_guard", "rule": "loader_slow"})
EVIDENCE = [{"condition": 'p99(dataloader_read_latency_us[30s]) > 3x baseline', "signal": "dataloader_read_latency_us",
             "agg": "p99", "window": 30.0, "op": ">", "value": 2100.0, "threshold": 150.0, "baseline": 50.0,
             "ok": True}]
PARAMS = {"severity": "critical", "summary": "DataLoader starved", "labels": {"team": "ml"}, "evidence": EVIDENCE}


@pytest.fixture(scope="module")
def am():
    require(Path(BINARY).exists(), f"Debian's prometheus-alertmanager at {BINARY}")
    with Alertmanager() as server:
        yield server


class Receiver:
    """A loopback HTTP server that records JSON POSTs and answers with the given statuses."""

    def __init__(self, statuses=()) -> None:
        self.statuses = list(statuses)
        self.requests: list[tuple[str, object]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append((self.path, json.loads(body)))
                self.send_response(outer.statuses.pop(0) if outer.statuses else 200)
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> "Receiver":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_plan_builds_the_alert_without_sending():
    with Receiver() as hook:
        act = AlertActuator(webhook_url=hook.url, node="node7")
        change = act.plan(TARGET, PARAMS)
        assert hook.requests == []
    assert not act.spec.changes_system and change.before is None
    assert change.after["labels"] == {"job": "llama", "rank": "3", "alertname": "reflexarc_numa_guard_loader_slow",
                                      "severity": "critical", "policy": "numa_guard", "rule": "loader_slow",
                                      "target": "job=llama,rank=3", "node": "node7", "team": "ml"}
    assert change.after["annotations"]["summary"] == "DataLoader starved"
    assert "value 2100, threshold 150, baseline 50" in change.after["annotations"]["description"]
    assert EVIDENCE[0]["condition"] in change.after["annotations"]["description"]
    assert "endsAt" not in change.after
    assert Change.from_dict(json.loads(json.dumps(change.to_dict()))).after == change.after


def test_alert_fires_and_resolves_in_alertmanager(am):
    act = AlertActuator(alertmanager_url=am.url, node="node7")
    change = act.plan(TARGET, PARAMS)
    act.apply(change)
    act.apply(change)        # idempotent: the same fingerprint
    mine = [a for a in am.alerts() if a["labels"].get("alertname") == "reflexarc_numa_guard_loader_slow"]
    assert len(mine) == 1
    assert mine[0]["labels"] == change.after["labels"]
    assert mine[0]["annotations"] == change.after["annotations"]
    assert mine[0]["status"]["state"] == "active"
    restarted = AlertActuator(alertmanager_url=am.url, node="node7")
    restarted.revert(Change.from_dict(json.loads(json.dumps(change.to_dict()))))
    assert not [a for a in am.alerts() if a["labels"] == change.after["labels"]], "revert must resolve it"


def test_webhook_receives_the_alert_then_its_resolution():
    with Receiver() as hook:
        act = AlertActuator(webhook_url=hook.url + "/hook")
        change = act.plan(TARGET, PARAMS)
        act.apply(change)
        act.revert(change)
    (path1, fired), (path2, resolved) = hook.requests
    assert path1 == path2 == "/hook"
    assert fired == change.after
    assert resolved["labels"] == fired["labels"] and resolved["startsAt"] == fired["startsAt"]
    assert resolved["endsAt"] >= fired["startsAt"]


def test_5xx_is_retried_until_it_succeeds():
    with Receiver([503, 503]) as hook:
        AlertActuator(webhook_url=hook.url, attempts=4, backoff=0.01).apply(
            AlertActuator(webhook_url=hook.url).plan(TARGET, PARAMS))
    assert len(hook.requests) == 3


def test_5xx_gives_up_after_bounded_attempts():
    with Receiver([503] * 10) as hook:
        act = AlertActuator(webhook_url=hook.url, attempts=3, backoff=0.01)
        with pytest.raises(TemporaryActuatorError, match="503"):
            act.apply(act.plan(TARGET, PARAMS))
    assert len(hook.requests) == 3


def test_4xx_is_permanent_and_not_retried():
    with Receiver([400]) as hook:
        act = AlertActuator(webhook_url=hook.url, attempts=4, backoff=0.01)
        with pytest.raises(PermanentActuatorError, match="400"):
            act.apply(act.plan(TARGET, PARAMS))
    assert len(hook.requests) == 1


def test_unreachable_alertmanager_is_temporary():
    act = AlertActuator(alertmanager_url=f"http://127.0.0.1:{free_port()}", attempts=3, backoff=0.01)
    with pytest.raises(TemporaryActuatorError, match="after 3 attempts"):
        act.apply(act.plan(TARGET, PARAMS))


def test_refresh_resends_only_when_due():
    with Receiver() as hook:
        act = AlertActuator(webhook_url=hook.url, resend_interval=3600)
        change = act.plan(TARGET, PARAMS)
        act.apply(change)
        assert act.refresh(change) is None and len(hook.requests) == 1
        act.resend_interval = 0
        act.refresh(change)
        assert len(hook.requests) == 2 and hook.requests[1][1] == change.after


def test_bad_requests_are_permanent():
    with pytest.raises(PermanentActuatorError, match="bad-name"):
        AlertActuator(webhook_url="http://127.0.0.1:9").plan(TARGET, {"labels": {"bad-name": "x"}})
    act = AlertActuator()
    with pytest.raises(PermanentActuatorError, match="configured"):
        act.apply(act.plan(TARGET, {}))
