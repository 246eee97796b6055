"""Runs the controller against a simulated plant in simulated time.

The scenario's plant publishes signals each tick; its simulated actuators stand
in for the real ones under the same names and parameter specs, so the policies
are exactly the ones a node runs. A 10-minute scenario runs in well under a
second of plant time. A scenario named by path is read only when it is a
regular UTF-8 file (``simulations.load_scenario`` reads it through the one
YAML reader): a FIFO or a device is refused.

The audit samples evaluations as a live run's does (``evals="sampled"``,
``controller/engine/audit.py``): a change of result or state, and every tick on the
way to acting, is written; a quiet rule-target once per ``sample_every``
simulated seconds (``run``'s default ``--audit-sample``). ``evals="all"``
(``simulate --all-evals``) writes every evaluation, for charts that show each
tick. The audit of an earlier run in ``out_dir`` (with its rotated files) is
removed first, so the report covers this run alone.

Example::

    result = run_scenario("numa-remote-worker", mode="dry-run", out_dir="out/")
    result.summary["would_have_acted"], result.audit_path, result.reports["html"]
    run_scenario("numa-remote-worker", load_policies(["my-policy.yaml"]), "enforce", evals="all")

Overhead: one controller tick and one plant step per simulated tick. 100
rules x 10 quiet targets at a 1 s tick: about 55,000 rule-target evaluations
per CPU second and 1.6 MB of audit per simulated hour sampled; about 23,000
and 1.9 GB an hour with every evaluation.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import reflexarc.policies
from reflexarc.simulations import Plant, load_scenario

from ..engine.audit import AuditLog, rotated_paths
from ..engine.bus import SignalBus
from ..engine.clock import SimClock
from ..engine.engine import Controller
from ..engine.journal import Journal
from ..policy.loader import load_policies

BUILTIN_POLICIES = Path(reflexarc.policies.__file__).resolve().parent
SCENARIO_SUFFIXES = (".yaml", ".yml")
AUDIT_SAMPLE = 1200.0     # seconds between a quiet rule-target's written evaluations: run's --audit-sample


@dataclass
class SimResult:
    scenario: object
    mode: str | None
    summary: dict
    records: list[dict]
    plant: Plant
    audit_path: Path | None = None
    reports: dict = field(default_factory=dict)

    def actions(self) -> list[dict]:
        return [r for r in self.records if r["kind"] == "action"]


def run_scenario(scenario, policies: list | None = None, mode: str | None = None,
                 out_dir: str | Path | None = None, report: bool = False, evals: str = "sampled",
                 sample_every: float = AUDIT_SAMPLE) -> SimResult:
    """Run ``scenario`` (a name, a path or a loaded scenario) with ``policies``
    (loaded, ``load_policies``) or, by default, the policy files the scenario names.
    ``evals``: ``sampled`` or ``all`` evaluations in the audit (``AuditLog``)."""
    sc = load_scenario(scenario) if isinstance(scenario, str) else scenario
    if policies is None:
        policies = load_policies(list(sc.policies))
    clock = SimClock()
    bus = SignalBus(retention=3600.0)
    plant = Plant(sc, seed=sc.seed)
    out = Path(out_dir) if out_dir else None
    audit_path = out / "audit.jsonl" if out else None
    if audit_path:
        for stale in rotated_paths(audit_path):
            stale.unlink()
    audit = AuditLog(audit_path, clock, evals=evals, sample_every=sample_every)
    audit.keep_in_memory = True
    with tempfile.TemporaryDirectory(prefix="reflexarc-sim-") as tmp:
        journal = Journal(Path(tmp) / "journal.jsonl", clock)
        ctl = Controller(policies, bus, plant.registry(), clock, mode_override=mode, journal=journal,
                         audit=audit, real_sleep=False)
        ctl.start(source=f"simulation:{sc.name}", scenario={"name": sc.name, "description": sc.description,
                                                           "duration": sc.duration, "tick": sc.tick})
        steps = int(round(sc.duration / sc.tick))
        for i in range(steps + 1):
            t = i * sc.tick
            clock.set(t)
            plant.step(t, bus.publish)
            ctl.tick(t)
        ctl.shutdown()
        journal.close()
    audit.close()
    result = SimResult(sc, mode, ctl.summary(), audit.records, plant, audit_path)
    if report and audit_path:
        from reflexarc.controller.report import write_report
        result.reports = write_report(audit_path, out)
    return result
