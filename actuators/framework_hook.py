"""The ``framework_hook`` actuator: calls a handler a training script registered with
``reflexarc.actuators.hooks.Hooks``, over the script's Unix socket.

Endpoints are the sockets ``<hook_dir>/<job>-<rank>-<pid>.sock`` of the target:
the job from the labels or selector, the rank from ``labels["rank"]``, and the
process from ``labels["pid"]`` (the process itself or, for a DataLoader worker's
pid, its training process) or the descendants of ``selector["pids"]``.

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
                             "instance": "5f0c...", "state": {"prefetch_factor": 2}}]}
    after  = the same with "state" as the preview's "after"; without a preview,
             before's state is None and after's is the call's args

``read_signals(hook_dir)`` collects the step signals the scripts report;
``ranks_by_pid(hook_dir)`` maps each training process to its rank, for labels.

Example::

    act = FrameworkHookActuator(hook_dir="/run/reflexarc/hooks")
    change = act.plan(Target({"job": "llama", "rank": "0"}),
                      {"handler": "dataloader.prefetch", "args": {"factor": 4}})
    act.apply(change)       # returns {socket: handler result}
    act.revert(change)

Overhead: one Unix-socket round trip per endpoint and request (0.1-0.5 ms plus the
handler's own time; at a step boundary, up to one training step more).
"""
from __future__ import annotations

import errno
import json
import logging
import os
import re
import socket
from typing import NamedTuple

from reflexarc.core.procfs import ProcFS

from .base import Actuator, Change, PermanentActuatorError, Target, TemporaryActuatorError
from .hooks import JOB_CHARS, SIGNAL_NAMES
from .specs import SPECS

log = logging.getLogger("reflexarc.actuators.framework_hook")

SOCKET_NAME = re.compile(rf"(?P<job>{JOB_CHARS}+)-(?P<rank>\d+)-(?P<pid>\d+)\.sock")
GRACE = 1.0          # seconds the client waits beyond the script's own step-boundary deadline
MAX_REPLY = 1 << 20
RETRYABLE = (errno.EAGAIN, errno.EINTR, errno.EBUSY, errno.ECONNRESET, errno.EPIPE)
PERMANENT_KINDS = ("refused", "unknown_handler", "handler_error", "bad_request")


class HookGone(PermanentActuatorError):
    """The endpoint's script is no longer there (socket removed, or another instance)."""


class HookUnreachable(TemporaryActuatorError):
    """Nobody listens on the socket (the script died and left it, or is starting)."""


class Endpoint(NamedTuple):
    path: str
    job: str
    rank: int
    pid: int


def find_endpoints(hook_dir: str, job: str | None = None, rank: int | str | None = None) -> list[Endpoint]:
    """Sockets in ``hook_dir``, optionally only those of one job and rank."""
    try:
        names = os.listdir(hook_dir)
    except FileNotFoundError:
        return []
    out = []
    for name in sorted(names):
        m = SOCKET_NAME.fullmatch(name)
        if not m or (job is not None and m["job"] != job) or (rank not in (None, "") and int(m["rank"]) != int(rank)):
            continue
        out.append(Endpoint(os.path.join(hook_dir, name), m["job"], int(m["rank"]), int(m["pid"])))
    return out


def ranks_by_pid(hook_dir: str) -> dict[int, str]:
    """The rank of each training process with a socket in ``hook_dir``, e.g.
    ``{4242: "0", 4243: "1"}``: what a loader signal's ``trainer`` pid needs to
    carry ``rank``. Costs one directory listing; sockets are not contacted, so a
    socket left by a killed script still counts until it is removed."""
    return {ep.pid: str(ep.rank) for ep in find_endpoints(hook_dir)}


