"""The alert actuator against a real Alertmanager and local JSON webhooks:
delivery is queued, so each test waits for it with ``flush`` before looking at
what a receiver got and at the ``deliveries`` counters."""
from __future__ import annotations

import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import require

from reflexarc.actuators.alert import REPLY_LIMIT, AlertActuator
from reflexarc.actuators.base import Change, PermanentActuatorError, Target
from reflexarc.simulations.testbed.alertmanager import BINARY, Alertmanager, free_port

TARGET = Target({"job": "llama", "rank": "3"}, {"policy": "numa_guard", "rule": "loader_slow"})
EVIDENCE = [{"condition": 'p99(dataloader_read_latency_us[30s]) > 3x baseline', "signal": "dataloader_read_latency_us",
             "agg": "p99", "window": 30.0, "op": ">", "value": 2100.0, "threshold": 150.0, "baseline": 50.0,
             "ok": True}]
PARAMS = {"severity": "critical", "summary": "DataLoader starved", "labels": {"team": "ml"}, "evidence": EVIDENCE}
HANG = 30.0     # how long a hanging receiver would hold a request; every bound below is far shorter


@pytest.fixture(scope="module")
def am():
    require(Path(BINARY).exists(), f"Debian's prometheus-alertmanager at {BINARY}")
    with Alertmanager() as server:
        yield server


class Receiver:
    """A loopback HTTP server that records JSON POSTs and answers with the given
    statuses (then 200), each with ``reply`` as the body."""

    def __init__(self, statuses=(), reply: bytes = b"{}") -> None:
        self.statuses = list(statuses)
        self.requests: list[tuple[str, object]] = []
        self.written: list[int] = []        # bytes of each reply the client took before it hung up
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append((self.path, json.loads(body)))
                self.send_response(outer.statuses.pop(0) if outer.statuses else 200)
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                sent = 0
                try:
                    for at in range(0, len(reply), 1 << 20):
                        self.wfile.write(reply[at:at + (1 << 20)])
                        sent += len(reply[at:at + (1 << 20)])
                except OSError:
                    pass
                outer.written.append(sent)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    def __enter__(self) -> "Receiver":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


