"""The PromQL source against a hostile Prometheus: a real HTTP server on
loopback that trickles its reply a byte at a time, accepts and never answers,
nests its JSON 100 000 deep, sends more than ``MAX_REPLY`` bytes, answers
with values no percentage can have or with an error spread over several lines.
Each request ends by its deadline (the configuration's ``timeout``), each such
reply is a counted, typed failure of its own query only, logged once, and
``reflexarc validate`` reports it as a diagnostic line, never a traceback or
a hang."""
from __future__ import annotations

import json
import logging
import socket
import socketserver
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path

import pytest
from conftest import ROOT, run_cli
from prometheus_client import CollectorRegistry

from reflexarc.controller.sources.promql import MAX_REPLY, Kind, PromqlSource, QueryError, instant_query, load_checked
from reflexarc.controller.sources.promql_config import load_config

STRAGGLER = ROOT / "policies" / "rank-straggler.yaml"
TIMEOUT = 1.0
TRICKLE = 0.3            # seconds between two bytes of a trickled reply
HANG_BOUND = 5.0         # a request with a 1 s deadline that runs this long is hanging
DEEP = 100_000


def vector(*samples: tuple[dict, str]) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": metric, "value": [1700000000.0, value]} for metric, value in samples]}}).encode()


OK = vector(({"gpu": "0"}, "87"), ({"gpu": "1"}, "12"))


