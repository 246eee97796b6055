"""One ``reflexarc run`` controller as a node of a fleet, for the tests against a
real etcd cluster: its own state directory, node name and fixture ``/proc/sys``
tree (the ``sysctl`` actuator writes ``kernel.numa_balancing`` there, so the
machine is left alone), replaying four minutes of slow steps (``step_time_ms``
520 every 0.2 s, job ``j`` unless told, rank 0) so its policy wants to act at once.
What a test checks comes from what the node wrote: its journal and audit.

Also what the fleet's tests share: ``fresh_prefix`` (keys of their own),
``reason_of`` (the reason a call was refused with) and ``one_error_at`` (a
policy file's one error and where it is); their ``etcd`` fixture is
conftest's."""
from __future__ import annotations

import json
import math
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import spawn_cli
from reflexarc.controller.fleet.budget import Refused
from reflexarc.controller.policy.loader import validate_paths

TTL = 6                   # the nodes' lease in these tests (s): renewed every 2 s


def fresh_prefix() -> str:
    """Keys no other test writes."""
    return f"/rxtest-{uuid.uuid4().hex[:8]}"


def reason_of(call) -> str:
    """The reason ``call()`` was ``Refused`` with (it must be)."""
    with pytest.raises(Refused) as refused:
        call()
    return refused.value.reason


def one_error_at(path: Path, where: str, error: str) -> None:
    """``validate`` finds exactly one error in ``path``, at ``where``
    (``line:col`` or ``line:``), saying ``error``."""
    _, diagnostics = validate_paths([str(path)])
    errors = [str(d) for d in diagnostics if d.is_error]
    assert len(errors) == 1 and error in errors[0], errors
    assert errors[0].startswith(f"{path}:{where}"), errors[0]


class Node:
    """One ``reflexarc run`` of the fleet, its own state, proc tree and name."""

    def __init__(self, tmp: Path, name: str, endpoints: list[str], prefix: str, policy: str,
                 extra: tuple[str, ...] = (), job: str = "j") -> None:
        self.dir = tmp / name
        self.name = name
        self.knob = self.dir / "proc" / "sys" / "kernel" / "numa_balancing"
        self.knob.parent.mkdir(parents=True, exist_ok=True)
        self.knob.write_text("1\n")
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "policy.yaml").write_text(policy)
        with open(self.dir / "signals.jsonl", "w") as f:
            for i in range(1200):          # four minutes of slow steps, every 0.2 s
                f.write(json.dumps({"t": i * 0.2, "name": "step_time_ms", "labels": {"job": job, "rank": "0"},
                                    "value": 520}) + "\n")
        self.journal_path = self.dir / "state" / "journal.jsonl"
        self.audit_path = self.dir / "state" / "audit.jsonl"
        self.args = (
            "--state-dir", str(self.dir / "state"), "--proc-root", str(self.dir / "proc"),
            "--hook-dir", str(self.dir / "hooks"), "run", "--no-probes", "--replay", str(self.dir / "signals.jsonl"),
            "--policy", str(self.dir / "policy.yaml"), "--interval", "0.2", "--mode", "policy",
            "--kill-switch", str(self.dir / "disable"), "--fleet-etcd", ",".join(endpoints),
            "--fleet-ttl", str(TTL), "--fleet-prefix", prefix, "--node-name", name, *extra)
        self.start()

    def start(self) -> None:
        """Start it (again, after ``stop``: the same state directory)."""
        self.proc = spawn_cli(*self.args, stdout=subprocess.DEVNULL, stderr=open(self.dir / "stderr", "a"))

    def _lines(self, path: Path) -> list[dict]:
        if not path.exists():
            return []
        out = []
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass                       # a line still being written
        return out

    def journal(self) -> list[dict]:
        return self._lines(self.journal_path)

    def audit(self) -> list[dict]:
        return self._lines(self.audit_path)

    def applied(self) -> int:
        return sum(1 for r in self.journal() if r.get("state") == "applied")

    def intervals(self) -> list[tuple[float, float]]:
        """``[intent, closed]`` of each change it journaled (closed: inf while open)."""
        opened, closed = {}, {}
        for r in self.journal():
            if r["state"] == "intent":
                opened[r["id"]] = r["ts"]
            elif r["state"] not in ("intent", "applied"):
                closed.setdefault(r["id"], r["ts"])
        return [(t, closed.get(jid, math.inf)) for jid, t in opened.items()]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr(self) -> str:
        return (self.dir / "stderr").read_text(errors="replace")[-3000:]

    def stop(self) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()
