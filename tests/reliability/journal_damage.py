"""Journal damage against the operator's levers: a real change (the affinity
actuator pinning a sleeping child to CPU 1, or a tc-BPF DSCP mark on a veth in
a network namespace), a journal damaged around it, and ``rollback --all`` (or
a restart's reconcile) that must still revert it.

Damage: a torn last line (before or after the change), each malformed line of
``test_journal_damage.MALFORMED`` (before the change) and all of them after it,
binary garbage and NUL bytes, a 2 MiB line, the intent line repeated, CRLF line
ends, the change's ``applied`` line cut in half, ``chattr +a`` (append-only) and
``chattr +i`` (immutable: the revert is made, the journal cannot record it, so
exit 1 with one error line; once the flag is cleared the next rollback records
it), and ``chattr +i`` before a change (refused before anything is applied).

CI runs the ``SHORT`` cases; a soak all of them, and four on DSCP changes.
For each case: the lever's exit code, one ``error:`` line at most, no
traceback, the change reverted on the system, and nothing left open in the
journal at the end.

Example::

    figures = run_damage(Path("/tmp/j"), full=False)
    figures["reverted"] == figures["cases"]

Needs root, two CPUs, ``chattr`` and a filesystem that keeps inode flags
(ext4, xfs, btrfs) under ``tmp``; the DSCP cases need tc-BPF and netns.
Overhead: two or three CLI children per case (~1 s).
"""
from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

from conftest import run_cli
from reliability.workloads import QUIET

MALFORMED = [b"{}", b"[]", b"1", b'{"id": "w", "state": "intent"}', b"\xff\xfe\x00garbage\x80",
             b'{"id": 5, "state": ["applied"]}',
             b'{"id": "w", "state": "intent", "change": {"actuator": "affinity", "target": {"labels": "x"}}}',
             b'{"id": "w", "state": "intent", "change": {"actuator": 7, "target": {}}, "policy": 3}']


def chattr(path: Path, flag: str) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True, capture_output=True)


def _errors(r: subprocess.CompletedProcess) -> list[str]:
    return [line for line in r.stderr.splitlines() if line.startswith("error:")]


class Case:
    """One damage: ``before`` (bytes written ahead of the change), ``after``
    (a function of the journal path, run once the change is applied), the
    lever (``rollback`` or ``run``) and the exit code it must give."""

    def __init__(self, name: str, before: bytes = b"", after=None, lever: str = "rollback", code: int = 0,
                 immutable: bool = False, refused: bool = False) -> None:
        self.name, self.before, self.after, self.lever, self.code = name, before, after, lever, code
        self.immutable, self.refused = immutable, refused


def _append(data: bytes):
    def damage(journal: Path) -> None:
        with open(journal, "ab") as f:
            f.write(data)
    return damage


def _rewrite(fn):
    def damage(journal: Path) -> None:
        journal.write_bytes(fn(journal.read_bytes()))
    return damage


