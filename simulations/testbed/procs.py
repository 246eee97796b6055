"""Processes and cgroups of the testbed: running ``ip``/``tc``, starting tagged
processes inside a network namespace and a cgroup v2 directory, and ending them.

Every process the testbed starts carries ``REFLEXARC_TESTBED=<prefix>`` in its
environment (inherited by its children, DataLoader workers included), runs in
its own process group and, when given a cgroup, is written into
that cgroup before it executes anything, so no child escapes it. A teardown
finds what is left by that tag, by ``ip netns pids`` and by the cgroup's
``cgroup.procs``, even from another process after a crash.

Example::

    cg = make_cgroup("rxtb42/store")            # /sys/fs/cgroup/unified/rxtb42/store
    proc = spawn(["sleep", "60"], tag="rxtb42", netns="rxtb42st", cgroup=cg,
                 stdout=Path("/tmp/out.log"))
    end_groups([proc])                          # SIGTERM, SIGKILL for what is left after 3 s
    end_pids(tagged_pids("rxtb42"))             # the same for any process carrying the tag
    remove_cgroup_tree(cgroup2_root() / "rxtb42")

Overhead: a fork/exec per command; ``tagged_pids`` reads the environment of
every process on the node (a few ms for a few hundred processes).
"""
from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from reflexarc.core.cgroups import cgroup2_root as core_cgroup2_root

TAG = "REFLEXARC_TESTBED"


class TestbedError(RuntimeError):
    """A testbed step failed; the message says which command and why."""


def run(*argv: str, check: bool = True) -> str:
    """Run a command (an argument list, never a shell string); its stdout. Raises
    ``TestbedError`` with the command and its stderr when it fails and ``check``."""
    done = subprocess.run(list(argv), capture_output=True, text=True)
    if check and done.returncode != 0:
        raise TestbedError(f"{' '.join(argv)}: {(done.stderr or done.stdout).strip() or f'exit {done.returncode}'}")
    return done.stdout


def cgroup2_root() -> Path:
    """The cgroup2 mount (``/sys/fs/cgroup/unified`` on a hybrid v1/v2 host)."""
    root = core_cgroup2_root()
    if root is None:
        raise TestbedError("no cgroup2 hierarchy is mounted: cannot place the job in a cgroup")
    return root


def make_cgroup(relative: str) -> Path:
    """Create a cgroup v2 directory (and its parents) given relative to the mount."""
    path = cgroup2_root() / relative
    path.mkdir(parents=True, exist_ok=True)
    return path


def spawn(argv: list[str], *, tag: str, stdout: Path, netns: str | None = None,
          cgroup: Path | None = None, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``argv`` as the leader of a new process group, inside ``netns`` and
    ``cgroup`` when given, tagged with ``tag``, with ``env`` added to this
    process's environment; stdout goes to ``stdout``, stderr to the same name +
    ``.err``."""
    command = (["ip", "netns", "exec", netns] if netns else []) + list(argv)
    procs = str(cgroup / "cgroup.procs") if cgroup is not None else None

    def enter_cgroup() -> None:       # runs in the child between fork and exec
        fd = os.open(procs, os.O_WRONLY)
        try:
            os.write(fd, str(os.getpid()).encode())
        finally:
            os.close(fd)

    with open(stdout, "ab") as out, open(f"{stdout}.err", "ab") as err:
        try:
            return subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=err, process_group=0,
                                    env={**os.environ, **(env or {}), TAG: tag}, preexec_fn=enter_cgroup if procs else None)
        except subprocess.SubprocessError as exc:     # the cgroup write failed in the child
            raise TestbedError(f"cannot start {argv[0]} in {cgroup}: {exc}") from exc


def _alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def tagged_pids(tag: str) -> set[int]:
    """Live processes whose environment holds ``REFLEXARC_TESTBED=<tag>``."""
    needle = f"{TAG}={tag}".encode()
    found = set()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0") and _alive(int(entry.name)):
            found.add(int(entry.name))
    found.discard(os.getpid())
    return found


def netns_pids(netns: str) -> set[int]:
    """Processes inside a named network namespace (``ip netns pids``)."""
    return {int(p) for p in run("ip", "netns", "pids", netns, check=False).split() if _alive(int(p))}


def cgroup_pids(path: Path) -> set[int]:
    """Processes in a cgroup v2 directory and all below it."""
    found = set()
    for procs in path.rglob("cgroup.procs") if path.is_dir() else ():
        try:
            found.update(int(p) for p in procs.read_text().split())
        except OSError:
            continue
    return {p for p in found if _alive(p)}


def end_pids(pids: set[int], grace: float = 3.0) -> None:
    """SIGTERM ``pids``, SIGKILL what is still alive after ``grace`` seconds, and
    wait (up to 5 s more) until all are gone."""
    pids = set(pids) - {os.getpid()}
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while pids and time.monotonic() < deadline:
            pids = {p for p in pids if _alive(p)}
            time.sleep(0.05)
        if not pids:
            return


def end_groups(started: list[subprocess.Popen], grace: float = 3.0) -> None:
    """End processes started by ``spawn`` and their process groups, all at once:
    SIGTERM, up to ``grace`` seconds for the leaders to exit, then SIGKILL for what
    is left of each group; the leaders are reaped. A leader reaped earlier is left
    alone: its group id may belong to someone else by now."""
    live = [p for p in started if p.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in live:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        for p in live:
            try:
                p.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    for p in live:
        p.wait()


def remove_cgroup_tree(path: Path, timeout: float = 5.0) -> None:
    """rmdir a cgroup directory and everything below it, deepest first; exiting
    processes may hold a directory for a moment, so retry until ``timeout``."""
    deadline = time.monotonic() + timeout
    while path.is_dir():
        dirs = sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
        try:
            for d in [*dirs, path]:
                d.rmdir()
        except OSError as exc:
            if time.monotonic() > deadline:
                raise TestbedError(f"cannot remove cgroup {path}: {exc}") from exc
            time.sleep(0.1)


@contextmanager
def signals_deferred() -> Iterator[None]:
    """Hold SIGINT and SIGTERM off while the block runs (a teardown must finish),
    then deliver them to the handlers that were in place. Outside the main
    thread, where handlers cannot be changed, the block simply runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, _frame: held.append(signum))
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for signum in dict.fromkeys(held):
            signal.raise_signal(signum)
