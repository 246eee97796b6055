"""The closed loop on the testbed, measured: a real job, a real fault, the real
controller (``controller.py``), and what it cost and recovered.

Each fault runs on a fresh testbed: the job warms up, the controller starts in
``enforce`` with the shipped policies (selectors filled in for this testbed),
a baseline is measured, the fault is injected with a logged onset (half-way
through an epoch, away from the batch waits of an epoch start), the loop
runs until the policy's outcome is known (verified, or rolled back and
alerted), the fault stops and the controller shuts down. A state snapshot from
before the controller started is compared with one after it stopped.

=====  ============  =====================================================
fault  policy        what happens
=====  ============  =====================================================
a      nccl-...      a bulk upload from rank 0 shares the switch's bottleneck
                     -> DSCP CS1 demotes it -> step time back
b      starvation    the store's per-request latency rises -> batch wait
                     -> more DataLoader workers and prefetch via the hook
c      numa-repin    rank 0 and its workers (which decode, 5 ms of CPU an
                     item) pinned to CPU 1, node 1 of a declared two-node
                     topology, beside a CPU hog -> worker read latency and
                     remote ratio rise -> re-pin the workers to node 0
d      starvation    the store serves one request at a time (throughput-
                     capped) -> the hook does not help -> verify fails ->
                     rollback -> alert to a real Alertmanager
e      (none)        no fault for ``quiet`` seconds, with the job's natural
                     jitter (an epoch turn every ``EPOCH_STEPS`` steps, a
                     checkpoint pause every ``CHECKPOINT_STEPS``) -> no action
=====  ============  =====================================================

Example::

    result = run_fault("a", out_dir=Path("out/demo"))
    result["steps_ms"]["remediated"]["median"] / result["steps_ms"]["baseline"]["median"]   # ~1.05

Overhead: the testbed's and the controller's own; one fault takes 1.5-3 min
(``e``: ``quiet`` + 1 min).
"""
from __future__ import annotations

import json
import os
import platform
import statistics
import time
from pathlib import Path

from . import procs
from .alertmanager import BINARY as ALERTMANAGER
from .alertmanager import Alertmanager
from .controller import POLICY_DIR, ControllerProcess, Timeline, fill_selectors, records, write_report
from .faults import BulkUpload, Misplaced, Nothing, StoreLatency, StoreSerial
from .state import diff, snapshot
from .topology import EPOCH_STEPS, Testbed

CHECKPOINT_STEPS = 300     # the no-fault run's job: rank 0 checkpoints every that many steps, the other waits

FAULTS = {
    "a": {"name": "bulk upload on the bottleneck", "policy": "nccl-congestion-dscp",
          "make": lambda tb, job: BulkUpload(tb), "ends": "verified"},
    "b": {"name": "store latency 50 ms per request", "policy": "dataloader-starvation",
          "make": lambda tb, job: StoreLatency(tb, 50), "ends": "verified"},
    "c": {"name": "rank 0 on the far node beside a CPU hog", "policy": "dataloader-numa-repin",
          "make": lambda tb, job: Misplaced(tb, job.ranks[0].pid, cpu=1), "ends": "verified", "two_nodes": True,
          "job": {"decode_ms": 5.0},   # workers that decode: CPU placement matters to them
          "baseline": 75.0,        # the policy's 10m baseline counts after 60 s of history
          "timeout": 240.0},       # slow to detect here (see docs/benchmarks.md), then a 90 s verify
    "d": {"name": "store serving one request at a time", "policy": "dataloader-starvation",
          "make": lambda tb, job: StoreSerial(tb, 20), "ends": "alerted"},
    "e": {"name": "no fault", "policy": None, "make": lambda tb, job: Nothing(tb), "ends": None,
          "job": {"checkpoint_every": CHECKPOINT_STEPS}},
}


def two_node_sys(root: Path) -> str:
    """A sysfs tree declaring CPU 0 as node 0 and CPU 1 as node 1: on a two-core,
    one-node machine, the closest stand-in for a two-socket host."""
    for node, cpu in ((0, 0), (1, 1)):
        d = root / "devices/system/node" / f"node{node}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpulist").write_text(f"{cpu}\n")
    cpu_dir = root / "devices/system/cpu"
    cpu_dir.mkdir(parents=True, exist_ok=True)
    (cpu_dir / "online").write_text("0-1\n")
    return str(root)


