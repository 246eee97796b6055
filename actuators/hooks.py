"""Framework hooks: the client a training script imports so reflexarc can call into it.

The script registers named handlers (each with an optional ``undo`` and
``preview``), calls ``step_boundary()`` once per training step, and reports its step
signals. A background thread serves a Unix socket (mode 0600, or 0660 with
``group``) speaking JSON lines; every caller is checked with SO_PEERCRED (allowed:
the script's own uid, root, and ``allowed_uids``). Handler exceptions are returned
to the caller as errors and never reach the training loop. Standard library only,
besides the tiny ``reflexarc.core.signals`` that declares the step signals.

Where the socket lives (docs/hooks.md says why): the hook directory
(``/run/reflexarc/hooks``) is root's, mode 0755, so no other user can put a
socket in it.

- A script running as root serves ``<hook_dir>/<job>-<rank>-<pid>.sock``.
- Any other user's serves ``<hook_dir>/<job>/<job>-<rank>-<pid>.sock``: a
  directory root made for that job and user, once, e.g.
  ``install -d -o alice -m 0700 /run/reflexarc/hooks/llama``. The controller
  reads the job of a socket there from the directory, and trusts it only while
  the process serving it (SO_PEERCRED, read on connect) is the directory's
  owner and has the pid the name gives. Without that directory ``start`` raises
  ``HookDirError`` saying what to create.

Every reply carries the script's ``pid`` and ``start`` (its start time, field 22
of ``/proc/<pid>/stat``): a pid that now names another process is told apart.

Example::

    from reflexarc.actuators.hooks import Hooks

    hooks = Hooks.start(job="llama", rank=0)

    @hooks.handler("dataloader.prefetch", undo=restore_prefetch, preview=preview_prefetch)
    def set_prefetch(factor: int):
        ...

    for batch in loader:
        ...
        hooks.report(step_time_ms=dt_ms, dataloader_batch_wait_ms=wait_ms, iteration=step)
        hooks.step_boundary()          # runs calls queued for the step boundary

Handlers, ``undo`` and ``preview`` take the same keyword arguments. ``preview``
returns ``{"before": ..., "after": ...}`` without changing anything. ``undo`` runs
only after its handler ran and only once per call, so a repeated revert is harmless.

Requests (one JSON object per line, one reply line each)::

    {"op": "describe", "handler": "dataloader.prefetch", "args": {"factor": 4}}
    {"op": "call", "handler": ..., "args": {...}, "at_step_boundary": true, "timeout": 10}
    {"op": "undo", "handler": ..., "args": {...}, "at_step_boundary": true, "timeout": 10}
    {"op": "signals"}
    reply: {"ok": true, "instance": "...", "pid": 812, "start": 91023, ...}
           or {"ok": false, "kind": KIND, "error": "...", "instance": ..., "pid": ..., "start": ...}
    KIND: refused, unknown_handler, handler_error, timeout, stale, bad_request

Overhead: ``step_boundary()`` with nothing queued costs under a microsecond and
``report()`` a few microseconds; one idle thread waits in ``accept``, and each
request is served on a short-lived thread.
"""
from __future__ import annotations

import atexit
import grp
import json
import os
import re
import secrets
import socket
import stat
import struct
import threading
import time
from collections import deque
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from reflexarc.core.signals import STEP_PRE_COLLECTIVE, SignalSpec

DEFAULT_HOOK_DIR = "/run/reflexarc/hooks"
STALLED_STEP_MS = 1000.0     # a step running this long (and twice the last) reports its time so far
# The step signals a script may report; the controller's signal catalogue takes them from here.
# step_time_ms and dataloader_batch_wait_ms are also read from unmodified jobs by
# the batch_wait probe (bpf/batch_wait.py), which declares them the same (the
# catalogue insists): its samples carry the training process as pid and trainer.
SIGNALS = (
    SignalSpec("step_time_ms", "ms", ("node", "job", "rank", "pod", "pid", "trainer"), "gauge",
               "Training step time"),
    SignalSpec("dataloader_batch_wait_ms", "ms", ("node", "job", "rank", "pod", "pid", "trainer"), "gauge",
               "Time the training loop waited for the next batch"),
    SignalSpec("mfu_pct", "%", ("node", "job", "rank"), "gauge", "Model FLOPs utilisation"),
    STEP_PRE_COLLECTIVE,
)
SIGNAL_NAMES = tuple(s.name for s in SIGNALS)
JOB_CHARS = r"[A-Za-z0-9_.:-]"
JOB_NAME = re.compile(JOB_CHARS + "{1,64}")
MAX_REQUEST = 1 << 20
IDLE_TIMEOUT = 60.0     # seconds a connection may sit without a request


class HookDirError(RuntimeError):
    """The script's user has no directory to serve its hooks in."""


