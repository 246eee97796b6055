"""``reflexarc act ACTUATOR key=value...``: one actuator by hand, through the
executor's plan, diff and journal like the controller's (``--mode dry-run``
by default), audited as policy ``manual``; a summary of what it did, or
``--json`` the whole result. With a controller running on the state
directory, an ``enforce`` is asked of it (it holds the journal). An alert is
delivered, or reported failed, before the command exits. ``actuators_help``
lists every actuator and its parameters (``act ACTUATOR --help`` one).

Example::

    reflexarc act affinity cpus=0 --label trainer=4242 --mode dry-run

Overhead: one actuator step; an alert waits for its receivers (at most twice their deadline).
"""
from __future__ import annotations

import json
from pathlib import Path

from reflexarc.core.outcomes import Outcome

from .shared import CliError, _actuator_config, _ask, _journal


def _delivered(sender, res):
    """``res`` once the alert it queued was delivered, or FAILED with why when
    no receiver took it (a one-shot command has no later tick to tell)."""
    import dataclasses
    sender.flush(2 * sender.deadline + 5)
    if any(outcome == "sent" and n for (_, outcome), n in sender.deliveries.items()):
        return res
    failed = sorted({receiver for (receiver, outcome), n in sender.deliveries.items() if n})
    why = "; ".join(f"{r}: {sender.last_error.get(r, 'not sent')}" for r in failed) or "not sent"
    return dataclasses.replace(res, outcome=Outcome.FAILED, error=f"alert not delivered: {why}")


def cmd_act(args) -> int:
    from reflexarc.actuators.base import Target
    from reflexarc.actuators.registry import build_registry
    from reflexarc.actuators.specs import SPECS
    from reflexarc.core.params import check_params
    from reflexarc.core.ports import port_ranges
    from reflexarc.core.targets import pid_label

    from ..engine.clock import WallClock
    from ..engine.executor import Executor
    spec = SPECS.get(args.actuator)
    if spec is None:
        from reflexarc.core.signals import suggest
        hint = suggest(args.actuator, sorted(SPECS))
        raise CliError(f"unknown actuator '{args.actuator}'" + (f"; did you mean '{hint}'?" if hint else ""))
    if spec.held_by_controller and args.mode == "enforce":
        raise CliError(f"{spec.name} lives as long as the controller that makes the change: let a policy make it "
                       "(reflexarc run), or plan it here with --mode dry-run")
    config = _actuator_config(args)
    if "deep_tier" in spec.takes:        # an idle deep tier to plan against (no probe loads in dry-run)
        from reflexarc.bpf.manager import ProbeManager
        from reflexarc.bpf.probe import Selection
        config.deep_tier = ProbeManager(Selection(), probes=[])
    registry = build_registry(config)
    texts = {}
    for item in args.params:
        key, sep, value = item.partition("=")
        if not sep:
            raise CliError(f"'{item}': parameters are key=value")
        texts[key] = value
    labels = {}
    for item in args.label:
        key, sep, value = item.partition("=")
        if not (sep and key):
            raise CliError(f"--label '{item}': labels are key=value, e.g. trainer=4242")
        labels[key] = value
    try:
        params = check_params(spec, texts)
        ports = port_ranges(args.port)
        named = [pid for pid in (pid_label(labels, "pid"), pid_label(labels, "trainer")) if pid is not None]
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if any(pid < 1 for pid in args.pid):
        raise CliError(f"--pid {min(args.pid)} is not a process id (a whole number > 0)")
    if spec.target == "process" and not (args.pid or args.cgroup or args.job or named or labels.get("job")):
        raise CliError(f"{args.actuator} acts on processes: name the target by --pid PID, --cgroup PATH, "
                       "--job NAME, --label pid=PID or --label trainer=PID (a process name alone would match "
                       "processes anywhere on the node)")
    selector = {"match": {"job": args.job} if args.job else {}, "processes": args.process, "pids": args.pid,
                "cgroup": args.cgroup or "", "interfaces": args.interface, "ports": ports}
    if args.mode == "enforce":              # a running controller holds the journal: it acts, and audits
        reply = _ask(args, {"verb": "act", "actuator": args.actuator, "params": texts, "labels": labels,
                            "selector": {**selector, "ports": args.port}, "mode": args.mode})
        if reply is not None:
            registry.close()
            return _acted(args, {k: reply.get(k) for k in ("outcome", "journal_id", "error", "before", "after",
                                                             "summary")})
    clock = WallClock()
    journal = _journal(args, clock) if args.mode == "enforce" else None
    ex = Executor(registry, journal, clock)
    target = Target(labels, {**selector, "policy": "manual", "rule": "act"})
    res = ex.act(args.actuator, target, params, args.mode, policy="manual", rule="act")
    if res.notice is not None:         # the alert is queued: delivered (or given up) before it is reported
        res = _delivered(registry.get("alert"), res)
    registry.close()
    _audit_manual(args, clock, target, params, res)
    if journal:
        journal.close()
    return _acted(args, {"outcome": res.outcome, "journal_id": res.journal_id, "error": res.error,
                         "before": res.change.before if res.change else None,
                         "after": res.change.after if res.change else None,
                         "summary": res.change.summary if res.change else None})


