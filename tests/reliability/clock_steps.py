"""The wall clock stepped under a running controller and under a hooked
training script, for real: libfaketime (Debian's ``faketime``) preloaded into
the process, its offset read from a file the test rewrites
(``FAKETIME_TIMESTAMP_FILE``, ``FAKETIME_NO_CACHE``), the monotonic clock left
alone (``FAKETIME_DONT_FAKE_MONOTONIC``), as an NTP step or an operator's
``date -s`` leaves it.

- ``controller_steps``: ``run --duration RUN_S --interval 0.35`` with the wall
  clock stepped back an hour mid-run. The loop must go on ticking (one that
  waits ``interval - (wall now - wall then)`` may sleep an hour) and end at its
  duration (one that measures it on the wall clock runs an hour more): the run
  must exit 0 within ``EXIT_LIMIT`` seconds of it, its audit timestamps
  following the wall clock people read.
- ``forward_step_limits``: an enforcing rule (the affinity bed of
  ``crash.py``: two idle DataLoader workers pinned to CPU 1 on a slow
  replayed step) with ``max_actions`` of one an hour, a 1 s cooldown and
  ``rollback: on clear``, fed slow and fast steps in turn: it acts once and
  is reverted on clear; then the wall clock jumps two hours ahead. The rule
  must still be held back (``limit`` ``max_actions`` audited), never act a
  second time within the hour.
- ``hook_steps``: a script serving the hooks (a 2 s step reported every 2 s)
  with its wall clock stepped 45 s forward between two reports: no read of its
  signals may then report a step time over ``FALSE_STEP_MS`` (a step "running"
  since the last report, measured on the wall clock, reads 45 s).

Example::

    controller_steps(Path("/tmp/x")), hook_steps(Path("/tmp/y"))    # [], []

Overhead: one controller for ~RUN_S seconds, one hook script for ~6 s.
"""
from __future__ import annotations

import glob
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

from conftest import spawn_cli  # noqa: E402
from reliability.counts import record_sigterm  # noqa: E402
from reliability.workloads import QUIET as POLICY  # noqa: E402

RUN_S = 5.0
EXIT_LIMIT = 30.0
FALSE_STEP_MS = 10000.0

# a training loop serving the hooks, a 2 s step reported every 2 s; it waits
# on an Event: libfaketime 0.9.10 fails time.sleep's absolute monotonic
# clock_nanosleep with EINVAL
HOOKED = r"""
import sys, threading
from reflexarc.actuators.hooks import Hooks
hooks = Hooks.start(job=sys.argv[2], rank=0, hook_dir=sys.argv[1])
tick, step = threading.Event(), 0
while True:
    hooks.report(step_time_ms=2000.0, iteration=step)
    hooks.step_boundary()
    step += 1
    tick.wait(2.0)
"""


def libfaketime() -> str | None:
    found = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
    return found[0] if found else None


def _set(offset_file: Path, offset: str) -> None:
    """A new offset, replaced at once (libfaketime rereads the file at every clock call)."""
    tmp = offset_file.with_name(offset_file.name + ".new")
    tmp.write_text(offset + "\n")
    os.replace(tmp, offset_file)