def _cut_last(data: bytes) -> bytes:
    lines = data.rstrip(b"\n").split(b"\n")
    return b"\n".join(lines[:-1] + [lines[-1][:len(lines[-1]) // 2]])


def cases() -> list[Case]:
    rng = random.Random(7)
    garbage = bytes(rng.randrange(256) for _ in range(4096))
    out = [Case("torn-tail-before", before=b'{"id": "t", "sta'),
           Case("torn-tail-after", after=_append(b'{"id": "t", "sta')),
           Case("torn-tail-after-run", after=_append(b'{"id": "t", "sta'), lever="run")]
    out += [Case(f"malformed-{i}-before", before=bad + b"\n") for i, bad in enumerate(MALFORMED)]
    out += [Case("malformed-all-after", after=_append(b"\n".join(MALFORMED) + b"\n")),
            Case("malformed-all-after-run", after=_append(b"\n".join(MALFORMED) + b"\n"), lever="run"),
            Case("binary-before", before=garbage + b"\n"),
            Case("binary-after", after=_append(garbage)),
            Case("nul-bytes-after", after=_append(b"\0" * 8192)),
            Case("long-line-after", after=_append(b"x" * (2 << 20) + b"\n")),
            Case("intent-repeated", after=_rewrite(lambda d: d + d.split(b"\n")[0] + b"\n")),
            Case("crlf", after=_rewrite(lambda d: d.replace(b"\n", b"\r\n"))),
            Case("applied-line-cut", after=_rewrite(_cut_last)),
            Case("append-only", after=lambda j: chattr(j, "+a")),
            Case("append-only-run", after=lambda j: chattr(j, "+a"), lever="run"),
            Case("immutable", after=lambda j: chattr(j, "+i"), code=1, immutable=True),
            Case("immutable-before-change", code=1, refused=True)]
    return out


class Bed:
    def __init__(self, tmp: Path, pair=None) -> None:
        self.tmp = tmp
        self.pair = pair
        (tmp / "quiet.yaml").write_text(QUIET)
        self.children: list[subprocess.Popen] = []

    def rx(self, state: Path, *args: str) -> subprocess.CompletedProcess:
        return run_cli("--state-dir", str(state), "--hook-dir", str(self.tmp / "hooks"), *args)

    def lever(self, state: Path, lever: str) -> subprocess.CompletedProcess:
        if lever == "rollback":
            return self.rx(state, "rollback", "--all")
        return self.rx(state, "run", "--no-probes", "--duration", "0", "--policy", str(self.tmp / "quiet.yaml"),
                       "--kill-switch", str(self.tmp / "off"))

    # the change: affinity of a sleeper, or a DSCP mark
    def start(self, kind: str) -> dict:
        if kind == "affinity":
            child = subprocess.Popen(["sleep", "1000"])
            self.children.append(child)
            return {"pid": child.pid, "args": ["act", "affinity", "cpus=1", "--label", f"pid={child.pid}",
                                               "--process", "sleep", "--mode", "enforce"]}
        return {"args": ["act", "dscp", "dscp=EF", f"interfaces={self.pair.if_a}", f"netns={self.pair.ns_a}",
                         "ports=5201", "protocol=udp", "--mode", "enforce"]}

    def changed(self, kind: str, change: dict) -> bool:
        if kind == "affinity":
            return sorted(os.sched_getaffinity(change["pid"])) == [1]
        q = self.pair.run("a", "tc", "qdisc", "show", "dev", self.pair.if_a).stdout
        return "clsact" in q

    def close(self) -> None:
        for child in self.children:
            child.kill()
            child.wait()


def run_case(bed: Bed, case: Case, kind: str, n: int) -> dict:
    state = bed.tmp / f"case{n}"
    state.mkdir()
    journal = state / "journal.jsonl"
    rec = {"case": case.name, "change": kind, "problems": []}
    flagged: list[Path] = []
    try:
        if case.before:
            journal.write_bytes(case.before)
        if case.refused:
            journal.write_bytes(b"")
            chattr(journal, "+i")
            flagged.append(journal)
        change = bed.start(kind)
        act = bed.rx(state, *change["args"])
        if case.refused:
            rec["reverted"] = not bed.changed(kind, change)
            if act.returncode != 1 or len(_errors(act)) != 1 or "refused before apply" not in act.stderr:
                rec["problems"].append(f"act on an immutable journal: exit {act.returncode}: {act.stderr[-300:]}")
            if not rec["reverted"]:
                rec["problems"].append("act applied a change it could not journal")
            return rec
        if act.returncode != 0 or not bed.changed(kind, change):
            rec["problems"].append(f"act: exit {act.returncode}: {act.stderr[-400:]}")
            return rec
        if case.after:
            case.after(journal)
            if case.name.startswith(("append-only", "immutable")):
                flagged.append(journal)
        r = bed.lever(state, case.lever)
        rec["exit"] = r.returncode
        rec["reverted"] = not bed.changed(kind, change)
        if r.returncode != case.code:
            rec["problems"].append(f"{case.lever}: exit {r.returncode}, expected {case.code}: {r.stderr[-400:]}")
        if len(_errors(r)) != (1 if case.code else 0) or "Traceback" in r.stdout + r.stderr:
            rec["problems"].append(f"{case.lever}: {len(_errors(r))} error lines: {r.stderr[-400:]}")
        if not rec["reverted"]:
            rec["problems"].append(f"{case.lever} left the change in place: {r.stdout[-300:]} {r.stderr[-300:]}")
        if case.immutable:
            if "could not be recorded" not in r.stderr:
                rec["problems"].append(f"rollback did not say what it could not record: {r.stderr[-300:]}")
            chattr(journal, "-i")
            flagged.remove(journal)
            again = bed.lever(state, "rollback")      # the journal still lists it open: reverted again, recorded
            if again.returncode != 0 or " reverted " not in again.stdout:
                rec["problems"].append(f"rollback once writable: exit {again.returncode}: {again.stdout[-300:]} "
                                       f"{again.stderr[-300:]}")
        listing = bed.rx(state, "journal")
        still = [line for line in listing.stdout.splitlines() if line.split()[1:2] in (["intent"], ["applied"])]
        if listing.returncode != 0 or still:
            rec["problems"].append(f"journal after the lever: exit {listing.returncode}, open: {still}")
        return rec
    finally:
        for path in flagged:
            chattr(path, "-i")
            chattr(path, "-a")


SHORT = ("torn-tail-before", "torn-tail-after", "torn-tail-after-run", "malformed-2-before", "malformed-all-after",
         "binary-after", "long-line-after", "applied-line-cut", "append-only", "immutable",
         "immutable-before-change")
DSCP_CASES = ("torn-tail-after", "binary-after", "immutable", "append-only-run")


def run_damage(tmp: Path, full: bool = True, with_dscp: bool = True) -> dict:
    """Every case (``full``) or the ``SHORT`` ones, on affinity changes, and a
    few on DSCP changes (``with_dscp``)."""
    if shutil.which("chattr") is None:
        raise RuntimeError("chattr (e2fsprogs) is needed for the append-only and immutable cases")
    probe = tmp / ".attr-probe"
    probe.write_text("")
    r = subprocess.run(["chattr", "+i", str(probe)], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"inode flags (chattr +i) on the filesystem of {tmp}: {r.stderr.strip()}")
    chattr(probe, "-i")
    probe.unlink()
    pair = None
    began = time.monotonic()
    records = []
    try:
        if with_dscp:
            sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
            from netns import NetnsPair
            pair = NetnsPair("jd").__enter__()
        bed = Bed(tmp, pair)
        try:
            plan = [(case, "affinity") for case in cases() if full or case.name in SHORT]
            if with_dscp:
                plan += [(case, "dscp") for case in cases() if case.name in (DSCP_CASES if full else DSCP_CASES[2:3])]
            for n, (case, kind) in enumerate(plan):
                records.append(run_case(bed, case, kind, n))
        finally:
            bed.close()
    finally:
        if pair is not None:
            pair.__exit__(None, None, None)
    return {"cases": len(records), "reverted": sum(bool(r.get("reverted")) for r in records),
            "failures": [f"{r['case']} ({r['change']}): {'; '.join(r['problems'])}" for r in records if r["problems"]],
            "records": records, "seconds": round(time.monotonic() - began, 1)}
