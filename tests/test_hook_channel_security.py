"""The hook channel against a local user who is not the job's: real processes
running as nobody (uid 65534) serve fake sockets with forged and malformed
replies beside real training scripts, and the controller (HookSource, the
engine with an enforce policy, ``reflexarc run``) must act on none of them,
count each in ``reflexarc_hook_rejected_total{reason}`` and never exit on one.
A script of a user who is not root registers through the job directory root
made for it, and its signals do drive the policy."""
from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from conftest import require_root, run_cli
from engine_fixtures import Knob, Note, policy

from reflexarc.actuators.base import Registry, Target
from reflexarc.actuators.framework_hook import FrameworkHookActuator, HookRejected, Rejected, find_endpoints
from reflexarc.controller.engine.audit import AuditLog
from reflexarc.controller.engine.bus import SignalBus
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.engine.engine import Controller
from reflexarc.controller.engine.metrics import ControllerMetrics
from reflexarc.controller.policy.model import Selector
from reflexarc.controller.sources.readers import HookSource

pytestmark = [pytest.mark.kernel]

NOBODY = 65534

# A training script: serves hooks through the real client and reports a step
# time every 50 ms until it is killed; a handler records its calls.
SCRIPT = textwrap.dedent(r"""
    import json, sys, time
    from reflexarc.actuators.hooks import Hooks, HookDirError

    opts = json.loads(sys.argv[1])
    try:
        hooks = Hooks.start(job=opts["job"], rank=0, hook_dir=opts["dir"])
    except HookDirError as exc:
        print(json.dumps({"error": str(exc)}), flush=True)
        sys.exit(0)
    calls = []
    hooks.handler("knob.set")(lambda value: calls.append(value) or len(calls))
    print(json.dumps({"ready": hooks.path, "pid": hooks.pid}), flush=True)
    while True:
        hooks.report(step_time_ms=opts["step_ms"], dataloader_batch_wait_ms=1.0, iteration=1)
        hooks.step_boundary()
        time.sleep(0.05)
""")

FAKE_SCRIPT = Path(__file__).resolve().parent / "workloads" / "fake_hook_socket.py"
FAKE = FAKE_SCRIPT.read_text()     # run as nobody with ``python -c``: it need not reach the file


def signals_reply(job: str, value: str = "5000", name: str = "step_time_ms", pid: str = '"{pid}"',
                  start: str = '"{start}"') -> str:
    return ('{"ok": true, "instance": "f00d", "pid": %s, "start": %s, "job": "%s", "rank": 0, "iteration": 1, '
            '"queued": 0, "signals": {"%s": {"value": %s, "ts": 1.0, "steps": 1}}}' % (pid, start, job, name, value))


