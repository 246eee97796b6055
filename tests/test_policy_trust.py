"""Enforcement only from policy files no other local user can write: a file
owned by another user, writable by others, or in a directory others may write
(not sticky) is refused for enforce; dry-run still reads it."""
from __future__ import annotations

import os

from conftest import require_root, run_cli

from reflexarc.controller.policy.trust import untrusted
import pytest

pytestmark = [pytest.mark.kernel]

NOBODY = 65534
POLICY = """\
policies:
  - name: pinning
    mode: enforce
    rules:
      - name: slow
        when: {signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: 400}
        actions:
          - {actuator: log, params: {message: slow}}
        rollback: never
"""


def place(tmp_path, mode=0o644, owner=0, dir_mode=0o755):
    d = tmp_path / "pol"
    d.mkdir()
    d.chmod(dir_mode)
    f = d / "p.yaml"
    f.write_text(POLICY)
    f.chmod(mode)
    os.chown(f, owner, owner)
    return f


def run(tmp_path, f, *extra):
    return run_cli("--state-dir", str(tmp_path / "state"), "--hook-dir", str(tmp_path / "hooks"), "run",
                   "--no-probes", "--duration", "0.2", "--interval", "0.1", "--policy", str(f), "--kill-switch",
                   str(tmp_path / "disable"), *extra, timeout=60)


def test_a_root_owned_private_file_is_trusted(tmp_path):
    require_root()
    f = place(tmp_path)
    assert untrusted(f) is None
    r = run(tmp_path, f, "--mode", "policy")
    assert r.returncode == 0, r.stderr


def test_files_others_can_write_are_refused_for_enforce(tmp_path):
    require_root()
    cases = [("world-writable", dict(mode=0o666), "writable by group and others"),
             ("owned by nobody", dict(owner=NOBODY), f"owned by uid {NOBODY}"),
             ("in a directory others may write", dict(dir_mode=0o777), "is writable by others")]
    for n, (what, kw, words) in enumerate(cases):
        case = tmp_path / str(n)
        case.mkdir()
        f = place(case, **kw)
        assert words in (untrusted(f) or ""), what
        r = run(case, f, "--mode", "policy")
        assert r.returncode == 1, (what, r.stderr)
        [line] = r.stderr.splitlines()
        assert line.startswith(f"error: {f}: policy pinning would enforce") and words in line, line
        assert not (case / "state" / "journal.jsonl").exists() or "pinning" not in \
            (case / "state" / "journal.jsonl").read_text()
        dry = run(case, f)                         # the default dry-run changes nothing: it may read it
        assert dry.returncode == 0, (what, dry.stderr)


def test_a_sticky_directory_is_trusted_for_files_its_owner_wrote(tmp_path):
    require_root()
    f = place(tmp_path, dir_mode=0o1777)
    assert untrusted(f) is None
    os.chown(f, NOBODY, NOBODY)                    # a file another user dropped there is not
    assert "owned by uid" in untrusted(f)