class HookClient:
    """One request/reply exchange with a script's hook socket."""

    def __init__(self, path: str) -> None:
        self.path = path

    def request(self, op: str, wait: float, **fields) -> dict:
        """Send ``{"op": op, **fields}`` and wait up to ``wait`` seconds for the reply;
        return it or raise an actuator error."""
        message = json.dumps({"op": op, **fields}).encode() + b"\n"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(wait)
        reply = b""
        try:
            sock.connect(self.path)
            sock.sendall(message)
            while not reply.endswith(b"\n") and len(reply) <= MAX_REPLY:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                reply += chunk
        except socket.timeout:
            raise TemporaryActuatorError(f"{self.path}: no reply to {op} within {wait:g}s") from None
        except FileNotFoundError:
            raise HookGone(f"{self.path}: socket is gone") from None
        except ConnectionRefusedError:
            raise HookUnreachable(f"{self.path}: connection refused (nobody listening)") from None
        except PermissionError:
            raise PermanentActuatorError(f"{self.path}: refused by the socket's permissions") from None
        except OSError as exc:
            if exc.errno in RETRYABLE:
                raise TemporaryActuatorError(f"{self.path}: {exc.strerror}") from exc
            raise PermanentActuatorError(f"{self.path}: {exc}") from exc
        finally:
            sock.close()
        if not reply.endswith(b"\n"):
            raise TemporaryActuatorError(f"{self.path}: the script closed the connection without a full reply")
        try:
            data = json.loads(reply)
        except ValueError:
            raise PermanentActuatorError(f"{self.path}: reply is not JSON") from None
        if data.get("ok"):
            return data
        kind, error = data.get("kind", "?"), data.get("error", "")
        if kind == "timeout":
            raise TemporaryActuatorError(f"{self.path}: {error}")
        if kind == "stale":
            raise HookGone(f"{self.path}: {error}")
        if kind in PERMANENT_KINDS:
            raise PermanentActuatorError(f"{self.path}: {kind}: {error}")
        raise PermanentActuatorError(f"{self.path}: unexpected reply {data}")


def read_signals(hook_dir: str, job: str | None = None, timeout: float = 1.0) -> list[dict]:
    """The latest step signals of every script in ``hook_dir`` as
    ``{"name", "labels": {"job", "rank"}, "value", "ts"}``; unreachable ones are left out."""
    out = []
    for ep in find_endpoints(hook_dir, job):
        try:
            reply = HookClient(ep.path).request("signals", timeout)
        except (TemporaryActuatorError, PermanentActuatorError) as exc:
            log.debug("signals from %s: %s", ep.path, exc)
            continue
        for name, point in sorted(reply.get("signals", {}).items()):
            if name in SIGNAL_NAMES:
                out.append({"name": name, "labels": {"job": ep.job, "rank": str(ep.rank)},
                            "value": float(point["value"]), "ts": float(point["ts"])})
    return out


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
        labels, sel = target.labels, target.selector
        found = find_endpoints(self.hook_dir, labels.get("job") or _plain_job(sel), labels.get("rank"))
        if labels.get("pid") not in (None, ""):
            lineage = set(self.procfs.ancestors(int(labels["pid"])))
            found = [ep for ep in found if ep.pid in lineage]
        if sel.get("pids"):
            found = [ep for ep in found if self.procfs.descends_from(ep.pid, sel["pids"])]
        return found

    def read_current(self, target: Target) -> list[dict]:
        """Each endpoint of the target with the handlers its script offers."""
        out = []
        for ep in self.endpoints(target):
            reply = HookClient(ep.path).request("describe", 5.0)
            out.append({**ep._asdict(), "instance": reply["instance"], "handlers": reply["handlers"]})
        return out

    def plan(self, target: Target, params: dict) -> Change:
        checked = self.checked(params)
        handler, args = checked["handler"], dict(checked.get("args") or {})
        timeout = checked.get("timeout", self.spec.param("timeout").default)
        boundary = checked.get("at_step_boundary", self.spec.param("at_step_boundary").default)
        endpoints = self.endpoints(target)
        if not endpoints:
            raise PermanentActuatorError(f"no hook socket for {target.key()} in {self.hook_dir}")
        before, after, undo = [], [], True
        for ep in endpoints:
            reply = HookClient(ep.path).request("describe", timeout, handler=handler, args=args)
            preview = reply.get("preview")
            where = {"socket": ep.path, "job": ep.job, "rank": ep.rank, "pid": ep.pid, "instance": reply["instance"]}
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
        return HookClient(endpoint["socket"]).request(
            op, timeout + GRACE if boundary else timeout, handler=params["handler"], args=params.get("args") or {},
            at_step_boundary=boundary, timeout=timeout, instance=endpoint["instance"])

    def apply(self, change: Change) -> dict:
        """Call the handler on every endpoint; returns ``{socket: result}``."""
        return {ep["socket"]: self._send(ep, "call", change.params).get("result")
                for ep in change.after["endpoints"]}

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
