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

import os
import pwd
import stat
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

from reliability.workloads import QUIET as POLICY  # noqa: E402

RX = [sys.executable, "-m", "reflexarc.controller.cli"]
SECRET = b"root-only secret line\n"


def _run(state: Path, policy: Path, hooks: Path) -> subprocess.CompletedProcess:
    return subprocess.run(RX + ["--state-dir", str(state), "--hook-dir", str(hooks), "run", "--no-probes",
                                "--policy", str(policy), "--duration", "0"],
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)


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
