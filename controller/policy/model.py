"""The policy model: what a validated YAML policy file becomes.

Every node carries its source location (``Loc``) so later checks and the audit
report can point back at the file. The loader (``loader.py``) builds these; the
engine only reads them.

Example::

    policies = load_policies(["policies/"])      # -> list[Policy]
    rule = policies[0].rules[0]
    rule.when        # Condition | Combo
    rule.actions[0]  # Action(actuator="affinity", params={"node": 0})

Overhead: plain dataclasses.
"""
from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from reflexarc.core.budget import BudgetSpec
from reflexarc.core.rollout import RolloutSpec

MODES = ("dry-run", "alert-only", "enforce")
AGGREGATIONS = ("p50", "p90", "p99", "mean", "max", "min", "last", "rate", "count", "delta", "slope")
OPERATORS = (">", ">=", "<", "<=", "==", "!=")
ROLLBACK_TRIGGERS = ("verify-failed", "clear", "ttl", "shutdown")
ON_RESTART = ("revert", "adopt")
ALERTS_AT_STOP = ("resolve", "keep")


@dataclass(frozen=True)
class Loc:
    file: str
    line: int   # 1-based
    col: int    # 1-based

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


CHANGE_DIRECTIONS = ("up", "down")
CHANGE_FRESH_S = 30.0        # a change condition's target is live while a point is this recent


@dataclass(frozen=True)
class ChangeSpec:
    """``change: {signal, up|down: shift, false_alarms: n/period}``: the signal
    has shifted from its learned reference by at least ``factor`` times it
    (``1.3x``) or by ``amount`` in its unit (``50ms``), detected by a CUSUM
    whose threshold gives about ``false_alarms`` alarms per second on a series
    that has not shifted (``engine/changepoint.py``)."""

    direction: str               # "up" | "down"
    factor: float | None         # 1.3 for "up: 1.3x"; 0.7 for "down: 0.7x"
    amount: float | None         # an absolute shift in the signal's unit, for a reference near zero
    false_alarms: float          # per second and target
    text: str                    # as written: "up 1.3x, 1/day"


@dataclass
class Condition:
    """``agg(signal{match}[window]) op threshold`` where the threshold is either
    absolute or ``factor`` times a learned baseline; or, with ``change``, a
    change point of the signal against its learned reference (``agg`` is
    ``"change"``, ``window`` how recent a point keeps the target live)."""

    signal: str
    agg: str
    window: float                # seconds
    op: str
    threshold: float             # absolute value, or the factor when relative
    relative: bool = False       # threshold is "<factor>x baseline"
    match: dict = field(default_factory=dict)
    baseline_window: float = 600.0   # seconds of healthy history the baseline is the median of
    change: ChangeSpec | None = None
    loc: Loc | None = None

    def describe(self) -> str:
        sel = ",".join(f'{k}="{v}"' for k, v in sorted(self.match.items()))
        if self.change is not None:
            return f"change({self.signal}{{{sel}}}) {self.change.text}"
        rhs = f"{self.threshold:g}x baseline" if self.relative else f"{self.threshold:g}"
        return f"{self.agg}({self.signal}{{{sel}}}[{self.window:g}s]) {self.op} {rhs}"


@dataclass
class Combo:
    kind: str                    # "all" | "any"
    items: list                  # of Condition | Combo
    loc: Loc | None = None

    def conditions(self) -> list[Condition]:
        out = []
        for item in self.items:
            out.extend(item.conditions() if isinstance(item, Combo) else [item])
        return out


COMBINATORS = ("all", "any")


def when_tree(expr):
    """An expression (``Condition`` or ``Combo``) as nested JSON, as the audit's
    ``run`` record carries it: the condition's ``describe()`` text, or
    ``{"all"|"any": [items]}``."""
    if expr is None:
        return None
    if isinstance(expr, Combo):
        return {expr.kind: [when_tree(item) for item in expr.items]}
    return expr.describe()


@dataclass
class Action:
    actuator: str
    params: dict = field(default_factory=dict)
    loc: Loc | None = None


@dataclass
class Verify:
    when: Condition | Combo      # must hold within ``timeout`` after acting
    timeout: float
    loc: Loc | None = None


@dataclass
class Rollback:
    on: frozenset = frozenset()  # subset of ROLLBACK_TRIGGERS
    ttl: float | None = None     # seconds; required when "ttl" in on
    never: bool = False          # explicit "keep the change"
    on_restart: str = "revert"   # what a restarted controller does with it
    alerts: str = "resolve"      # what a stopping controller does with the rule's firing alerts
    loc: Loc | None = None


