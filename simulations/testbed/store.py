"""The object store: a threaded HTTP server with a real dataset, whose service
mode changes at run time, plus a sink for uploads.

Run inside the store's namespace, it writes ``--items`` deterministic
pseudo-random items of ``--item-kb`` KiB each into ``--dir`` and serves
``GET /item/<i>`` from those files. A Unix socket (``--control``, reachable from
any namespace) switches the mode:

* ``normal``: no added delay;
* ``latency``: each request waits ``ms`` before its reply, independently of the
  others (latency-bound: more client parallelism helps);
* ``serial``: requests are served one at a time, ``ms`` each (throughput-capped:
  more client parallelism does not help).

A TCP sink on ``--sink-port`` (443, a checkpoint upload's destination) reads and
discards whatever it is sent. Stdout gets JSON lines: ``ready``, and ``mode``
with the wall-clock ``ts`` of each switch.

Example::

    ip netns exec rxtb42st python -m reflexarc.simulations.testbed.store \\
        --dir /tmp/data --addr 10.77.1.2 --control /tmp/store.sock
    control("/tmp/store.sock", mode="latency", ms=60)   # {"ok": true, "ts": ..., "mode": "latency", ...}
    control("/tmp/store.sock")                          # the current mode and counters

Overhead: a thread per request (stdlib ``ThreadingHTTPServer``), about 0.4 ms of
CPU per 64 KiB item (measured over 1000 requests); writing the 256 default
items (16 MiB) takes a fraction of a second at start-up.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

MODES = ("normal", "latency", "serial")


def say(**fields) -> None:
    print(json.dumps({"ts": time.time(), **fields}), flush=True)


def control(path: str, timeout: float = 5.0, **request) -> dict:
    """One request to a store's control socket: ``mode=`` and ``ms=`` switch the
    mode; no arguments read the mode and counters. Returns the reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        sock.sendall(json.dumps(request).encode() + b"\n")
        reply = sock.makefile("rb").readline()
    data = json.loads(reply)
    if not data.get("ok"):
        raise ValueError(data.get("error", "store refused the request"))
    return data


class Store:
    """Items on disk, the current mode and the request counters."""

    def __init__(self, root: Path, items: int, item_kb: int, seed: int = 0) -> None:
        if items < 1 or item_kb < 1:
            raise ValueError("--items and --item-kb must be at least 1")
        self.root, self.items = root, items
        root.mkdir(parents=True, exist_ok=True)
        for i in range(items):
            (root / f"{i}.bin").write_bytes(random.Random(f"{seed}:{i}").randbytes(item_kb * 1024))
        self.mode, self.ms = "normal", 0.0
        self.served = self.sunk_bytes = 0
        self._lock = threading.Lock()         # guards mode and counters
        self._serial = threading.Lock()       # held while serving in serial mode

    def set_mode(self, mode: str, ms: float = 0.0) -> dict:
        if mode not in MODES:
            raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
        if ms < 0 or (mode != "normal" and ms == 0):
            raise ValueError(f"mode {mode} needs ms > 0")
        with self._lock:
            self.mode, self.ms = mode, float(ms) if mode != "normal" else 0.0
        ts = time.time()
        say(event="mode", mode=self.mode, ms=self.ms, onset=ts)
        return {"ts": ts, **self.state()}

    def state(self) -> dict:
        with self._lock:
            return {"mode": self.mode, "ms": self.ms, "served": self.served, "sunk_bytes": self.sunk_bytes}

    def item(self, i: int) -> bytes:
        """The item's bytes, after the delay the mode asks for."""
        with self._lock:
            mode, delay = self.mode, self.ms / 1000.0
            self.served += 1
        if mode == "serial":
            with self._serial:
                time.sleep(delay)
                return (self.root / f"{i}.bin").read_bytes()
        if mode == "latency":
            time.sleep(delay)
        return (self.root / f"{i}.bin").read_bytes()

    def sunk(self, n: int) -> None:
        with self._lock:
            self.sunk_bytes += n


def http_server(store: Store, addr: str, port: int) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:   # noqa: N802 - the stdlib's name
            parts = self.path.split("/")
            if len(parts) != 3 or parts[1] != "item" or not parts[2].isdigit() or int(parts[2]) >= store.items:
                self.send_error(404)
                return
            body = store.item(int(parts[2]))
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer((addr, port), Handler)
    server.daemon_threads = True
    return server


def serve_sink(store: Store, listener: socket.socket) -> None:
    def drain(conn: socket.socket) -> None:
        with conn:
            while chunk := conn.recv(1 << 20):
                store.sunk(len(chunk))

    while True:
        conn, _ = listener.accept()
        threading.Thread(target=drain, args=(conn,), daemon=True).start()


def control_listener(path: str) -> socket.socket:
    if os.path.exists(path):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    os.chmod(path, 0o600)
    listener.listen(8)
    return listener


def serve_control(store: Store, listener: socket.socket) -> None:
    while True:
        conn, _ = listener.accept()
        with conn:
            try:
                req = json.loads(conn.makefile("rb").readline() or b"{}")
                reply = store.set_mode(req["mode"], float(req.get("ms", 0))) if "mode" in req else store.state()
                reply = {"ok": True, **reply}
            except (ValueError, TypeError, KeyError) as exc:
                reply = {"ok": False, "error": str(exc)}
            try:
                conn.sendall(json.dumps(reply).encode() + b"\n")
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", required=True, type=Path, help="where the items are written")
    ap.add_argument("--addr", required=True)
    ap.add_argument("--port", type=int, default=80)
    ap.add_argument("--sink-port", type=int, default=443)
    ap.add_argument("--control", required=True, help="path of the control socket")
    ap.add_argument("--items", type=int, default=256)
    ap.add_argument("--item-kb", type=int, default=64)
    args = ap.parse_args(argv)
    try:
        store = Store(args.dir, args.items, args.item_kb)
        server = http_server(store, args.addr, args.port)
        sink = socket.create_server((args.addr, args.sink_port), backlog=16)
        ctl = control_listener(args.control)
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    threading.Thread(target=serve_sink, args=(store, sink), daemon=True).start()
    threading.Thread(target=serve_control, args=(store, ctl), daemon=True).start()
    say(event="ready", pid=os.getpid(), items=args.items, item_kb=args.item_kb, port=args.port,
        sink_port=args.sink_port)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
