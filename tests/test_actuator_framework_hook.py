"""The framework_hook actuator against real training-script processes: a small
script using ``reflexarc.actuators.hooks`` driven over stdin (its step boundaries
happen when the test says so), and the PyTorch example ``train_with_hooks.py``."""
from __future__ import annotations

import json
import os
import queue
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT, require_root

from reflexarc.actuators.base import Change, PermanentActuatorError, Target, TemporaryActuatorError
from reflexarc.actuators.framework_hook import (FrameworkHookActuator, HookClient, find_endpoints, served_by_pid,
                                                read_signals)
from reflexarc.controller.policy.loader import load_policies
from reflexarc.core.procfs import ProcFS

pytestmark = [pytest.mark.kernel]

NOBODY = 65534

SCRIPT = textwrap.dedent(r"""
    import json, sys, threading, time
    from reflexarc.actuators.hooks import Hooks

    opts = json.loads(sys.argv[1])
    hooks = Hooks.start(job=opts["job"], rank=opts.get("rank", 0), hook_dir=opts["dir"],
                        group=opts.get("group"), allowed_uids=opts.get("allowed_uids", ()))
    state = {"knob": 1, "calls": [], "undos": 0}

    def say(**fields):
        print(json.dumps(fields), flush=True)

    @hooks.handler("echo")
    def echo(**args):
        state["calls"].append(["echo", args])
        return {"echo": args, "thread": threading.current_thread().name}

    @hooks.handler("slow")
    def slow(seconds):
        state["calls"].append(["slow", seconds])
        time.sleep(seconds)
        return "slept"

    @hooks.handler("fail")
    def fail():
        raise RuntimeError("disk on fire")

    def knob_undo(value):
        state["knob"] = 1
        state["undos"] += 1

    def knob_preview(value):
        return {"before": {"knob": state["knob"]}, "after": {"knob": value}}

    @hooks.handler("knob.set", undo=knob_undo, preview=knob_preview)
    def knob_set(value):
        state["calls"].append(["knob.set", value, threading.current_thread().name])
        state["knob"] = value
        return {"knob": value}

    say(ready=hooks.path, pid=hooks.pid)
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "step":
            say(ran=hooks.step_boundary(), state=state)
        elif cmd[0] == "state":
            say(state=state)
        elif cmd[0] == "report":
            hooks.report(step_time_ms=float(cmd[1]), dataloader_batch_wait_ms=float(cmd[2]), iteration=int(cmd[3]))
            say(reported=int(cmd[3]))
    hooks.close()
    say(closed=True)
""")