class Hostile(socketserver.ThreadingTCPServer):
    """A server on 127.0.0.1 whose reply is chosen by the query's text: ``ok``,
    ``trickle_head``, ``trickle_body``, ``hang``, ``deep``, ``deep_error``,
    ``huge_declared``, ``huge_streamed``, ``pct_huge``, ``not_finite``,
    ``multiline_error``, ``not_http``."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Reply)
        self.closing = threading.Event()
        self.asked: list[str] = []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.closing.set()
        self.shutdown()
        self.server_close()


class _Reply(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock, server = self.request, self.server
        request = b""
        while b"\r\n\r\n" not in request:
            data = sock.recv(4096)
            if not data:
                return
            request += data
        target = request.split(b" ", 2)[1].decode()
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query).get("query", [""])[0]
        server.asked.append(query)
        try:
            self.reply(sock, server, query)
        except OSError:          # the client gave up: what a deadline is for
            pass

    @staticmethod
    def head(status: str = "200 OK", length: int | None = None) -> bytes:
        size = f"Content-Length: {length}\r\n" if length is not None else ""
        return f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n{size}Connection: close\r\n\r\n".encode()

    def reply(self, sock: socket.socket, server: Hostile, query: str) -> None:
        if query in ("trickle_head", "trickle_body"):
            whole = self.head(length=len(OK)) + OK
            sent = 0 if query == "trickle_head" else len(self.head(length=len(OK)))
            sock.sendall(whole[:sent])
            for i in range(sent, len(whole)):
                if server.closing.wait(TRICKLE):
                    return
                sock.sendall(whole[i:i + 1])
        elif query == "hang":
            server.closing.wait(60)
        elif query == "huge_declared":
            sock.sendall(self.head(length=MAX_REPLY + 1) + b"[" * 1024)
            server.closing.wait(5)
        elif query == "huge_streamed":
            sock.sendall(self.head())
            chunk = b" " * (1 << 20)
            for _ in range(MAX_REPLY // len(chunk) + 2):
                sock.sendall(chunk)
        elif query == "not_http":
            sock.sendall(b"SSH-2.0-OpenSSH_9.2p1\r\n\r\n")
        else:
            status, body = {
                "ok": ("200 OK", OK),
                "deep": ("200 OK", b"[" * DEEP + b"]" * DEEP),
                "deep_error": ("400 Bad Request", b"[" * DEEP + b"]" * DEEP),
                "pct_huge": ("200 OK", vector(({"gpu": "0"}, "1e308"), ({"gpu": "1"}, "50"))),
                "not_finite": ("200 OK", vector(({"gpu": "0"}, "NaN"), ({"gpu": "1"}, "-5"), ({"gpu": "2"}, "+Inf"),
                                                ({"gpu": "3"}, "40"))),
                "multiline_error": ("400 Bad Request", json.dumps({
                    "status": "error", "errorType": "bad_data",
                    "error": "line one\nerror: forged line\x1b[31m" + "x" * 5000}).encode()),
            }[query]
            sock.sendall(self.head(status, len(body)) + body)


@pytest.fixture
def hostile():
    server = Hostile()
    yield server
    server.close()


def config(tmp_path: Path, url: str, *queries: str, name: str = "promql.yaml") -> Path:
    """A configuration whose queries are ``gpu_utilization_pct`` queries with the given texts."""
    path = tmp_path / name
    path.write_text(f"prometheus: {url}\ninterval: 5s\ntimeout: {TIMEOUT:g}s\nnode: node-a\nqueries:\n"
                    + "".join(f"  - {{signal: gpu_utilization_pct, query: {q}, labels: {{gpu: gpu}}}}\n"
                              for q in queries))
    return path


def errors(registry: CollectorRegistry, kind: str) -> float | None:
    return registry.get_sample_value("reflexarc_promql_errors_total", {"signal": "gpu_utilization_pct", "kind": kind})


def validate(path: Path) -> tuple[subprocess.CompletedProcess, float]:
    started = time.monotonic()
    r = run_cli("validate", "--promql-config", str(path), str(STRAGGLER))
    return r, time.monotonic() - started


def assert_no_crash(r: subprocess.CompletedProcess) -> None:
    out = r.stdout + r.stderr
    assert r.returncode in (0, 1) and "Traceback" not in out and "internal error" not in out, out


# --- one request ----------------------------------------------------------------------------

@pytest.mark.parametrize("query", ["trickle_head", "trickle_body", "hang"])
def test_a_request_ends_at_its_deadline_whatever_the_server_sends(hostile, query):
    started = time.monotonic()
    with pytest.raises(QueryError) as raised:
        instant_query(hostile.url, query, TIMEOUT)
    took = time.monotonic() - started
    assert raised.value.kind is Kind.TIMEOUT and raised.value.message == "no complete reply within 1s"
    assert TIMEOUT - 0.05 <= took < TIMEOUT + 2.0, took


@pytest.mark.parametrize("query,words", [
    ("deep", "not a Prometheus query reply (JSON nested too deeply)"),
    ("huge_declared", f"the reply is larger than {MAX_REPLY} bytes (Content-Length {MAX_REPLY + 1})"),
    ("huge_streamed", f"the reply is larger than {MAX_REPLY} bytes"),
    ("not_http", "not an HTTP reply (BadStatusLine"),
])
def test_a_reply_that_is_not_prometheuss_is_a_bad_reply(hostile, query, words):
    with pytest.raises(QueryError) as raised:
        instant_query(hostile.url, query, TIMEOUT)
    assert raised.value.kind is Kind.BAD_REPLY and raised.value.message.startswith(words), raised.value.message


def test_a_servers_error_text_is_one_bounded_line(hostile):
    with pytest.raises(QueryError) as raised:
        instant_query(hostile.url, "multiline_error", TIMEOUT)
    message = raised.value.message
    assert raised.value.kind is Kind.BAD_QUERY and message.startswith("HTTP 400: bad_data: line one error: forged")
    assert message.isprintable() and len(message) <= 500 and message.endswith("...")
    with pytest.raises(QueryError) as raised:                       # an error reply nested 100 000 deep
        instant_query(hostile.url, "deep_error", TIMEOUT)
    assert raised.value.kind is Kind.BAD_QUERY and raised.value.message == "HTTP 400: Bad Request"


# --- the source -------------------------------------------------------------------------------

def test_hostile_queries_fail_alone_counted_and_logged_once(tmp_path, hostile, caplog):
    registry = CollectorRegistry()
    src = PromqlSource(load_config(config(tmp_path, hostile.url, "trickle_body", "deep", "hang", "not_finite",
                                          "ok")), registry)
    caplog.set_level(logging.WARNING, "reflexarc.promql")
    for _ in range(2):
        started = time.monotonic()
        result = src.evaluate()
        took = time.monotonic() - started
        assert took < 2 * TIMEOUT + 2.0, f"two deadlines and some: {took}"
        assert [f.kind for f in result.failures] == [Kind.TIMEOUT, Kind.BAD_REPLY, Kind.TIMEOUT, Kind.OUT_OF_RANGE]
        assert sorted((labels["gpu"], value) for _, labels, value in result.samples) == \
            [("0", 87.0), ("1", 12.0), ("3", 40.0)]
    assert "3 value(s) out of range for unit '%' of gpu_utilization_pct, dropped; the first: " \
           '{gpu="0",node="node-a"} = nan (not_finite)' == result.failures[3].message
    assert errors(registry, "timeout") == 4 and errors(registry, "bad_reply") == 2
    assert errors(registry, "out_of_range") == 2
    assert registry.get_sample_value("reflexarc_promql_retries_total", {"kind": "timeout"}) is None
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 4, logged                            # once per query and kind, not per round
    assert sum("(timeout): no complete reply within 1s" in line for line in logged) == 2, logged


def test_a_query_stuck_at_its_deadline_does_not_wedge_the_polls(tmp_path, hostile):
    """The live loop's side: rounds keep coming while one query hangs every time."""
    registry = CollectorRegistry()
    src = PromqlSource(load_config(config(tmp_path, hostile.url, "hang", "ok")), registry)
    try:
        for now in (100.0, 105.0, 110.0):                      # three intervals of the loop's clock
            started = time.monotonic()
            got = src.poll(now)
            while not got and time.monotonic() - started < HANG_BOUND:
                time.sleep(0.05)
                got = src.poll(now + 0.5)
            assert sorted(labels["gpu"] for _, labels, _ in got) == ["0", "1"], f"round at {now}: nothing"
        assert errors(registry, "timeout") >= 2
    finally:
        src.close()


