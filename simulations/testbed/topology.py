"""The testbed's network: one namespace per rank, a switch, a spine and an object
store, with the switch's uplink egress as the bottleneck shared by the
collective and by anything else rank 0 sends to the far side.

Layout, with ``P`` standing for the prefix (e.g. ``rxtb42``: ``Pr0`` is the
namespace ``rxtb42r0``) and N ranks::

  netns Pr0              netns Psw (router)                netns Psp (bridge Pbr)
 +-------------+      +---------------------------+      +----------------------+
 | Pe0         +------+ Ppa                  Ppu  +======+ Psu                  |
 | 10.77.0.2   |      | 10.77.0.1       10.77.1.1 |  ^   |                      |
 | gw .0.1     |      | ip_forward=1              |  |   | Ps1 ---- Pe1 [Pr1]   | 10.77.1.11
 +-------------+      +---------------------------+  |   | Ps2 ---- Pe2 [Pr2]   | 10.77.1.12 ...
  rank 0                                             |   | Pss ---- Pes [Pst]   | 10.77.1.2
                                     bottleneck: egress  +----------------------+  store: HTTP :80
                                     of Ppu, HTB by DSCP    far side, gw 10.77.1.1  sink   :443
                                     (reverse: egress of Ppa, only with shape_reverse)

Rank 0 sits alone on the switch's port A (``Ppa``); ranks 1..N-1 and the store
sit behind the switch's uplink (``Ppu``), on one bridge in the spine namespace:
a leaf-spine in miniature. Rank 0's collective traffic to the other ranks and an
upload from rank 0 to the store leave through the same egress, ``Ppu`` in
``Psw``, whose HTB classifies by DSCP (``switch.py``). The addresses are private
and exist only inside these namespaces (each namespace is its own stack, so
concurrent testbeds reuse them without conflict); names carry the prefix, so
they do not collide either.

Everything the testbed creates is named after the prefix: namespaces ``Pr<i>``,
``Psw``, ``Psp``, ``Pst``; the cgroup v2 directory ``P`` (the store in
``P/store``, job ranks in ``P/job<n>/r<i>``, faults in ``P/<fault>``); the work
directory ``<tmp>/reflexarc-testbed/P`` (dataset, logs, hook sockets, state).
``down()`` and ``sweep(prefix)`` remove all of it, processes first.

Example::

    with Testbed(ranks=2, bottleneck="200mbit") as tb:
        job = tb.start_job(duration=60)
        time.sleep(20)
        job.median_step_ms(time.time() - 15, time.time())     # ~190

Overhead: ``up()`` takes about 0.3 s for two ranks (some 45 ``ip``/``tc`` calls and
the store writing its items); ``down()`` under 0.1 s when every process ends on
SIGTERM (3 s more for one that ignores it).
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path
from typing import NamedTuple

from reflexarc.core.cgroups import cgroup2_id

from . import procs, switch
from .handle import Job, Rank
from .procs import TestbedError
from .store import control

PREFIX = re.compile(r"[a-z][a-z0-9]{1,7}")
NETNS_SUFFIX = r"(r\d+|sw|sp|st)"
LINK_SUFFIX = r"(e\d+|es|pa|pu|su|s\d+|ss|br)"
MAX_RANKS = 16
EPOCH_STEPS = 100          # the job's steps per epoch (each epoch forks new DataLoader workers)
RANK0_NET, FAR_NET = "10.77.0", "10.77.1"
STORE_PORT, SINK_PORT, RENDEZVOUS_PORT = 80, 443, 29500


class Port(NamedTuple):
    netns: str
    iface: str


def default_prefix() -> str:
    return f"rxtb{os.getpid() % 10000}"


def workdir_of(prefix: str) -> Path:
    return Path(tempfile.gettempdir()) / "reflexarc-testbed" / prefix


class Testbed:
    """A multi-rank network with a DSCP-aware bottleneck and an object store."""

    def __init__(self, ranks: int = 2, bottleneck: str = "200mbit", prefix: str | None = None, *,
                 shape_reverse: bool = False, items: int = 256, item_kb: int = 64,
                 buffer: int = switch.DEFAULT_BUFFER) -> None:
        self.prefix = prefix or default_prefix()
        if not PREFIX.fullmatch(self.prefix):
            raise ValueError(f"prefix {self.prefix!r} must match {PREFIX.pattern} (names must fit 15 characters)")
        if not 2 <= ranks <= MAX_RANKS:
            raise ValueError(f"ranks must be 2..{MAX_RANKS}")
        self.ranks, self.rate, self.rate_bps = ranks, bottleneck, switch.parse_rate(bottleneck)
        self.shape_reverse, self.items, self.item_kb, self.buffer = shape_reverse, items, item_kb, buffer
        self.workdir = workdir_of(self.prefix)
        self.hook_dir = self.workdir / "hooks"
        self._procs: list[subprocess.Popen] = []
        self._jobs = itertools.count()

    # -- names and addresses ---------------------------------------------------------

    def rank_netns(self, i: int) -> str:
        return f"{self.prefix}r{self._rank(i)}"

    def rank_iface(self, i: int) -> str:
        return f"{self.prefix}e{self._rank(i)}"

    def rank_addr(self, i: int) -> str:
        return f"{RANK0_NET}.2" if self._rank(i) == 0 else f"{FAR_NET}.{10 + i}"

    def _rank(self, i: int) -> int:
        if not 0 <= i < self.ranks:
            raise IndexError(f"rank {i} outside 0..{self.ranks - 1}")
        return i

    @property
    def switch_netns(self) -> str:
        return f"{self.prefix}sw"

    @property
    def spine_netns(self) -> str:
        return f"{self.prefix}sp"

    @property
    def store_netns(self) -> str:
        return f"{self.prefix}st"

    @property
    def store_addr(self) -> str:
        return f"{FAR_NET}.2"

    @property
    def store_url(self) -> str:
        return f"http://{self.store_addr}:{STORE_PORT}"

    @property
    def store_control(self) -> str:
        return str(self.workdir / "store.sock")

    @property
    def bottleneck(self) -> Port:
        """The switch egress every rank-0 flow to the far side leaves through."""
        return Port(self.switch_netns, f"{self.prefix}pu")

    @property
    def reverse_port(self) -> Port:
        """The switch egress towards rank 0 (shaped only with ``shape_reverse``)."""
        return Port(self.switch_netns, f"{self.prefix}pa")

    @property
    def cgroup(self) -> str:
        """The testbed's cgroup v2 directory, relative to the cgroup2 mount."""
        return self.prefix

    @property
    def events(self) -> Path:
        return self.workdir / "events.jsonl"

    def describe(self) -> dict:
        qos = {"rate": self.rate, "rate_bps": self.rate_bps, "buffer_bytes": self.buffer,
               "classes": switch.classes(self.rate_bps)}
        return {
            "prefix": self.prefix,
            "ranks": [{"rank": i, "netns": self.rank_netns(i), "iface": self.rank_iface(i), "addr": self.rank_addr(i)}
                      for i in range(self.ranks)],
            "switch": {"netns": self.switch_netns, "port_a": {"iface": self.reverse_port.iface, "addr": f"{RANK0_NET}.1"},
                       "uplink": {"iface": self.bottleneck.iface, "addr": f"{FAR_NET}.1"}},
            "spine": {"netns": self.spine_netns, "bridge": f"{self.prefix}br"},
            "store": {"netns": self.store_netns, "iface": f"{self.prefix}es", "addr": self.store_addr,
                      "url": self.store_url, "sink_port": SINK_PORT, "control": self.store_control,
                      "items": self.items, "item_kb": self.item_kb},
            "bottleneck": {**self.bottleneck._asdict(), **qos},
            "reverse": {**self.reverse_port._asdict(), **qos} if self.shape_reverse else None,
            "cgroup": self.cgroup, "workdir": str(self.workdir), "hook_dir": str(self.hook_dir),
            "events": str(self.events),
        }

    def class_stats(self, port: Port | None = None) -> dict:
        """Bytes, packets and drops per HTB class of the bottleneck (or ``port``)."""
        port = port or self.bottleneck
        return switch.class_stats(procs.run("tc", "-n", port.netns, "-s", "class", "show", "dev", port.iface))

    # -- life cycle ------------------------------------------------------------------

    def __enter__(self) -> "Testbed":
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> "Testbed":
        """Build everything; on any failure (signals included) remove what was built and re-raise."""
        try:
            self.workdir.mkdir(parents=True)
        except FileExistsError:
            raise TestbedError(f"prefix {self.prefix} is in use ({self.workdir} exists); "
                               f"if it is left from a crash, sweep it") from None
        try:
            self._build()
        except BaseException:
            self.down()
            raise
        return self

    def _build(self) -> None:
        ip = procs.run
        self.hook_dir.mkdir()
        far = [(self.rank_netns(i), self.rank_iface(i), f"{self.prefix}s{i}", self.rank_addr(i))
               for i in range(1, self.ranks)] + [(self.store_netns, f"{self.prefix}es", f"{self.prefix}ss",
                                                  self.store_addr)]
        for ns in [self.rank_netns(0), self.switch_netns, self.spine_netns, *(f[0] for f in far)]:
            ip("ip", "netns", "add", ns)
            ip("ip", "-n", ns, "link", "set", "lo", "up")
        sw, sp, bridge = self.switch_netns, self.spine_netns, f"{self.prefix}br"
        ip("ip", "-n", sp, "link", "add", bridge, "type", "bridge")
        self._veth(self.rank_netns(0), self.rank_iface(0), sw, self.reverse_port.iface)
        self._veth(sw, self.bottleneck.iface, sp, f"{self.prefix}su")
        for ns, iface, port, _ in far:
            self._veth(ns, iface, sp, port)
        for port in [f"{self.prefix}su", *(f[2] for f in far)]:
            ip("ip", "-n", sp, "link", "set", port, "master", bridge, "up")
        ip("ip", "-n", sp, "link", "set", bridge, "up")
        self._address(self.rank_netns(0), self.rank_iface(0), f"{RANK0_NET}.2", f"{RANK0_NET}.1")
        self._address(sw, self.reverse_port.iface, f"{RANK0_NET}.1")
        self._address(sw, self.bottleneck.iface, f"{FAR_NET}.1")
        for ns, iface, _, addr in far:
            self._address(ns, iface, addr, f"{FAR_NET}.1")
        ip("ip", "netns", "exec", sw, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1")
        for port in [self.bottleneck] + ([self.reverse_port] if self.shape_reverse else []):
            for argv in switch.qos_commands(port.netns, port.iface, self.rate_bps, self.buffer):
                ip(*argv)
        try:
            (procs.cgroup2_root() / self.cgroup).mkdir()
        except FileExistsError:
            raise TestbedError(f"cgroup {self.cgroup} already exists; if it is left from a crash, sweep it") from None
        self._start_store()
        (self.workdir / "testbed.json").write_text(json.dumps(self.describe(), indent=1) + "\n")
        self.event(event="up", prefix=self.prefix)

    @staticmethod
    def _veth(ns_a: str, name_a: str, ns_b: str, name_b: str) -> None:
        procs.run("ip", "link", "add", name_a, "netns", ns_a, "type", "veth", "peer", "name", name_b, "netns", ns_b)
        procs.run("ip", "-n", ns_a, "link", "set", name_a, "up")
        procs.run("ip", "-n", ns_b, "link", "set", name_b, "up")

    @staticmethod
    def _address(ns: str, iface: str, addr: str, gateway: str | None = None) -> None:
        procs.run("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", iface)
        if gateway:
            procs.run("ip", "-n", ns, "route", "add", "default", "via", gateway)

    def second_store(self) -> str:
        """Start another object store beside the first (same items, its own port
        and its own modes: a fault on one store leaves the other's jobs alone);
        returns its URL."""
        self._start_store(port=STORE_PORT + 1, sink=SINK_PORT + 1, socket=str(self.workdir / "store2.sock"),
                          name="store2")
        return f"http://{self.store_addr}:{STORE_PORT + 1}"

    def _start_store(self, timeout: float = 30.0, *, port: int = STORE_PORT, sink: int = SINK_PORT,
                     socket: str | None = None, name: str = "store") -> None:
        socket = socket or self.store_control
        proc = self.spawn([sys.executable, "-m", "reflexarc.simulations.testbed.store", "--dir",
                           str(self.workdir / "data"), "--addr", self.store_addr, "--port", str(port),
                           "--sink-port", str(sink), "--control", socket,
                           "--items", str(self.items), "--item-kb", str(self.item_kb)],
                          name=name, netns=self.store_netns, cgroup=name)
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise TestbedError(f"the store exited ({proc.returncode}): {self.log_tail(name)}")
            try:
                control(socket)
                return
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise TestbedError(f"the store did not come up within {timeout:g}s") from None
                time.sleep(0.1)

    def down(self) -> None:
        """End every process, remove namespaces, cgroups and the work directory; SIGINT
        and SIGTERM wait until it is done. Raises if something could not be removed."""
        with procs.signals_deferred():
            procs.end_groups(self._procs)
            self._procs.clear()
            sweep(self.prefix)

    # -- running things inside -------------------------------------------------------

    def spawn(self, argv: list[str], *, name: str, netns: str | None = None,
              cgroup: str | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
        """Start a tracked process (ended on ``down``) in ``netns`` and in the cgroup
        ``<prefix>/<cgroup>``, with ``env`` added to its environment; its stdout
        goes to ``<workdir>/<name>.log``."""
        cg = procs.make_cgroup(f"{self.cgroup}/{cgroup}") if cgroup else None
        proc = procs.spawn(argv, tag=self.prefix, stdout=self.workdir / f"{name}.log", netns=netns, cgroup=cg,
                           env=env)
        self._procs.append(proc)
        return proc

    def log_tail(self, name: str, lines: int = 5) -> str:
        """The last lines of a process's stderr (``<name>.log.err``), for error messages."""
        try:
            text = (self.workdir / f"{name}.log.err").read_text(errors="replace")
        except OSError:
            return "(no stderr)"
        return " | ".join(text.strip().splitlines()[-lines:]) or "(empty stderr)"

    def event(self, **fields) -> float:
        """Append a JSON line with the wall-clock ``ts`` to the events log; returns ``ts``."""
        ts = fields.pop("ts", None) or time.time()
        with open(self.events, "a") as f:
            f.write(json.dumps({"ts": ts, **fields}) + "\n")
        return ts

    def store_mode(self, mode: str, ms: float = 0.0) -> float:
        """Switch the store's mode; returns the wall-clock onset the store logged."""
        reply = control(self.store_control, mode=mode, ms=ms)
        return self.event(ts=reply["ts"], event="store-mode", mode=mode, ms=ms)

    def start_job(self, *, name: str | None = None, workers: int = 2, prefetch: int = 2, batch: int = 16,
                  epoch_steps: int = EPOCH_STEPS, decode_ms: float = 0.0, steps: int | None = None,
                  duration: float | None = None, ready_timeout: float = 90.0, launcher: str = "torchrun",
                  hooks: bool = True, store_url: str | None = None, ranks: int | None = None,
                  compute_ms: float = 0.0, checkpoint_every: int = 0) -> Job:
        """Start the training job, one process per rank in its namespace and cgroup,
        and wait until every rank is ready; ``steps`` or ``duration`` ends it (none:
        it runs until ``stop()``). ``ranks``: fewer ranks than the testbed has (the
        first ones' namespaces).

        Each rank is launched as ``launcher`` would (``launches``): torchrun's
        environment with each rank in its own pod-style cgroup (a PyTorchJob's pod
        per node), or Slurm's with each rank in its job step's cgroup. Nothing
        names the job to the controller: it finds it. Without ``hooks`` the job
        is unmodified: it imports nothing of reflexarc's hook library.
        ``checkpoint_every``: rank 0 writes a checkpoint every that many steps
        while the others wait (``job.py``'s ``--checkpoint-every``; 0: none)."""
        n = next(self._jobs)
        rendezvous = f"{self.rank_addr(0)}:{RENDEZVOUS_PORT + n}"
        world = ranks or self.ranks
        ranks = []
        for i in range(world):
            env, cgroup, label = launches(launcher, name or f"{self.prefix}job{n}", n, i, world, rendezvous)
            argv = [sys.executable, "-m", "reflexarc.simulations.testbed.job", "--rank", str(i),
                    "--world", str(world), "--master", rendezvous,
                    "--iface", self.rank_iface(i), "--store", store_url or self.store_url,
                    "--items", str(self.items),
                    "--item-kb", str(self.item_kb), "--workers", str(workers),
                    "--prefetch", str(prefetch), "--batch", str(batch), "--epoch-steps", str(epoch_steps),
                    "--decode-ms", str(decode_ms), "--compute-ms", str(compute_ms)]
            argv += ["--hook-dir", str(self.hook_dir)] if hooks else ["--no-hooks"]
            argv += ["--checkpoint-every", str(checkpoint_every)] if checkpoint_every else []
            argv += ["--steps", str(steps)] if steps else []
            argv += ["--duration", str(duration)] if duration else []
            log = f"job{n}-r{i}"
            proc = self.spawn(argv, name=log, netns=self.rank_netns(i), cgroup=f"job{n}/{cgroup}", env=env)
            cg = f"{self.cgroup}/job{n}/{cgroup}"
            ranks.append(Rank(i, proc, cg, cgroup2_id(cg), self.workdir / f"{log}.log"))
        job = Job(label, ranks)
        self.event(event="job-start", job=name, pids=job.pids)
        try:
            job.wait_ready(ready_timeout)
        except BaseException:
            job.stop(timeout=2.0)
            raise
        return job

def launches(launcher: str, name: str, n: int, rank: int, world: int, rendezvous: str) -> tuple[dict, str, str]:
    """What ``launcher`` gives rank ``rank`` of job ``name`` (the testbed's ``n``-th):
    its environment, its cgroup below the job's directory (kubelet's systemd
    layout for torchrun, one pod per rank; Slurm's step layout for slurm), and
    the job's name as the node sees it."""
    addr, port = rendezvous.rsplit(":", 1)
    if launcher == "torchrun":
        pod = uuid.UUID(int=(zlib.crc32(name.encode()) << 64) | (n << 16) | rank)
        container = hashlib.sha256(f"{name}/{rank}".encode()).hexdigest()
        env = {"TORCHELASTIC_RUN_ID": name, "RANK": str(rank), "LOCAL_RANK": "0", "GROUP_RANK": str(rank),
               "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": addr, "MASTER_PORT": port,
               "TORCHELASTIC_RESTART_COUNT": "0"}
        uid = str(pod).replace("-", "_")
        return env, (f"kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
                     f"cri-containerd-{container}.scope"), name
    if launcher == "slurm":
        job_id = str(4000 + zlib.crc32(name.encode()) % 100000)
        env = {"SLURM_JOB_ID": job_id, "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank), "SLURM_LOCALID": "0",
               "SLURM_NTASKS": str(world), "SLURM_NODEID": str(rank)}
        return env, f"system.slice/slurmstepd.scope/job_{job_id}/step_0/user/task_{rank}", f"slurm-{job_id}"
    raise ValueError(f"unknown launcher {launcher!r} (torchrun or slurm)")


def _named(listing: str, pattern: str) -> list[str]:
    names = (line.split()[0].split("@")[0].rstrip(":") for line in listing.splitlines() if line.strip())
    return [n for n in names if re.fullmatch(pattern, n)]


def _netns(prefix: str) -> list[str]:
    return _named(procs.run("ip", "netns", "list", check=False), re.escape(prefix) + NETNS_SUFFIX)


def _root_links(prefix: str) -> list[str]:
    listing = "\n".join(line.split(":", 2)[1] for line in procs.run("ip", "-o", "link", "show", check=False)
                        .splitlines() if line.count(":") >= 2)
    return _named(listing, re.escape(prefix) + LINK_SUFFIX)


def residue(prefix: str) -> list[str]:
    """What is left of a testbed with ``prefix``: namespaces, links in this
    namespace, processes, its cgroup and work directory (empty once all is gone)."""
    left = [f"netns {n}" for n in _netns(prefix)] + [f"link {n}" for n in _root_links(prefix)]
    pids = procs.tagged_pids(prefix)
    for ns in _netns(prefix):
        pids |= procs.netns_pids(ns)
    cg = _cgroup_dir(prefix)
    if cg is not None and cg.exists():
        pids |= procs.cgroup_pids(cg)
        left.append(f"cgroup {cg}")
    left += [f"pid {p}" for p in sorted(pids)]
    if workdir_of(prefix).exists():
        left.append(f"workdir {workdir_of(prefix)}")
    return left


def _cgroup_dir(prefix: str) -> Path | None:
    try:
        return procs.cgroup2_root() / prefix
    except TestbedError:
        return None


def sweep(prefix: str) -> list[str]:
    """Remove every process, namespace, link, cgroup and file of the testbed with
    ``prefix``, whoever created it; returns what was removed. Raises
    ``TestbedError`` if something is still there afterwards."""
    if not PREFIX.fullmatch(prefix):
        raise ValueError(f"prefix {prefix!r} must match {PREFIX.pattern}")
    found = residue(prefix)
    namespaces, cg = _netns(prefix), _cgroup_dir(prefix)
    pids = procs.tagged_pids(prefix)
    for ns in namespaces:
        pids |= procs.netns_pids(ns)
    if cg is not None:
        pids |= procs.cgroup_pids(cg)
    procs.end_pids(pids)
    for ns in namespaces:           # deleting a namespace deletes the veths inside
        procs.run("ip", "netns", "del", ns, check=False)
    for link in _root_links(prefix):
        procs.run("ip", "link", "del", link, check=False)
    if cg is not None:
        procs.remove_cgroup_tree(cg)
    shutil.rmtree(workdir_of(prefix), ignore_errors=True)
    left = residue(prefix)
    if left:
        raise TestbedError(f"sweep {prefix}: still there: {', '.join(left)}")
    return found