def fills(tb: Testbed, job) -> dict[str, dict]:
    """Each shipped policy's selector for this testbed, as a user would adapt it:
    rank 0's data-plane interface in its namespace and the bottleneck's speed
    (a veth's reported speed says nothing of it). Nothing names the job, its
    cgroup or its processes: the controller finds them."""
    return {"nccl-congestion-dscp": {"interfaces": [tb.rank_iface(0)], "netns": tb.rank_netns(0),
                                     "link_speeds": {tb.rank_iface(0): tb.rate}}}


def phase(job, t0: float, t1: float, started_before: float | None = None) -> dict | None:
    """Step times of every rank that ended between t0 and t1 (and, given
    ``started_before``, began before it): median, mean, p10, p90."""
    steps = job.steps(t0, t1)
    if started_before is not None:
        steps = [s for s in steps if s["ts"] - s["step_ms"] / 1000.0 < started_before]
    values = sorted(s["step_ms"] for s in steps)
    if not values:
        return None
    q = statistics.quantiles(values, n=10) if len(values) > 1 else values * 9
    return {"median": round(statistics.median(values), 1), "mean": round(statistics.fmean(values), 1),
            "p10": round(q[0], 1), "p90": round(q[-1], 1), "steps": len(values)}


def _wait_for(audit: Path, policy: str, since: float, until: str, timeout: float) -> Timeline:
    deadline = time.time() + timeout
    while True:
        t = Timeline.of(audit, policy, since)
        if getattr(t, until) is not None or time.time() > deadline:
            return t
        time.sleep(0.5)


