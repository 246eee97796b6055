"""A damaged or unwritable journal never costs the operator a rollback: real
changes (the affinity actuator on a sleeping child, pinned to CPU 1) through the
``reflexarc`` command line, a real journal file, real ``chattr`` flags.

- a torn last line, any malformed line: ``journal``, ``run`` and ``rollback``
  say where (``<path>:<line>: warning: ...``) and revert the change (exit 0);
- entries this node cannot revert fail alone, the others are reverted;
- an immutable journal: a new change is refused before it is applied,
  ``rollback`` reverts and says what it could not record (exit 1);
- an append-only journal: ``run`` goes on uncompacted, with one warning line.
"""
from __future__ import annotations

import json
import re
import os
import subprocess

import pytest
from conftest import require, run_cli
from file_attrs import FileAttrs

from engine_fixtures import policy, registry
from reflexarc.controller.engine.bus import SignalBus
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.engine.engine import Controller
from reflexarc.controller.engine.journal import Journal

ALL_CPUS = sorted(os.sched_getaffinity(0))
POLICY = """\
policies:
  - name: quiet
    mode: dry-run
    selector: {match: {job: j}}
    rules:
      - name: r
        when: {signal: step_time_ms, agg: max, window: 2s, op: ">", threshold: 300}
        actions:
          - actuator: log
            params: {message: x}
"""
MALFORMED = [b"{}", b"[]", b"1", b'{"id": "w", "state": "intent"}', b"\xff\xfe\x00garbage\x80",
             b'{"id": 5, "state": ["applied"]}',
             b'{"id": "w", "state": "intent", "change": {"actuator": "affinity", "target": {"labels": "x"}}}',
             b'{"id": "w", "state": "intent", "change": {"actuator": 7, "target": {}}, "policy": 3}']


@pytest.fixture
def file_attrs(tmp_path):
    with FileAttrs(tmp_path) as attrs:
        yield attrs


@pytest.fixture
def node(tmp_path):
    """A state dir and sleeping children; ``node.pinned()`` starts one pinned to CPU 1."""
    require(len(ALL_CPUS) >= 2 and 1 in ALL_CPUS, "two CPUs (0 and 1) to pin a process to one of them")
    node = Node(tmp_path)
    yield node
    node.close()


class Node:
    def __init__(self, tmp) -> None:
        self.tmp = tmp
        self.state = tmp / "state"
        self.state.mkdir()
        self.journal = self.state / "journal.jsonl"
        (tmp / "policy.yaml").write_text(POLICY)
        self.children: list[subprocess.Popen] = []

    def sleeper(self) -> int:
        child = subprocess.Popen(["sleep", "1000"])
        self.children.append(child)
        return child.pid

    def rx(self, *args: str) -> subprocess.CompletedProcess:
        return run_cli("--state-dir", str(self.state), "--hook-dir", str(self.tmp / "hooks"), *args)

    def act(self, pid: int) -> subprocess.CompletedProcess:
        return self.rx("act", "affinity", "cpus=1", "--label", f"pid={pid}", "--process", "sleep",
                       "--mode", "enforce", "--json")

    def run(self) -> subprocess.CompletedProcess:
        return self.rx("run", "--no-probes", "--duration", "0", "--policy", str(self.tmp / "policy.yaml"),
                       "--kill-switch", str(self.tmp / "disable"))

    def pinned(self) -> int:
        pid = self.sleeper()
        r = self.act(pid)
        assert r.returncode == 0, r.stderr
        assert sorted(os.sched_getaffinity(pid)) == [1]
        return pid

    def close(self) -> None:
        for child in self.children:
            child.kill()
            child.wait()


def test_a_torn_last_line_does_not_hide_the_next_change(node):
    node.journal.write_bytes(b'{"id": "t", "sta')              # a crash mid-write
    pid = node.sleeper()
    r = node.act(pid)
    assert r.returncode == 0, r.stderr
    assert f"{node.journal}:1: warning: torn last line (a write cut short?)" in r.stderr
    jid = json.loads(r.stdout)["journal_id"]
    back = node.rx("rollback", "--all")
    assert back.returncode == 0, back.stderr
    assert back.stdout.startswith(f"{jid} affinity") and " reverted " in back.stdout
    assert back.stderr == f"{node.journal}:1: warning: not JSON: skipped\n"
    assert sorted(os.sched_getaffinity(pid)) == ALL_CPUS


@pytest.mark.parametrize("bad", MALFORMED, ids=range(len(MALFORMED)))
def test_a_malformed_line_never_blocks_journal_or_rollback(node, bad):
    node.journal.write_bytes(bad + b"\n")
    pid = node.pinned()
    listing = node.rx("journal")
    assert listing.returncode == 0, listing.stderr
    assert " applied   affinity " in listing.stdout
    assert listing.stderr.startswith(f"{node.journal}:1: warning: ") and listing.stderr.endswith(": skipped\n")
    back = node.rx("rollback", "--all")
    assert back.returncode == 0, back.stderr
    assert " reverted " in back.stdout
    assert sorted(os.sched_getaffinity(pid)) == ALL_CPUS


def test_run_reconciles_past_every_malformed_line(node):
    pid = node.pinned()
    with open(node.journal, "ab") as f:
        f.write(b"\n".join(MALFORMED) + b"\n")
    r = node.run()
    assert r.returncode == 0, r.stderr
    assert sorted(os.sched_getaffinity(pid)) == ALL_CPUS
    located = {line.split(":")[1] for line in r.stderr.splitlines() if line.startswith(f"{node.journal}:")}
    assert located == {str(n) for n in range(3, 3 + len(MALFORMED))}          # after intent and applied
    assert node.rx("rollback", "--all").stdout == "nothing to roll back\n"


