"""The ``reflexarc`` command line with kill points inside the actuators: the
process SIGKILLs itself at the named point, the way a crash, the OOM killer or
a node's watchdog would end it there.

The executor's own points (``REFLEXARC_FAULT_INJECT=after-intent|after-apply``)
sit between journal steps; these sit inside a step, where no journal line says
how far it got:

=======================  ==========================================================
``dscp.compiled``        the classifier compiled and its maps pinned, its program not yet
``dscp.pinned``          the program pinned too, nothing attached
``dscp.clsact``          clsact added to the interface, no filter yet
``dscp.filter``          the filter attached, no rule written, journal not told
``dscp.rules``           the rules written: the change in effect, journal not told
``dscp.revert-rules``    (revert) the change's rules dropped, filter still attached
``dscp.revert-filter``   (revert) the filter deleted, clsact and pins still there
``dscp.unpin``           (revert) the first pin removed, the others not
``affinity.set``         after the Nth thread's mask was set (``_N``), apply or revert
``hook.call``            while the handler's call is on the wire or queued (``_DELAY`` s in, at most
                         until the reply)
``hook.called``          the script ran the handler, journal not told
``hook.undo``            (revert) while the undo is on the wire or queued (as ``hook.call``)
``deep.start``           while the deep probe compiles and attaches (``_DELAY`` s in, at most
                         until it is attached)
``deep.enabled``         the deep probe attached, journal not told
=======================  ==========================================================

Environment: ``REFLEXARC_RELIABILITY_KILL`` names the point,
``REFLEXARC_RELIABILITY_KILL_N`` the call it fires on (default 1),
``REFLEXARC_RELIABILITY_KILL_DELAY`` the seconds a timed point waits.
Without ``REFLEXARC_RELIABILITY_KILL`` this is the plain command line.

Usage::

    REFLEXARC_RELIABILITY_KILL=dscp.filter python tests/reliability/killrun.py act dscp dscp=EF ...

Overhead: one wrapper call per patched function, in the child only.
"""
from __future__ import annotations

import functools
import os
import signal
import sys
import threading

POINT_ENV = "REFLEXARC_RELIABILITY_KILL"
NTH_ENV = "REFLEXARC_RELIABILITY_KILL_N"
DELAY_ENV = "REFLEXARC_RELIABILITY_KILL_DELAY"
PIN_ROOT = "/sys/fs/bpf/reflexarc"

POINTS = ("dscp.compiled", "dscp.pinned", "dscp.clsact", "dscp.filter", "dscp.rules", "dscp.revert-rules",
          "dscp.revert-filter", "dscp.unpin", "affinity.set", "hook.call", "hook.called", "hook.undo",
          "deep.start", "deep.enabled")


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def after(owner, name: str, nth: int = 1, when=lambda *a, **k: True) -> None:
    """SIGKILL right after the ``nth`` call of ``owner.name`` for which ``when`` holds returns."""
    original = getattr(owner, name)
    seen = [0]

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        result = original(*args, **kwargs)
        if when(*args, **kwargs):
            seen[0] += 1
            if seen[0] == nth:
                die()
        return result

    setattr(owner, name, wrapper)


def during(owner, name: str, delay: float, when=lambda *a, **k: True) -> None:
    """SIGKILL ``delay`` seconds into the first call of ``owner.name`` for which
    ``when`` holds, or as it returns if it returns sooner: always inside that call."""
    original = getattr(owner, name)
    armed = [False]

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if armed[0] or not when(*args, **kwargs):
            return original(*args, **kwargs)
        armed[0] = True
        timer = threading.Timer(delay, die)
        timer.daemon = True
        timer.start()
        try:
            return original(*args, **kwargs)
        finally:
            die()

    setattr(owner, name, wrapper)


def _op(op: str):
    return lambda self, requested, *a, **k: requested == op


def install(point: str, nth: int = 1, delay: float = 0.0) -> None:
    if point not in POINTS:
        raise SystemExit(f"error: unknown kill point {point!r} (known: {', '.join(POINTS)})")
    family = point.split(".")[0]
    if family == "dscp":
        from reflexarc.actuators import dscp
        if point == "dscp.compiled":
            import bcc
            after(bcc.BPF, "load_func")
        elif point == "dscp.pinned":
            after(dscp, "_obj_pin", when=lambda fd, path: str(path).endswith("/prog"))
        elif point == "dscp.clsact":
            after(dscp._Link, "add_clsact")
        elif point == "dscp.filter":
            after(dscp._Link, "set_filter")
        elif point == "dscp.rules":
            after(dscp._Pinned, "write_rules")
        elif point == "dscp.revert-rules":
            after(dscp._Pinned, "drop_owner")
        elif point == "dscp.revert-filter":
            after(dscp._Link, "del_filter")
        elif point == "dscp.unpin":
            import pathlib
            after(pathlib.Path, "unlink", when=lambda path, *a, **k: str(path).startswith(PIN_ROOT + "/"))
    elif family == "affinity":
        from reflexarc.actuators.affinity import AffinityActuator
        after(AffinityActuator, "_set", nth)
    elif family == "hook":
        from reflexarc.actuators.framework_hook import HookClient
        if point == "hook.call":
            during(HookClient, "request", delay, when=_op("call"))
        elif point == "hook.called":
            after(HookClient, "request", when=_op("call"))
        else:
            during(HookClient, "request", delay, when=_op("undo"))
    elif family == "deep":
        from reflexarc.bpf.manager import ProbeManager
        if point == "deep.start":
            during(ProbeManager, "enable_deep", delay)
        else:
            after(ProbeManager, "enable_deep")


def main(argv: list[str]) -> int:
    point = os.environ.get(POINT_ENV)
    if point:
        install(point, int(os.environ.get(NTH_ENV, "1")), float(os.environ.get(DELAY_ENV, "0")))
    from reflexarc.controller.cli.main import main as cli_main
    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
