"""The reflexarc controller as the testbed runs it: the real ``reflexarc run``
in its own process on the host, in ``enforce`` (or another ``mode``), with the
real probes and actuators and the shipped policies whose selectors the testbed
fills in (``fill_selectors``), nothing else changed; given ``metrics_addr``, it
serves its signals to Prometheus too.

``ControllerProcess`` starts it, waits until it is armed (probes compiled, first
audit record written), measures its CPU time and memory from ``/proc`` while it
runs, and stops it with SIGTERM so its shutdown rollback runs. ``Timeline``
reads its audit log: when a rule first saw the fault (``pending``), fired, acted,
verified, rolled back and alerted.

Example::

    paths = fill_selectors(POLICY_DIR, tmp / "policies", {"nccl-congestion-dscp": {"netns": "r0", ...}})
    with ControllerProcess(tmp / "policies", tmp / "state", hook_dir) as ctl:
        ...                                   # inject a fault
        Timeline.of(ctl.audit_path, "nccl-congestion-dscp", since=onset).applied

The testbed drives the controller only through its command line, as an
operator would (this layer does not import ``reflexarc.controller``).

Overhead: the controller's own (measured here); sampling reads two /proc files.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

import reflexarc.policies
from reflexarc.core.outcomes import Outcome

POLICY_DIR = Path(reflexarc.policies.__file__).resolve().parent
CLI = [sys.executable, "-m", "reflexarc.controller.cli"]
CLK_TCK = os.sysconf("SC_CLK_TCK")
_BOOL = "tag:yaml.org,2002:bool"


class _PolicyYaml(yaml.SafeLoader):
    """YAML as policy files are read: only true/false are booleans (``on:`` of a
    rollback is a key, not YAML 1.1's True)."""


_PolicyYaml.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_PolicyYaml.add_implicit_resolver(_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))


def fill_selectors(src: Path, dst: Path, fills: dict[str, dict]) -> list[Path]:
    """Copy the policy files of ``src`` to ``dst`` with each named policy's
    selector updated by ``fills[name]``; only selectors change. ``dst`` is made
    root-owned and closed to other users, so ``run`` accepts it for enforce."""
    dst.mkdir(parents=True, exist_ok=True)
    dst.chmod(0o755)
    out = []
    for path in sorted(Path(src).glob("*.yaml")):
        doc = yaml.load(path.read_text(), Loader=_PolicyYaml)
        for policy in doc.get("policies", []):
            if policy["name"] in fills:
                policy["selector"] = {**policy.get("selector", {}), **fills[policy["name"]]}
        target = dst / path.name
        target.write_text(yaml.safe_dump(doc, sort_keys=False))
        target.chmod(0o644)
        out.append(target)
    return out


@dataclass
class Usage:
    cpu_s: float          # user + system seconds since armed
    wall_s: float
    rss_mb: float         # resident now
    peak_rss_mb: float    # VmHWM: includes the LLVM compile at start

    @property
    def cpu_pct(self) -> float:
        return 100.0 * self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0


