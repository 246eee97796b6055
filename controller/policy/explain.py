"""What a policy will do, in plain words: the text of ``reflexarc explain``.

For each policy: its mode and what that mode does, the devices it requires and
what it may touch; for each rule the condition as written (``all``/``any``
nested as in the file, thresholds in the units of the signal catalogue), how
long it must hold, the actions in order with their parameters, the
verification, the escalation, when a change is undone, how the rule clears,
its cooldown and rate limit; then what the policy needs on this node (each
signal's producers and whether they can run here, the hooks and receivers its
actions use) and the readiness findings of ``readiness.py``.

Example::

    print(explain(load_policies(["policies/"]), NodeFacts(), receiver=False))
    # dataloader-starvation (policies/dataloader-starvation.yaml:12:5)
    #   Raise DataLoader prefetching through the framework hook when ...
    #   mode dry-run: it will only plan and log (no change, no alert, no check follows); --mode enforce to
    #   act.
    #
    #   rule loader-starved: when, for one job (by: job),
    #       all of:
    #         - the mean of dataloader_batch_wait_ms over 5 s is above 10 ms
    #   ...

Overhead: string formatting, and the readiness checks (``producers.py``: one
probe import and attach-point choice per producer, cached per ``NodeFacts``).
"""
from __future__ import annotations

import textwrap

from reflexarc.actuators.specs import SPECS
from reflexarc.core.durations import format_duration
from reflexarc.core.ports import format_port_ranges
from reflexarc.core.rates import format_rate

from ..signals.catalogue import CATALOGUE, producers_of
from ..signals.producers import HOOKS, NVML, PROMQL, NodeFacts
from .model import Action, Combo, Condition, Policy, Rule, Selector, conditions_of
from .readiness import CatalogueFacts, findings

WIDTH = 100
AGG_WORDS = {"p50": "the p50", "p90": "the p90", "p99": "the p99", "mean": "the mean", "max": "the max",
             "min": "the min", "last": "the last value", "rate": "the rate per second",
             "count": "the number of samples", "delta": "the increase", "slope": "the trend per minute"}
OP_WORDS = {">": "above", ">=": "at or above", "<": "below", "<=": "at or below", "==": "equal to",
            "!=": "not equal to"}
UNITLESS = ("1", "ratio")
PERIOD_NOUNS = {"s": "second", "m": "minute", "min": "minute", "h": "hour", "d": "day", "w": "week"}
# What one value of a ``by`` label names; a label not listed names itself.
LABEL_NOUNS = {"trainer": "training process", "pid": "process", "dev": "device", "qp": "queue pair",
               "iface": "interface", "netns": "network namespace", "gpu": "GPU", "numa_node": "NUMA node"}
REQUIREMENT_NOUNS = {"gpu": "a GPU", "rdma": "an RDMA device", "pcie_aer": "a PCIe device reporting AER counters",
                     PROMQL: "a PromQL source"}
TRIGGER_WORDS = {"verify-failed": "when the check fails", "clear": "when the rule clears",
                 "shutdown": "when the controller shuts down"}
PRODUCER_NOTES = {HOOKS: " (the training script reports it through reflexarc.actuators.hooks, docs/hooks.md)",
                  NVML: " (nvidia-ml-py on a node with a GPU)",
                  PROMQL: " (a query of --promql-config against the cluster's Prometheus)"}


def _per(window: float) -> str:
    return "an hour" if window == 3600 else "a day" if window == 86400 else f"per {format_duration(window)}"


def _matchers(match: dict) -> str:
    """``{quantile: "0.99", counter: "~a|b"}`` as ``{counter=~"a|b",quantile="0.99"}``."""
    def one(label, want):
        want = str(want)
        if want.startswith("~"):
            return f'{label}=~"{want[1:]}"'
        if want.startswith("!"):
            return f'{label}!="{want[1:]}"'
        return f'{label}="{want}"'
    return "{" + ",".join(one(k, v) for k, v in sorted(match.items())) + "}" if match else ""


def _unit(cond: Condition) -> str:
    """The unit of the condition's threshold: the signal's (per second for ``rate``), none for ``count``."""
    unit = CATALOGUE[cond.signal].unit
    if cond.agg == "count":
        return ""
    if cond.agg == "rate":
        return "/s" if unit in UNITLESS else f" {unit}/s"
    if cond.agg == "slope":
        return "/min" if unit in UNITLESS else f" {unit}/min"
    if unit in UNITLESS:
        return ""
    return unit[1:] if unit.startswith("1/") else unit if unit == "%" else f" {unit}"


