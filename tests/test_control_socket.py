"""Steering a running controller over its control socket: status, journal,
rollback of one change through the engine, pause and resume, the kill switch
holding refreshes, and a non-root peer refused.

The bed: a training process (``SPAWNER``) with DataLoader-named workers
(``tests/workloads/idle_worker.py``) that starts one more on each line of its
stdin; an enforcing policy pins its workers to NUMA node 1 (CPU 1 of a fixture
sysfs) while a replayed step time is slow. Real processes, real
``sched_setaffinity``, a real ``reflexarc run`` in a subprocess.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import allowed, require, require_root, run_cli, spawn_cli, two_node_sys, wait_until

pytestmark = [pytest.mark.kernel]

IDLE_WORKER = str(Path(__file__).resolve().parent / "workloads" / "idle_worker.py")
JOB = "steer"

SPAWNER = r"""
import json, os, subprocess, sys
workers = []
def spawn():
    w = subprocess.Popen([sys.executable, sys.argv[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert w.stdout.readline().strip() == "ready"
    workers.append(w)
    return w.pid
spawn(); spawn()
print(json.dumps({"trainer": os.getpid(), "workers": [w.pid for w in workers]}), flush=True)
for line in sys.stdin:
    print(json.dumps({"worker": spawn()}), flush=True)
for w in workers:
    w.stdin.close()
    w.wait()
"""


def _policy(path: Path, trainer: int) -> Path:
    path.write_text(
        "policies:\n  - name: steer\n    mode: enforce\n"
        f"    selector: {{match: {{job: {JOB}}}, pids: [{trainer}], processes: [pt_data_worker]}}\n"
        "    rules:\n      - name: slow-steps\n"
        "        when: {signal: step_time_ms, agg: max, window: 2s, op: \">\", threshold: 300}\n"
        "        actions:\n          - {actuator: affinity, params: {node: 1}}\n"
        "        cooldown: 1h\n        rollback: {on: [shutdown]}\n")
    return path


def _replay(path: Path, slow_from: float, seconds: float = 120.0) -> Path:
    with open(path, "w") as f:
        for i in range(int(seconds * 10)):
            f.write(json.dumps({"t": i * 0.1, "name": "step_time_ms", "labels": {"job": JOB, "rank": "0"},
                                "value": 520 if i * 0.1 >= slow_from else 100}) + "\n")
    return path


class Bed:
    def __init__(self, tmp: Path, slow_from: float = 0.0) -> None:
        require_root()
        require({0, 1} <= os.sched_getaffinity(0), "CPUs 0 and 1 (to pin workers to one of them)")
        self.tmp = tmp
        self.state = tmp / "state"
        self.switch = tmp / "off"
        self.trainer = subprocess.Popen([sys.executable, "-c", SPAWNER, IDLE_WORKER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        info = json.loads(self.trainer.stdout.readline())
        self.workers = info["workers"]
        assert _free(self.workers), "the workers start free to run on CPUs 0-1"
        self.globals = ["--state-dir", str(self.state), "--hook-dir", str(tmp / "hooks"),
                        "--sys-root", str(two_node_sys(tmp / "sys"))]
        self.err = open(tmp / "run.stderr", "w")
        self.proc = spawn_cli(
            *self.globals, "run", "--no-probes", "--replay", str(_replay(tmp / "steps.jsonl", slow_from)),
            "--policy", str(_policy(tmp / "steer.yaml", self.trainer.pid)), "--mode", "policy",
            "--interval", "0.2", "--duration", "120", "--kill-switch", str(self.switch),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=self.err)
        wait_until("the control socket", lambda: (self.state / "control.sock").exists() or self._died(), 60)

    def _died(self):
        if self.proc.poll() is not None:
            raise AssertionError(f"reflexarc run exited {self.proc.returncode}: {self.stderr()[-2000:]}")
        return False

    def stderr(self) -> str:
        return (self.tmp / "run.stderr").read_text(errors="replace")

    def cli(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess:
        res = run_cli(*self.globals, *argv)
        if check:
            assert res.returncode == 0, f"{argv}: exit {res.returncode}: {res.stderr}"
            assert "Traceback" not in res.stderr
        return res

    def status(self) -> dict:
        return json.loads(self.cli("status", "--json").stdout)

    def spawn(self) -> int:
        self.trainer.stdin.write("spawn\n")
        self.trainer.stdin.flush()
        return json.loads(self.trainer.stdout.readline())["worker"]

    def audit(self) -> list[dict]:
        return [json.loads(line) for line in (self.state / "audit.jsonl").read_text().splitlines() if line.strip()]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(timeout=60)
        self.err.close()
        self.trainer.stdin.close()
        self.trainer.wait(timeout=30)


@pytest.fixture
def bed(tmp_path):
    beds = []

    def make(**kw) -> Bed:
        beds.append(Bed(tmp_path, **kw))
        return beds[-1]
    yield make
    for b in beds:
        b.close()


def _pinned(pids) -> bool:
    return all(allowed(pid) == {"1"} for pid in pids)


def _free(pids) -> bool:
    return all(allowed(pid) == {"0-1"} for pid in pids)


def test_status_journal_and_rollback_of_one_change_through_the_running_engine(bed):
    b = bed()
    wait_until("the workers pinned by the rule", lambda: _pinned(b.workers) or b._died(), 60)
    st = b.status()
    assert [c["actuator"] for c in st["changes"]] == ["affinity"]
    jid = st["changes"][0]["journal_id"]
    assert [(r["policy"], r["state"]) for r in st["rules"]] == [("steer", "remediated")]
    assert "step_time_ms 520 > 300" in st["rules"][0]["evidence"]
    assert st["limits"]["active"] == 1 and st["enforcement"]["held"] is None
    text = b.cli("status").stdout
    assert "steer/slow-steps" in text and "remediated" in text and jid in text
    top = b.cli("top", "--once").stdout           # the controller's view: no probe of its own
    assert "the running controller's view" in top and "job steer" in top
    assert "step_time_ms" in top and "520" in top and "remediated" in top and jid in top

    listing = b.cli("journal").stdout      # the running controller holds the journal's lock: it answers
    line = next(row for row in listing.splitlines() if row.startswith(jid))
    assert line.split()[1:3] == ["applied", "affinity"] and line.split()[3].startswith("20")   # a date: 20YY-

    acted = b.cli("act", "affinity", "node=0", "--pid", str(b.trainer.pid), "--mode", "enforce").stdout
    assert acted.startswith("applied: affinity: pin 2 processes") and "journal id" in acted
    manual = acted.split("journal id ")[1].split(":")[0]
    assert all(allowed(pid) == {"0"} for pid in b.workers)
    assert any(r["kind"] == "action" and r["policy"] == "manual" and r["journal_id"] == manual
               and "by an operator" in r.get("note", "") for r in b.audit())
    assert "reverted" in b.cli("rollback", manual).stdout
    assert _pinned(b.workers)              # back to what the rule made, which it still holds

    out = b.cli("rollback", jid).stdout
    assert f"{jid} affinity" in out and "reverted" in out
    assert _free(b.workers)                # the system follows at once
    st = b.status()
    assert st["changes"] == [] and st["limits"]["active"] == 0
    assert [r["state"] for r in st["rules"]] == ["cooldown"]     # the lifecycle followed: no re-pin for 1 h
    records = b.audit()
    assert any(r["kind"] == "transition" and r["to"] == "rolled_back" and "operator" in r.get("note", "")
               for r in records)
    assert any(r["kind"] == "operator" and r["verb"] == "rollback" and r["by"]["uid"] == 0 for r in records)
    assert b.cli("rollback", jid, check=False).returncode == 1     # nothing open by that id any more


def test_pause_holds_new_actions_and_resume_lets_them_through(bed):
    b = bed(slow_from=6.0)
    b.cli("pause", "--reason", "kernel upgrade")
    assert b.status()["enforcement"]["paused"]["reason"] == "kernel upgrade"
    wait_until("the breach held back by the pause",
               lambda: any(r["kind"] == "limit" and r["reason"] == "paused" for r in b.audit()) or b._died(), 60)
    assert _free(b.workers)
    assert b.cli("journal").stdout.strip() == ""           # nothing journaled while paused
    refused = b.cli("act", "affinity", "node=1", "--pid", str(b.trainer.pid), "--mode", "enforce", check=False)
    assert refused.returncode == 1 and refused.stderr.startswith("error: enforcement is held (paused)")
    assert _free(b.workers)
    held = b.cli("rollback", "--all").stdout
    assert "nothing to roll back" in held
    b.cli("resume", "--reason", "upgrade done")
    wait_until("the workers pinned after resume", lambda: _pinned(b.workers) or b._died(), 60)
    kinds = [r["kind"] for r in b.audit()]
    assert "pause" in kinds and "resume" in kinds
    jid = b.status()["changes"][0]["journal_id"]       # an operator keeps it: closed, not reverted
    assert "forgotten" in b.cli("rollback", "--forget", jid, "--reason", "keep the pin").stdout
    assert b.status()["changes"] == [] and _pinned(b.workers)
    assert any(r["kind"] == "forget" and r["journal_id"] == jid and r["by"]["uid"] == 0 for r in b.audit())
    b.cli("report", str(b.state / "audit.jsonl"), "--out", str(b.tmp / "report"))
    page = (b.tmp / "report" / "report.md").read_text()
    assert "enforcement paused by uid 0: kernel upgrade" in page and "enforcement resumed by uid 0: upgrade done" in page
    assert "unknown kind" not in page and f"journal entry {jid}" in page


def test_the_kill_switch_stops_refreshes_and_both_are_audited(bed):
    b = bed()
    wait_until("the workers pinned by the rule", lambda: _pinned(b.workers) or b._died(), 60)
    b.switch.touch()
    wait_until("the kill switch seen", lambda: b.status()["enforcement"]["held"] == "kill_switch", 30)
    new = b.spawn()
    time.sleep(2.0)     # ten ticks at 0.2 s: an unheld controller follows a new worker within one (below)
    assert _free([new]), "a new worker was pinned while the kill switch was engaged"
    b.switch.unlink()
    wait_until("the new worker followed once the switch is released", lambda: _pinned([new]) or b._died(), 30)
    # the refresh is audited right after it pinned the worker, in the same tick: wait for the record
    wait_until("the refresh audited", lambda: any(r["kind"] == "action" and "refreshed" in (r.get("note") or "")
                                                  for r in b.audit()), 30)
    records = b.audit()
    switch = [r["engaged"] for r in records if r["kind"] == "kill_switch"]
    assert switch == [True, False]
    assert any(r["kind"] == "action" and "refreshed" in (r.get("note") or "") for r in records)
    assert "kill switch engaged" in b.stderr()


@pytest.fixture
def open_dir():
    base = Path(tempfile.mkdtemp(prefix="reflexarc-control-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


NOBODY_CLIENT = r"""
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
try:
    s.sendall(b'{"verb": "pause", "reason": "x"}\n')
except BrokenPipeError:      # refused before the request was read: the reply waits to be read
    pass
print(s.makefile().readline().strip())
"""


def test_a_peer_that_is_not_root_is_refused_by_its_credentials(open_dir):
    """The socket's mode already keeps other users out; here it is widened to
    0666 so that the ``SO_PEERCRED`` check alone must refuse ``nobody``."""
    require_root()
    require(shutil.which("setpriv") is not None, "setpriv (util-linux) to run a process as nobody")
    from reflexarc.controller.runtime.control import ControlServer
    asked = []
    server = ControlServer(open_dir / "control.sock", lambda req, peer: asked.append(req) or {"ok": True},
                           mode=0o666)
    server.start()
    try:
        out = subprocess.run(["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups",
                              sys.executable, "-I", "-c", NOBODY_CLIENT, str(open_dir / "control.sock")],
                             capture_output=True, text=True, timeout=60)
        server.serve()
    finally:
        server.close()
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert reply["ok"] is False and "refused" in reply["error"]
    assert asked == []
    assert not (open_dir / "control.sock").exists()


def test_the_cli_as_nobody_gets_one_error_line(bed, tmp_path, cli):
    """The state dir is root's 0700: ``nobody`` cannot reach the socket at all."""
    b = bed(slow_from=1e9)
    require(shutil.which("setpriv") is not None, "setpriv (util-linux) to run a process as nobody")
    os.chmod(tmp_path, 0o755)
    out = cli(*b.globals, "status", timeout=60, cwd="/",
              prefix=["setpriv", "--reuid", "nobody", "--regid", "nogroup", "--clear-groups"])
    assert out.returncode == 1
    assert out.stderr.splitlines() == [f"error: {b.state}: permission denied: only root (or the control group) "
                                       "may ask the running controller or read its journal"]


def test_bad_requests_get_one_error_each_and_leave_nothing_half_done(bed):
    import socket
    b = bed(slow_from=1e9)
    path = str(b.state / "control.sock")
    for raw, expect in ((b"not json\n", "not one line of JSON"), (b'{"verb": "reboot"}\n', "unknown request"),
                        (b'{"verb": "pause"}\n', "needs a reason"), (b"[1]\n", "a JSON object")):
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(path)
            s.sendall(raw)
            reply = json.loads(s.makefile().readline())
        assert reply["ok"] is False and expect in reply["error"], (raw, reply)
    with socket.socket(socket.AF_UNIX) as s:       # half a request, then gone
        s.connect(path)
        s.sendall(b'{"verb": "pause", "reason": "half')
    assert b.status()["enforcement"]["paused"] is None
    assert b.proc.poll() is None


def test_a_counter_is_shown_as_its_rate_over_the_last_window():
    from reflexarc.controller.engine.bus import SignalBus
    from reflexarc.controller.runtime.steer import _rate
    from reflexarc.controller.cli.top import remote_samples
    bus = SignalBus()
    for t in range(30):                            # 50 reads a second, then a reset
        bus.publish("dataloader_reads_total", {"pid": "7"}, 50.0 * t, float(t))
    series = bus.series("dataloader_reads_total")[0]
    assert _rate(series) == 50.0
    bus.publish("dataloader_reads_total", {"pid": "7"}, 3.0, 30.0)
    assert _rate(series) is None
    rows = remote_samples({"signals": [{"name": "dataloader_reads_total", "labels": {"pid": "7"}, "value": 1450.0,
                                        "ts": 1.0, "rate": 50.0}]})
    assert rows == [("dataloader_reads_total/s", {"pid": "7"}, 50.0, 1.0)]


def test_journal_check_finds_a_change_undone_behind_the_running_controllers_back(bed):
    b = bed()
    wait_until("the workers pinned by the rule", lambda: _pinned(b.workers) or b._died(), 60)
    assert "0 drifted" in b.cli("journal", "--check").stdout
    os.sched_setaffinity(b.workers[0], {0, 1})          # someone else moves a thread back
    res = b.cli("journal", "--check", check=False)
    assert res.returncode == 1, res.stdout + res.stderr
    assert f"thread {b.workers[0]} of pid {b.workers[0]} runs on CPUs 0-1, not 1" in res.stdout
    assert res.stderr.startswith("error: 1 open change(s) no longer hold as journaled")
    drift = [r for r in b.audit() if r["kind"] == "drift"]
    assert len(drift) == 1 and "runs on CPUs 0-1" in drift[0]["differs"]


def test_journal_check_without_a_controller_reads_the_files(tmp_path, cli):
    require_root()
    require({0, 1} <= os.sched_getaffinity(0), "CPUs 0 and 1 (to pin workers to one of them)")
    trainer = subprocess.Popen([sys.executable, "-c", SPAWNER, IDLE_WORKER], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    try:
        workers = json.loads(trainer.stdout.readline())["workers"]
        glob = ["--state-dir", str(tmp_path / "state"), "--sys-root", str(two_node_sys(tmp_path / "sys"))]
        run = lambda *a: cli(*glob, *a)  # noqa: E731
        assert run("act", "affinity", "node=1", "--pid", str(trainer.pid), "--mode", "enforce").returncode == 0
        assert _pinned(workers)
        assert run("journal", "--check").returncode == 0
        os.sched_setaffinity(workers[1], {0})
        res = run("journal", "--check")
        assert res.returncode == 1 and "drifted: thread" in res.stdout and "runs on CPUs 0, not 1" in res.stdout
        assert run("rollback", "--all").returncode == 0
        assert _free(workers)
    finally:
        trainer.stdin.close()
        trainer.wait(timeout=30)