class Script:
    """A subprocess whose JSON output lines are collected by a reader thread."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def expect(self, test, bound: float = 30.0) -> dict:
        """The next output line for which ``test`` holds (earlier lines are dropped)."""
        while True:
            try:
                line = self.lines.get(timeout=bound)
            except queue.Empty:
                raise AssertionError(f"no matching output from pid {self.proc.pid} within {bound}s") from None
            assert line is not None, f"pid {self.proc.pid} ended (exit {self.proc.poll()})"
            if test(line):
                return line

    def send(self, command: str) -> dict:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.expect(lambda line: True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()


@pytest.fixture
def hook_dir():
    path = tempfile.mkdtemp(prefix="rxhooks-")
    os.chmod(path, 0o755)       # traversable by the unprivileged caller of the refusal test
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def start(hook_dir):
    scripts = []

    def run(job: str = "llama", **opts) -> tuple[Script, dict]:
        script = Script([sys.executable, "-c", SCRIPT, json.dumps({"job": job, "dir": hook_dir, **opts})])
        scripts.append(script)
        return script, script.expect(lambda line: "ready" in line)

    yield run
    for script in scripts:
        script.stop()


def hook(act: FrameworkHookActuator, target: Target, handler: str, args: dict | None = None, **params) -> Change:
    return act.plan(target, {"handler": handler, "args": args or {}, **params})


def in_thread(fn):
    box: dict = {}

    def run():
        try:
            box["result"] = fn()
        except Exception as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc
    thread = threading.Thread(target=run)
    thread.start()
    return thread, box


def client(path: str) -> HookClient:
    """A client of the socket at ``path``, checked as the controller checks it."""
    [endpoint] = [ep for ep in find_endpoints(os.path.dirname(path)) if ep.path == path]
    return HookClient(endpoint, ProcFS())


def wait_queued(path: str, count: int) -> None:
    """Until the script has ``count`` calls waiting for a step boundary (bounded)."""
    for _ in range(3000):
        if client(path).request("signals", 5.0)["queued"] == count:
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"{path}: never {count} queued calls")


def as_user(uid: int, fn) -> dict:
    """Run ``fn`` in a forked child with uid/gid ``uid``; its result or error as a dict."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            try:
                out = {"result": fn()}
            except Exception as exc:  # noqa: BLE001 - reported to the parent
                out = {"error": type(exc).__name__, "message": str(exc)}
            os.write(write_end, json.dumps(out, default=repr).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return json.loads(data)


def test_socket_is_private_and_removed_on_close(hook_dir, start):
    script, ready = start()
    st = os.stat(ready["ready"])
    assert stat.S_ISSOCK(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600 and st.st_uid == os.getuid()
    assert Path(ready["ready"]).name == f"llama-0-{ready['pid']}.sock"
    assert [p.name for p in Path(hook_dir).iterdir()] == [Path(ready["ready"]).name]

    script.proc.stdin.close()
    script.expect(lambda line: line.get("closed"))
    assert not Path(ready["ready"]).exists()


def test_call_returns_the_handlers_result(hook_dir, start):
    script, ready = start()
    act = FrameworkHookActuator(hook_dir=hook_dir)
    change = hook(act, Target({"job": "llama"}), "echo", {"a": 1}, at_step_boundary=False)
    assert change.before["endpoints"][0]["state"] is None and change.after["endpoints"][0]["state"] == {"a": 1}
    assert change.after["endpoints"][0]["pid"] == ready["pid"]
    assert "no undo: revert is a no-op" in change.summary
    assert script.send("state")["state"]["calls"] == [], "plan must not call the handler"

    results = act.apply(change)
    assert results == {ready["ready"]: {"echo": {"a": 1}, "thread": "reflexarc-hooks-conn"}}
    assert script.send("state")["state"]["calls"] == [["echo", {"a": 1}]]
    act.revert(change)      # no undo: nothing happens, no error
    assert script.send("state")["state"]["calls"] == [["echo", {"a": 1}]]


def test_preview_in_plan_and_undo_on_revert(hook_dir, start):
    script, _ = start()
    act = FrameworkHookActuator(hook_dir=hook_dir)
    change = hook(act, Target({"job": "llama"}), "knob.set", {"value": 5}, at_step_boundary=False)
    assert change.before["endpoints"][0]["state"] == {"knob": 1}
    assert change.after["endpoints"][0]["state"] == {"knob": 5}
    assert "revert calls its undo" in change.summary
    assert script.send("state")["state"]["knob"] == 1

    act.apply(change)
    assert script.send("state")["state"]["knob"] == 5
    act.revert(Change.from_dict(json.loads(json.dumps(change.to_dict()))))
    state = script.send("state")["state"]
    assert (state["knob"], state["undos"]) == (1, 1)
    act.revert(change)      # undo runs once per applied call
    assert script.send("state")["state"]["undos"] == 1


def test_errors_map_to_temporary_and_permanent(hook_dir, start):
    script, _ = start()
    act = FrameworkHookActuator(hook_dir=hook_dir)
    target = Target({"job": "llama"})
    slow = hook(act, target, "slow", {"seconds": 3}, at_step_boundary=False, timeout=0.3)
    with pytest.raises(TemporaryActuatorError, match="no reply to call"):
        act.apply(slow)
    with pytest.raises(PermanentActuatorError, match="unknown_handler: no handler 'nope'"):
        hook(act, target, "nope")
    with pytest.raises(PermanentActuatorError, match="RuntimeError: disk on fire"):
        act.apply(hook(act, target, "fail", at_step_boundary=False))
    with pytest.raises(PermanentActuatorError, match="no hook socket for job=other"):
        hook(act, Target({"job": "other"}), "echo")
    # The script's loop is unharmed by any of it.
    assert script.send("state")["state"]["calls"][0] == ["slow", 3]


def test_step_boundary_calls_wait_for_the_loop(hook_dir, start):
    script, ready = start()
    act = FrameworkHookActuator(hook_dir=hook_dir)
    change = hook(act, Target({"job": "llama", "rank": "0"}), "knob.set", {"value": 7}, timeout=60)
    thread, box = in_thread(lambda: act.apply(change))
    wait_queued(ready["ready"], 1)
    assert script.send("state")["state"]["knob"] == 1, "queued, not run before the step boundary"
    stepped = script.send("step")
    thread.join()
    assert stepped["ran"] == 1 and stepped["state"]["calls"] == [["knob.set", 7, "MainThread"]]
    assert box == {"result": {ready["ready"]: {"knob": 7}}}

    thread, box = in_thread(lambda: act.revert(change))
    wait_queued(ready["ready"], 1)
    stepped = script.send("step")
    thread.join()
    assert "error" not in box and stepped["state"]["knob"] == 1 and stepped["state"]["undos"] == 1

    late = hook(act, Target({"job": "llama"}), "knob.set", {"value": 9}, timeout=0.3)
    with pytest.raises(TemporaryActuatorError, match="no step boundary within 0.3s; not run"):
        act.apply(late)
    stepped = script.send("step")
    assert stepped["ran"] == 0 and stepped["state"]["knob"] == 1, "a call that timed out never runs"


def test_callers_are_checked_with_peer_credentials(hook_dir, start):
    require_root()
    act = FrameworkHookActuator(hook_dir=hook_dir)
    grouped, ready = start(job="grouped", group=NOBODY)         # 0660, group nogroup: nobody may connect
    st = os.stat(ready["ready"])
    assert stat.S_IMODE(st.st_mode) == 0o660 and st.st_gid == NOBODY
    change = hook(act, Target({"job": "grouped"}), "knob.set", {"value": 3}, at_step_boundary=False)
    refused = as_user(NOBODY, lambda: act.apply(change))
    assert refused["error"] == "PermanentActuatorError"
    assert "refused: uid 65534 may not call" in refused["message"]
    assert grouped.send("state")["state"]["calls"] == []

    private, _ = start(job="private")                              # 0600: not even a connection
    change = hook(act, Target({"job": "private"}), "echo", at_step_boundary=False)
    denied = as_user(NOBODY, lambda: act.apply(change))
    assert denied["error"] == "PermanentActuatorError" and "permissions" in denied["message"]

    trusting, _ = start(job="trusting", group=NOBODY, allowed_uids=[NOBODY])
    change = hook(act, Target({"job": "trusting"}), "knob.set", {"value": 3}, at_step_boundary=False)
    allowed = as_user(NOBODY, lambda: act.apply(change))
    assert list(allowed["result"].values()) == [{"knob": 3}]
    assert trusting.send("state")["state"]["knob"] == 3


def test_step_signals_are_served(hook_dir, start):
    script, ready = start()
    other, _ = start(job="other", rank=1)
    assert read_signals(hook_dir, "llama") == ([], [])
    script.send("report 182.5 4.25 41")
    other.send("report 90 1 7")
    got = {(s["labels"]["job"], s["labels"]["rank"], s["name"]): s["value"] for s in read_signals(hook_dir).signals}
    assert got == {("llama", "0", "step_time_ms"): 182.5, ("llama", "0", "dataloader_batch_wait_ms"): 4.25,
                   ("other", "1", "step_time_ms"): 90.0, ("other", "1", "dataloader_batch_wait_ms"): 1.0}
    assert client(ready["ready"]).request("signals", 5.0)["iteration"] == 41


def test_a_stalled_step_reports_its_time_so_far(hook_dir, start):
    """A step that has run for over a second (and twice the last step) is at least
    that long: the reader sees it before the step ends, then the real mean again."""
    script, _ = start()
    script.send("report 100 1 1")
    time.sleep(1.2)
    [step] = [s for s in read_signals(hook_dir, "llama").signals if s["name"] == "step_time_ms"]
    assert step["value"] >= 1200
    script.send("report 1300 1 2")
    [step] = [s for s in read_signals(hook_dir, "llama").signals if s["name"] == "step_time_ms"]
    assert step["value"] == 1300


def test_ranks_by_training_process(hook_dir, start):
    _, zero = start()
    _, one = start(job="other", rank=1)
    Path(hook_dir, "notes.txt").write_text("not a socket name\n")
    assert served_by_pid(hook_dir) == {zero["pid"]: ("0", "llama"), one["pid"]: ("1", "other")}
    assert served_by_pid(str(Path(hook_dir, "missing"))) == {}


def test_example_training_script_changes_prefetch(hook_dir):
    example = Script([sys.executable, str(ROOT / "examples" / "train_with_hooks.py"), "--job", "mlp",
                      "--hook-dir", hook_dir, "--steps", "1000000", "--samples", "128", "--read-ms", "2"])
    try:
        ready = example.expect(lambda line: line.get("event") == "ready", bound=120.0)
        act = FrameworkHookActuator(hook_dir=hook_dir)
        # A worker's pid (as a loader probe labels it) leads to its training process.
        # Each epoch has new workers: look until one is caught alive.
        for _ in range(1000):
            workers = ProcFS().find(("pt_data_worker",), pids=[ready["pid"]])
            found = [ep.pid for ep in act.endpoints(Target({"job": "mlp", "pid": str(workers[0])}))] if workers else []
            if found:
                break
            threading.Event().wait(0.01)
        assert found == [ready["pid"]]
        assert act.endpoints(Target({"job": "mlp", "pid": str(os.getpid())})) == []
        target = Target({"job": "mlp", "rank": "0"})

        # the arguments the shipped dataloader-starvation policy sends
        [args] = [a.params["args"] for p in load_policies([str(ROOT / "policies")]) if p.name == "dataloader-starvation"
                  for r in p.rules for a in r.actions if a.actuator == "framework_hook"]
        assert args == {"prefetch_factor": 8, "num_workers": 8}
        with pytest.raises(PermanentActuatorError, match="takes prefetch_factor, num_workers"):
            hook(act, target, "dataloader.prefetch", {"factor": 4}, timeout=60)
        change = hook(act, target, "dataloader.prefetch", {"prefetch_factor": 4, "num_workers": 3}, timeout=60)
        assert (change.before["endpoints"][0]["state"], change.after["endpoints"][0]["state"]) == \
            ({"prefetch_factor": 2, "num_workers": 2}, {"prefetch_factor": 4, "num_workers": 3})
        assert act.apply(change) == {ready["socket"]: {"prefetch_factor": 4, "num_workers": 3,
                                                       "original": {"prefetch_factor": 2, "num_workers": 2}}}
        example.expect(lambda line: line.get("event") == "epoch" and line["prefetch_factor"] == 4
                       and line["num_workers"] == 3)
        signals = {s["name"]: s["value"] for s in read_signals(hook_dir, "mlp").signals}
        assert signals["step_time_ms"] >= signals["dataloader_batch_wait_ms"] >= 0
        assert signals["step_time_ms"] > 0

        act.revert(change)
        example.expect(lambda line: line.get("event") == "epoch" and line["prefetch_factor"] == 2
                       and line["num_workers"] == 2)
    finally:
        example.stop()
