"""A real etcd cluster (Debian's ``etcd-server``) on loopback for the fleet's
tests and benchmark: three members by default, each on free client and peer
ports with its data in a temp dir, removed on exit.

A member can be SIGKILLed (``kill``) and brought back on its ports and data
(``start``); ``stop`` takes the whole cluster down (the store unreachable) and
``start`` brings it back. ``leader()`` asks the members which of them leads.
With ``tls`` (``tls.make_certificates``) the members serve their clients over
HTTPS and ask each for a certificate their CA signed (``--client-cert-auth``),
as a production etcd does; the peers still talk plain HTTP on loopback.

Example::

    with EtcdCluster() as etcd:
        store = EtcdStore(etcd.endpoints)
        etcd.kill(etcd.leader())       # the others elect a new leader
        etcd.wait_healthy()
        etcd.running                   # [0, 2]: the members still up
        etcd.stop()                    # nothing answers any more
    with EtcdCluster(tls=make_certificates(tmp)) as etcd:   # https://, client certificates required
        ...

Overhead: ~20 MB and a few ms of CPU a second per member; starting a cluster
takes ~1-2 s (its first election).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import ssl
import subprocess
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

from .local_server import free_port
from .tls import Certificates

BINARY = "/usr/bin/etcd"
STOP_GRACE = 2.0

__all__ = ["BINARY", "EtcdCluster"]


class EtcdCluster:
    def __init__(self, members: int = 3, start_timeout: float = 30.0, tls: Certificates | None = None) -> None:
        self.size = members
        self.tls = tls
        self._context = None
        if tls is not None:              # how this harness asks the members: as a client the CA signed
            self._context = ssl.create_default_context(cafile=str(tls.ca))
            self._context.load_cert_chain(str(tls.client_cert), str(tls.client_key))
        self.start_timeout = start_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="rxetcd-"))
        self.token = f"rx-{uuid.uuid4().hex[:8]}"
        self.procs: list[subprocess.Popen | None] = [None] * members
        self.client_ports: list[int] = []
        self.peer_ports: list[int] = []

    # --- addresses ---------------------------------------------------------------------------
    @property
    def endpoints(self) -> list[str]:
        """Every member's client URL, in member order."""
        scheme = "https" if self.tls is not None else "http"
        return [f"{scheme}://127.0.0.1:{port}" for port in self.client_ports]

    @property
    def running(self) -> list[int]:
        """The members whose process is up."""
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None]

    def _name(self, i: int) -> str:
        return f"m{i}"

    def _flags(self, i: int) -> list[str]:
        peers = ",".join(f"{self._name(j)}=http://127.0.0.1:{p}" for j, p in enumerate(self.peer_ports))
        client, peer = self.endpoints[i], f"http://127.0.0.1:{self.peer_ports[i]}"
        tls = [] if self.tls is None else ["--cert-file", str(self.tls.server_cert), "--key-file",
                                           str(self.tls.server_key), "--trusted-ca-file", str(self.tls.ca),
                                           "--client-cert-auth"]
        return [*tls, "--name", self._name(i), "--data-dir", str(self.dir / self._name(i)),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", peers, "--initial-cluster-state", "new",
                "--initial-cluster-token", self.token, "--logger", "zap", "--log-level", "warn"]

    # --- life ------------------------------------------------------------------------------------
    def __enter__(self):
        try:
            for _ in range(3):          # a free port can be taken before a member binds it
                self.client_ports = [free_port() for _ in range(self.size)]
                self.peer_ports = [free_port() for _ in range(self.size)]
                if len(set(self.client_ports + self.peer_ports)) < 2 * self.size:
                    continue
                for i in range(self.size):
                    self._spawn(i)
                try:
                    self.wait_healthy()
                    return self
                except RuntimeError:
                    self.stop()
                    for i in range(self.size):
                        shutil.rmtree(self.dir / self._name(i), ignore_errors=True)
            raise RuntimeError(f"etcd did not start:\n{self.log()}")
        except BaseException:
            self.__exit__()
            raise

    def _spawn(self, i: int) -> None:
        with open(self.dir / f"{self._name(i)}.log", "ab") as log:
            self.procs[i] = subprocess.Popen([BINARY, *self._flags(i)], stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)

    def kill(self, member: int) -> None:
        """SIGKILL one member (its data stays for ``start``)."""
        proc = self.procs[member]
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()

    def stop(self) -> None:
        """Stop every member: SIGTERM, then SIGKILL after ``STOP_GRACE`` s (a
        member that lost its peers spends seconds trying to hand its leadership
        over; its data is safe either way, the WAL is synced)."""
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + STOP_GRACE
        for proc in self.procs:
            if proc is None:
                continue
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def start(self, member: int | None = None) -> None:
        """Bring back one stopped member, or every stopped one, on its ports and
        data; returns once the cluster has a leader again (with a quorum up)."""
        for i in range(self.size) if member is None else (member,):
            if i not in self.running:
                self._spawn(i)
        if len(self.running) > self.size // 2:
            self.wait_healthy()

    # --- asking the members ----------------------------------------------------------------------
    def _status(self, i: int) -> dict | None:
        request = urllib.request.Request(f"{self.endpoints[i]}/v3/maintenance/status", data=b"{}",
                                         method="POST")
        try:
            with urllib.request.urlopen(request, timeout=2, context=self._context) as response:
                return json.load(response)
        except (OSError, ValueError):
            return None

    def leader(self) -> int | None:
        """The member that leads now (as the members up say), or None."""
        ids = {}
        leaders = set()
        for i in self.running:
            status = self._status(i)
            if status is None:
                continue
            ids[status["header"]["member_id"]] = i
            if status.get("leader") and status["leader"] != "0":
                leaders.add(status["leader"])
        for leader in leaders:
            if leader in ids:
                return ids[leader]
        return None

    def healthy(self) -> bool:
        """Every member up answers ``/health`` true (it sees a leader)."""
        up = self.running
        if not up:
            return False
        for i in up:
            try:
                with urllib.request.urlopen(f"{self.endpoints[i]}/health", timeout=2,
                                            context=self._context) as response:
                    if json.load(response).get("health") != "true":
                        return False
            except (OSError, ValueError):
                return False
        return True

    def wait_healthy(self, timeout: float | None = None) -> None:
        """Return once every member up is healthy and one of them leads;
        RuntimeError with the members' logs after ``timeout`` s."""
        deadline = time.monotonic() + (self.start_timeout if timeout is None else timeout)
        while time.monotonic() < deadline:
            if self.healthy() and self.leader() is not None:
                return
            time.sleep(0.1)
        raise RuntimeError(f"etcd not healthy within {self.start_timeout:g} s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')}"
                         for path in sorted(self.dir.glob("*.log")))

    def __exit__(self, *exc) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