def test_entries_this_node_cannot_revert_fail_alone(node):
    node.journal.write_text(
        json.dumps({"id": "unknown1", "state": "intent", "change": {"actuator": "nope", "target": {}}}) + "\n"
        + json.dumps({"id": "noread1", "state": "intent", "change": {"actuator": "affinity", "target": {}}}) + "\n")
    pid = node.pinned()
    back = node.rx("rollback", "--all")
    assert back.returncode == 1
    lines = back.stdout.splitlines()
    assert lines[0].startswith("unknown1 nope") and "failed: unknown actuator 'nope'" in lines[0]
    assert lines[1].startswith("noread1 affinity") and "failed: revert: the journaled change is not one affinity" \
        in lines[1]
    assert " reverted " in lines[2]
    assert back.stderr == "error: 2 change(s) could not be reverted; they stay in the journal\n"
    assert sorted(os.sched_getaffinity(pid)) == ALL_CPUS


@pytest.mark.kernel  # chattr needs root
def test_an_immutable_journal_refuses_new_changes_and_rollback_still_reverts(node, file_attrs):
    pid = node.pinned()
    jid = json.loads(node.journal.read_text().splitlines()[0])["id"]
    file_attrs.set(node.journal, "+i")
    recorded = node.journal.read_bytes()
    unwritable = (f"{node.journal}: warning: cannot be written (Operation not permitted): "
                  "no new change is applied until it can")

    other = node.sleeper()
    refused = node.act(other)
    assert refused.returncode == 1
    assert refused.stderr.splitlines() == [
        unwritable, f"error: affinity: refused before apply: journal {node.journal} cannot be written "
                    "(Operation not permitted)"]
    assert sorted(os.sched_getaffinity(other)) == ALL_CPUS       # nothing applied

    back = node.rx("rollback", "--all")
    assert back.returncode == 1
    assert sorted(os.sched_getaffinity(pid)) == ALL_CPUS         # the system is reverted
    [line] = back.stdout.splitlines()
    assert line.startswith(f"{jid} affinity       reverted; not recorded: journal {node.journal} cannot be written "
                           "(Operation not permitted)")
    assert back.stderr.splitlines() == [
        unwritable, f"error: {node.journal}: 1 revert(s) could not be recorded; the journal still lists them open, "
                    "the next start or rollback reverts them again"]
    assert node.journal.read_bytes() == recorded

    listing = node.rx("journal")
    assert listing.returncode == 0 and listing.stdout.splitlines()[1].startswith(f"{jid} applied   affinity")

    file_attrs.clear(node.journal)
    again = node.rx("rollback", "--all")                         # writable again: recorded now
    assert again.returncode == 0, again.stderr
    assert node.rx("journal").stdout.splitlines()[1].startswith(f"{jid} reverted  affinity")   # below the heading


@pytest.mark.kernel  # chattr needs root
def test_run_on_an_immutable_journal_reverts_and_goes_on(node, file_attrs):
    pid = node.pinned()
    file_attrs.set(node.journal, "+i")
    r = node.run()
    assert r.returncode == 0, r.stderr
    assert sorted(os.sched_getaffinity(pid)) == ALL_CPUS
    assert f"{node.journal}: warning: cannot be written (Operation not permitted)" in r.stderr
    assert '"reverted": 1' in r.stdout


@pytest.mark.kernel  # chattr needs root
def test_an_append_only_journal_is_kept_uncompacted_and_run_goes_on(node, file_attrs):
    pid = node.pinned()
    file_attrs.set(node.journal, "+a")
    r = node.run()
    assert r.returncode == 0, r.stderr
    assert sorted(os.sched_getaffinity(pid)) == ALL_CPUS
    told = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d ")     # the narrated lines of what it did
    reconciled, warning = [line for line in r.stderr.splitlines() if not told.match(line)]
    assert reconciled.startswith("reconciled at start: ") and reconciled.endswith(" affinity reverted"), reconciled
    assert warning.endswith(f"journal {node.journal} not compacted (Operation not permitted): "
                            "going on with it uncompacted")
    assert [json.loads(x)["state"] for x in node.journal.read_text().splitlines()] == ["intent", "applied",
                                                                                     "reverted"]
    assert node.rx("rollback", "--all").stdout == "nothing to roll back\n"


@pytest.mark.kernel  # chattr needs root
def test_the_engine_records_a_change_refused_by_an_immutable_journal(tmp_path, file_attrs):
    path = tmp_path / "journal.jsonl"
    path.write_text("")
    file_attrs.set(path, "+i")
    journal = Journal(path)
    state, clock, bus = {}, SimClock(), SignalBus()
    ctl = Controller([policy()], bus, registry(state, []), clock, journal=journal)
    ctl.start("test")
    for t in range(120):
        clock.set(float(t))
        bus.publish("step_time_ms", {"job": "j", "rank": "0"}, 300.0 if t >= 60 else 50.0, t)
        ctl.tick()
    ctl.shutdown()
    journal.close()
    assert state == {}                                           # never applied
    actions = [r for r in ctl.audit.records if r["kind"] == "action"]
    assert actions and all(a["outcome"] == "failed" and a["journal_id"] is None for a in actions)
    assert actions[0]["error"] == f"refused before apply: journal {path} cannot be written (Operation not permitted)"
    assert path.read_bytes() == b""
