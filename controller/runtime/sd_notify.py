"""Tell a service manager how the controller is doing: sd_notify(3) in the standard library.

Under ``Type=notify`` (``deploy/systemd/reflexarc.service``) systemd counts the
controller as started only when it says ``READY=1``, which it says once the
probes are armed and the loop is about to take its first samples; it says
``STOPPING=1`` when it begins to shut down (rules that roll back on shutdown
are reverted after that). systemd passes the socket to write to in
``$NOTIFY_SOCKET``: a filesystem path, or an abstract socket name that starts
with ``@``. Anywhere else (a shell, a container without systemd) the variable
is absent and nothing is sent.

Example::

    notify("READY=1")                         # True under systemd, False elsewhere
    notify("STATUS=7 probes armed\\nREADY=1")  # several assignments, one per line

Overhead: one datagram on a fresh AF_UNIX socket per call; a no-op without
``$NOTIFY_SOCKET``.
"""
from __future__ import annotations

import os
import socket
from collections.abc import Mapping


def _address(value: str) -> str | bytes | None:
    """The socket address ``$NOTIFY_SOCKET`` names, or None for one this module cannot use."""
    if value.startswith("/"):
        return value
    if value.startswith("@") and len(value) > 1:
        return b"\0" + value[1:].encode()     # Linux abstract namespace
    return None                               # empty, relative, or vsock:CID:PORT (not used here)


def notify(state: str, env: Mapping[str, str] = os.environ) -> bool:
    """Send ``state`` (newline-separated ``NAME=value`` assignments) to the
    service manager. True when the datagram was sent; False when there is no
    manager listening (no or unusable ``$NOTIFY_SOCKET``) or it could not be
    reached. Never raises for a missing or vanished socket: a controller that
    cannot report readiness still runs."""
    if not state or "=" not in state:
        raise ValueError(f"'{state}' is not a notification: give NAME=value assignments, e.g. READY=1")
    address = _address(env.get("NOTIFY_SOCKET", ""))
    if address is None:
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(state.encode(), address)
    except OSError:
        return False
    return True