def change(cond: Condition) -> str:
    """A change condition in words, e.g. ``step_time_ms rises by 1.3x from its reference (...)``."""
    spec = cond.change
    verb = "rises" if spec.direction == "up" else "falls"
    shift = f"to {spec.factor:g}x" if spec.factor is not None else f"by {spec.amount:g}{_unit(cond)}"
    count, per = spec.text.split(", ")[-1].split("/")
    per = PERIOD_NOUNS.get(per, per)
    return (f"{cond.signal}{_matchers(cond.match)} {verb} {shift} its reference (the median of the last "
            f"{format_duration(cond.baseline_window)} while healthy), seen by a CUSUM over each new point "
            f"(at least 3 shifted points; about {count} false alarm(s) a {per} on a series that has not shifted)")


def condition(cond: Condition) -> str:
    """One condition in words, e.g. ``the mean of step_time_ms over 60 s is above 2x its baseline (...)``."""
    if cond.change is not None:
        return change(cond)
    what = f"{AGG_WORDS[cond.agg]} of {cond.signal}{_matchers(cond.match)} over {format_duration(cond.window)}"
    if cond.relative:
        rhs = (f"{cond.threshold:g}x its baseline (the median of the last {format_duration(cond.baseline_window)} "
               f"while healthy)")
    else:
        rhs = f"{cond.threshold:g}{_unit(cond)}"
    return f"{what} is {OP_WORDS[cond.op]} {rhs}"


def expression(expr: Condition | Combo, indent: int, bullet: str = "") -> list[str]:
    """Lines of a condition or an ``all``/``any`` of them, nested as written."""
    pad = " " * indent + bullet
    if isinstance(expr, Condition):
        return _wrap(condition(expr), indent, len(pad) + 2, bullet)
    out = [pad + f"{expr.kind} of:"]
    for item in expr.items:
        out += expression(item, indent + len(bullet) + 2, "- ")
    return out


def _values(params: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())


def action(act: Action, selector: Selector) -> str:
    """What one action does, with its parameters (the selector's filled in where
    the actuator takes them from it): the phrase of its spec (``ActuatorSpec.explain``)."""
    spec = SPECS[act.actuator]
    params = spec.resolve(act.params, selector.to_dict())
    return spec.explain(params) if spec.explain else f"runs the {spec.name} actuator ({_values(params)})"


def _changes(act: Action) -> bool:
    return SPECS[act.actuator].changes_system


def _target(rule: Rule) -> str:
    if not rule.by:
        return "node-wide (per job where several jobs run)"
    nouns = " and ".join(LABEL_NOUNS.get(label, label) for label in rule.by)
    per_job = "" if "job" in rule.by else ", per job where several jobs run"
    return f"for one {nouns} (by: {', '.join(rule.by)}{per_job})"


def _steps(rule: Rule, selector: Selector) -> list[str]:
    """The numbered actions, with the check after a change and what a failure leads to."""
    steps = rule.actions if rule.escalate else rule.actions[:1]
    reverts = "verify-failed" in rule.rollback.on
    kept = "(rollback: never)" if rule.rollback.never else "(rollback has no verify-failed)"
    out = []
    for i, act in enumerate(steps):
        text = action(act, selector)
        if i:
            if not _changes(steps[i - 1]):
                text = f"if the alert cannot be sent, it {text}"
            elif reverts:
                text = f"if that check fails or the change cannot be made, it rolls the change back and {text}"
            else:
                text = (f"if the change cannot be made, it rolls it back; if that check fails, it keeps the change "
                        f"{kept}; either way it then {text}")
        out += _wrap(f"{i + 1}. {text}", 6, 9)
        if act.actuator == "framework_hook":
            lacking = ("the step fails and the rule goes on to the next action" if i + 1 < len(steps)
                       else "the step fails and nothing else is done")
            out += _wrap(f"(only a training script that serves reflexarc's hooks has this handler; on an "
                         f"unmodified job {lacking}, and the audit says why)", 9, 9)
        if _changes(act) and rule.verify is not None:
            again = " again" if i else ""
            out.append(" " * 9 + f"it then checks{again} for up to {format_duration(rule.verify.timeout)} that")
            out += expression(rule.verify.when, 11)
    if len(steps) < len(rule.actions):
        unused = "action 2 never runs" if len(rule.actions) == 2 else f"actions 2-{len(rule.actions)} never run"
        out += _wrap(f"(escalate is false: {unused})", 6, 6)
    if rule.verify is not None and _changes(steps[-1]):
        ending = "rolls the change back" if reverts else f"keeps the change {kept}"
        out += _wrap(f"if that check fails, it {ending} and stops there.", 6, 6)
    return out


