"""The control socket: how an operator steers a running controller.

``run`` listens on ``STATE_DIR/control.sock``, a Unix stream socket created
0600 (0660 with ``--control-group``) in the state directory, which ``run``
has already checked is root's and writable by root only. Each connection
carries one request, a JSON object on one line (``{"verb": "status"}``), and
gets one reply line (``{"ok": true, ...}`` or ``{"ok": false, "error": ...}``).
The peer is checked by ``SO_PEERCRED`` as well as by the file's mode: uid 0,
or a member of the control group; anyone else is refused before a byte of the
request is read.

Requests are carried out on the controller's own loop thread, between two
ticks (``ControlServer.serve``, called by ``live.py``): the engine is never
touched from another thread, and a request is done whole or not at all. A
client that disconnects before its line is complete leaves nothing queued;
one that disconnects after only loses the reply.

Example::

    server = ControlServer(state_dir / "control.sock", handler)
    server.start()
    ...                                      # in the loop, between ticks
    server.wait(0.5); server.serve()         # run what arrived, reply
    request(state_dir, {"verb": "status"})   # a client, e.g. ``reflexarc status``

Bounds: a request line is at most 64 KiB and must arrive within 5 s; at most
16 requests wait for the loop (more are answered "busy"); a client waits at
most ``REPLY_WAIT`` for its reply. Overhead when idle: one thread blocked in
``accept``.
"""
from __future__ import annotations

import grp
import json
import logging
import os
import queue
import socket
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("reflexarc.control")

SOCKET_NAME = "control.sock"
MAX_REQUEST = 64 << 10
READ_DEADLINE = 5.0
REPLY_WAIT = 120.0           # a rollback of many changes may take a while; the client waits this long
QUEUE = 16


class ControlError(Exception):
    """A request could not be made or was refused; the message says why, in one line."""


class NoController(ControlError):
    """No controller listens on this state directory."""


@dataclass(frozen=True)
class Peer:
    """Who asked, from ``SO_PEERCRED``: written into the audit with what they asked."""

    pid: int
    uid: int
    gid: int

    def as_dict(self) -> dict:
        return {"pid": self.pid, "uid": self.uid, "gid": self.gid}


@dataclass
class _Pending:
    request: dict
    peer: Peer
    done: threading.Event
    reply: dict | None = None


def _sockaddr(path: Path) -> tuple[str, int | None]:
    """An address ``bind``/``connect`` take: paths past the 107 bytes of
    ``sun_path`` go through an ``O_PATH`` descriptor of their directory."""
    text = str(path)
    if len(text.encode()) < 100:
        return text, None
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{path.name}", fd


def _peer(conn: socket.socket) -> Peer:
    raw = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, gid = struct.unpack("3i", raw)
    return Peer(pid, uid, gid)


def _groups_of(pid: int) -> set[int]:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Groups:"):
                    return {int(g) for g in line.split()[1:]}
    except OSError:
        pass
    return set()


def group_id(name: str | None) -> int | None:
    """The gid of ``--control-group`` (a name or a number), or None."""
    if not name:
        return None
    try:
        return int(name) if name.isdigit() else grp.getgrnam(name).gr_gid
    except KeyError:
        raise ControlError(f"--control-group {name}: no such group") from None