def own_start_time() -> int:
    """This process's start time: field 22 of ``/proc/self/stat``, clock ticks after boot."""
    with open("/proc/self/stat", "rb") as f:
        return int(f.read().rpartition(b")")[2].split()[19])


def socket_name(job: str, rank: int, pid: int) -> str:
    return f"{job}-{int(rank)}-{int(pid)}.sock"


def socket_dir(hook_dir: str, job: str, euid: int) -> str:
    """Where a script of user ``euid`` serves job ``job``'s hooks: the hook
    directory for root, the job's directory in it for anyone else."""
    return hook_dir if euid == 0 else os.path.join(hook_dir, job)


def _unusable(directory: str, euid: int) -> str | None:
    """Why a user who is not root cannot serve hooks in ``directory``, or None."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return "does not exist"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != euid:
        return f"is owned by uid {st.st_uid}, not by this process's uid {euid}"
    if st.st_mode & 0o022:
        return f"is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def peer_credentials(conn: socket.socket) -> tuple[int, int, int]:
    """(pid, uid, gid) of the process at the other end of a Unix socket."""
    return struct.unpack("iII", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("iII")))


@dataclass
class _Handler:
    fn: Callable[..., Any]
    undo: Callable[..., Any] | None
    preview: Callable[..., Any] | None


class Hooks:
    """The handlers, step signals and socket server of one training process."""

    def __init__(self, job: str, rank: int = 0, hook_dir: str | None = None, group: str | int | None = None,
                 allowed_uids: Iterable[int] = ()) -> None:
        if not JOB_NAME.fullmatch(job):
            raise ValueError(f"job name {job!r} must match {JOB_NAME.pattern}")
        self.job, self.rank, self.pid = job, int(rank), os.getpid()
        self.start = own_start_time()
        self.hook_dir = hook_dir or os.environ.get("REFLEXARC_HOOK_DIR") or DEFAULT_HOOK_DIR
        self.socket_dir = socket_dir(self.hook_dir, job, os.geteuid())
        self.path = os.path.join(self.socket_dir, socket_name(job, rank, self.pid))
        self.instance = secrets.token_hex(8)
        self.allowed_uids = frozenset({os.getuid(), 0, *map(int, allowed_uids)})
        self._group = group
        self._handlers: dict[str, _Handler] = {}
        self._active: dict[str, dict] = {}            # handler -> args of its last call not yet undone
        self._queue: deque[tuple[Future, Callable[[], dict]]] = deque()
        # per signal: last value, time, and the sum and count since the last read, so a
        # reader polling slower than the steps gets the mean, not a biased sample
        self._signals: dict[str, dict] = {}
        self._iteration: int | None = None
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._inode = -1

    # -- life cycle ------------------------------------------------------------------

    @classmethod
    def start(cls, job: str | None = None, rank: int | None = None, *, hook_dir: str | None = None,
              group: str | int | None = None, allowed_uids: Iterable[int] = ()) -> "Hooks":
        """Create the socket and start serving it. ``job`` and ``rank`` default to
        what the launcher put in this process's environment (torchrun, Slurm, Open
        MPI, ...: ``reflexarc.core.launchers``), the names the controller finds the
        job by. ``group`` (name or gid) makes the
        socket 0660 and owned by that group; the SO_PEERCRED check still applies.
        Raises HookDirError when a script that is not root has no job directory."""
        if job is None or rank is None:
            from reflexarc.core.launchers import from_environ, recognised  # only when the launcher names it
            launch = from_environ(recognised(b"\0".join(b"%s=%s" % kv for kv in os.environb.items())))
            if job is None and launch is None:
                raise ValueError("no job given and none in the environment (no launcher set one): "
                                 "pass job=NAME")
            job = launch.job if job is None else job
            rank = (launch.rank if launch is not None else None) if rank is None else rank
        hooks = cls(job, rank or 0, hook_dir, group, allowed_uids)
        hooks._listen()
        return hooks

    def _listen(self) -> None:
        euid = os.geteuid()
        if euid == 0:
            os.makedirs(self.hook_dir, mode=0o755, exist_ok=True)
        else:
            problem = _unusable(self.socket_dir, euid)
            if problem:
                raise HookDirError(
                    f"{self.socket_dir} {problem}: a training process that is not root serves its hooks in a "
                    f"directory root makes for its job and user, e.g. "
                    f"'install -d -o {euid} -m 0700 {self.socket_dir}' (see docs/hooks.md)")
        # The mode is set before listen(): nobody can connect while the umask's mode
        # applies. Binding under a private name and renaming replaces a stale socket
        # of the same name (a dead process with this pid) in one step.
        staging = os.path.join(self.socket_dir, f".{self.instance}.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(staging)
            if self._group is None:
                os.chmod(staging, 0o600)
            else:
                gid = self._group if isinstance(self._group, int) else grp.getgrnam(self._group).gr_gid
                os.chown(staging, -1, gid)
                os.chmod(staging, 0o660)
            listener.listen(16)
            os.replace(staging, self.path)
            self._inode = os.stat(self.path).st_ino
        except BaseException:
            listener.close()
            if os.path.lexists(staging):
                os.unlink(staging)
            raise
        self._listener = listener
        threading.Thread(target=self._accept_loop, args=(listener,), name="reflexarc-hooks", daemon=True).start()
        os.register_at_fork(after_in_child=self._forget_in_child)
        atexit.register(self.close)

    def _forget_in_child(self) -> None:
        # A forked child (e.g. a DataLoader worker) must not keep the listening socket alive.
        if self._listener is not None:
            self._listener.close()
            self._listener = None

    def close(self) -> None:
        """Stop serving and remove the socket (only in the process that created it)."""
        listener, self._listener = self._listener, None
        if listener is None or os.getpid() != self.pid:
            return
        try:
            listener.shutdown(socket.SHUT_RDWR)    # wakes the thread blocked in accept()
        except OSError:
            pass
        listener.close()
        atexit.unregister(self.close)
        try:
            if os.stat(self.path).st_ino == self._inode:   # not a newer process's socket
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        with self._lock:
            pending, self._queue = list(self._queue), deque()
        for fut, _ in pending:
            fut.cancel()

    def __enter__(self) -> "Hooks":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- what the training script calls ----------------------------------------------

    def handler(self, name: str, undo: Callable[..., Any] | None = None,
                preview: Callable[..., Any] | None = None) -> Callable:
        """Decorator registering ``fn`` under ``name``; returns ``fn`` unchanged."""
        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            with self._lock:
                self._handlers[name] = _Handler(fn, undo, preview)
            return fn
        return register

    def step_boundary(self) -> int:
        """Run the calls queued for the step boundary, in the caller's thread.
        Returns how many ran. Never raises: failures go back to the caller."""
        if not self._queue:
            return 0
        ran = 0
        while True:
            with self._lock:
                if not self._queue:
                    return ran
                fut, work = self._queue.popleft()
            if fut.set_running_or_notify_cancel():
                fut.set_result(work())
                ran += 1

    def report(self, iteration: int | None = None, **values: float) -> None:
        """Record step signals, e.g. ``report(step_time_ms=182.0, iteration=41)``; a reader
        gets the mean over the steps since its previous read."""
        unknown = set(values) - set(SIGNAL_NAMES)
        if unknown:
            raise ValueError(f"unknown step signal(s) {sorted(unknown)}; known: {', '.join(SIGNAL_NAMES)}")
        now, mono = time.time(), time.monotonic()
        with self._lock:
            for name, value in values.items():
                acc = self._signals.setdefault(name, {"sum": 0.0, "count": 0})
                acc.update(last=float(value), ts=now, mono=mono, sum=acc["sum"] + float(value),
                           count=acc["count"] + 1)
            if iteration is not None:
                self._iteration = int(iteration)

    # -- serving ---------------------------------------------------------------------

    def _accept_loop(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return      # closed
            threading.Thread(target=self._serve, args=(conn,), name="reflexarc-hooks-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(IDLE_TIMEOUT)
            try:
                _, uid, _ = peer_credentials(conn)
                if uid not in self.allowed_uids:
                    self._send(conn, self._error("refused", f"uid {uid} may not call the hooks of "
                                                            f"{self.job} rank {self.rank}"))
                    self._drain(conn)
                    return
                stream = conn.makefile("rb")
                while True:
                    line = stream.readline(MAX_REQUEST + 1)
                    if not line:
                        return
                    if len(line) > MAX_REQUEST:
                        self._send(conn, self._error("bad_request", "request too long"))
                        return
                    self._send(conn, self._handle(line))
            except OSError:
                return      # the caller went away, timed out, or sat idle

    @staticmethod
    def _drain(conn: socket.socket) -> None:
        """Read what the refused caller sent until it hangs up, so closing does not
        reset the connection before it read the refusal."""
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(2.0)
        while conn.recv(65536):
            pass

    def _send(self, conn: socket.socket, reply: dict) -> None:
        reply.update(instance=self.instance, pid=self.pid, start=self.start)
        conn.sendall(json.dumps(reply, default=repr).encode() + b"\n")

    @staticmethod
    def _error(kind: str, message: str) -> dict:
        return {"ok": False, "kind": kind, "error": message}

    def _handle(self, line: bytes) -> dict:
        try:
            req = json.loads(line)
            if not isinstance(req, dict):
                raise ValueError("a request is a JSON object")
            args = req.get("args") or {}
            if not isinstance(args, dict):
                raise ValueError("'args' must be an object")
            timeout = float(req.get("timeout") or 10.0)
        except (ValueError, TypeError) as exc:
            return self._error("bad_request", str(exc))
        if req.get("instance") not in (None, self.instance):
            return self._error("stale", f"instance {req['instance']} is gone; this is {self.instance}")
        op = req.get("op")
        if op == "signals":
            return self._signals_reply()
        if op == "describe" and not req.get("handler"):
            with self._lock:
                names = sorted(self._handlers)
            return {"ok": True, "handlers": [self._describe(n) for n in names]}
        if op not in ("describe", "call", "undo"):
            return self._error("bad_request", f"unknown op {op!r}")
        name = str(req.get("handler"))
        with self._lock:
            entry = self._handlers.get(name)
        if entry is None:
            return self._error("unknown_handler", f"no handler '{name}' (known: {', '.join(sorted(self._handlers))})")
        if op == "describe":
            return self._preview(name, entry, args)
        work = (lambda: self._call(name, entry, args)) if op == "call" else (lambda: self._undo(name, entry))
        if not req.get("at_step_boundary"):
            return work()
        return self._at_step_boundary(work, timeout)

    def _describe(self, name: str) -> dict:
        entry = self._handlers[name]
        return {"handler": name, "has_undo": entry.undo is not None, "has_preview": entry.preview is not None}

    def _preview(self, name: str, entry: _Handler, args: dict) -> dict:
        reply = {"ok": True, **self._describe(name), "preview": None}
        if entry.preview is not None:
            try:
                preview = entry.preview(**args)
            except Exception as exc:  # noqa: BLE001 - the script's code: report, never raise
                return self._error("handler_error", f"preview of {name}: {type(exc).__name__}: {exc}")
            if not (isinstance(preview, dict) and {"before", "after"} <= set(preview)):
                return self._error("handler_error", f"preview of {name} must return {{'before': ..., 'after': ...}}")
            reply["preview"] = {"before": preview["before"], "after": preview["after"]}
        return reply

    def _call(self, name: str, entry: _Handler, args: dict) -> dict:
        with self._lock:
            self._active[name] = args     # once started, an undo is owed even if it fails
        try:
            return {"ok": True, "result": entry.fn(**args)}
        except Exception as exc:  # noqa: BLE001
            return self._error("handler_error", f"{name}: {type(exc).__name__}: {exc}")

    def _undo(self, name: str, entry: _Handler) -> dict:
        """Runs ``undo`` with the arguments of the call it undoes."""
        with self._lock:
            applied = self._active.get(name)
        if applied is None:
            return {"ok": True, "undone": False, "result": None, "note": f"{name} is not applied here"}
        if entry.undo is None:
            return {"ok": True, "undone": False, "result": None, "note": f"{name} has no undo"}
        try:
            result = entry.undo(**applied)
        except Exception as exc:  # noqa: BLE001
            return self._error("handler_error", f"undo of {name}: {type(exc).__name__}: {exc}")
        with self._lock:
            self._active.pop(name, None)
        return {"ok": True, "undone": True, "result": result}

    def _at_step_boundary(self, work: Callable[[], dict], timeout: float) -> dict:
        fut: Future = Future()
        with self._lock:
            self._queue.append((fut, work))
        try:
            return fut.result(timeout=timeout)
        except FutureTimeout:
            if fut.cancel():
                return self._error("timeout", f"no step boundary within {timeout:g}s; not run")
            return self._error("timeout", f"still running after {timeout:g}s")
        except CancelledError:
            return self._error("timeout", "the script is shutting down; not run")

    def _signals_reply(self) -> dict:
        """Each signal's mean over the steps since the previous read (its last value
        when no step ran since), with the time of its latest report. A step still
        running for longer than the last one took reports ``step_time_ms`` as its
        time so far, a lower bound, so a stalled step shows before it ends."""
        now, mono = time.time(), time.monotonic()     # the wall clock is sent; durations are monotonic
        with self._lock:
            signals = {}
            for name, acc in self._signals.items():
                mean = acc["sum"] / acc["count"] if acc["count"] else acc["last"]
                signals[name] = {"value": mean, "ts": acc["ts"], "steps": acc["count"]}
                running_ms = (mono - acc["mono"]) * 1000.0
                if name == "step_time_ms" and running_ms > max(2 * acc["last"], STALLED_STEP_MS):
                    signals[name] = {"value": running_ms, "ts": now, "steps": 0, "running": True}
                acc.update(sum=0.0, count=0)
            return {"ok": True, "job": self.job, "rank": self.rank, "pid": self.pid, "iteration": self._iteration,
                    "queued": len(self._queue), "signals": signals}