@pytest.fixture
def hook_dir():
    require_root()
    path = Path(tempfile.mkdtemp(prefix="rxhooksec-"))
    path.chmod(0o755)                      # root's, as 'reflexarc run' makes it
    scratch = path / "scratch"             # the job directory root made for nobody's job
    scratch.mkdir(mode=0o700)
    os.chown(scratch, NOBODY, NOBODY)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def spawn():
    procs = []

    def run(code: str, opts: dict, user: int | None = None) -> dict:
        as_user = [] if user is None else ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]
        proc = subprocess.Popen([*as_user, sys.executable, "-c", code, json.dumps(opts)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        procs.append(proc)
        line = proc.stdout.readline()
        assert line, f"no output from pid {proc.pid}: {proc.stderr.read()[-2000:]}"
        return json.loads(line)

    yield run
    for proc in procs:
        proc.kill()
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()


def rejected(registry, reason: str) -> float:
    return registry.get_sample_value("reflexarc_hook_rejected_total", {"reason": reason}) or 0.0


def drive(pols, source: HookSource, metrics: ControllerMetrics, ticks: int = 12):
    """The engine fed by ``source`` for ``ticks`` simulated seconds; returns
    (knob state, audit records, samples published)."""
    state: dict = {}
    registry = Registry()
    registry.register(Knob.spec, lambda: Knob(state))
    registry.register(Note.spec, lambda: Note([]))
    clock = SimClock()
    ctl = Controller(pols, SignalBus(), registry, clock, audit=AuditLog(None, clock), metrics=metrics)
    ctl.start("test")
    published = []
    for t in range(ticks):
        clock.set(float(t))
        for name, labels, value in source.poll(float(t)):
            published.append((name, dict(labels), value))
            ctl.bus.publish(name, labels, value, float(t))
        ctl.tick()
    ctl.shutdown()
    return state, ctl.audit.records, published


def enforce(job: str, **selector) -> list:
    """An enforce policy on the job's step times (over 100 ms for 5 s: turn the knob)."""
    p = policy(verify=False, rollback_on=("clear",))
    p.name = f"slow-{job}"
    p.selector = Selector(match={"job": job}, **selector)
    return [p]


def applied(records) -> list[str]:
    return [r["target"] for r in records if r["kind"] == "action" and r["outcome"] == "applied"]


def test_nobody_cannot_put_a_socket_where_root_or_another_job_serves(hook_dir, spawn):
    other = hook_dir / "llama"                   # the directory of another user's job
    other.mkdir(mode=0o700)
    os.chown(other, 12345, 12345)
    for path in (hook_dir / "llama-0-1.sock", other / "llama-0-{pid}.sock"):
        out = spawn(FAKE, {"path": str(path), "reply": "{}"}, user=NOBODY)
        assert out == {"refused": "PermissionError"}, path
    assert find_endpoints(str(hook_dir)) == []


def test_forged_and_malformed_sockets_never_drive_an_enforce_action(hook_dir, spawn):
    victim = spawn(SCRIPT, {"job": "llama", "dir": str(hook_dir), "step_ms": 50.0})    # root's real job
    vstart = int(Path(f"/proc/{victim['pid']}/stat").read_bytes().rpartition(b")")[2].split()[19])
    scratch = hook_dir / "scratch"
    fakes = {   # socket -> reply, each served by a process running as nobody
        scratch / f"llama-0-{victim['pid']}.sock": signals_reply("llama"),                  # place: not its job
        scratch / f"scratch-0-{victim['pid']}.sock": signals_reply("llama", pid=str(victim["pid"]),
                                                                   start=str(vstart)),       # peer: not that pid
        scratch / "scratch-0-{pid}.sock": '{"signals":{"step_time_ms":5}}',                 # reply: malformed
        scratch / "scratch-1-{pid}.sock": signals_reply("scratch", start="12345"),          # stale: not its start
    }
    for path, reply in fakes.items():
        assert "ready" in spawn(FAKE, {"path": str(path), "reply": reply}, user=NOBODY)
    # the rest claim a job nobody has no directory for, or break the schema, from nobody's own directory
    for reply in (signals_reply("llama"), signals_reply("scratch", value="NaN"),
                  signals_reply("scratch", name="evil_signal"), signals_reply("scratch", value='"' + "x" * 20000 + '"'),
                  signals_reply("scratch", value="1e999999")):
        assert "ready" in spawn(FAKE, {"path": str(scratch / "scratch-0-{pid}.sock"), "reply": reply}, user=NOBODY)

    metrics = ControllerMetrics()
    source = HookSource(str(hook_dir), None, [], metrics.registry)
    state, records, published = drive(enforce("llama") + enforce("scratch"), source, metrics)

    assert state == {} and not [r for r in records if r["kind"] == "action"], "no enforce action, not even planned"
    assert {(labels["job"], value) for name, labels, value in published if name == "step_time_ms"} == {("llama", 50.0)}
    reg = metrics.registry
    counts = {reason: rejected(reg, reason) for reason in Rejected}
    assert counts == {"place": 12.0, "peer": 12.0, "stale": 12.0, "selector": 0.0, "reply": 72.0, "timeout": 0.0}, \
        "each fake counted on each of the 12 polls: 1 misplaced, 1 forged peer, 1 forged start, 6 bad replies"


def test_a_job_directory_others_may_write_is_not_trusted(hook_dir, spawn):
    scratch = hook_dir / "scratch"
    assert "ready" in spawn(SCRIPT, {"job": "scratch", "dir": str(hook_dir), "step_ms": 5000.0}, user=NOBODY)
    scratch.chmod(0o777)
    metrics = ControllerMetrics()
    state, _, published = drive(enforce("scratch"), HookSource(str(hook_dir), None, [], metrics.registry), metrics, 3)
    assert state == {} and published == []
    assert rejected(metrics.registry, "place") == 3.0


def test_a_job_that_is_not_root_registers_in_its_directory_and_drives_the_policy(hook_dir, spawn):
    job = spawn(SCRIPT, {"job": "scratch", "dir": str(hook_dir), "step_ms": 5000.0}, user=NOBODY)
    assert job["ready"] == str(hook_dir / "scratch" / f"scratch-0-{job['pid']}.sock")
    metrics = ControllerMetrics()
    pols = enforce("scratch", pids=(job["pid"],))
    state, records, _ = drive(pols, HookSource(str(hook_dir), None, pols, metrics.registry), metrics)
    assert state == {"rank=0": 1} and applied(records) == ["rank=0"], "its slow steps made the enforce policy act"
    assert sum(rejected(metrics.registry, r) for r in Rejected) == 0.0

    # The actuator calls it too, after the same checks.
    act = FrameworkHookActuator(hook_dir=str(hook_dir))
    change = act.plan(Target({"job": "scratch"}), {"handler": "knob.set", "args": {"value": 3},
                                                   "at_step_boundary": False})
    assert act.apply(change) == {job["ready"]: 1}


def test_a_process_outside_the_policys_selector_is_ignored(hook_dir, spawn):
    spawn(SCRIPT, {"job": "scratch", "dir": str(hook_dir), "step_ms": 5000.0}, user=NOBODY)
    pols = enforce("scratch", cgroup="/no/such/job")
    metrics = ControllerMetrics()
    state, _, published = drive(pols, HookSource(str(hook_dir), None, pols, metrics.registry), metrics, 3)
    assert state == {} and published == []
    assert rejected(metrics.registry, "selector") == 3.0


def test_without_its_job_directory_a_script_that_is_not_root_is_told_what_to_create(hook_dir, spawn):
    out = spawn(SCRIPT, {"job": "nodir", "dir": str(hook_dir), "step_ms": 1.0}, user=NOBODY)
    assert out["error"].startswith(f"{hook_dir}/nodir does not exist")
    assert f"install -d -o 65534 -m 0700 {hook_dir}/nodir" in out["error"]
    os.chown(hook_dir / "scratch", 0, 0)
    out = spawn(SCRIPT, {"job": "scratch", "dir": str(hook_dir), "step_ms": 1.0}, user=NOBODY)
    assert "is owned by uid 0, not by this process's uid 65534" in out["error"]


def test_a_reused_pid_is_never_called_for_the_old_change(hook_dir, spawn):
    job = spawn(SCRIPT, {"job": "llama", "dir": str(hook_dir), "step_ms": 1.0})
    act = FrameworkHookActuator(hook_dir=str(hook_dir))
    change = act.plan(Target({"job": "llama"}),
                      {"handler": "knob.set", "args": {"value": 1}, "at_step_boundary": False})
    [endpoint] = change.after["endpoints"]
    assert endpoint["pid"] == job["pid"] and endpoint["start"] > 0
    endpoint["start"] += 1             # as if the pid now named a process started later
    with pytest.raises(HookRejected) as refused:
        act.apply(change)
    assert refused.value.reason is Rejected.STALE and f"pid {job['pid']} started at" in str(refused.value)


def rx(hook_dir: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return run_cli("--state-dir", str(tmp_path / "state"), "--hook-dir", str(hook_dir), *args)


POLICY = """\
policies:
  - name: slow-steps
    mode: enforce
    rules:
      - name: r
        by: [job]
        when: {signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: 1}
        actions:
          - actuator: log
            params: {message: slow steps}
        rollback: {on: [shutdown]}
"""


def test_run_survives_forged_and_malformed_sockets(hook_dir, spawn, tmp_path):
    policy_file = tmp_path / "p.yaml"
    policy_file.write_text(POLICY)
    scratch = hook_dir / "scratch"
    for path, reply in ((scratch / "scratch-0-{pid}.sock", '{"signals":{"step_time_ms":5}}'),
                        (scratch / "llama-0-{pid}.sock", signals_reply("llama"))):
        assert "ready" in spawn(FAKE, {"path": str(path), "reply": reply}, user=NOBODY)
    r = rx(hook_dir, tmp_path, "run", "--no-probes", "--mode", "enforce", "--policy", str(policy_file),
           "--duration", "2", "--interval", "0.5")
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr and "ignored (reply)" in r.stderr and "ignored (place)" in r.stderr
    audit = [json.loads(line) for line in (tmp_path / "state" / "audit.jsonl").read_text().splitlines()]
    assert not [rec for rec in audit if rec["kind"] == "action"], "the forged signals drove nothing"


def test_run_refuses_a_hook_directory_others_may_write(tmp_path):
    require_root()
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    for mode, owner, words in ((0o1777, 0, "writable by group and others (mode 1777)"),
                               (0o755, NOBODY, "owned by uid 65534")):
        hooks.chmod(mode)
        os.chown(hooks, owner, owner)
        r = rx(hooks, tmp_path, "run", "--no-probes", "--duration", "1")
        errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
        assert r.returncode == 1 and len(errors) == 1, r.stderr
        assert errors[0].startswith(f"error: hook directory {hooks}: ") and words in errors[0]
        assert f"chown root:root {hooks} && chmod 0755 {hooks}" in errors[0]


def test_run_makes_the_hook_directory_roots_and_private(tmp_path):
    require_root()
    hooks = tmp_path / "run" / "hooks"
    r = rx(hooks, tmp_path, "run", "--no-probes", "--duration", "0")
    assert r.returncode == 0, r.stderr
    st = hooks.stat()
    assert (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (0, 0, 0o755)


@pytest.mark.parametrize("reply, why", [
    ('{"ok": true, "pid": "{pid}", "start": "{start}"}', "does not name the script's instance"),
    ('{"ok": true, "instance": "f00d", "pid": "{pid}", "start": "{start}", "handler": "knob.set"}',
     "does not say whether knob.set has an undo"),
    ('{"ok": true, "instance": "f00d", "pid": "{pid}", "start": "{start}", "has_undo": true, "preview": 3}',
     "has a preview without 'before' and 'after'"),
])
def test_a_describe_reply_off_its_schema_is_rejected_not_a_crash(hook_dir, spawn, reply, why):
    """A socket that passes every check of place and peer (nobody's own job, in
    the directory root made for it) but answers ``describe`` off the schema: the
    plan fails with HookRejected(reply), which the CLI turns into one error line."""
    assert "ready" in spawn(FAKE, {"path": str(hook_dir / "scratch" / "scratch-0-{pid}.sock"), "reply": reply},
                            user=NOBODY)
    act = FrameworkHookActuator(hook_dir=str(hook_dir))
    with pytest.raises(HookRejected, match=why) as caught:
        act.plan(Target({"job": "scratch"}), {"handler": "knob.set", "args": {"value": 3}, "at_step_boundary": False})
    assert caught.value.reason == Rejected.REPLY


def test_a_socket_a_killed_script_left_is_passed_over(hook_dir):
    """A SIGKILLed script cannot remove its socket: the file stays, nobody
    listens. Its pid no longer runs, so it is not an endpoint (before, every plan
    failed on "connection refused" until someone removed it)."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    left.bind(str(hook_dir / f"llama-0-{gone.pid}.sock"))
    left.close()
    act = FrameworkHookActuator(hook_dir=str(hook_dir))
    assert [ep.pid for ep in find_endpoints(str(hook_dir), "llama")] == [gone.pid], "the scan still lists it"
    assert act.endpoints(Target({"job": "llama"})) == []