def _env(offset_file: Path) -> dict:
    _set(offset_file, "+0")
    return {**os.environ, "LD_PRELOAD": libfaketime() or "", "FAKETIME_TIMESTAMP_FILE": str(offset_file),
            "FAKETIME_NO_CACHE": "1", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def controller_steps(tmp: Path) -> list[str]:
    state, hooks = tmp / "state", tmp / "hooks"
    state.mkdir(mode=0o700)
    hooks.mkdir(mode=0o755)
    policy = tmp / "quiet.yaml"
    policy.write_text(POLICY)
    offset = tmp / "offset"
    proc = spawn_cli("--state-dir", str(state), "--hook-dir", str(hooks), "run", "--no-probes", "--policy",
                     str(policy), "--duration", str(RUN_S), "--interval", "0.35", env=_env(offset),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    audit = state / "audit.jsonl"
    deadline = time.monotonic() + 60
    while not audit.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)                    # running: its audit has its first record
    began = time.monotonic()
    time.sleep(1.0)
    _set(offset, "-1h")
    failures = []
    try:
        out, err = proc.communicate(timeout=RUN_S + EXIT_LIMIT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        return [f"run --duration {RUN_S:g} still running {time.monotonic() - began:.0f} s after it began "
                f"ticking, with the wall clock stepped back an hour: the loop stalled"]
    if proc.returncode != 0:
        failures.append(f"exit {proc.returncode}: {err[-600:]}")
    stamps = [json.loads(x)["ts"] for x in audit.read_text().splitlines() if x.strip()]
    if not stamps or not 3000 < time.time() - stamps[-1] < 4200:   # the last ("end") was written an hour back
        failures.append(f"the audit's timestamps do not follow the wall clock people read: {stamps[-3:]}")
    return failures


def hook_steps(tmp: Path) -> list[str]:
    from reflexarc.controller.sources.readers import HookSource
    hooks = tmp / "hooks"
    hooks.mkdir(mode=0o755)
    offset = tmp / "offset"
    job = "clockjob"
    proc = subprocess.Popen([sys.executable, "-c", HOOKED, str(hooks), job],
                            env=_env(offset), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    source = HookSource(str(hooks), job)
    failures, reads = [], []
    try:
        deadline = time.monotonic() + 60
        while not reads and time.monotonic() < deadline and proc.poll() is None:
            reads = [v for n, _, v in source.poll(time.monotonic()) if n == "step_time_ms"]
            time.sleep(0.1)
        if not reads:
            return [f"the hook script served no step time: {proc.stderr.read() if proc.poll() is not None else ''}"]
        _set(offset, "+45s")
        after = []
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            time.sleep(0.25)
            after += [v for n, _, v in source.poll(time.monotonic()) if n == "step_time_ms"]
        if not after:
            failures.append("no step time read after the step")
        if any(v > FALSE_STEP_MS for v in after):
            failures.append(f"a false step after the wall clock jumped 45 s: {max(after):.0f} ms "
                            f"(the script's steps take 2 s): {after}")
    finally:
        source.close()
        proc.kill()
        proc.wait()
    return failures


ALTERNATING_S = 3.0        # seconds of slow steps, then as many of fast ones, in turn


def _alternating_replay(path: Path, seconds: float) -> Path:
    with open(path, "w") as f:
        for i in range(int(seconds * 10)):
            t = i * 0.1
            slow = int(t // ALTERNATING_S) % 2 == 0
            f.write(json.dumps({"t": t, "name": "step_time_ms", "labels": {"job": "rj", "rank": "0"},
                                "value": 520 if slow else 100}) + "\n")
    return path


def forward_step_limits(tmp: Path) -> list[str]:
    from reliability.crash import AffinityBed
    bed = AffinityBed(tmp)
    bed.setup()
    policy = tmp / "limited.yaml"
    policy.write_text(
        "policies:\n  - name: limited\n    mode: enforce\n"
        f"    selector: {{match: {{job: rj}}, pids: [{bed.trainer.pid}], processes: [pt_data_worker]}}\n"
        "    rules:\n      - name: slow-steps\n"
        "        when: {signal: step_time_ms, agg: max, window: 1s, op: \">\", threshold: 300}\n"
        "        actions:\n          - {actuator: affinity, params: {node: 1}}\n"
        "        clear_for: 1s\n        cooldown: 1s\n        max_actions: {count: 1, window: 1h}\n"
        "        rollback: {on: [clear, shutdown]}\n")
    replay = _alternating_replay(tmp / "alternating.jsonl", 120)
    state = tmp / "state"
    state.mkdir(mode=0o700)
    offset = tmp / "offset"
    proc = spawn_cli(*bed.globals(state), "run", "--no-probes", "--replay", str(replay), "--policy", str(policy),
                     "--mode", "policy", "--interval", "0.2", "--duration", "60", "--kill-switch", str(state / "off"),
                     env=_env(offset), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    audit = state / "audit.jsonl"

    def records(kind: str) -> list[dict]:
        if not audit.exists():
            return []
        out = []
        for line in audit.read_text().splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("kind") == kind:
                out.append(rec)
        return out

    def outcomes() -> list[str]:
        return [r["outcome"] for r in records("action") if r.get("actuator") == "affinity"]

    failures = []
    try:
        deadline = time.monotonic() + 60
        while "reverted" not in outcomes() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)                   # acted once, then reverted on clear
        if outcomes()[:2] != ["applied", "reverted"]:
            return [f"the rule did not act and clear first: {outcomes()} {proc.stderr.read() if proc.poll() else ''}"]
        _set(offset, "+2h")
        stepped = len(records("limit"))
        time.sleep(4 * ALTERNATING_S)         # two more slow stretches, each a breach
        applied = outcomes().count("applied")
        limits = [r for r in records("limit")[stepped:] if r.get("reason") == "max_actions"]
        if applied != 1:
            failures.append(f"acted {applied} times within the hour of max_actions after the wall clock jumped "
                            f"two hours: {outcomes()}")
        if not limits and applied == 1:
            failures.append("no breach after the jump was held back by max_actions: the case proves nothing")
    finally:
        sent = None
        if proc.poll() is None:
            sent = time.monotonic()
            proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=EXIT_LIMIT)
            if sent is not None:
                record_sigterm("clock-steps forward_step_limits", time.monotonic() - sent)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            record_sigterm("clock-steps forward_step_limits", None)
            failures.append("the controller did not stop on SIGTERM")
        if bed.live():
            failures.append("a pin was left after SIGTERM")
            bed.cleanup()
        bed.teardown()
    return failures
