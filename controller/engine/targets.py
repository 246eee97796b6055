"""A rule's targets: which label sets of its ``by`` labels the bus holds series
for, and which series each condition of each target reads.

Resolution runs once, and again only when the generation of one of the rule's
signals moves (a series appeared or was dropped), so a tick never scans labels.
A target is *fresh* while one of its ``when`` series has a point inside that
condition's window; a target whose series all stopped (the process exited,
the interface went away) is *silent* and may be retired by the controller.

A series that lacks some ``by`` labels (e.g. a job-wide step time read by a
rule grouped by training process) joins every target it does not contradict.

A target never joins the series of two jobs: where the series of one target
of a rule whose ``by`` does not name ``job`` carry two or more jobs (the jobs
discovery found, ``reflexarc.core.jobs``), that target is split into one per
job, the ``job`` label added to its labels; series without a job label (the
node's own, such as a link's total) join every job's target. With one job on
the node the targets are those the ``by`` gives.

Example::

    rt = RuleTargets(bus, policy, rule)
    if rt.resolve_if_changed():
        for key, inputs in rt.groups.items():   # key: ("4242",) for by: [trainer]
            ...
    rt.fresh(("4242",), now)

Overhead: a generation look-up per signal of the rule per tick; a resolution
matches the labels of every series of the rule's signals once (a dict look-up
per series; only a series short of the ``by`` labels, such as a job-wide one
in a rule by training process, is compared with every target).
"""
from __future__ import annotations

from reflexarc.core.targets import target_key

from ..policy.model import Policy, Rule, conditions_of
from ..signals.catalogue import CATALOGUE
from .bus import Matcher, SignalBus
from .evaluate import Input


class RuleTargets:
    def __init__(self, bus: SignalBus, policy: Policy, rule: Rule) -> None:
        self.bus = bus
        self.by = tuple(rule.by) if "job" in rule.by else (*rule.by, "job")
        self._implicit_job = "job" not in rule.by
        self.when = rule.conditions()
        self.conditions = self.when + conditions_of(rule.verify.when if rule.verify else None)
        self.index = {id(c): i for i, c in enumerate(self.conditions)}
        self._matchers = [Matcher({**policy.selector.match, **c.match}) for c in self.conditions]
        self._selector = policy.selector
        self._counter = [getattr(CATALOGUE.get(c.signal), "kind", "") == "counter" for c in self.conditions]
        self.signals = tuple(sorted({c.signal for c in self.conditions}))
        self._generations: tuple | None = None
        self.empty = self._inputs()     # what a target whose series were dropped reads: no data
        self.groups: dict[tuple, list[Input]] = {}      # filled by resolve_if_changed

    def _inputs(self) -> list[Input]:
        return [Input(c, [], counter) for c, counter in zip(self.conditions, self._counter)]

    def labels(self, key: tuple) -> dict:
        return {k: v for k, v in zip(self.by, key) if v is not None}

    def key_text(self, key: tuple) -> str:
        return target_key(self.labels(key))

    def resolve_if_changed(self) -> bool:
        """Re-resolve when a signal's generation moved; returns whether it did."""
        generations = tuple(self.bus.generation(s) for s in self.signals)
        if generations == self._generations:
            return False
        self._generations = generations
        self._resolve()
        return True

    def _resolve(self) -> None:
        by = self.by
        scoped = self._selector.scoped
        matching = [[s for s in self.bus.series(c.signal) if m(s.labels) and scoped(s.labels)]
                    for c, m in zip(self.conditions, self._matchers)]
        named = by[:-1] if self._implicit_job else by        # the labels a key needs
        keys = {tuple(s.labels.get(k) for k in by)
                for i in range(len(self.when)) for s in matching[i]
                if all(k in s.labels for k in named)}
        if self._implicit_job:                               # split by job only where two jobs meet
            jobs_of: dict[tuple, set] = {}
            for key in keys:
                jobs_of.setdefault(key[:-1], set()).add(key[-1])
            keys = {base + (job,) for base, jobs in jobs_of.items() for job in jobs if job is not None}
            keys = {key for key in keys if len(jobs_of[key[:-1]] - {None}) > 1} | {
                base + (None,) for base, jobs in jobs_of.items() if len(jobs - {None}) <= 1}
            if not named and not keys:
                keys = {(None,)}
        groups = {key: self._inputs() for key in keys}
        jobs_at: dict[tuple, list[tuple]] = {}               # the keys of each named part, one per job
        if self._implicit_job:
            for key in groups:
                jobs_at.setdefault(key[:-1], []).append(key)
        for i, series in enumerate(matching):
            for s in series:
                labels = s.labels
                if all(k in labels for k in by):
                    inputs = groups.get(tuple(labels[k] for k in by))
                    if inputs is not None:
                        inputs[i].series.append(s)
                        continue
                if self._implicit_job and all(k in labels for k in named):
                    job = labels.get("job")             # no job: every job's target of these labels
                    for key in jobs_at.get(tuple(labels[k] for k in named), ()):
                        if job is None or key[-1] is None or key[-1] == job:
                            groups[key][i].series.append(s)
                    continue
                for key, inputs in groups.items():      # a series short of named labels: a scan
                    if all(labels.get(k, v) == v for k, v in zip(by, key) if v is not None):
                        inputs[i].series.append(s)
        self.groups = groups

    def fresh(self, key: tuple, now: float) -> bool:
        """A ``when`` series of the target has a point inside its condition's window."""
        inputs = self.groups.get(key)
        if inputs is None:
            return False
        return any(inp.last_seen() > now - inp.cond.window for inp in inputs[:len(self.when)])

    def last_seen(self, key: tuple) -> float:
        inputs = self.groups.get(key)
        if not inputs:
            return float("-inf")
        return max(inp.last_seen() for inp in inputs[:len(self.when)])