class Hanging:
    """A loopback server that accepts connections, reads what comes and never
    replies (for ``HANG`` s at most); closing it hangs up on every client."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/hook"
        self.conns: list[socket.socket] = []
        self.done = threading.Event()

    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)

    def __enter__(self) -> "Hanging":
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.sock.close()
        for conn in self.conns:
            conn.close()


def test_plan_builds_the_alert_without_sending():
    with Receiver() as hook:
        act = AlertActuator(webhook_url=hook.url, node="node7")
        change = act.plan(TARGET, PARAMS)
        assert act.flush(5) and hook.requests == [] and act.pending == 0
    assert not act.spec.changes_system and change.before is None
    assert change.after["labels"] == {"job": "llama", "rank": "3", "alertname": "reflexarc_numa_guard_loader_slow",
                                      "severity": "critical", "policy": "numa_guard", "rule": "loader_slow",
                                      "target": "job=llama,rank=3", "node": "node7", "team": "ml"}
    assert change.after["annotations"]["summary"] == "DataLoader starved"
    assert "value 2100, threshold 150, baseline 50" in change.after["annotations"]["description"]
    assert EVIDENCE[0]["condition"] in change.after["annotations"]["description"]
    assert "endsAt" not in change.after
    assert Change.from_dict(json.loads(json.dumps(change.to_dict()))).after == change.after


@pytest.mark.slow
def test_alert_fires_and_resolves_in_alertmanager(am):
    act = AlertActuator(alertmanager_url=am.url, node="node7")
    change = act.plan(TARGET, PARAMS)
    act.apply(change)
    act.apply(change)        # idempotent: the same fingerprint
    assert act.flush(30)
    assert act.deliveries == {("alertmanager", "sent"): 2}
    mine = [a for a in am.alerts() if a["labels"].get("alertname") == "reflexarc_numa_guard_loader_slow"]
    assert len(mine) == 1
    assert mine[0]["labels"] == change.after["labels"]
    assert mine[0]["annotations"] == change.after["annotations"]
    assert mine[0]["status"]["state"] == "active"
    restarted = AlertActuator(alertmanager_url=am.url, node="node7")
    restarted.revert(Change.from_dict(json.loads(json.dumps(change.to_dict()))))
    restarted.close()        # close delivers what is queued (within its bound)
    assert restarted.deliveries == {("alertmanager", "sent"): 1}
    assert not [a for a in am.alerts() if a["labels"] == change.after["labels"]], "revert must resolve it"
    act.close()


def test_webhook_receives_the_alert_then_its_resolution():
    with Receiver() as hook:
        act = AlertActuator(webhook_url=hook.url + "/hook")
        change = act.plan(TARGET, PARAMS)
        act.apply(change)
        act.revert(change)
        assert act.flush(30)
    (path1, fired), (path2, resolved) = hook.requests
    assert path1 == path2 == "/hook"
    assert fired == change.after
    assert resolved["labels"] == fired["labels"] and resolved["startsAt"] == fired["startsAt"]
    assert resolved["endsAt"] >= fired["startsAt"]
    assert act.deliveries == {("webhook", "sent"): 2}


def test_5xx_is_retried_until_it_succeeds():
    with Receiver([503, 503]) as hook:
        act = AlertActuator(webhook_url=hook.url, attempts=4, backoff=0.01)
        act.apply(act.plan(TARGET, PARAMS))
        assert act.flush(30)
    assert len(hook.requests) == 3
    assert act.deliveries == {("webhook", "sent"): 1}


def test_5xx_gives_up_after_bounded_attempts(caplog):
    with Receiver([503] * 10, reply=b"overloaded") as hook:
        act = AlertActuator(webhook_url=hook.url, attempts=3, backoff=0.01)
        with caplog.at_level(logging.ERROR, logger="reflexarc.actuators.alert"):
            act.apply(act.plan(TARGET, PARAMS))        # returns at once: the failure is the worker's
            assert act.flush(30)
    assert len(hook.requests) == 3
    assert act.deliveries == {("webhook", "failed"): 1}
    assert "HTTP 503 overloaded" in act.last_error["webhook"] and "3 attempt" in act.last_error["webhook"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "webhook" in errors[0] and "HTTP 503" in errors[0], errors


def test_500_makes_a_bounded_number_of_posts_within_the_deadline():
    with Receiver([500] * 100) as hook:
        act = AlertActuator(webhook_url=hook.url, attempts=100, backoff=0.05, deadline=1.0)
        start = time.monotonic()
        act.apply(act.plan(TARGET, PARAMS))
        assert act.flush(30)
        took = time.monotonic() - start
    # waits 0.05, 0.1, 0.2, 0.4, 0.4, ... never past 1 s: a handful of POSTs, not 100
    assert 2 <= len(hook.requests) <= 8, len(hook.requests)
    assert act.deliveries == {("webhook", "failed"): 1}
    assert took < 10, "the deadline bounds the retries"


def test_4xx_is_not_retried():
    with Receiver([400]) as hook:
        act = AlertActuator(webhook_url=hook.url, attempts=4, backoff=0.01)
        act.apply(act.plan(TARGET, PARAMS))
        assert act.flush(30)
    assert len(hook.requests) == 1
    assert act.deliveries == {("webhook", "failed"): 1}
    assert act.last_error["webhook"].startswith("refused: HTTP 400")


def test_unreachable_alertmanager_fails_after_bounded_attempts():
    act = AlertActuator(alertmanager_url=f"http://127.0.0.1:{free_port()}", attempts=3, backoff=0.01)
    act.apply(act.plan(TARGET, PARAMS))
    assert act.flush(30)
    assert act.deliveries == {("alertmanager", "failed"): 1}
    assert "refused" in act.last_error["alertmanager"] and "3 attempt" in act.last_error["alertmanager"]


def test_alertmanager_down_does_not_keep_the_alert_from_the_webhook():
    with Receiver() as hook:
        act = AlertActuator(alertmanager_url=f"http://127.0.0.1:{free_port()}", webhook_url=hook.url,
                            attempts=2, backoff=0.01)
        change = act.plan(TARGET, PARAMS)
        act.apply(change)
        assert act.flush(30)
    assert [body for _, body in hook.requests] == [change.after]
    assert act.deliveries == {("alertmanager", "failed"): 1, ("webhook", "sent"): 1}


@pytest.mark.slow
def test_webhook_down_does_not_keep_the_alert_from_alertmanager(am):
    with Hanging() as hook:
        act = AlertActuator(alertmanager_url=am.url, webhook_url=hook.url, deadline=1.0, timeout=HANG)
        change = act.plan(TARGET, dict(PARAMS, labels={"team": "webhook-down"}))
        act.apply(change)
        assert act.flush(30)
    assert act.deliveries == {("alertmanager", "sent"): 1, ("webhook", "failed"): 1}
    assert [a for a in am.alerts() if a["labels"] == change.after["labels"]]
    act.revert(change)
    act.close()


def test_a_hanging_receiver_does_not_block_apply(caplog):
    with Hanging() as hook:
        act = AlertActuator(webhook_url=hook.url, deadline=1.0, timeout=HANG)
        change = act.plan(TARGET, PARAMS)
        start = time.monotonic()
        with caplog.at_level(logging.ERROR, logger="reflexarc.actuators.alert"):
            act.apply(change)
            returned = time.monotonic() - start
            undecided = dict(act.deliveries)
            assert act.flush(30)
        took = time.monotonic() - start
    assert returned < 0.9 and undecided == {}, "apply returned before the receiver could answer"
    assert act.deliveries == {("webhook", "failed"): 1}
    assert took < HANG / 2, "the deadline ends the delivery, not the receiver"
    assert "timed out" in act.last_error["webhook"]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "webhook" in errors[0] and "timed out" in errors[0], errors


def test_close_returns_promptly_while_a_receiver_hangs():
    with Hanging() as hook:
        act = AlertActuator(webhook_url=hook.url, deadline=HANG, timeout=HANG)
        for rank in range(3):
            act.apply(act.plan(Target({"rank": str(rank)}, TARGET.selector), PARAMS))
        start = time.monotonic()
        act.close()
        took = time.monotonic() - start
        assert took < 2.0, f"close waited {took:.1f} s on a receiver that hangs for {HANG:g} s"
        assert act.deliveries[("webhook", "dropped")] >= 2     # the queued ones; the one in flight is abandoned
        assert act.pending == 0 and act.flush(0)


def test_a_full_queue_is_a_permanent_error_and_counted():
    with Hanging() as hook:
        act = AlertActuator(webhook_url=hook.url, deadline=HANG, timeout=HANG, queue_size=2)
        with pytest.raises(PermanentActuatorError, match=r"[23] alerts are still undelivered \(queue of 2 full"):
            for rank in range(5):
                act.apply(act.plan(Target({"rank": str(rank)}, TARGET.selector), PARAMS))
        assert act.deliveries == {("webhook", "dropped"): 1}
        undelivered = act.pending               # queued, and the one in flight
        act.close()
        assert act.deliveries[("webhook", "dropped")] >= 1 + undelivered - 1


def test_a_huge_reply_is_not_read_in_full():
    size = 50 << 20
    with Receiver(reply=b"x" * size) as hook, Receiver([500], reply=b"y" * size) as failing:
        act = AlertActuator(webhook_url=hook.url, alertmanager_url=failing.url, attempts=1)
        act.apply(act.plan(TARGET, PARAMS))
        assert act.flush(30)
        assert act.deliveries == {("webhook", "sent"): 1, ("alertmanager", "failed"): 1}
        assert "HTTP 500 yyy" in act.last_error["alertmanager"] and len(act.last_error["alertmanager"]) < 400
        deadline = time.monotonic() + 30
        while (not hook.written or not failing.written) and time.monotonic() < deadline:
            time.sleep(0.05)
    # the client hung up after REPLY_LIMIT bytes: the server could write no more
    # than what the loopback socket buffers hold, far from the whole reply
    assert hook.written and hook.written[0] < size and failing.written and failing.written[0] < size, \
        (hook.written, failing.written, REPLY_LIMIT)


def test_refresh_resends_only_when_due():
    with Receiver() as hook:
        act = AlertActuator(webhook_url=hook.url, resend_interval=3600)
        change = act.plan(TARGET, PARAMS)
        act.apply(change)
        assert act.refresh(change) is None and act.flush(30) and len(hook.requests) == 1
        act.resend_interval = 0
        assert act.refresh(change) is None and act.flush(30)
        assert len(hook.requests) == 2 and hook.requests[1][1] == change.after


def test_bad_requests_are_permanent():
    with pytest.raises(PermanentActuatorError, match="bad-name"):
        AlertActuator(webhook_url="http://127.0.0.1:9").plan(TARGET, {"labels": {"bad-name": "x"}})
    act = AlertActuator()
    with pytest.raises(PermanentActuatorError, match="configured"):
        act.apply(act.plan(TARGET, {}))
    assert act.pending == 0 and act.deliveries == {}
