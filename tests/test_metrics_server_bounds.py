"""The metrics endpoint is bounded: clients cannot take the controller's threads
or descriptors through it.

A real ``MetricsServer`` on 127.0.0.1 with a small cap (8 connections) and a
short deadline, and real sockets: idle clients in a child process, so that
the descriptors and threads counted in this process are the server's. More
idle connections than the cap leave this process's descriptors and threads
within the cap, the ones over it are refused, and the ones it holds are
dropped at the deadline. A client that trickles its request a byte at a time
is cut off and counted. A scrape refused while the cap is held succeeds once
the idle clients are dropped. ``close()`` returns while idle clients are
connected and shuts their connections down.
"""
from __future__ import annotations

import json
import os
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest
from conftest import wait_until
from prometheus_client import CollectorRegistry, Gauge

from reflexarc.controller.runtime.exporter import CONNECTION_DEADLINE_S, MAX_CONNECTIONS, MetricsServer

CAP = 8
DEADLINE = 1.5
SLACK = 4           # descriptors or threads that come and go in this process meanwhile

# Opens N connections to HOST:PORT and says so; on "check T" says, for each,
# whether the server closed it within T s; exits on end of input.
_IDLE = r"""
import json, select, socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.stdin.readline()
socks = [socket.create_connection((host, port)) for _ in range(n)]
print("connected", len(socks), flush=True)
for line in sys.stdin:
    end = time.monotonic() + float(line.split()[1])
    closed, open_, data = 0, 0, 0
    for s in socks:
        ready, _, _ = select.select([s], [], [], max(0.0, end - time.monotonic()))
        if not ready:
            open_ += 1
            continue
        try:
            got = s.recv(4096)
        except ConnectionResetError:
            got = b""
        if got:
            data += 1
        else:
            closed += 1
    print(json.dumps({"closed": closed, "open": open_, "data": data}), flush=True)
"""


class IdleClients:
    """A child process holding ``n`` idle connections to ``address``."""

    def __init__(self, address: tuple[str, int], n: int) -> None:
        self.n = n
        self.proc = subprocess.Popen([sys.executable, "-c", _IDLE, address[0], str(address[1]), str(n)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def connect(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().split() == ["connected", str(self.n)]

    def check(self, within: float) -> dict:
        """How many of the connections the server has closed (EOF or reset),
        waiting up to ``within`` s for each; ``open``: still open then."""
        self.proc.stdin.write(f"check {within}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)
        self.proc.stdout.close()


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def scrape(server: MetricsServer) -> str:
    with urllib.request.urlopen("http://%s:%d/metrics" % server.address, timeout=10) as response:
        return response.read().decode()


def bounded_server(**bounds) -> MetricsServer:
    registry = CollectorRegistry()
    Gauge("reflexarc_bounds_test", "A value to find in the scrape", registry=registry).set(7)
    server = MetricsServer(("127.0.0.1", 0), registry, **bounds)
    server.start()
    return server


def test_the_defaults():
    assert MAX_CONNECTIONS == 32 and CONNECTION_DEADLINE_S == 10.0


def test_idle_connections_over_the_cap_hold_no_more_than_the_cap():
    server = bounded_server(max_connections=CAP, deadline=DEADLINE)
    n = CAP + 50
    clients = IdleClients(server.address, n)
    try:
        fd_base, thread_base = fds(), threading.active_count()
        clients.connect()
        most_fds, most_threads = 0, 0

        def all_dropped() -> bool:       # each one refused at accept or cut at its deadline
            nonlocal most_fds, most_threads
            most_fds, most_threads = max(most_fds, fds()), max(most_threads, threading.active_count())
            return server.refused + server.timed_out == n and server.connections == 0

        wait_until("every idle connection to be refused or dropped", all_dropped, timeout=30, every=0.01)
        assert server.refused > 0 and server.timed_out > 0
        assert most_fds <= fd_base + CAP + SLACK
        assert most_threads <= thread_base + CAP + SLACK
        assert clients.check(within=10) == {"closed": n, "open": 0, "data": 0}
        assert fds() <= fd_base + SLACK
    finally:
        clients.close()
        server.close()


def test_a_trickling_client_is_cut_off():
    server = bounded_server(max_connections=CAP, deadline=DEADLINE)
    request = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: trickle\r\n\r\n"
    sock = socket.create_connection(server.address)
    got, cut, sent = b"", False, 0
    give_up = time.monotonic() + DEADLINE + 10          # a bound on the test, not a timed assertion
    try:
        while not cut and sent < len(request) and time.monotonic() < give_up:
            try:
                sock.sendall(request[sent:sent + 1])
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            sent += 1
            ready, _, _ = select.select([sock], [], [], 0.3)
            if ready:
                try:
                    got = sock.recv(4096)
                except ConnectionResetError:
                    got = b""
                cut = not got
                break
    finally:
        sock.close()
        server.close()
    assert cut and got == b"", (sent, got)
    assert sent < len(request)
    assert server.timed_out == 1 and server.refused == 0


def test_a_scrape_refused_while_the_cap_is_held_succeeds_once_it_is_released():
    server = bounded_server(max_connections=CAP, deadline=3.0)
    clients = IdleClients(server.address, CAP + 4)
    try:
        clients.connect()
        wait_until("the cap to be held", lambda: server.connections == CAP and server.refused == 4, timeout=30,
                   every=0.01)
        with pytest.raises(OSError):           # closed at accept: no response
            scrape(server)
        assert server.refused == 5
        wait_until("the idle connections to be dropped", lambda: server.connections == 0, timeout=30)
        assert "reflexarc_bounds_test 7.0" in scrape(server)
        assert server.timed_out == CAP and server.refused == 5
        assert clients.check(within=10) == {"closed": CAP + 4, "open": 0, "data": 0}
    finally:
        clients.close()
        server.close()


def test_close_returns_while_idle_clients_are_connected():
    server = bounded_server(max_connections=CAP, deadline=600.0)
    clients = IdleClients(server.address, CAP)
    try:
        clients.connect()
        wait_until("the cap to be held", lambda: server.connections == CAP, timeout=30, every=0.01)
        closing = threading.Thread(target=server.close)
        closing.start()
        closing.join(timeout=30)                          # a bound on the test, not a timed assertion
        assert not closing.is_alive()
        assert clients.check(within=10) == {"closed": CAP, "open": 0, "data": 0}
        wait_until("the handler threads to end", lambda: server.connections == 0, timeout=30)
        assert server.timed_out == 0 and server.refused == 0
        with pytest.raises(urllib.error.URLError):
            scrape(server)
    finally:
        clients.close()
        server.close()
