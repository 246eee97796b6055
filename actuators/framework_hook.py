"""The ``framework_hook`` actuator: calls a handler a training script registered with
``reflexarc.actuators.hooks.Hooks``, over the script's Unix socket.

Endpoints are the sockets ``<hook_dir>/<job>-<rank>-<pid>.sock`` (root's
scripts) and ``<hook_dir>/<job>/<job>-<rank>-<pid>.sock`` (the scripts of the
user root made that job directory for; ``reflexarc.actuators.hooks``) of the
target: the job from the labels or selector, the rank from ``labels["rank"]``,
and the process from ``labels["pid"]`` (the process itself or, for a DataLoader
worker's pid, its training process), the descendants of ``selector["pids"]``
and the ``selector["cgroup"]`` subtree.

Nothing is trusted by its name alone (``HookClient``): the hook directory must
be root's (or the controller user's) and a job directory its owner's, neither
writable by others; on each connection SO_PEERCRED must give the pid the
socket's name claims and the uid of its directory's owner, the pid's start time
must be the one the reply states (and the one recorded at plan time), and a
reply must fit its size limit and, for signals, the schema (``signals_of``).
What fails is a ``HookRejected`` with a typed ``Rejected`` reason.

``plan`` asks each endpoint to describe the handler (its ``preview``, if it has
one) and never calls it; ``apply`` calls it, queued for the next step boundary when
``at_step_boundary`` is set; ``revert`` calls its undo (the script runs an undo once
per applied call, so a repeated revert is harmless; a handler without an undo makes
revert a no-op, which the plan's summary says). Each endpoint is recorded with the
script's instance id: a restarted script with the same pid is never called on the
old change's behalf.

The change (plain JSON)::

    before = {"handler": "dataloader.prefetch",
              "endpoints": [{"socket": ".../llama-0-812.sock", "job": "llama", "rank": 0, "pid": 812,
                             "start": 91023, "instance": "5f0c...", "state": {"prefetch_factor": 2}}]}
    after  = the same with "state" as the preview's "after"; without a preview,
             before's state is None and after's is the call's args

``read_signals(hook_dir)`` collects the step signals the scripts report (and
what it did not trust); ``served_by_pid(hook_dir)`` maps each training process
serving hooks to its rank and the job it announces, for labels.

Example::

    act = FrameworkHookActuator(hook_dir="/run/reflexarc/hooks")
    change = act.plan(Target({"job": "llama", "rank": "0"}),
                      {"handler": "dataloader.prefetch", "args": {"factor": 4}})
    act.apply(change)       # returns {socket: handler result}
    act.revert(change)

Overhead: one Unix-socket round trip per endpoint and request (0.1-0.5 ms plus the
handler's own time; at a step boundary, up to one training step more, the same for all
endpoints since they are called at once), plus a SO_PEERCRED and a ``stat`` read of
the serving process per connection (~20 us); a scan lists the hook directory and each
job directory in it. ``read_signals`` reads on up to ``MAX_PARALLEL_READS`` threads
started per call (~50 us each).
"""
from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import socket
import stat
import time
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from typing import Callable, NamedTuple

from reflexarc.core.procfs import ProcFS
from reflexarc.core.targets import pid_label

from .base import Actuator, Change, PermanentActuatorError, Target, TemporaryActuatorError
from .hooks import JOB_CHARS, JOB_NAME, SIGNAL_NAMES, peer_credentials
from .specs import SPECS

log = logging.getLogger("reflexarc.actuators.framework_hook")

SOCKET_NAME = re.compile(rf"(?P<job>{JOB_CHARS}+)-(?P<rank>\d+)-(?P<pid>\d+)\.sock")
GRACE = 1.0          # seconds the client waits beyond the script's own step-boundary deadline
MAX_REPLY = 1 << 20
MAX_SIGNALS_REPLY = 16 << 10   # bytes of a ``signals`` reply line (a script's is ~400)
MAX_PARALLEL_READS = 32        # sockets read at once by ``read_signals``
RETRYABLE = (errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ECONNRESET, errno.EPIPE)
PERMANENT_KINDS = ("refused", "unknown_handler", "handler_error", "bad_request")