class ControlServer:
    def __init__(self, path: Path, handler, group: int | None = None, mode: int | None = None) -> None:
        self.path = Path(path)
        self.handler = handler           # handler(request: dict, peer: Peer) -> dict, on the loop thread
        self.group = group
        self._queue: queue.Queue[_Pending] = queue.Queue(QUEUE)
        self.wake = threading.Event()    # set when a request waits, or when the loop must stop waiting
        self._closed = threading.Event()
        if os.path.lexists(self.path):
            if not self.path.is_socket() or self.path.is_symlink():
                raise ControlError(f"{self.path} exists and is not a socket; remove it, the controller "
                                   "makes its own")
            self.path.unlink()           # a dead controller's: its lock on the journal is ours now
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        address, dirfd = _sockaddr(self.path)
        umask = os.umask(0o177 if group is None else 0o117)
        try:
            self._sock.bind(address)
        finally:
            os.umask(umask)
            if dirfd is not None:
                os.close(dirfd)
        if group is not None:
            os.chown(self.path, 0, group, follow_symlinks=False)
        if mode is not None:             # only tests widen it, to reach the SO_PEERCRED check
            os.chmod(self.path, mode, follow_symlinks=False)
        self._sock.listen(QUEUE)
        self._thread = threading.Thread(target=self._accept, name="reflexarc-control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # --- the accepting thread -------------------------------------------------
    def allowed(self, peer: Peer) -> bool:
        if peer.uid == 0:
            return True
        return self.group is not None and (peer.gid == self.group or self.group in _groups_of(peer.pid))

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                if self._closed.is_set():
                    return
                time.sleep(0.05)         # e.g. EMFILE: try again, never spin
                continue
            try:
                self._take(conn)
            except OSError:
                pass
            finally:
                conn.close()

    def _take(self, conn: socket.socket) -> None:
        peer = _peer(conn)
        if not self.allowed(peer):
            log.warning("control: refused uid %d (pid %d): only root%s may steer the controller", peer.uid,
                        peer.pid, "" if self.group is None else f" or group {self.group}")
            _send(conn, {"ok": False, "error": "refused: only root"
                         + ("" if self.group is None else " or the control group") + " may steer the controller"})
            return
        try:
            request = _read_request(conn)
        except ControlError as exc:
            _send(conn, {"ok": False, "error": str(exc)})
            return
        if request is None:
            return                       # gone before the line was complete: nothing was asked
        pending = _Pending(request, peer, threading.Event())
        try:
            self._queue.put_nowait(pending)
        except queue.Full:
            _send(conn, {"ok": False, "error": "busy: too many requests wait for the controller; try again"})
            return
        self.wake.set()
        if not pending.done.wait(REPLY_WAIT):
            _send(conn, {"ok": False, "error": "the controller did not answer in time; the request may "
                                               "still be carried out (see 'reflexarc journal')"})
            return
        _send(conn, pending.reply)

    # --- the loop's side ---------------------------------------------------------
    def wait(self, timeout: float) -> None:
        """Sleep until a request waits, the loop is woken, or ``timeout`` passes."""
        if self.wake.wait(max(0.0, timeout)):
            self.wake.clear()

    def serve(self) -> int:
        """Carry out every waiting request, on the calling (loop) thread."""
        served = 0
        while True:
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                return served
            try:
                pending.reply = self.handler(pending.request, pending.peer)
            except ControlError as exc:
                pending.reply = {"ok": False, "error": str(exc)}
            except Exception as exc:  # noqa: BLE001 - one bad request never stops the loop
                log.error("control request %s failed", pending.request.get("verb"), exc_info=exc)
                pending.reply = {"ok": False, "error": f"internal error: {type(exc).__name__}: {exc}"}
            pending.done.set()
            served += 1

    def close(self) -> None:
        """Stop listening, answer what still waits, remove the socket."""
        self._closed.set()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        while True:
            try:
                pending = self._queue.get_nowait()
            except queue.Empty:
                break
            pending.reply = {"ok": False, "error": "the controller is stopping; nothing was done"}
            pending.done.set()
        try:
            self.path.unlink()
        except OSError:
            pass


def _read_request(conn: socket.socket) -> dict | None:
    deadline = time.monotonic() + READ_DEADLINE
    data = b""
    while b"\n" not in data:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ControlError(f"no complete request line within {READ_DEADLINE:g} s")
        conn.settimeout(left)
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            raise ControlError(f"no complete request line within {READ_DEADLINE:g} s") from None
        if not chunk:
            return None
        data += chunk
        if len(data) > MAX_REQUEST:
            raise ControlError(f"request longer than {MAX_REQUEST} bytes")
    try:
        request = json.loads(data.split(b"\n", 1)[0])
    except (ValueError, RecursionError):
        raise ControlError("the request is not one line of JSON") from None
    if not isinstance(request, dict) or not isinstance(request.get("verb"), str):
        raise ControlError('a request is a JSON object with a "verb"')
    return request


def _send(conn: socket.socket, reply: dict) -> None:
    conn.settimeout(READ_DEADLINE)
    try:
        conn.sendall((json.dumps(reply, sort_keys=True, default=str) + "\n").encode())
    except OSError:
        pass                             # the client left: the request was still carried out whole


# --- the client ------------------------------------------------------------------
def socket_path(state_dir: str | Path) -> Path:
    return Path(state_dir) / SOCKET_NAME


def request(state_dir: str | Path, payload: dict, timeout: float = REPLY_WAIT + 5) -> dict:
    """Send one request to the controller running on ``state_dir``; its reply.
    ``NoController`` when none listens there; ``ControlError`` when refused."""
    path = socket_path(state_dir)
    try:
        os.lstat(path)
    except FileNotFoundError:
        raise NoController(f"no controller is running on {state_dir}") from None
    except PermissionError:
        raise ControlError(f"{state_dir}: permission denied: only root (or the control group) may ask the "
                           "running controller or read its journal") from None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        address, dirfd = _sockaddr(path)
        try:
            sock.connect(address)
        finally:
            if dirfd is not None:
                os.close(dirfd)
    except (ConnectionRefusedError, FileNotFoundError):
        sock.close()
        raise NoController(f"no controller is running on {state_dir} (a stale {path.name})") from None
    except PermissionError:
        sock.close()
        raise ControlError(f"{path}: permission denied: only root (or the control group) may ask the "
                           "running controller") from None
    with sock:
        try:
            try:
                sock.sendall((json.dumps(payload) + "\n").encode())
            except BrokenPipeError:      # refused before it was read: the refusal waits to be read
                pass
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            raise ControlError(f"the controller on {state_dir} did not answer within {timeout:g} s") from None
        except OSError as exc:
            raise ControlError(f"{path}: {exc.strerror or exc}") from None
    try:
        reply = json.loads(data)
    except ValueError:
        raise ControlError(f"{path}: the controller closed the connection without a reply") from None
    if not reply.get("ok"):
        raise ControlError(reply.get("error") or "refused")
    return reply
