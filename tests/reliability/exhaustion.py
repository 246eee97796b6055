"""A controller holding changes when the node runs out of something: its state
disk fills up, or another user takes every file descriptor it may open. What
must hold: every change it made is reverted (at SIGTERM, or by the next start),
the process neither dies of it nor hangs, and nothing it cannot see is taken
for "gone".

Full state disk (``full_disk``), on a tmpfs of ``STATE_SIZE`` mounted as the
state directory, with the affinity bed of ``crash.py`` (two idle DataLoader
workers under a training process; an enforcing policy pins them to CPU 1 when
a replayed step time is slow). Once the change is applied and journaled, the
tmpfs is filled: a file of zeros to ENOSPC, then newlines appended to
``journal.jsonl`` and ``audit.jsonl`` until their last pages are full too (a
blank line is no journal step). Then, per case:

- ``sigterm``: SIGTERM at once;
- ``running``: ``RUNNING_S`` seconds of ticks on the full disk (audit records
  dropped), the process still running, then SIGTERM;
- ``restart``: SIGKILL, then a restart (``run --duration 0``) on the still
  full disk, which must revert what the killed one left.

A case passes when every worker thread has its original mask back, the
controller exited 0 within ``EXIT_LIMIT`` seconds of the signal, its stderr
holds no traceback and says the audit dropped records (or, for ``restart``,
what it reconciled).

Descriptors (``fd_exhaustion``): the controller runs with a soft limit of
``SOFT_NOFILE`` descriptors (systemd's default) and ``--metrics-addr``; once
its change is applied, ``nobody`` opens ``IDLE_CLIENTS`` idle connections to
the metrics port and keeps them. The controller must still be running a
``HOLD_S`` later, the change still journaled open and applied (never closed
as ``target-gone``), and SIGTERM must revert it.

Metrics port taken (``port_taken``): a controller holding a change is
SIGKILLed and restarted with ``--metrics-addr`` on a port another process
holds: the restart refuses the port with one error line, after reverting.

Example::

    figures = full_disk(Path("/tmp/x"), cases=("sigterm", "running", "restart"))
    figures["leaks"], figures["failures"]      # 0, []

Needs root (mount, setpriv) and CPUs 0 and 1.

Overhead: per case one controller (~1 s to start, no probes) and a 1 MiB
tmpfs; the descriptor case ~10 s.
"""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from conftest import run_cli, spawn_cli  # noqa: E402
from reliability.counts import record_sigterm  # noqa: E402
from reliability.crash import AffinityBed  # noqa: E402

STATE_SIZE = "1m"
RUNNING_S = 3.0
EXIT_LIMIT = 30.0          # seconds from the signal to the exit: past it, the controller hangs
APPLY_LIMIT = 60.0         # seconds for the change to be applied and journaled
SOFT_NOFILE = 1024
IDLE_CLIENTS = 1100
HOLD_S = 5.0
CASES = ("sigterm", "running", "restart")


