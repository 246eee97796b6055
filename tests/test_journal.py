"""The journal under damage: a torn last line, lines that are not journal steps
and a file that cannot be replaced never hide an open change."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import require_root

from reflexarc.controller.journal import Journal

RX = [sys.executable, "-m", "reflexarc.controller.cli"]
CHANGE = {"actuator": "log", "target": {"labels": {}, "selector": {}}, "params": {"message": "x"},
          "before": None, "after": None, "summary": "a logged line"}


def test_a_torn_last_line_does_not_swallow_the_next_intent(tmp_path):
    path = tmp_path / "journal.jsonl"
    path.write_text('{"id": "t", "sta')                  # a crash mid-write
    j = Journal(path)
    jid = j.intent(CHANGE)
    j.mark(jid, "applied")
    j.close()
    again = Journal(path)
    assert [(e.id, e.state) for e in again.open_entries()] == [(jid, "applied")]
    assert again.damaged == ["line 1: not JSON (a torn write?)"]
    again.close()


@pytest.mark.parametrize("bad", ["{}", "[]", "1", '{"id": "w", "state": "intent"}',
                                 '{"id": "w", "state": "applied", "change": 3}', "null"])
def test_a_malformed_line_is_skipped_and_the_open_change_stays_revertible(tmp_path, bad):
    path = tmp_path / "journal.jsonl"
    good = json.dumps({"id": "a1", "state": "intent", "change": CHANGE}) + "\n" + \
        json.dumps({"id": "a1", "state": "applied"}) + "\n"
    path.write_text(bad + "\n" + good)
    j = Journal(path)
    assert [e.id for e in j.open_entries()] == ["a1"]
    assert len(j.damaged) == 1 and j.damaged[0].startswith("line 1: ")
    j.close()
    state = tmp_path / "state"
    state.mkdir()
    path.rename(state / "journal.jsonl")
    listing = subprocess.run(RX + ["--state-dir", str(state), "journal"], capture_output=True, text=True, timeout=60)
    assert listing.returncode == 0, listing.stderr
    assert "a1" in listing.stdout and "warning:" in listing.stderr and "skipped" in listing.stderr
    back = subprocess.run(RX + ["--state-dir", str(state), "rollback", "--all"], capture_output=True, text=True,
                          timeout=60)
    assert back.returncode == 0, back.stderr
    assert "a1" in back.stdout and "reverted" in back.stdout
    assert Journal(state / "journal.jsonl").open_entries() == []


def test_compaction_of_a_file_that_cannot_be_replaced_keeps_the_journal(tmp_path):
    require_root()
    state = tmp_path / "state"
    state.mkdir()
    j = Journal(state / "journal.jsonl")
    jid = j.intent(CHANGE)
    j.mark(jid, "applied")
    subprocess.run(["chattr", "+i", str(state)], check=True)   # no new file, no rename in it
    try:
        assert j.compact() is False
        assert [e.id for e in j.open_entries()] == [jid]
        j.mark(jid, "reverted")             # the journal still takes steps
        assert j.open_entries() == []
    finally:
        subprocess.run(["chattr", "-i", str(state)], check=True)
        j.close()
    assert [e.state for e in Journal(state / "journal.jsonl").entries()] == ["reverted"]
