"""A journal from another version, and a signal at the wrong moment:

- ``unknown_actuator``: an open entry of an actuator this version does not
  know. ``rollback --all`` fails on it (exit 1, the entry stays open), ``run``
  starts anyway and says so; ``rollback --forget ID --reason TEXT`` closes it,
  audited (a ``forget`` record with the reason); then ``rollback --all`` has
  nothing left and exits 0. ``--forget`` without ``--reason`` is refused.
- ``newer_format``: a journal whose intent carries ``"v": 2``: ``run``,
  ``rollback`` and ``journal`` refuse it with one error line naming the
  format, and the file is left as it was.
- ``hup_at_start``: SIGHUP sent every 20 ms from the moment ``run`` catches
  it, which must be before it opens the journal, through its first second: it
  keeps running and exits 0 at its duration.

Example::

    failures = unknown_actuator(Path("/tmp/x")) + newer_format(Path("/tmp/y"))

Overhead: a few CLI children (~0.3-1 s each).
"""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from conftest import run_cli, spawn_cli  # noqa: E402
from reliability.workloads import QUIET as POLICY  # noqa: E402


def _rx(state: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return run_cli("--state-dir", str(state), "--hook-dir", str(state.parent / "hooks"), *args, timeout=timeout)


def _setup(tmp: Path, intent: dict) -> tuple[Path, Path]:
    state = tmp / "state"
    state.mkdir(mode=0o700)
    (tmp / "hooks").mkdir(mode=0o755, exist_ok=True)
    policy = tmp / "quiet.yaml"
    policy.write_text(POLICY)
    (state / "journal.jsonl").write_text(json.dumps(intent) + "\n" + json.dumps(
        {"id": intent["id"], "state": "applied", "ts": 1}) + "\n")
    return state, policy


def _errors(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("error:")]


def unknown_actuator(tmp: Path) -> list[str]:
    jid = "0123456789ab"
    state, policy = _setup(tmp, {"id": jid, "state": "intent", "v": 1, "ts": 0, "policy": "p", "rule": "r",
                                 "change": {"actuator": "frobnicate", "target": {"labels": {}, "selector": {}},
                                            "params": {}, "before": 1, "after": 2, "summary": "frob 1 -> 2"}})
    failures = []
    r = _rx(state, "rollback", "--all")
    if r.returncode != 1 or "frobnicate" not in r.stdout + r.stderr:
        failures.append(f"rollback --all on an unknown actuator: exit {r.returncode}: {r.stdout}{r.stderr}")
    r = _rx(state, "run", "--no-probes", "--policy", str(policy), "--duration", "0")
    if r.returncode != 0 or f"reconciled at start: {jid} frobnicate failed" not in r.stderr:
        failures.append(f"run beside an entry it cannot revert: exit {r.returncode}: {r.stderr[-600:]}")
    r = _rx(state, "rollback", "--forget", jid)
    if r.returncode != 1 or len(_errors(r)) != 1 or "--reason" not in r.stderr:
        failures.append(f"--forget without --reason: exit {r.returncode}: {r.stderr}")
    r = _rx(state, "rollback", "--forget", jid, "--reason", "frobnicate was removed in 2.0")
    if r.returncode != 0 or "forgotten" not in r.stdout:
        failures.append(f"rollback --forget: exit {r.returncode}: {r.stdout}{r.stderr}")
    r = _rx(state, "rollback", "--all")
    if r.returncode != 0 or "nothing to roll back" not in r.stdout:
        failures.append(f"rollback --all after --forget: exit {r.returncode}: {r.stdout}{r.stderr}")
    records = [json.loads(x) for x in (state / "audit.jsonl").read_text().splitlines() if x.strip()]
    forgets = [x for x in records if x.get("kind") == "forget"]
    if len(forgets) != 1 or forgets[0].get("reason") != "frobnicate was removed in 2.0" \
            or forgets[0].get("journal_id") != jid:
        failures.append(f"the audit's forget records: {forgets}")
    return failures


def newer_format(tmp: Path) -> list[str]:
    state, policy = _setup(tmp, {"id": "abcdefabcdef", "state": "intent", "v": 2, "ts": 0,
                                 "change": {"actuator": "affinity", "target": {"labels": {}, "selector": {}},
                                            "params": {}, "before": {}, "after": {}}})
    before = (state / "journal.jsonl").read_bytes()
    failures = []
    for args in (("run", "--no-probes", "--policy", str(policy), "--duration", "0"), ("rollback", "--all"),
                 ("journal",)):
        r = _rx(state, *args)
        errs = _errors(r)
        if r.returncode != 1 or len(errs) != 1 or "journal format 2" not in errs[0] or "newer" not in errs[0]:
            failures.append(f"{args[0]} on a format-2 journal: exit {r.returncode}: {r.stderr[-600:]}")
        if "Traceback" in r.stderr:
            failures.append(f"{args[0]}: a traceback")
    if (state / "journal.jsonl").read_bytes() != before:
        failures.append("the newer journal was rewritten")
    return failures


def _catches_hup(pid: int) -> bool:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1)))
    except (OSError, ValueError):
        pass
    return False


def hup_at_start(tmp: Path) -> list[str]:
    state = tmp / "state"
    state.mkdir(mode=0o700)
    (tmp / "hooks").mkdir(mode=0o755, exist_ok=True)
    policy = tmp / "quiet.yaml"
    policy.write_text(POLICY)
    proc = spawn_cli("--state-dir", str(state), "--hook-dir", str(tmp / "hooks"), "run", "--no-probes", "--policy",
                     str(policy), "--duration", "3", "--interval", "0.2", stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
    # from the moment the program catches SIGHUP (before that, while the
    # interpreter itself starts, no program can): its first lines do
    deadline = time.monotonic() + 30
    while not _catches_hup(proc.pid) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.002)
    failures = []
    if (state / "journal.jsonl.lock").exists():
        failures.append("SIGHUP is caught only once the journal is open: a reload asked earlier kills the start")
    end = time.monotonic() + 1.0
    while time.monotonic() < end and proc.poll() is None:
        proc.send_signal(signal.SIGHUP)
        time.sleep(0.02)
    out, err = proc.communicate(timeout=60)
    if proc.returncode != 0:
        failures.append(f"run under SIGHUP at start: exit {proc.returncode}: {err[-600:]}")
    return failures