def _wait_for(what: str, check, limit: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the controller exited ({proc.returncode}) before {what}")
        time.sleep(0.1)
    raise RuntimeError(f"no {what} after {limit:.0f} s")


def fill(state: Path) -> int:
    """Fill the filesystem of ``state``; returns the bytes written."""
    written = 0
    with open(state / "fill", "wb", buffering=0) as f:
        chunk = b"\0" * 65536
        while True:
            try:
                n = f.write(chunk)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
                if len(chunk) == 1:
                    break
                chunk = chunk[:len(chunk) // 2]
                continue
            written += n or 0
    for name in ("journal.jsonl", "audit.jsonl"):     # their last pages too
        fd = os.open(state / name, os.O_WRONLY | os.O_APPEND)
        try:
            while True:
                try:
                    os.write(fd, b"\n" * 512)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    try:
                        while os.write(fd, b"\n"):
                            written += 1
                    except OSError:
                        break
                written += 512
        finally:
            os.close(fd)
    return written


class Controller:
    """``reflexarc run`` on the bed's policy, its stderr in a file."""

    def __init__(self, bed: AffinityBed, state: Path, extra: list[str], duration: float = 120.0,
                 preexec=None) -> None:
        self.log = state.parent / f"{state.name}.stderr"
        self.err = open(self.log, "w")
        self.proc = spawn_cli(*bed.globals(state), "run", "--no-probes", "--replay", str(bed.replay), "--policy",
                              str(bed.policy), "--mode", "policy", "--interval", "0.2", "--duration", str(duration),
                              "--kill-switch", str(state / "off"), *extra, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=self.err, preexec_fn=preexec)

    def stop(self, sig: int) -> tuple[int | None, float]:
        """Send ``sig``; the exit code (None when it hung) and the seconds it took."""
        began = time.monotonic()
        self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout=EXIT_LIMIT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        self.err.close()
        return code, time.monotonic() - began

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")


def journal_state(state: Path) -> str:
    """The last state of the journal's last entry, read without its lock (the
    controller holds it): "none" without one."""
    last: dict[str, str] = {}
    try:
        lines = (state / "journal.jsonl").read_bytes().splitlines()
    except FileNotFoundError:
        return "none"
    for raw in lines:
        try:
            rec = json.loads(raw)
        except ValueError:
            continue
        if isinstance(rec, dict) and "id" in rec:
            last.pop(rec["id"], None)
            last[rec["id"]] = rec.get("state", "")
    return list(last.values())[-1] if last else "none"


def _mount(state: Path) -> None:
    state.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={STATE_SIZE},mode=0755", "tmpfs", str(state)],
                   check=True, capture_output=True, timeout=30)


def _umount(state: Path) -> None:
    subprocess.run(["umount", "-l", str(state)], capture_output=True, timeout=30)


def _applied(bed: AffinityBed, state: Path) -> bool:
    return bed.live() and journal_state(state) == "applied"


def _case(bed: AffinityBed, tmp: Path, case: str, n: int) -> dict:
    state = tmp / f"state-{case}-{n}"
    _mount(state)
    rec = {"case": case, "problems": []}
    try:
        ctl = Controller(bed, state, [])
        _wait_for("change applied and journaled", lambda: _applied(bed, state), APPLY_LIMIT, ctl.proc)
        rec["filled_bytes"] = fill(state)
        if case == "running":
            time.sleep(RUNNING_S)
            if ctl.proc.poll() is not None:
                rec["problems"].append(f"the controller died on the full disk (exit {ctl.proc.returncode})")
        if case == "restart":
            ctl.stop(signal.SIGKILL)
            rec["live_after_kill"] = bed.live()
            restart = run_cli(*bed.globals(state), "run", "--no-probes", "--policy", str(bed.tmp / "quiet.yaml"),
                              "--mode", "policy", "--duration", "0", timeout=EXIT_LIMIT + 30)
            rec["exit"], err = restart.returncode, restart.stderr
            if "reconciled at start" not in err:
                rec["problems"].append(f"the restart did not say what it reconciled: {err[-800:]}")
        else:
            rec["exit"], rec["exit_s"] = ctl.stop(signal.SIGTERM)
            record_sigterm(f"full-disk {case}", None if rec["exit"] is None else rec["exit_s"])
            err = ctl.stderr()
            if "audit" not in err or "dropped" not in err:
                rec["problems"].append(f"stderr does not say the audit dropped records: {err[-800:]}")
        if rec["exit"] != 0:
            rec["problems"].append(f"exit {rec['exit']} (None: still running {EXIT_LIMIT:.0f} s after the "
                                   f"signal): {err[-800:]}")
        if "Traceback" in err:
            rec["problems"].append(f"a traceback: {err[-1500:]}")
        rec["leaks"] = bed.leaks()
    finally:
        _umount(state)
        if bed.live():
            bed.cleanup()
    return rec


def full_disk(tmp: Path, cases=CASES, rounds: int = 1) -> dict:
    bed = AffinityBed(tmp)
    bed.setup()
    records = []
    try:
        for n in range(rounds):
            for case in cases:
                records.append(_case(bed, tmp, case, n))
    finally:
        bed.teardown()
    return _summary(records)


def _summary(records: list[dict]) -> dict:
    leaks = [f"{r['case']}: {leak}" for r in records for leak in r.get("leaks", [])]
    failures = [f"{r['case']}: {p}" for r in records for p in r["problems"]]
    return {"trials": len(records), "leaks": len(leaks), "leak_details": leaks, "failures": failures,
            "exit_s": [round(r["exit_s"], 2) for r in records if r.get("exit_s") is not None],
            "records": records}


IDLE_HOLDER = r"""
import socket, sys, time
port, count, hold = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
socks, refused = [], 0
for _ in range(count):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
        socks.append(s)
    except OSError:
        refused += 1
        s.close()
print(len(socks), refused, flush=True)
time.sleep(hold)
"""


def _low_nofile() -> None:
    import resource
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_NOFILE, max(hard, 4 * SOFT_NOFILE)))


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def fd_exhaustion(tmp: Path) -> dict:
    bed = AffinityBed(tmp)
    bed.setup()
    state = tmp / "state-fds"
    state.mkdir()
    rec = {"case": "fds", "problems": []}
    holder = None
    try:
        port = _free_port()
        ctl = Controller(bed, state, ["--metrics-addr", f"127.0.0.1:{port}"], preexec=_low_nofile)
        _wait_for("change applied and journaled", lambda: _applied(bed, state), APPLY_LIMIT, ctl.proc)
        holder = subprocess.Popen(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                                   sys.executable, "-c", IDLE_HOLDER, str(port), str(IDLE_CLIENTS), str(HOLD_S * 3)],
                                  stdout=subprocess.PIPE, text=True, cwd="/")
        line = holder.stdout.readline().split()
        rec["connected"], rec["refused_connects"] = (int(line[0]), int(line[1])) if len(line) == 2 else (0, 0)
        time.sleep(HOLD_S)
        if ctl.proc.poll() is not None:
            rec["problems"].append(f"the controller exited ({ctl.proc.returncode}) under the idle clients")
        fds = len(os.listdir(f"/proc/{ctl.proc.pid}/fd")) if ctl.proc.poll() is None else None
        rec["controller_fds"] = fds
        rec["journal_at_hold"] = journal_state(state)
        rec["live_at_hold"] = bed.live()
        if rec["journal_at_hold"] != "applied" or not rec["live_at_hold"]:
            rec["problems"].append(f"the change is no longer held as applied: journal {rec['journal_at_hold']}, "
                                   f"live {rec['live_at_hold']}")
        rec["exit"], rec["exit_s"] = ctl.stop(signal.SIGTERM)
        record_sigterm("fd-exhaustion", None if rec["exit"] is None else rec["exit_s"])
        err = ctl.stderr()
        if rec["exit"] != 0:
            rec["problems"].append(f"exit {rec['exit']}: {err[-800:]}")
        if "Traceback" in err or "Too many open files" in err:
            rec["problems"].append(f"stderr: {err[-1500:]}")
        rec["leaks"] = bed.leaks()
    finally:
        if holder is not None:
            holder.kill()
            holder.wait()
        if bed.live():
            bed.cleanup()
        bed.teardown()
    return _summary([rec])