def test_a_round_past_its_bound_is_logged_once_by_poll(tmp_path, hostile, caplog):
    src = PromqlSource(load_config(config(tmp_path, hostile.url, "hang")))
    assert src.round_bound == 1 * 3 * (TIMEOUT + 0.5 * 8) + TIMEOUT
    src.round_bound = 0.2                                      # as if resolving the name never ended
    caplog.set_level(logging.WARNING, "reflexarc.promql")
    try:
        assert src.poll(100.0) == []
        time.sleep(0.5)
        for now in (100.5, 101.0):
            assert src.poll(now) == []
    finally:
        src.close()
    stalled = [r.getMessage() for r in caplog.records if "has run for over" in r.getMessage()]
    assert stalled == [f"a PromQL round against {hostile.url} has run for over 0.2s (its bound): the PromQL "
                       "signals are not refreshed until it ends"]


def test_a_huge_percentage_is_counted_and_the_sane_one_kept(tmp_path, hostile):
    registry = CollectorRegistry()
    src = PromqlSource(load_config(config(tmp_path, hostile.url, "pct_huge")), registry)
    result = src.evaluate()
    assert ("gpu_utilization_pct", {"node": "node-a", "gpu": "1"}, 50.0) in result.samples
    assert [s for s in result.samples if s[1]["gpu"] == "0"] == [], "1e308 % is no utilisation"
    assert [f.kind for f in result.failures] == [Kind.OUT_OF_RANGE] and errors(registry, "out_of_range") == 1


# --- at load --------------------------------------------------------------------------------------

def test_validate_reports_a_deep_reply_as_one_error_line(tmp_path, hostile):
    path = config(tmp_path, hostile.url, "deep", "ok")
    checked = load_checked(str(path))
    assert checked.config is None
    [d] = [d for d in checked.diagnostics if d.severity != "note"]
    assert d.severity == "error" and d.line == 6
    r, _ = validate(path)
    assert_no_crash(r)
    lines = [line for line in r.stdout.splitlines() if "error:" in line]
    assert r.returncode == 1 and r.stderr == "error: 1 error(s) in 1 path(s)\n" and lines == [
        f"{path}:6:42: error: {hostile.url} does not answer like Prometheus: not a Prometheus query reply "
        "(JSON nested too deeply)"], r.stdout + r.stderr


@pytest.mark.parametrize("query", ["hang", "trickle_head"])
def test_validate_finishes_against_a_server_that_does_not_answer(tmp_path, hostile, query):
    path = config(tmp_path, hostile.url, query, "ok")
    r, took = validate(path)
    assert_no_crash(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{path}:6:42: warning: the queries are not checked: {hostile.url} did not answer (no complete reply " \
           "within 1s)" in r.stdout, r.stdout
    assert hostile.asked == [query], "the queries after one that timed out are not asked"
    assert took < 30, took                                     # the interpreter's start, then one deadline


def test_validate_warns_of_values_out_of_range(tmp_path, hostile):
    path = config(tmp_path, hostile.url, "not_finite")
    checked = load_checked(str(path))
    assert checked.config is not None
    [d] = checked.diagnostics
    assert d.severity == "warning" and d.message.startswith(
        "the query gives 3 value(s) out of range for unit '%' of gpu_utilization_pct"), d.message