@dataclass
class RateLimit:
    count: int
    window: float
    loc: Loc | None = None


@dataclass
class Rule:
    name: str
    when: Condition | Combo
    actions: list[Action]
    rollback: Rollback
    by: tuple[str, ...] = ()     # labels that make a target; () = one target per policy
    for_: float = 0.0            # sustain before firing
    clear_for: float = 0.0       # hysteresis before clearing
    verify: Verify | None = None
    escalate: bool = True        # on verify failure, go on to the next action
    cooldown: float = 0.0
    max_actions: RateLimit | None = None
    loc: Loc | None = None

    def conditions(self) -> list[Condition]:
        return self.when.conditions() if isinstance(self.when, Combo) else [self.when]


@dataclass
class Selector:
    """What a policy may touch, and label matchers applied to every signal it reads."""

    match: dict = field(default_factory=dict)        # e.g. {"job": "llama"}
    processes: tuple[str, ...] = ()                  # comm names, e.g. ("pt_data_worker",)
    pids: tuple[int, ...] = ()
    cgroup: str = ""                                 # cgroup path of the job
    interfaces: tuple[str, ...] = ()
    netns: str = ""                                  # network namespace of the interfaces; "": the controller's
    link_speeds: dict[str, int] = field(default_factory=dict)   # interface -> bits/s, for virtual links
    ports: tuple[tuple[int, int], ...] = ()          # inclusive ranges
    jobs: tuple[str, ...] = ()                       # globs on the discovered job, e.g. ("llama-*",)
    pods: tuple[str, ...] = ()                       # globs on the pod UID
    loc: Loc | None = None

    def one_job(self) -> str | None:
        """The one job its matchers name (``match: {job: NAME}``, equality), else None."""
        job = self.match.get("job")
        return job if isinstance(job, str) and job and not job.startswith(("~", "!")) else None

    def to_dict(self) -> dict:
        return {"match": dict(self.match), "processes": list(self.processes), "pids": list(self.pids),
                "cgroup": self.cgroup, "interfaces": list(self.interfaces), "netns": self.netns,
                "link_speeds": dict(self.link_speeds),
                "ports": [list(p) for p in self.ports], "jobs": list(self.jobs), "pods": list(self.pods)}

    def scoped(self, labels: dict) -> bool:
        """A series is inside ``jobs`` and ``pods`` unless it names another job or
        pod (the node's own series, which name none, are read by every job)."""
        for label, globs in (("job", self.jobs), ("pod", self.pods)):
            value = labels.get(label)
            if globs and value is not None and not any(fnmatch.fnmatchcase(value, g) for g in globs):
                return False
        return True


@dataclass
class Policy:
    name: str
    rules: list[Rule]
    description: str = ""
    mode: str = "dry-run"
    selector: Selector = field(default_factory=Selector)
    requires: tuple[str, ...] = ()   # device kinds or "promql" (producers.REQUIREMENTS) without which it is idle
    rollout: RolloutSpec | None = None   # enforced stage by stage across the fleet, behind a breaker
    budget: BudgetSpec | None = None     # its own fleet budget (else the node's --fleet-max-*), per policy or job
    loc: Loc | None = None


def conditions_of(expr: Condition | Combo | None) -> list[Condition]:
    """The conditions of a ``when`` expression, in order; none for no expression."""
    if expr is None:
        return []
    return expr.conditions() if isinstance(expr, Combo) else [expr]


def change_words(item: dict, number) -> str:
    """A change condition's evidence item in words, numbers through ``number``:
    ``rose 2.04x from 200 (CUSUM 3.1, fires above 1.2)``, ``no shift from 200``,
    or ``learning its reference``."""
    if item.get("value") is None:
        return "learning its reference"
    base, shift, relative = item.get("baseline"), item.get("shift"), "x," in (item.get("condition") or "")
    cusum = f"(CUSUM {number(item['value'])}, fires above {number(item.get('threshold'))})"
    if shift is None:
        return f"no shift from {number(base)} {cusum}"
    rose = shift > 1 if relative else shift > 0
    amount = f"{shift:.2f}x" if relative else f"by {number(abs(shift))}"
    return f"{'rose' if rose else 'fell'} {amount} from {number(base)} {cusum}"
