"""The journal under damage: a torn last line, lines that are not journal steps,
a file that cannot be replaced or written never hide an open change. Real files,
real ``chattr`` flags."""
from __future__ import annotations

import json
import logging
import os

import pytest
from file_attrs import FileAttrs

from reflexarc.core.input_files import InputFileError
from reflexarc.controller.engine.journal import Journal, JournalWriteError

CHANGE = {"actuator": "log", "target": {"labels": {}, "selector": {}}, "params": {"message": "x"},
          "before": None, "after": None, "summary": "a logged line"}


@pytest.fixture
def file_attrs(tmp_path):
    with FileAttrs(tmp_path) as attrs:
        yield attrs


def applied(jid: str = "a1") -> str:
    return (json.dumps({"id": jid, "state": "intent", "change": CHANGE}) + "\n"
            + json.dumps({"id": jid, "state": "applied"}) + "\n")


def test_a_torn_last_line_is_reported_and_the_next_step_starts_a_line_of_its_own(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_text('{"id": "t", "sta')                  # a crash mid-write
    j = Journal(path)
    assert j.warnings == [f"{path}:1: warning: torn last line (a write cut short?); the next step starts on a "
                          "line of its own: skipped"]
    jid = j.intent(CHANGE)
    j.mark(jid, "applied")
    j.close()
    assert path.read_text().splitlines()[0] == '{"id": "t", "sta'
    again = Journal(path)
    assert [(e.id, e.state) for e in again.open_entries()] == [(jid, "applied")]
    assert again.warnings == [f"{path}:1: warning: not JSON: skipped"]
    again.close()


def test_every_append_starts_a_fresh_line_even_after_a_foreign_partial_write(tmp_path):
    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    jid = j.intent(CHANGE)
    with open(path, "ab") as other:                      # torn while the journal is open
        other.write(b'{"id": "x", "state": "app')
    j.mark(jid, "applied")
    j.close()
    again = Journal(path)
    assert [(e.id, e.state) for e in again.open_entries()] == [(jid, "applied")]
    assert [d.line for d in again.damaged] == [2]
    again.close()


@pytest.mark.parametrize("bad, why", [
    (b"{}", "a journal step without a string id"),
    (b"[]", "an array, not a journal step"),
    (b"1", "a number, not a journal step"),
    (b"null", "null, not a journal step"),
    (b'"intent"', "a string, not a journal step"),
    (b'{"id": "w", "state": "intent"}', "intent step of w: no change"),
    (b"\xff\xfe\x00garbage\x80", "not UTF-8 text"),
    (b"[" * 100000, "not JSON"),
    (b'{"id": 5, "state": "applied"}', "a journal step without a string id"),
    (b'{"id": "w", "state": ["intent"]}', "step of w with an unknown state ['intent']"),
    (b'{"id": "a1", "state": "closed-by-someone"}', "step of a1 with an unknown state 'closed-by-someone'"),
    (b'{"id": "w", "state": "intent", "change": 3}', "intent step of w: the change is a number"),
    (b'{"id": "w", "state": "intent", "change": {"actuator": 7, "target": {}}}',
     "intent step of w: the change names no actuator"),
    (b'{"id": "w", "state": "intent", "change": {"actuator": "log", "target": []}}',
     "intent step of w: the change has no target object"),
    (b'{"id": "w", "state": "intent", "change": {"actuator": "log", "target": {"labels": "x"}}}',
     "intent step of w: the change's labels is not an object"),
    (b'{"id": "w", "state": "intent", "change": {"actuator": "log", "target": {}, "params": [1]}}',
     "intent step of w: the change's params is not an object"),
    (b'{"id": "a1", "state": "applied", "change": {"actuator": "log", "target": {}, "summary": 1}}',
     "applied step of a1: the change's summary is not a string"),
])
def test_a_malformed_line_is_skipped_with_a_located_warning(tmp_path, bad, why):
    path = tmp_path / "journal.jsonl"
    path.write_bytes(bad + b"\n" + applied().encode())
    j = Journal(path)
    assert [(e.id, e.state, e.change) for e in j.open_entries()] == [("a1", "applied", CHANGE)]
    assert j.warnings == [f"{path}:1: warning: {why}: skipped"]
    assert [(d.line, d.raw) for d in j.damaged] == [(1, bad)]
    j.close()


def test_unusable_policy_rule_or_on_restart_keep_the_change_revertible(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_text(json.dumps({"id": "a1", "state": "intent", "change": CHANGE, "policy": {"p": 1},
                                "rule": 7, "on_restart": "forever"}) + "\n")
    j = Journal(path)
    [entry] = j.open_entries()
    assert (entry.id, entry.policy, entry.rule, entry.on_restart) == ("a1", "", "", "revert")
    assert j.warnings == [f"{path}:1: warning: intent of a1: policy {{'p': 1}} is unusable: left empty",
                          f"{path}:1: warning: intent of a1: rule 7 is unusable: left empty",
                          f"{path}:1: warning: intent of a1: on_restart 'forever' is unusable: treated as revert"]
    assert j.damaged == []
    j.close()


def test_compaction_is_atomic_and_keeps_what_it_could_not_read(tmp_path, monkeypatch):
    path = tmp_path / "journal.jsonl"
    closed = json.dumps({"id": "c1", "state": "intent", "change": CHANGE}) + "\n" + \
        json.dumps({"id": "c1", "state": "reverted"}) + "\n"
    path.write_bytes(b"\xffdamaged\n" + closed.encode() + applied().encode())
    j = Journal(path)
    calls, opened = [], {}
    real_fsync, real_replace, real_open = os.fsync, os.replace, os.open

    def spy_open(name, flags, *mode):
        fd = real_open(name, flags, *mode)
        opened[fd] = str(name)
        return fd

    def spy_fsync(fd):
        calls.append(("fsync", opened.get(fd)))
        real_fsync(fd)

    def spy_replace(src, dst):
        calls.append(("replace", str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "open", spy_open)
    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    assert j.compact() is None
    monkeypatch.undo()
    tmp = [c for c in calls if c[0] == "replace"][0][1]
    assert os.path.dirname(tmp) == str(tmp_path)
    assert calls == [("fsync", tmp), ("replace", tmp, str(path)), ("fsync", str(tmp_path))]
    assert sorted(os.listdir(tmp_path)) == ["journal.jsonl", "journal.jsonl.lock"]
    assert path.read_bytes().splitlines()[0] == b"\xffdamaged"          # kept for an operator to look at
    assert [(e.id, e.state) for e in j.open_entries()] == [("a1", "applied")]
    jid = j.intent(CHANGE)                                            # appends go to the new file
    j.close()
    again = Journal(path)
    assert [e.id for e in again.entries()] == ["a1", jid]
    assert again.warnings == [f"{path}:1: warning: not UTF-8 text: skipped"]
    again.close()


@pytest.mark.kernel  # chattr needs root
def test_compaction_of_an_append_only_journal_keeps_it_and_warns_once(tmp_path, file_attrs, caplog):
    path = tmp_path / "journal.jsonl"
    path.write_text(applied() + applied("a2"))
    j = Journal(path)
    file_attrs.set(path, "+a")
    before = path.read_bytes()
    with caplog.at_level(logging.WARNING, logger="reflexarc.journal"):
        assert j.compact() == "Operation not permitted"
    assert [r.getMessage() for r in caplog.records] == [
        f"journal {path} not compacted (Operation not permitted): going on with it uncompacted"]
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["journal.jsonl", "journal.jsonl.lock"]
    j.mark("a1", "reverted")                             # appending still works
    assert [e.id for e in j.open_entries()] == ["a2"]
    j.close()
    file_attrs.clear(path)
    assert [e.id for e in Journal(path).open_entries()] == ["a2"]


@pytest.mark.kernel  # chattr needs root
def test_compaction_in_a_directory_that_takes_no_new_file_keeps_the_journal(tmp_path, file_attrs):
    state = tmp_path / "state"
    state.mkdir()
    j = Journal(state / "journal.jsonl")
    jid = j.intent(CHANGE)
    j.mark(jid, "applied")
    file_attrs.set(state, "+i")                         # no new file, no rename in it
    try:
        assert j.compact() == "Operation not permitted"
        assert [e.id for e in j.open_entries()] == [jid]
        j.mark(jid, "reverted")             # the journal still takes steps
        assert j.open_entries() == []
    finally:
        file_attrs.clear(state)
        j.close()
    assert [e.state for e in Journal(state / "journal.jsonl").entries()] == ["reverted"]


@pytest.mark.kernel  # chattr needs root
def test_an_immutable_journal_is_read_and_refuses_every_step(tmp_path, file_attrs):
    path = tmp_path / "journal.jsonl"
    path.write_text(applied())
    file_attrs.set(path, "+i")
    j = Journal(path)
    assert j.unwritable == "Operation not permitted"
    assert [(e.id, e.state) for e in j.open_entries()] == [("a1", "applied")]
    with pytest.raises(JournalWriteError, match=f"journal {path} cannot be written \\(Operation not permitted\\)"):
        j.intent(CHANGE)
    with pytest.raises(JournalWriteError):
        j.mark("a1", "reverted")
    assert path.read_text() == applied()
    assert [(e.id, e.state) for e in j.entries()] == [("a1", "applied")]   # memory follows the file
    file_attrs.clear(path)
    j.mark("a1", "reverted")                             # writable again: the same journal takes steps
    assert j.unwritable is None and j.open_entries() == []
    j.close()


@pytest.mark.kernel  # chattr needs root
def test_a_journal_made_immutable_while_open_refuses_and_says_so_once(tmp_path, file_attrs, caplog):
    path = tmp_path / "journal.jsonl"
    j = Journal(path)
    jid = j.intent(CHANGE)
    file_attrs.set(path, "+i")
    with caplog.at_level(logging.ERROR, logger="reflexarc.journal"):
        for _ in range(2):
            with pytest.raises(JournalWriteError):
                j.mark(jid, "applied")
    assert [r.getMessage() for r in caplog.records] == [
        f"journal {path} cannot be written (Operation not permitted): no new change is applied until it can"]
    assert j.get(jid).state == "intent"
    file_attrs.clear(path)
    j.close()


@pytest.mark.parametrize("kind", ["fifo", "zero", "dir"])
def test_a_journal_that_is_not_a_regular_file_is_refused_before_a_byte_is_read(tmp_path, kind):
    """A FIFO nobody writes would block the reader, ``/dev/zero`` never ends
    (and a link is never followed): refused at once, naming what it is, and the
    lock is let go."""
    path = tmp_path / "journal.jsonl"
    {"fifo": lambda: os.mkfifo(path), "zero": lambda: path.symlink_to("/dev/zero"), "dir": path.mkdir}[kind]()
    what = {"fifo": "a FIFO, not a regular file", "zero": "a symbolic link, not followed",
            "dir": "a directory, not a regular file"}[kind]
    with pytest.raises(InputFileError, match=f"{path}: is {what}"):
        Journal(path)
    with pytest.raises(InputFileError):
        Journal(path)                 # not JournalLocked: the first attempt let the lock go