def _acted(args, view: dict) -> int:
    """Print what ``act`` did (a summary, or ``--json``); an error for a failed step."""
    if args.json:
        print(json.dumps(view, indent=2, sort_keys=True, default=str))
    elif view["outcome"] != Outcome.FAILED:
        print(_act_summary(view))
    if view["outcome"] == Outcome.FAILED:
        raise CliError(f"{args.actuator}: {view['error']}")
    return 0


ACT_AFTERWORDS = {Outcome.PLANNED: "nothing was changed (dry-run); --mode enforce applies it",
                  Outcome.ALERTED: "nothing was changed (alert-only): an alert describes the change",
                  Outcome.NOOP: "nothing to change: the system already is as asked"}


def _act_summary(view: dict) -> str:
    """What ``act`` did, for a person: the outcome and the change, then what
    follows from it (``--json`` prints the whole result instead)."""
    outcome = Outcome(view["outcome"])
    lines = [f"{outcome}: {view['summary'] or 'no change'}"]
    if outcome in ACT_AFTERWORDS:
        lines.append(f"  {ACT_AFTERWORDS[outcome]}")
    if view["journal_id"]:
        lines.append(f"  journal id {view['journal_id']}: 'reflexarc rollback {view['journal_id']}' reverts it")
    return "\n".join(lines)


def _audit_manual(args, clock, target, params, res) -> None:
    """Manual actions go to the same audit log as the controller's, so reports show them."""
    from ..engine.audit import AuditLog
    audit = AuditLog(args.audit or Path(args.state_dir) / "audit.jsonl", clock)
    change = res.change
    audit.write("action", policy="manual", rule="act", target=target.key(), target_labels=target.labels,
                mode=args.mode, step=0, actuator=args.actuator, params=params, outcome=res.outcome,
                change={"before": change.before, "after": change.after, "summary": change.summary} if change else None,
                journal_id=res.journal_id, error=res.error)
    audit.close()


SELECTOR_OPTIONS = {"interfaces": "--interface", "ports": "--port"}
"""The selector field a parameter may be filled from -> the option of ``act`` that sets it."""


def actuators_help(only: str | None = None) -> str:
    """Every actuator a policy or ``act`` may name (or just ``only``), with its
    parameters: type, required or default, choices, range, an example and
    what it is for; the parameters of which exactly one is given."""
    from reflexarc.actuators.specs import SPECS
    lines = ["actuators:"]
    for spec in SPECS.values():
        if only is not None and spec.name != only:
            continue
        kind = "" if spec.changes_system else " (notifies only)"
        lines.append(f"  {spec.name}{kind}: {spec.help}")
        for p in spec.params:
            given = SELECTOR_OPTIONS.get(p.from_selector)
            need = ("required" if p.required and not p.from_selector else
                    f"{'required, or' if p.required else 'default:'} {given}" if given else
                    f"default {p.default}" if p.default not in (None, "") else "optional")
            choices = f", one of {'|'.join(map(str, p.choices))}" if p.choices else ""
            bounds = f", {p.range[0]}..{p.range[1]}" if p.range else ""
            text = f" - {p.help}" if p.help else ""
            example = f" (e.g. {p.name}={_text(p.example)})" if p.example is not None else ""
            lines.append(f"      {p.name}={p.type} ({need}{choices}{bounds}){text}{example}")
        lines += [f"    give exactly one of {', '.join(group)}" for group in spec.one_of]
    if only is None:
        lines.append("example: reflexarc act affinity cpus=0 --label trainer=4242 --mode dry-run")
    return "\n".join(lines)


def _text(value) -> str:
    """A parameter's example as ``act`` takes it on the command line: lists as ``a,b``."""
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict) else str(value)