def port_taken(tmp: Path) -> dict:
    """A controller killed while holding a change, restarted on a metrics port
    another process holds: the restart must revert the change before it
    refuses the port with one error line."""
    import socket
    bed = AffinityBed(tmp)
    bed.setup()
    state = tmp / "state-port"
    state.mkdir()
    rec = {"case": "port-taken", "problems": []}
    squatter = socket.socket()
    try:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        port = squatter.getsockname()[1]
        ctl = Controller(bed, state, [])
        _wait_for("change applied and journaled", lambda: _applied(bed, state), APPLY_LIMIT, ctl.proc)
        ctl.stop(signal.SIGKILL)
        rec["live_after_kill"] = bed.live()
        r = run_cli(*bed.globals(state), "run", "--no-probes", "--policy", str(bed.policy), "--mode", "policy",
                    "--duration", "0", "--metrics-addr", f"127.0.0.1:{port}", timeout=EXIT_LIMIT + 30)
        rec["exit"] = r.returncode
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        if r.returncode != 1 or len(errors) != 1 or str(port) not in errors[0]:
            rec["problems"].append(f"want exit 1 and one error line naming the port, got {r.returncode}: "
                                   f"{r.stderr[-800:]}")
        if "Traceback" in r.stderr:
            rec["problems"].append(f"a traceback: {r.stderr[-1500:]}")
        rec["leaks"] = bed.leaks()
    finally:
        squatter.close()
        if bed.live():
            bed.cleanup()
        bed.teardown()
    return _summary([rec])


if __name__ == "__main__":
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        print(json.dumps(full_disk(Path(d)), indent=1, default=str))