class ControllerProcess:
    def __init__(self, policy_dir: Path, state_dir: Path, hook_dir: Path, *, interval: float = 1.0,
                 sys_root: str | None = None, alertmanager_url: str | None = None,
                 webhook_url: str | None = None, log: Path | None = None,
                 mode: str = "enforce", metrics_addr: str | None = None, arrivals: float | None = None) -> None:
        self.policy_dir, self.state_dir, self.hook_dir = Path(policy_dir), Path(state_dir), Path(hook_dir)
        self.audit_path = self.state_dir / "audit.jsonl"
        self.log_path = log or self.state_dir / "controller.log"
        argv = [*CLI, "--state-dir", str(self.state_dir), "--hook-dir", str(self.hook_dir)]
        if sys_root:
            argv += ["--sys-root", sys_root]
        if alertmanager_url:
            argv += ["--alertmanager-url", alertmanager_url]
        if webhook_url:
            argv += ["--webhook-url", webhook_url]
        argv += ["run", "--mode", mode, "--policy", str(self.policy_dir), "--interval", str(interval),
                 "--kill-switch", str(self.state_dir / "disable")]
        if metrics_addr:
            argv += ["--metrics-addr", metrics_addr]
        if arrivals is not None:               # else run's default
            argv += ["--arrivals", str(arrivals)]
        self.argv = argv
        self.proc: subprocess.Popen | None = None
        self.armed_at = 0.0
        self._cpu_at_arm = 0.0
        self.stdout = ""

    def __enter__(self) -> "ControllerProcess":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self, timeout: float = 180.0) -> float:
        """Start and wait until armed; returns the seconds that took. The audit
        starts afresh (a previous run's journal stays, for the controller to
        reconcile)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.audit_path.unlink(missing_ok=True)
        t0 = time.time()
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=self._log, text=True,
                                     start_new_session=True)
        while not (self.audit_path.exists() and self.audit_path.stat().st_size):
            if self.proc.poll() is not None:
                raise RuntimeError(f"the controller exited with {self.proc.returncode} before it was armed; "
                                   f"see {self.log_path}")
            if time.time() - t0 > timeout:
                raise RuntimeError(f"the controller was not armed after {timeout:.0f} s; see {self.log_path}")
            time.sleep(0.2)
        self.armed_at = time.time()
        self._cpu_at_arm = self._cpu()
        return self.armed_at - t0

    def _status(self) -> dict[str, str]:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)

    def _cpu(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def usage(self) -> Usage:
        status = self._status()
        kb = lambda key: int(status[key].split()[0]) / 1024   # noqa: E731
        return Usage(self._cpu() - self._cpu_at_arm, time.time() - self.armed_at, kb("VmRSS"), kb("VmHWM"))

    def stop(self, timeout: float = 60.0) -> dict:
        """SIGTERM (the shutdown rollback runs), then the end summary it printed."""
        if self.proc is None:
            return {}
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.stdout, _ = self.proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.stdout, _ = self.proc.communicate()
        self._log.close()
        self.proc = None
        for line in self.stdout.splitlines():
            if line.startswith("{"):
                return json.loads(line)
        return {}


def records(audit: Path) -> list[dict]:
    out = []
    for line in Path(audit).read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


@dataclass
class Timeline:
    """What one policy did after ``since`` (wall-clock seconds), from the audit."""

    pending: float | None = None     # each the ts of its first record; rolled_back only after a failed verify
    fired: float | None = None
    applied: float | None = None
    verified: float | None = None
    verify_failed: float | None = None
    rolled_back: float | None = None
    alerted: float | None = None
    actions: list[dict] = field(default_factory=list)

    @classmethod
    def of(cls, audit: Path, policy: str, since: float) -> "Timeline":
        """``pending`` may lie before ``since``: a rule already pending then (an
        epoch-start wait, say) that went on to fire without calming down."""
        t = cls()
        carried = None                 # a pending episode open at ``since``
        for r in records(audit):
            if r.get("policy") != policy:
                continue
            if r["ts"] < since:
                if r["kind"] == "transition":
                    carried = r["ts"] if r["to"] == "pending" else None
                continue
            if r["kind"] == "transition":
                to = r["to"]
                if carried is not None and t.fired is None and to not in ("pending", "firing"):
                    carried = None     # it calmed before firing: not this episode
                if to == "pending" and t.pending is None:
                    t.pending = r["ts"]
                elif to == "firing" and t.fired is None:
                    t.fired = r["ts"]
                elif to == "remediated" and t.verified is None:
                    t.verified = r["ts"]
                elif r.get("trigger") == "verify_failed" and t.verify_failed is None:
                    t.verify_failed = r["ts"]
            elif r["kind"] == "action":
                t.actions.append({k: r.get(k) for k in ("ts", "actuator", "outcome", "error", "target")}
                                 | {"summary": (r.get("change") or {}).get("summary")})
                if r["outcome"] == Outcome.APPLIED and t.applied is None:
                    t.applied = r["ts"]
                elif r["outcome"] == Outcome.REVERTED and t.verify_failed is not None and t.rolled_back is None:
                    t.rolled_back = r["ts"]
                elif r["actuator"] == "alert" and r["outcome"] == Outcome.NOTIFIED and t.alerted is None:
                    t.alerted = r["ts"]
        if carried is not None and t.fired is not None:
            t.pending = carried
        return t

    def after(self, onset: float) -> dict:
        """Seconds from ``onset`` to each step (None: did not happen)."""
        return {name: (round(getattr(self, name) - onset, 2) if getattr(self, name) is not None else None)
                for name in ("pending", "fired", "applied", "verified", "verify_failed", "rolled_back", "alerted")}


def open_changes(state_dir: Path) -> list[str]:
    """``reflexarc journal`` lines of changes still applied (or only intended)."""
    if not (Path(state_dir) / "journal.jsonl").exists():
        return []
    r = subprocess.run([*CLI, "--state-dir", str(state_dir), "journal"], capture_output=True, text=True, timeout=60)
    return [line for line in r.stdout.splitlines() if line.split()[1:2] in (["intent"], [Outcome.APPLIED])]


def write_report(audit: Path, out_dir: Path) -> str | None:
    """``reflexarc report``; the path of the HTML report it wrote."""
    r = subprocess.run([*CLI, "report", str(audit), "--out", str(out_dir)], capture_output=True, text=True,
                       timeout=300)
    return next((line.split(": ", 1)[1] for line in r.stdout.splitlines() if line.startswith("html: ")), None)