def _rollback(rule: Rule) -> list[str]:
    if not any(_changes(a) for a in rule.actions):
        return _wrap("It changes nothing on the node.", 4, 4)
    rb = rule.rollback
    if rb.never:
        return _wrap("Its changes are kept (rollback: never): the journal closes them as kept.", 4, 4)
    words = [f"{format_duration(rb.ttl)} after it was made" if trigger == "ttl" else TRIGGER_WORDS[trigger]
             for trigger in ("verify-failed", "clear", "ttl", "shutdown") if trigger in rb.on]
    text = "A change is undone " + (", ".join(words[:-1]) + " and " if len(words) > 1 else "") + words[-1]
    text += "" if "clear" in rb.on else ", not when the rule clears"
    restart = ("reverts it" if rb.on_restart == "revert"
               else "adopts it (keeps it; `reflexarc rollback` can still undo it)")
    return _wrap(f"{text}; a controller restarted while it is applied {restart}.", 4, 4)


def _clearing(rule: Rule) -> list[str]:
    held = (f"once the condition has been false for {format_duration(rule.clear_for)}" if rule.clear_for
            else "as soon as the condition is false")
    alerts = ", and resolves its alerts" if any(a.actuator == "alert" for a in rule.actions) else ""
    cooldown = f"then a {format_duration(rule.cooldown)} cooldown" if rule.cooldown else "no cooldown"
    text = f"It clears {held}{alerts}; {cooldown}"
    if rule.max_actions is not None:
        each = f" for one {' and '.join(LABEL_NOUNS.get(b, b) for b in rule.by)}" if rule.by else ""
        text += f"; at most {rule.max_actions.count} changes {_per(rule.max_actions.window)}{each}"
    return _wrap(text + ".", 4, 4)


def rule_lines(rule: Rule, selector: Selector) -> list[str]:
    sustain = f"for {format_duration(rule.for_)} in a row" if rule.for_ else "as soon as it holds"
    return ([f"  rule {rule.name}: when, {_target(rule)},"] + expression(rule.when, 6)
            + [f"    {sustain}, it"] + _steps(rule, selector) + _rollback(rule) + _clearing(rule))


def mode_text(policy: Policy) -> str:
    changes = any(_changes(a) for r in policy.rules for a in r.actions)
    if policy.mode == "dry-run":
        return ("mode dry-run: it will only plan and log (no change, no alert, no check follows); "
                "--mode enforce to act.")
    if policy.mode == "alert-only":
        instead = ("; instead of each change it sends an alert describing it (no check follows)" if changes
                   else " and changes nothing")
        return f"mode alert-only: it sends its alerts{instead}; --mode enforce to act."
    return ("mode enforce: it acts under `reflexarc run --mode policy` (run's default, --mode dry-run, only plans); "
            "while the kill-switch file exists it only plans.")


def _scope(policy: Policy) -> list[str]:
    s = policy.selector
    parts = [f"processes named {', '.join(s.processes)}" if s.processes else "",
             f"pids {', '.join(map(str, s.pids))}" if s.pids else "",
             f"the cgroup {s.cgroup}" if s.cgroup else "",
             f"interfaces {', '.join(s.interfaces)}" if s.interfaces else "",
             f"in network namespace {s.netns}" if s.netns else "",
             "link speeds " + ", ".join(f"{i}={format_rate(b)}" for i, b in s.link_speeds.items())
             if s.link_speeds else "",
             f"ports {format_port_ranges(s.ports)}" if s.ports else ""]
    out = []
    if any(parts):
        out += _wrap("It may touch " + "; ".join(p for p in parts if p) + ".", 2, 2)
    if s.match:
        out += _wrap(f"It reads only series with {_matchers(s.match)}.", 2, 2)
    scope = [f"of the job{'s' if len(s.jobs) > 1 else ''} {', '.join(s.jobs)}" if s.jobs else "",
             f"of the pod{'s' if len(s.pods) > 1 else ''} {', '.join(s.pods)}" if s.pods else ""]
    if any(scope):
        out += _wrap("It reads and acts on the series " + " and ".join(p for p in scope if p) +
                     " (as 'reflexarc jobs' names them), and the node's own.", 2, 2)
    if policy.requires:
        needs = " and ".join(REQUIREMENT_NOUNS.get(k, k) for k in policy.requires)
        lacking = "without one" if len(policy.requires) == 1 else "lacking one of them"
        out += _wrap(f"It needs {needs} (requires: {', '.join(policy.requires)}): on a node {lacking} it is idle.",
                     2, 2)
    return out


