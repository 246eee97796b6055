"""Links and files planted in the controller's state directory by another user:
nothing the controller writes may land in a file it did not make.

Cases, each a real ``reflexarc`` child on a fresh state directory next to two
root-only "secret" files (mode 0600, one line each):

- ``nobody-owns-the-dir``: the state directory belongs to ``nobody``, with
  ``journal.jsonl`` a link to one secret and ``audit.jsonl`` to the other;
  ``run`` must refuse with one ``error:`` line naming the directory and the
  fix, before reading or writing either;
- ``journal-link`` / ``audit-link``: a root-owned 0700 directory holding such a
  link (planted before it was locked down): refused with one error line;
- ``compaction-link``: ``journal.jsonl.compacting`` a link to a secret, next to
  a real journal: the run compacts through a file of its own, never the link;
- ``policy-link``: a policy path in a directory others may write, linked to
  a root-only file: ``run`` refuses it, and neither its messages nor the
  audit quote a word of the file;
- ``policy-link-reload``: the same link planted while a dry-run controller
  runs on a valid file at that path, then SIGHUP: the reload is refused, the
  controller keeps running its policies, and neither stderr nor the audit's
  ``reload`` record quotes a word of the file;
- ``modes``: a fresh run creates the journal, its lock and the audit 0600.

After each case both secrets must be byte for byte what they were and still
0600, and the child's stderr must not hold their content.

Example::

    figures = run_planted(Path("/tmp/x"))
    figures["failures"]        # []

Needs root (chown to nobody).

Overhead: one short ``run --duration 0 --no-probes`` child per case (~1 s).
"""
from __future__ import annotations

import json
import os
import pwd
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from conftest import run_cli, spawn_cli  # noqa: E402
from reliability.workloads import QUIET as POLICY  # noqa: E402

SECRET = b"root-only secret line\n"


def _run(state: Path, policy: Path, hooks: Path) -> subprocess.CompletedProcess:
    return run_cli("--state-dir", str(state), "--hook-dir", str(hooks), "run", "--no-probes", "--policy", str(policy),
                   "--duration", "0", timeout=60)


def _errors(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("error:")]