def run_fault(key: str, out_dir: Path, *, baseline: float = 40.0, settle: float = 20.0, quiet: float = 600.0,
              timeout: float = 150.0, hooks: bool = True, launcher: str = "torchrun", neighbour: bool = False,
              log=print) -> dict:
    """One fault on a fresh testbed (see the module docstring). ``hooks``: the job
    serves reflexarc's framework hooks and reports its steps through them;
    without, it is unmodified and every signal comes from the node. ``launcher``:
    how its ranks are started (``topology.launches``). ``neighbour``: a second,
    unmodified job shares the node (Slurm's environment and cgroups, its own
    store, one rank in rank 0's namespace: on two cores two full jobs starve
    each other's loaders); the fault hits the first job only, and
    ``result["neighbour"]`` says what the controller did about the second: its
    targets' states and any action on it."""
    spec = FAULTS[key]
    baseline = max(baseline, spec.get("baseline", 0.0))
    out_dir = Path(out_dir) / f"fault-{key}{'' if hooks else '-unmodified'}{'-neighbour' if neighbour else ''}"
    out_dir.mkdir(parents=True, exist_ok=True)
    result = {"fault": key, "name": spec["name"], "policy": spec["policy"], "hooks": hooks, "launcher": launcher}
    if not os.path.exists(ALERTMANAGER):
        raise procs.TestbedError(f"{ALERTMANAGER} is missing: the testbed alerts a real Alertmanager "
                                 "(Debian package prometheus-alertmanager; make setup installs it)")
    with Testbed(ranks=2) as tb, Alertmanager() as am:
        result["testbed"] = tb.prefix
        job = tb.start_job(duration=None, hooks=hooks, launcher=launcher, **spec.get("job", {}))
        # the neighbour: one rank, no collective on the bottleneck, a light loader beside the job's
        other = (tb.start_job(duration=None, hooks=False, launcher="slurm", store_url=tb.second_store(), ranks=1,
                              batch=8, compute_ms=150.0) if neighbour else None)
        policy_dir = out_dir / "policies"
        fill_selectors(POLICY_DIR, policy_dir, fills(tb, job))
        state_dir = out_dir / "state"
        _first_steps(job)
        if other is not None:
            _first_steps(other)
        before = snapshot(tb, job, state_dir)
        sys_root = two_node_sys(out_dir / "sys") if spec.get("two_nodes") else None
        ctl = ControllerProcess(policy_dir, state_dir, tb.hook_dir, sys_root=sys_root, alertmanager_url=am.url)
        log(f"[{key}] {spec['name']}: controller starting")
        try:
            result["armed_s"] = round(ctl.start(), 1)
            log(f"[{key}] armed in {result['armed_s']} s; baseline {baseline:.0f} s")
            waited = quiet if key == "e" else baseline
            time.sleep(waited)
            waited += _mid_epoch(job)
            fault = spec["make"](tb, job)
            onset = fault.start()
            log(f"[{key}] fault on")
            if spec["policy"]:
                t = _wait_for(ctl.audit_path, spec["policy"], onset, spec["ends"], spec.get("timeout", timeout))
                time.sleep(settle)
            else:
                t = Timeline()
            end = time.time()
            fault.stop()
            usage = ctl.usage()
            firing = _alertnames(am) if spec["ends"] else []      # the controller resolves them as it stops
        finally:
            summary = ctl.stop()
        after = _settled(tb, job, state_dir, before)
        result.update(_result(job, t, onset, end, waited, usage, summary, diff(before, after), ctl.audit_path,
                              firing, _alertnames(am) if spec["ends"] else []))
        (out_dir / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in job.steps()))
        if other is not None:
            result["neighbour"] = _neighbour(other, ctl.audit_path, onset, end, waited)
            other.stop()
        result["job"] = job.name
        if spec.get("job", {}).get("checkpoint_every"):
            result["jitter"] = jitter(job, onset - waited, end)
        job.stop()
    result["report"] = write_report(ctl.audit_path, out_dir / "report")
    (out_dir / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    return result


def jitter(job, t0: float, t1: float) -> dict:
    """The job's own pauses between ``t0`` and ``t1``: epoch turns (a new
    iterator's first step), checkpoints, and the step-time spread they make."""
    steps = job.steps(t0, t1, rank=0)
    ms = sorted(s["step_ms"] for s in steps)
    pauses = [c["ms"] for c in job.checkpoints(rank=0) if t0 <= c["ts"] <= t1]
    return {"steps": len(steps),
            "epoch_turns": sum(1 for s in steps if s["step"] % EPOCH_STEPS == 1),
            "checkpoints": len(pauses),
            "checkpoint_ms": {"median": round(statistics.median(pauses), 1), "max": round(max(pauses), 1)}
            if pauses else None,
            "step_ms": {"median": round(statistics.median(ms), 1), "p99": round(ms[int(0.99 * (len(ms) - 1))], 1),
                        "max": round(ms[-1], 1)} if ms else None}


def _neighbour(other, audit: Path, onset: float, end: float, waited: float) -> dict:
    """What the controller did about the job the fault did not hit: the states
    each of its rule targets went through, its actions, and its step times."""
    states: dict[str, list[str]] = {}
    actions = []
    for r in records(audit):
        target = r.get("target") or ""
        if other.name not in target:
            continue
        if r["kind"] == "transition":
            states.setdefault(f"{r.get('policy')}/{r.get('rule')}/{target}", []).append(r["to"])
        elif r["kind"] == "action":
            actions.append({k: r.get(k) for k in ("ts", "policy", "actuator", "outcome", "target")})
    evaluated = sorted({f"{r.get('policy')}/{r.get('rule')}/{r.get('target')}" for r in records(audit)
                        if r["kind"] == "eval" and other.name in (r.get("target") or "")})
    return {"job": other.name, "targets_evaluated": evaluated, "transitions": states, "actions": actions,
            "steps_ms": {"baseline": phase(other, onset - waited + 10, onset), "fault": phase(other, onset + 1, end)}}


def _mid_epoch(job, epoch_steps: int = EPOCH_STEPS, timeout: float = 60.0) -> float:
    """Wait until rank 0 is half-way through an epoch, so that a fault starts
    away from the batch waits every epoch start brings (a default DataLoader
    forks new workers then); returns the seconds waited."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        steps = job.steps(since=t0 - 5.0, rank=0)
        if steps and abs(steps[-1]["step"] % epoch_steps - epoch_steps // 2) <= 2:
            break
        time.sleep(0.05)
    return time.time() - t0


def _first_steps(job, timeout: float = 60.0) -> None:
    """Wait until every rank has reported a step (and so its DataLoader settings)."""
    deadline = time.time() + timeout
    while not all(job.steps(rank=r.rank) for r in job.ranks):
        if time.time() > deadline:
            raise procs.TestbedError(f"no step from every rank within {timeout:.0f} s")
        time.sleep(0.5)


def _settled(tb, job, state_dir, before: dict, timeout: float = 15.0) -> dict:
    """The state after the controller stopped, once the job has applied what the
    shutdown rollback queued for its next step boundary (or after ``timeout``)."""
    deadline = time.time() + timeout
    while True:
        after = snapshot(tb, job, state_dir)
        if not diff(before, after) or time.time() > deadline:
            return after
        time.sleep(1.0)


def _alertnames(am) -> list[str]:
    return [a["labels"].get("alertname", "") for a in am.alerts()]


def _result(job, t: Timeline, onset, end, waited, usage, summary, state_diff, audit, firing, after_stop) -> dict:
    remediated_from = t.verified
    acted = t.applied or end
    steps = {"baseline": phase(job, onset - waited + 10, onset),
             "fault": phase(job, onset + 1, end, started_before=acted),   # begun before the action took effect
             "remediated": phase(job, remediated_from, end) if remediated_from else None}
    base = (steps["baseline"] or {}).get("median")
    ratios = {k: round(v["median"] / base, 2) for k, v in steps.items() if v and base and k != "baseline"}
    actions = [r for r in records(audit) if r["kind"] == "action"]
    return {
        "onset": onset,
        "after_onset_s": t.after(onset),
        "actions": t.actions,
        "actions_total": len(actions),
        "steps_ms": steps,
        "ratio_to_baseline": ratios,
        "controller": {"cpu_pct": round(usage.cpu_pct, 2), "rss_mb": round(usage.rss_mb, 1),
                       "peak_rss_mb": round(usage.peak_rss_mb, 1), "wall_s": round(usage.wall_s, 1)},
        "end_summary": {k: summary.get(k) for k in ("transitions", "actions", "applied", "reverted", "errors")},
        "alerts_at_receiver": firing,              # active in Alertmanager before the controller stopped
        "alerts_after_stop": after_stop,           # active after it stopped: resolved at stop, none
        "state_diff": state_diff,
        "audit": str(audit),
    }


def machine() -> dict:
    return {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "node": platform.node()}


def format_actions(results: list[dict]) -> str:
    """What each fault's policy did, one line per action (seconds after the
    fault's onset), to print beside the table: ``a nccl-congestion-dscp: dscp
    applied +6.6 s: dscp CS1 (8) on r0:eth0 for tcp ports 443-443, ...``."""
    lines = []
    for r in results:
        head = f"{r['fault']} {r['policy'] or r['name']}"
        if not r["actions"]:
            lines.append(f"{head}: no action")
        for a in r["actions"]:
            text = f"{head}: {a['actuator']} {a['outcome']} {a['ts'] - r['onset']:+.1f} s"
            text += f": {a['summary']}" if a.get("summary") else ""
            lines.append(text + (f" (error: {a['error']})" if a.get("error") else ""))
    return "\n".join(lines)


def format_table(results: list[dict]) -> str:
    """The closed-loop figures as docs/benchmarks.md shows them."""
    def ms(r, phase):
        p = r["steps_ms"].get(phase)
        return f"{p['median']:.0f} ({p['p10']:.0f}-{p['p90']:.0f})" if p else "-"

    def sec(r, step):
        v = r["after_onset_s"].get(step)
        return f"{v:.1f}" if v is not None else "-"

    head = ("fault", "baseline ms", "fault ms", "remediated ms", "detected s", "applied s", "verified s",
            "rolled back s", "alerted s", "ctl CPU %", "ctl RSS MB", "state diff")
    rows = [head] + [(f"{r['fault']} {r['name']}{'' if r.get('hooks', True) else ', unmodified job'}"
                      f"{', beside a second job' if 'neighbour' in r else ''}", ms(r, "baseline"), ms(r, "fault"), ms(r, "remediated"),
                      sec(r, "pending"), sec(r, "applied"), sec(r, "verified"), sec(r, "rolled_back"),
                      sec(r, "alerted"), f"{r['controller']['cpu_pct']:.1f}", f"{r['controller']['rss_mb']:.0f}",
                      str(len(r["state_diff"])) + " lines") for r in results]
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