def node_lines(policy: Policy, facts: NodeFacts, receiver: bool) -> list[str]:
    """What the policy needs on this node, and what keeps it from working here
    (from the catalogue alone when ``facts`` are ``CatalogueFacts``)."""
    unseen = facts.reason if isinstance(facts, CatalogueFacts) else ""
    out = ["  on this node it needs:"]
    signals = dict.fromkeys(c.signal for r in policy.rules
                            for c in conditions_of(r.when) + conditions_of(r.verify.when if r.verify else None))
    for name in signals:
        spec = CATALOGUE[name]
        unit = spec.unit if spec.unit != "1" else "a count" if spec.kind == "counter" else "a number"
        out += _wrap(f"{name} ({unit}): {spec.help}", 4, 6)
        for producer in producers_of(name):
            why = facts.why_not(producer, name)
            status = "can run here" if why is None else f"not here: {why}"
            if unseen and producer.kind != PROMQL:
                status = f"not checked ({unseen})"
            out += _wrap(f"from {producer}{PRODUCER_NOTES.get(producer.kind, '')}: {status}", 6, 8)
    actions = [a for r in policy.rules for a in r.actions]
    for handler in dict.fromkeys(a.params["handler"] for a in actions if a.actuator == "framework_hook"):
        out += _wrap(f"the training script's `{handler}` handler, registered through reflexarc.actuators.hooks",
                     4, 6)
    if any(a.actuator == "alert" for a in actions):
        out += _wrap("an alert receiver (--alertmanager-url or --webhook-url) to send its alerts outside dry-run",
                     4, 6)
    found = findings([policy], facts, receiver)
    clear = (f" nothing in the signal catalogue keeps it from working (this node not checked: {unseen})." if unseen
             else " nothing keeps it from working on this node.")
    out.append("  readiness here:" + ("" if found else clear))
    out += [f"    {finding}" for finding in found]
    return out


def fleet_texts(policy: Policy) -> list[str]:
    """What the fleet holds of a policy's enforcement: its rollout and its budget."""
    out = []
    if policy.rollout is not None:
        out.append(f"Across the fleet it is enforced stage by stage: {policy.rollout.describe()}. Open, the breaker "
                   f"stops it on every node until an operator runs reflexarc fleet reset {policy.name} --reason "
                   f"TEXT. Enforcing it needs run --fleet-etcd.")
    if policy.budget is not None:
        out.append(f"Its fleet budget: {policy.budget.describe()} make its changes (instead of run's "
                   f"--fleet-max-nodes/--fleet-max-percent). Enforcing it needs run --fleet-etcd.")
    return out


def explain_policy(policy: Policy, facts: NodeFacts, receiver: bool) -> str:
    lines = [f"{policy.name} ({policy.loc})"]
    if policy.description:
        lines += _wrap(" ".join(policy.description.split()), 2, 2)
    lines += _wrap(mode_text(policy), 2, 2) + _scope(policy)
    for text in fleet_texts(policy):
        lines += _wrap(text, 2, 2)
    for rule in policy.rules:
        lines += [""] + rule_lines(rule, policy.selector)
    lines += [""] + node_lines(policy, facts, receiver)
    return "\n".join(lines)


def explain(policies: list[Policy], facts: NodeFacts, receiver: bool) -> str:
    """The text of ``reflexarc explain`` for ``policies``, one block per policy."""
    return "\n\n".join(explain_policy(p, facts, receiver) for p in policies) + "\n"


def _wrap(text: str, first: int, rest: int, bullet: str = "") -> list[str]:
    """``text`` in lines of at most ``WIDTH``: the first indented ``first`` and led by ``bullet``,
    the others indented ``rest``."""
    return textwrap.wrap(text, WIDTH, initial_indent=" " * first + bullet, subsequent_indent=" " * rest,
                         break_long_words=False, break_on_hyphens=False)