def run_planted(tmp: Path) -> dict:
    nobody = pwd.getpwnam("nobody")
    policy = tmp / "quiet.yaml"
    policy.write_text(POLICY)
    hooks = tmp / "hooks"
    hooks.mkdir(mode=0o755)
    secrets = [tmp / "secret-a", tmp / "secret-b"]
    for s in secrets:
        s.write_bytes(SECRET)
        os.chmod(s, 0o600)
    failures, cases = [], []

    def check(case: str, r: subprocess.CompletedProcess, refused: bool, *needles: str) -> None:
        cases.append(case)
        if refused:
            errs = _errors(r)
            if r.returncode != 1 or len(errs) != 1 or not all(n in errs[0] for n in needles):
                failures.append(f"{case}: want exit 1 and one error line with {needles}, got {r.returncode}: "
                                f"{r.stderr[-600:]}")
        elif r.returncode != 0:
            failures.append(f"{case}: exit {r.returncode}: {r.stderr[-600:]}")
        if "Traceback" in r.stderr:
            failures.append(f"{case}: a traceback: {r.stderr[-800:]}")
        for s in secrets:
            st = os.lstat(s)
            if s.read_bytes() != SECRET or stat.S_IMODE(st.st_mode) != 0o600 or st.st_uid != 0:
                failures.append(f"{case}: {s.name} was changed (mode {stat.S_IMODE(st.st_mode):04o})")
            if SECRET.decode().strip() in r.stderr + r.stdout:
                failures.append(f"{case}: a secret's content was printed")

    state = tmp / "nobody-state"
    state.mkdir()
    (state / "journal.jsonl").symlink_to(secrets[0])
    (state / "audit.jsonl").symlink_to(secrets[1])
    os.lchown(state / "journal.jsonl", nobody.pw_uid, nobody.pw_gid)
    os.lchown(state / "audit.jsonl", nobody.pw_uid, nobody.pw_gid)
    os.chown(state, nobody.pw_uid, nobody.pw_gid)
    check("nobody-owns-the-dir", _run(state, policy, hooks), True, str(state), "owned by uid", "chown root:root")

    for name, target in (("journal.jsonl", secrets[0]), ("audit.jsonl", secrets[1])):
        state = tmp / f"{name}-link"
        state.mkdir(mode=0o700)
        (state / name).symlink_to(target)
        check(f"{name.split('.')[0]}-link", _run(state, policy, hooks), True, "symbolic link")

    state = tmp / "compaction"
    state.mkdir(mode=0o700)
    (state / "journal.jsonl").write_text("")
    (state / "journal.jsonl.compacting").symlink_to(secrets[0])
    check("compaction-link", _run(state, policy, hooks), False)

    shared = tmp / "shared-policies"           # a policy directory others may write, a link planted in it
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / "numa.yaml").symlink_to(secrets[0])
    state = tmp / "policy-link"
    state.mkdir(mode=0o700)
    r = _run(state, shared / "numa.yaml", hooks)
    cases.append("policy-link")
    errs = _errors(r)
    if r.returncode != 1 or "withheld" not in r.stderr or "writable by others" not in r.stderr:
        failures.append(f"policy-link: want the file refused with its messages withheld, got {r.returncode}: "
                        f"{r.stderr[-600:]}")
    audit = state / "audit.jsonl"
    if SECRET.decode().split()[0] in r.stderr + (audit.read_text() if audit.exists() else ""):
        failures.append("policy-link: the linked file's content was printed or audited")
    if len(errs) != 1:
        failures.append(f"policy-link: {len(errs)} error: lines: {r.stderr[-600:]}")

    failures += _reload_link(tmp, shared, secrets[0], hooks)
    cases.append("policy-link-reload")

    state = tmp / "modes"
    check("modes", _run(state, policy, hooks), False)
    for name in ("journal.jsonl", "journal.jsonl.lock", "audit.jsonl"):
        path = state / name
        mode = stat.S_IMODE(os.lstat(path).st_mode) if path.exists() else None
        if mode != 0o600:
            failures.append(f"modes: {name} was made {mode if mode is None else oct(mode)}, not 0600")
    mode = stat.S_IMODE(os.stat(state).st_mode)
    if mode & 0o077:
        failures.append(f"modes: the state directory was made {mode:04o}, not 0700")
    return {"cases": cases, "failures": failures}


def _reload_link(tmp: Path, shared: Path, secret: Path, hooks: Path) -> list[str]:
    """A valid policy in a directory others may write is replaced by a link to
    ``secret`` while the controller runs; SIGHUP makes it reload."""
    failures = []
    path = shared / "live.yaml"
    path.write_text(POLICY)
    state = tmp / "policy-link-reload"
    state.mkdir(mode=0o700)
    proc = spawn_cli("--state-dir", str(state), "--hook-dir", str(hooks), "run", "--no-probes", "--policy", str(path),
                     "--interval", "0.2", "--duration", "30", stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                     stderr=subprocess.PIPE)
    audit = state / "audit.jsonl"
    records = lambda: [json.loads(line) for line in audit.read_text().splitlines() if line.strip()]  # noqa: E731
    deadline = time.monotonic() + 30
    while not (audit.exists() and any(r["kind"] == "run" for r in records())) and time.monotonic() < deadline:
        time.sleep(0.1)
    path.unlink()
    path.symlink_to(secret)
    proc.send_signal(signal.SIGHUP)
    while not any(r["kind"] == "reload" for r in records()) and time.monotonic() < deadline:
        time.sleep(0.1)
    alive = proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    reloads = [r for r in records() if r["kind"] == "reload"]
    if not alive:
        failures.append(f"policy-link-reload: the controller ended at the reload: {err[-600:]}")
    if [r.get("outcome") for r in reloads] != ["refused"]:
        failures.append(f"policy-link-reload: want one refused reload, got {reloads}")
    elif "withheld" not in json.dumps(reloads[0]):
        failures.append(f"policy-link-reload: the refusal does not say its messages are withheld: {reloads[0]}")
    word = SECRET.decode().split()[0]
    if word in err + out or word in audit.read_text():
        failures.append("policy-link-reload: the linked file's content was printed or audited")
    if "Traceback" in err:
        failures.append(f"policy-link-reload: a traceback: {err[-800:]}")
    return failures