class Rejected(StrEnum):
    """Why a hook socket or reply is not trusted (the ``reason`` of
    ``reflexarc_hook_rejected_total``)."""

    PLACE = "place"          # not in the hook directory or a job directory in it, or not a socket
    PEER = "peer"            # the process serving it is not the pid and uid the socket claims
    STALE = "stale"          # the claimed pid names another process now (its start time differs)
    SELECTOR = "selector"    # the process is outside the selector of a policy that reads its job
    REPLY = "reply"          # the reply breaks the schema: size, shape, job, signal names, numbers
    TIMEOUT = "timeout"      # no full reply before the read's deadline (a script that does not answer)


class HookTimeout(TemporaryActuatorError):
    """No full reply within the wait."""


class HookRejected(PermanentActuatorError):
    """A hook socket, directory or reply the controller does not trust; ``where`` names it."""

    def __init__(self, reason: Rejected, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.reason, self.where = reason, where


class HookGone(PermanentActuatorError):
    """The endpoint's script is no longer there (socket removed, or another instance)."""


class HookUnreachable(TemporaryActuatorError):
    """Nobody listens on the socket (the script died and left it, or is starting)."""


class Endpoint(NamedTuple):
    path: str
    job: str
    rank: int
    pid: int
    uid: int     # whose process may serve it: the owner of its directory


def _place(directory: str, hook_dir: str) -> tuple[int, str | None]:
    """The uid whose processes may serve hooks in ``directory`` and the job it is
    for (None: any, in the hook directory itself). HookRejected(PLACE) unless it is
    the hook directory (owned by root or the controller's user) or a job directory
    in it (a real directory, not a link), writable by its owner only."""
    top = os.path.abspath(directory) == os.path.abspath(hook_dir)
    job = None if top else os.path.basename(directory)
    if not top and (os.path.dirname(os.path.abspath(directory)) != os.path.abspath(hook_dir)
                    or not JOB_NAME.fullmatch(job)):
        raise HookRejected(Rejected.PLACE, directory, f"neither {hook_dir} nor a job directory in it")
    st = os.stat(directory) if top else os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise HookRejected(Rejected.PLACE, directory, "not a directory")
    if top and st.st_uid not in (0, os.geteuid()):
        raise HookRejected(Rejected.PLACE, directory, f"owned by uid {st.st_uid}, not by root or the controller's user")
    if st.st_mode & 0o022:
        raise HookRejected(Rejected.PLACE, directory, f"writable by other users (mode {stat.S_IMODE(st.st_mode):04o}): "
                                                      "no socket in it is trusted")
    return st.st_uid, job


def scan(hook_dir: str, job: str | None = None,
         rank: int | str | None = None) -> tuple[list[Endpoint], list[HookRejected]]:
    """The sockets in ``hook_dir`` and in its job directories (optionally one
    job's and rank's), and what was ignored there, with why. A socket in a job
    directory must be named for that job. No socket is contacted."""
    try:
        places = [(hook_dir, *_place(hook_dir, hook_dir))]
        names = sorted(os.listdir(hook_dir))
    except FileNotFoundError:
        return [], []
    except HookRejected as exc:
        return [], [exc]
    rejected = []
    for name in names:
        path = os.path.join(hook_dir, name)
        if (job is None or name == job) and JOB_NAME.fullmatch(name) and os.path.isdir(path):
            try:
                places.append((path, *_place(path, hook_dir)))
            except HookRejected as exc:
                rejected.append(exc)
    want_rank = None if rank in (None, "") else str(rank).strip()
    found = []
    for directory, uid, place_job in places:
        try:
            entries = sorted(os.listdir(directory))
        except OSError:
            continue
        for name in entries:
            m = SOCKET_NAME.fullmatch(name)
            if not m or (job is not None and m["job"] != job) or want_rank not in (None, str(int(m["rank"]))):
                continue
            path = os.path.join(directory, name)
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if not stat.S_ISSOCK(st.st_mode):
                rejected.append(HookRejected(Rejected.PLACE, path, "named like a hook socket, but not one"))
            elif place_job is not None and m["job"] != place_job:
                rejected.append(HookRejected(Rejected.PLACE, path, f"claims job {m['job']} in the directory "
                                                                   f"of job {place_job}"))
            else:
                found.append(Endpoint(path, m["job"], int(m["rank"]), int(m["pid"]), uid))
    return found, rejected


def find_endpoints(hook_dir: str, job: str | None = None, rank: int | str | None = None) -> list[Endpoint]:
    """The sockets ``scan`` finds, optionally only those of one job and rank."""
    return scan(hook_dir, job, rank)[0]


def served_by_pid(hook_dir: str) -> dict[int, tuple[str, str]]:
    """The rank and job of each training process with a socket in ``hook_dir``,
    e.g. ``{4242: ("0", "llama"), 4243: ("1", "llama")}``: what a loader signal's
    ``trainer`` pid needs to carry ``rank`` (and, for a process started by no
    launcher, the job its script names). Costs a listing of the hook directories
    and a ``stat`` of ``/proc/<pid>`` per socket; sockets are not contacted: a
    socket counts while its pid runs as the user of its directory."""
    out = {}
    for ep in find_endpoints(hook_dir):
        try:
            if os.stat(f"/proc/{ep.pid}").st_uid == ep.uid:
                out[ep.pid] = (str(ep.rank), ep.job)
        except OSError:
            continue
    return out


def _finite(value) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:       # an integer beyond any float
        return False


class HookClient:
    """One request/reply exchange with a script's hook socket. Nothing is sent
    until the process serving it is the endpoint's: the pid and uid SO_PEERCRED
    gives are those the socket claims, that pid's start time is ``start`` (when
    a plan recorded one), and ``admit`` (endpoint -> why not, or None) lets it
    in. The reply must state that pid and start time, and fit in ``limit`` bytes;
    the whole exchange ends within ``wait`` seconds."""

    def __init__(self, endpoint: Endpoint, procfs: ProcFS, start: int | None = None,
                 admit: Callable[[Endpoint], str | None] | None = None, limit: int = MAX_REPLY) -> None:
        self.endpoint, self.procfs, self.start, self.admit, self.limit = endpoint, procfs, start, admit, limit

    def _check_peer(self, sock: socket.socket) -> int:
        """The start time of the process serving ``sock``, once it is the endpoint's."""
        ep = self.endpoint
        pid, uid, _ = peer_credentials(sock)
        if (pid, uid) != (ep.pid, ep.uid):
            raise HookRejected(Rejected.PEER, ep.path, f"claims pid {ep.pid} of uid {ep.uid}, but pid {pid} of uid "
                                                       f"{uid} serves it")
        started = self.procfs.start_time(pid)
        if started is None:
            raise HookRejected(Rejected.STALE, ep.path, f"pid {pid} is not running, yet its socket is served")
        if self.start is not None and started != self.start:
            raise HookRejected(Rejected.STALE, ep.path, f"pid {pid} started at {started}, not at {self.start}: "
                                                        "another process")
        why = self.admit(ep) if self.admit is not None else None
        if why:
            raise HookRejected(Rejected.SELECTOR, ep.path, why)
        return started

    def request(self, op: str, wait: float, **fields) -> dict:
        """Send ``{"op": op, **fields}`` and wait up to ``wait`` seconds for the reply;
        return it or raise an actuator error (HookRejected for an untrusted one)."""
        path = self.endpoint.path
        message = json.dumps({"op": op, **fields}).encode() + b"\n"
        deadline = time.monotonic() + wait
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(wait)
        reply = b""
        try:
            sock.connect(path)
            started = self._check_peer(sock)
            sock.settimeout(max(deadline - time.monotonic(), 0.001))
            sock.sendall(message)
            while b"\n" not in reply and len(reply) <= self.limit:
                sock.settimeout(max(deadline - time.monotonic(), 0.001))   # a reply that trickles ends too
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
        except socket.timeout:
            raise HookTimeout(f"{path}: no reply to {op} within {wait:g}s") from None
        except FileNotFoundError:
            raise HookGone(f"{path}: socket is gone") from None
        except ConnectionRefusedError:
            raise HookUnreachable(f"{path}: connection refused (nobody listening)") from None
        except PermissionError:
            raise PermanentActuatorError(f"{path}: refused by the socket's permissions") from None
        except OSError as exc:
            if exc.errno in RETRYABLE:
                raise TemporaryActuatorError(f"{path}: {exc.strerror}") from exc
            raise PermanentActuatorError(f"{path}: {exc}") from exc
        finally:
            sock.close()
        line, newline, _ = reply.partition(b"\n")
        if len(line) > self.limit:
            raise HookRejected(Rejected.REPLY, path, f"reply longer than {self.limit} bytes")
        if not newline:
            raise TemporaryActuatorError(f"{path}: the script closed the connection without a full reply")
        try:
            data = json.loads(line)
        except (ValueError, RecursionError):
            raise HookRejected(Rejected.REPLY, path, "reply is not JSON") from None
        if not isinstance(data, dict):
            raise HookRejected(Rejected.REPLY, path, "reply is not a JSON object")
        if not all(isinstance(data.get(k), int) and not isinstance(data.get(k), bool) for k in ("pid", "start")):
            raise HookRejected(Rejected.REPLY, path, "the reply does not state the script's pid and start time")
        if (data["pid"], data["start"]) != (self.endpoint.pid, started):
            raise HookRejected(Rejected.STALE, path, f"the reply says pid {data['pid']} started at {data['start']}; "
                                                     f"pid {self.endpoint.pid} started at {started}")
        if data.get("ok") is True:
            return data
        kind, error = data.get("kind", "?"), data.get("error", "")
        if kind == "timeout":
            raise TemporaryActuatorError(f"{path}: {error}")
        if kind == "stale":
            raise HookGone(f"{path}: {error}")
        if kind in PERMANENT_KINDS:
            raise PermanentActuatorError(f"{path}: {kind}: {error}")
        raise PermanentActuatorError(f"{path}: unexpected reply {str(data)[:200]}")


def described(reply: dict, path: str, handler: str | None = None) -> dict:
    """A ``describe`` reply checked against its schema (the instance; for one
    handler ``has_undo`` and an optional ``preview`` of ``before``/``after``; for
    all of them the list of handlers); HookRejected(REPLY) otherwise."""
    def bad(why: str) -> HookRejected:
        return HookRejected(Rejected.REPLY, path, f"describe reply {why}")
    if not isinstance(reply.get("instance"), str) or not reply["instance"]:
        raise bad("does not name the script's instance")
    if handler is None:
        handlers = reply.get("handlers")
        if not isinstance(handlers, list) or not all(isinstance(h, dict) and isinstance(h.get("handler"), str)
                                                     for h in handlers):
            raise bad("has no list of handlers")
        return reply
    if not isinstance(reply.get("has_undo"), bool):
        raise bad(f"does not say whether {handler} has an undo")
    preview = reply.get("preview")
    if preview is not None and not (isinstance(preview, dict) and {"before", "after"} <= set(preview)):
        raise bad("has a preview without 'before' and 'after'")
    return reply


def signals_of(reply: dict, ep: Endpoint) -> list[dict]:
    """The step signals of a ``signals`` reply as ``{"name", "labels": {"job",
    "rank"}, "value", "ts"}`` once it fits the schema: the endpoint's job and
    rank, ``signals`` an object with known signal names only (so at most one
    entry per known signal), each ``{"value": number, "ts": number}``, finite;
    HookRejected(REPLY) otherwise."""
    def bad(why: str) -> HookRejected:
        return HookRejected(Rejected.REPLY, ep.path, why)

    if reply.get("job") != ep.job or reply.get("rank") != ep.rank:
        raise bad(f"reply for job {reply.get('job')!r} rank {reply.get('rank')!r} from the socket of job {ep.job} "
                  f"rank {ep.rank}")
    signals = reply.get("signals")
    if not isinstance(signals, dict):
        raise bad("'signals' is not an object")
    unknown = sorted(set(signals) - set(SIGNAL_NAMES))
    if unknown:
        raise bad(f"unknown signal(s) {', '.join(repr(n[:40]) for n in unknown[:3])}; known: {', '.join(SIGNAL_NAMES)}")
    out = []
    for name, point in sorted(signals.items()):
        if not (isinstance(point, dict) and _finite(point.get("value")) and _finite(point.get("ts"))):
            raise bad(f"signal {name} is not {{'value': number, 'ts': number}} with finite numbers")
        out.append({"name": name, "labels": {"job": ep.job, "rank": str(ep.rank)},
                    "value": float(point["value"]), "ts": float(point["ts"])})
    return out


class HookSignals(NamedTuple):
    signals: list[dict]             # {"name", "labels": {"job", "rank"}, "value", "ts"}
    rejected: list[HookRejected]    # sockets, directories and replies not trusted, with why


def read_signals(hook_dir: str, job: str | None = None, timeout: float = 1.0, procfs: ProcFS | None = None,
                 admit: Callable[[Endpoint], str | None] | None = None) -> HookSignals:
    """The latest step signals of every trusted script in ``hook_dir`` (see
    ``HookClient``, ``signals_of``); unreachable scripts are left out, untrusted
    sockets and replies are in ``rejected``. The sockets are read concurrently
    (``MAX_PARALLEL_READS`` at a time) under one deadline, ``timeout`` seconds
    from the call, each waiting its share of it (all of it when they fit in
    one round): a script that does not answer in its share is in ``rejected``
    (``timeout``), so silent sockets cost the caller one deadline, however
    many, and cannot use up the time of the others."""
    procfs = procfs or ProcFS()
    endpoints, rejected = scan(hook_dir, job)
    if not endpoints:
        return HookSignals([], rejected)
    deadline = time.monotonic() + timeout
    workers = min(MAX_PARALLEL_READS, len(endpoints))
    share = timeout / -(-len(endpoints) // workers)      # each socket's wait: all fit in the deadline

    def read(ep: Endpoint):
        wait = min(share, deadline - time.monotonic())
        if wait <= 0:
            raise HookRejected(Rejected.TIMEOUT, ep.path, f"not read: the {timeout:g}s deadline of this read passed")
        try:
            return HookClient(ep, procfs, admit=admit, limit=MAX_SIGNALS_REPLY).request("signals", wait)
        except HookTimeout:
            raise HookRejected(Rejected.TIMEOUT, ep.path, f"no reply within {wait:.2f}s") from None

    out = []
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="hook-read") as pool:
        for ep, future in [(ep, pool.submit(read, ep)) for ep in endpoints]:
            try:
                out.extend(signals_of(future.result(), ep))
            except HookRejected as exc:
                rejected.append(exc)
            except (TemporaryActuatorError, PermanentActuatorError) as exc:
                log.debug("signals from %s: %s", ep.path, exc)
    return HookSignals(out, rejected)


def _plain_job(selector: dict) -> str | None:
    """The selector's job, unless it is a regex (``~``) or negated (``!``) matcher."""
    job = selector.get("job") or (selector.get("match") or {}).get("job")
    return None if job in (None, "") or str(job)[:1] in "~!" else str(job)


class FrameworkHookActuator(Actuator):
    spec = SPECS["framework_hook"]

    def __init__(self, hook_dir: str = "/run/reflexarc/hooks", proc_root: str = "/proc") -> None:
        self.hook_dir = hook_dir
        self.procfs = ProcFS(proc_root)

    def endpoints(self, target: Target) -> list[Endpoint]:
        """The target's sockets: of its job and rank, of the process ``labels["pid"]``
        or its ancestors, below the selector's pids and in its cgroup."""
        labels, sel = target.labels, target.selector
        try:
            pid = pid_label(labels, "pid")
        except ValueError as exc:
            raise PermanentActuatorError(str(exc)) from None
        found = [ep for ep in find_endpoints(self.hook_dir, labels.get("job") or _plain_job(sel), labels.get("rank"))
                 if os.path.isdir(os.path.join(self.procfs.root, str(ep.pid)))]   # not a socket a killed script left
        if pid is not None:
            lineage = set(self.procfs.ancestors(pid))
            found = [ep for ep in found if ep.pid in lineage]
        if sel.get("pids"):
            found = [ep for ep in found if self.procfs.descends_from(ep.pid, sel["pids"])]
        if sel.get("cgroup"):
            found = [ep for ep in found if self.procfs.in_cgroup(ep.pid, sel["cgroup"])]
        return found

    def _endpoint(self, record: dict) -> Endpoint:
        """A change's endpoint, with the uid its directory lets serve it now."""
        path = record["socket"]
        try:
            uid, job = _place(os.path.dirname(path), self.hook_dir)
        except FileNotFoundError:
            raise HookGone(f"{path}: its directory is gone") from None
        if job not in (None, record["job"]):
            raise HookRejected(Rejected.PLACE, path, f"job {record['job']}'s socket in the directory of job {job}")
        return Endpoint(path, record["job"], int(record["rank"]), int(record["pid"]), uid)

    def read_current(self, target: Target, params: dict | None = None) -> list[dict]:
        """Each endpoint of the target with the handlers its script offers."""
        out = []
        for ep in self.endpoints(target):
            reply = described(HookClient(ep, self.procfs).request("describe", 5.0), ep.path)
            out.append({**ep._asdict(), "start": reply["start"], "instance": reply["instance"],
                        "handlers": reply["handlers"]})
        return out

    def plan(self, target: Target, params: dict) -> Change:
        checked = self.checked(params)
        handler, args = checked["handler"], dict(checked.get("args") or {})
        timeout = checked.get("timeout", self.spec.param("timeout").default)
        boundary = checked.get("at_step_boundary", self.spec.param("at_step_boundary").default)
        endpoints = self.endpoints(target)
        if not endpoints:
            raise PermanentActuatorError(f"no hook socket for {target.key()} in {self.hook_dir}: the job serves no "
                                         "framework hooks (an unmodified job; docs/hooks.md)")
        before, after, undo = [], [], True
        for ep in endpoints:
            reply = described(HookClient(ep, self.procfs).request("describe", timeout, handler=handler, args=args),
                              ep.path, handler)
            preview = reply.get("preview")
            where = {"socket": ep.path, "job": ep.job, "rank": ep.rank, "pid": ep.pid, "start": reply["start"],
                     "instance": reply["instance"]}
            before.append({**where, "state": preview["before"] if preview else None})
            after.append({**where, "state": preview["after"] if preview else args})
            undo = undo and reply["has_undo"]
        call = f"{handler}({', '.join(f'{k}={v!r}' for k, v in sorted(args.items()))})"
        when = " at the next step boundary" if boundary else ""
        procs = ", ".join(f"{ep.job} rank {ep.rank} pid {ep.pid}" for ep in endpoints)
        summary = (f"framework_hook: {call} on {procs}{when}; "
                   + ("revert calls its undo" if undo else "no undo: revert is a no-op"))
        params = {**checked, "handler": handler, "args": args, "timeout": timeout, "at_step_boundary": boundary}
        return Change("framework_hook", target, params, {"handler": handler, "endpoints": before},
                      {"handler": handler, "endpoints": after}, summary)

    def _send(self, endpoint: dict, op: str, params: dict) -> dict:
        boundary = bool(params.get("at_step_boundary", True))
        timeout = float(params.get("timeout", self.spec.param("timeout").default))
        return HookClient(self._endpoint(endpoint), self.procfs, endpoint.get("start")).request(
            op, timeout + GRACE if boundary else timeout, handler=params["handler"], args=params.get("args") or {},
            at_step_boundary=boundary, timeout=timeout, instance=endpoint["instance"])

    def apply(self, change: Change) -> dict:
        """Call the handler on every endpoint at once (the ranks of a synchronous job
        reach their step boundaries together, so one step's wait, not one per rank);
        returns ``{socket: result}``, or raises the first failure once all answered."""
        endpoints = change.after["endpoints"]
        with ThreadPoolExecutor(max_workers=max(1, len(endpoints))) as pool:
            futures = [(ep["socket"], pool.submit(self._send, ep, "call", change.params)) for ep in endpoints]
        return {sock: future.result().get("result") for sock, future in futures}

    def revert(self, change: Change) -> None:
        """Undo on every endpoint; scripts that are gone are skipped. Goes through
        all endpoints, then raises the first failure."""
        failure = None
        for ep in change.before["endpoints"]:
            try:
                reply = self._send(ep, "undo", change.params)
                if not reply.get("undone"):
                    log.info("revert %s on %s: %s", change.params["handler"], ep["socket"], reply.get("note"))
            except (HookGone, HookUnreachable) as exc:
                log.info("revert %s: script gone: %s", change.params["handler"], exc)
            except (TemporaryActuatorError, PermanentActuatorError) as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
