"""Reaction time and step time lost, side by side in one run: reflexarc against
the pipeline a user would build instead (Prometheus, an alerting rule,
Alertmanager, a webhook running a script), on the testbed's fault a.

One testbed and one training job serve every trial. The fault is the closed
loop's fault a: a bulk upload from rank 0 shares the switch's bottleneck and
the job's steps slow down ~2.3x; the remedy is the same DSCP CS1 demotion
whoever applies it. Trials interleave (each round rotates the order), and
each fault starts at a random phase of its pipeline's longest interval
(seeded: ``--seed``), then half-way through an epoch:

- ``reflexarc``: ``reflexarc run --mode enforce`` with the shipped policy
  (probe -> rule -> action); onset -> applied from its audit log.
- ``defaults`` / ``production`` / ``tightest``: a ``reflexarc run --mode
  dry-run`` exports the same signals (the same probes, the same hook reads),
  a real Prometheus scrapes them and evaluates the policy's rule in PromQL with
  the same ``for``, a real Alertmanager routes the alert to a webhook receiver,
  which runs ``reflexarc act dscp ...`` (see
  ``reflexarc.simulations.testbed.conventional``); onset -> the script returned.

Per trial: the seconds from onset to detected (the rule's condition first held:
reflexarc's ``pending``, Prometheus's ``activeAt``), to decided (reflexarc's
rule fired; the alert reached the receiver), to applied; and the step time
lost, the sum over rank 0's steps from onset to recovery of (step time - the
healthy median), recovery being the first of five steps after the action whose
median is back within 15 % of it.
A trial whose action did not come within its timeout counts its loss up to the
timeout and is marked ``censored``. Per setting: median, min and max; ratios of
the medians to reflexarc's, also beyond each one's ``for`` (the PromQL rule's
5 s; the policy's own, none beside its change point).

Example::

    python bench/reaction.py                      # 3 rounds, all four: ~30 min
    python bench/reaction.py --quick              # reflexarc and tightest once: ~4 min
    python bench/reaction.py --settings reflexarc,defaults --rounds 5

Writes ``bench/results/reaction.json`` (``--out``) and prints the table of docs/benchmarks.md.
Overhead: the testbed's (two ranks, a store, a switch) plus three Prometheus
and Alertmanager pairs; a run needs the machine to itself.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from contextlib import ExitStack
from datetime import datetime
from pathlib import Path

from reflexarc.simulations.testbed.alertmanager import Alertmanager
from reflexarc.simulations.testbed.closed_loop import _first_steps, _mid_epoch, fills, machine
from reflexarc.simulations.testbed.controller import CLI, POLICY_DIR, ControllerProcess, Timeline, fill_selectors
from reflexarc.simulations.testbed.conventional import SETTINGS, Pipeline, Receiver, rule_of, rules_yaml
from reflexarc.simulations.testbed.faults import BulkUpload
from reflexarc.simulations.testbed.local_server import free_port
from reflexarc.simulations.testbed.procs import TestbedError
from reflexarc.simulations.testbed.topology import Testbed

ROOT = Path(__file__).resolve().parent.parent
ORDER = ("reflexarc", "tightest", "production", "defaults")
TIMEOUT_S = {"reflexarc": 60.0, "tightest": 60.0, "production": 180.0, "defaults": 420.0}
RECOVERED = 1.15          # within 15 % of the healthy median
RECOVERY_STEPS = 5
LEARN_S = 65.0            # a fresh controller learns its step-time baseline from 60 s of history


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _median_ms(job, t0: float, t1: float) -> float | None:
    values = [s["step_ms"] for s in job.steps(t0, t1, rank=0)]
    return statistics.median(values) if values else None


def _healthy(job, base_ms: float, timeout: float = 90.0) -> None:
    """Wait until rank 0's last 5 s of steps are back within 15 % of the healthy median."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        m = _median_ms(job, time.time() - 5.0, time.time())
        if m is not None and m <= RECOVERED * base_ms:
            return
        time.sleep(1.0)
    raise TestbedError(f"the job's steps did not come back within {timeout:.0f} s of the last fault")


def _recovery(job, applied: float, base_ms: float, timeout: float = 45.0) -> float | None:
    """When the steps came back after ``applied``: the start of the first step within
    15 % of the healthy median that begins five steps whose median is too (an
    epoch start's batch wait may sit among them); None after ``timeout``."""
    deadline = applied + timeout
    limit = RECOVERED * base_ms
    while True:
        steps = job.steps(since=applied, rank=0)
        for i in range(len(steps) - RECOVERY_STEPS + 1):
            run = [s["step_ms"] for s in steps[i:i + RECOVERY_STEPS]]
            if run[0] <= limit and statistics.median(run) <= limit:
                return steps[i]["ts"] - steps[i]["step_ms"] / 1000.0
        if time.time() > deadline:
            return None
        time.sleep(0.5)


def _lost_s(job, onset: float, until: float, base_ms: float) -> float:
    """Step time lost from onset to ``until``: the sum of (step - healthy median) over
    rank 0's steps that ended in between (the one under way at onset included), in seconds."""
    return round(sum(s["step_ms"] - base_ms for s in job.steps(onset, until + 1e-6, rank=0)) / 1000.0, 2)


def _since(onset: float, ts: float | None) -> float | None:
    return round(ts - onset, 2) if ts is not None else None


class Bench:
    def __init__(self, tb: Testbed, job, out_dir: Path, exporter: str, am_url: str, seed: int,
                 interval: float, arrivals: float) -> None:
        self.tb, self.job, self.out_dir, self.exporter, self.am_url = tb, job, out_dir, exporter, am_url
        self.policy_dir = out_dir / "policies"
        fill_selectors(POLICY_DIR, self.policy_dir, fills(tb, job))
        self.rule = rule_of(self.policy_dir / "nccl-congestion-dscp.yaml")
        self.exporting: ControllerProcess | None = None
        self.base_ms = 0.0
        self.rng = random.Random(seed)
        self.interval, self.arrivals = interval, arrivals

    def controller(self, mode: str, name: str) -> ControllerProcess:
        return ControllerProcess(self.policy_dir, self.out_dir / name, self.tb.hook_dir, mode=mode, metrics_addr=self.exporter, alertmanager_url=self.am_url,
                                 interval=self.interval, arrivals=self.arrivals)

    def export(self) -> None:
        """The dry-run controller that exports the signals to the conventional pipelines."""
        self.exporting = self.controller("dry-run", "state-export")
        self.exporting.start()

    def act_argv(self) -> list[str]:
        """The receiver's script: the policy's DSCP action by hand, on rank 0's port."""
        params = {**self.rule.action, "interfaces": [self.tb.rank_iface(0)], "netns": self.tb.rank_netns(0)}
        texts = [f"{k}={','.join(map(str, v)) if isinstance(v, list) else v}" for k, v in params.items()]
        return [*CLI, "--state-dir", str(self.out_dir / "state-script"), "act", "dscp", *texts, "--mode", "enforce"]

    def undo_script(self) -> None:
        r = subprocess.run([*CLI, "--state-dir", str(self.out_dir / "state-script"), "rollback", "--all"],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise TestbedError(f"rollback of the script's change failed: {r.stderr.strip()}")

    def _fault(self, phase_s: float) -> tuple[BulkUpload, float]:
        """The fault, started at a random phase of the pipeline's cycle (its longest
        interval): waits that end on an evaluation would otherwise lock every
        onset to one phase."""
        _healthy(self.job, self.base_ms)
        time.sleep(self.rng.uniform(0.0, phase_s))
        _mid_epoch(self.job)
        fault = BulkUpload(self.tb)
        return fault, fault.start()

    def _close(self, trial: dict, onset: float, applied: float | None, timeout: float) -> dict:
        recovered = _recovery(self.job, applied, self.base_ms) if applied else None
        until = recovered or (applied + 45.0 if applied else onset + timeout)
        trial.update(recovered_s=_since(onset, recovered), lost_s=_lost_s(self.job, onset, until, self.base_ms),
                     censored=applied is None or recovered is None,
                     fault_median_ms=_median_ms(self.job, onset + 1.0, applied or onset + timeout))
        return trial

    def reflexarc(self, timeout: float, n: int) -> dict:
        self.exporting.stop()
        ctl = self.controller("enforce", f"state-reflexarc-{n}")
        trial = {"armed_s": round(ctl.start(), 2)}
        try:
            time.sleep(LEARN_S)
            fault, onset = self._fault(self.interval)
            deadline = time.time() + timeout
            t = Timeline.of(ctl.audit_path, self.rule.policy, onset)
            while t.applied is None and time.time() < deadline:
                time.sleep(0.2)
                t = Timeline.of(ctl.audit_path, self.rule.policy, onset)
            trial.update(onset=onset, detected_s=_since(onset, t.pending), decided_s=_since(onset, t.fired),
                         applied_s=_since(onset, t.applied))
            self._close(trial, onset, t.applied, timeout)
            fault.stop()
            usage = ctl.usage()
            trial["controller_cpu_pct"] = round(usage.cpu_pct, 2)
        finally:
            ctl.stop()
            self.export()
        return trial

    def conventional(self, pipeline: Pipeline, receiver: Receiver, timeout: float, episode: int) -> dict:
        if not pipeline.quiet(timeout=420.0):     # before the new episode: it must not see the last fault
            raise TestbedError(f"{pipeline.setting.name}: the previous fault still held the rule after 420 s")
        pipeline.episode(episode)
        receiver.arm(pipeline.setting.name, episode)
        fault, onset = self._fault(max(pipeline.setting.scrape_s, pipeline.setting.eval_s))
        try:
            d = receiver.wait(timeout)
            trial = {"onset": onset, "detected_s": _since(onset, pipeline.active_at()),
                     "decided_s": _since(onset, d.delivered), "applied_s": _since(onset, d.applied),
                     "script_s": d.script_s, "error": d.error}
            self._close(trial, onset, d.applied, timeout)
        finally:
            receiver.disarm()
            fault.stop()
            self.undo_script()
        return trial


def _stats(values: list[float]) -> dict | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return {"median": round(statistics.median(values), 2), "min": round(min(values), 2),
            "max": round(max(values), 2), "n": len(values)}


def summarize(trials: list[dict], for_s: float, own_for_s: float) -> tuple[dict, dict]:
    """Per setting; ``beyond_for_s`` is after its own ``for``: the PromQL rule's
    ``for_s``, reflexarc's policy's ``own_for_s``."""
    summary = {}
    for name in dict.fromkeys(t["setting"] for t in trials):
        mine = [t for t in trials if t["setting"] == name]
        applied = [t["applied_s"] for t in mine]
        wait = own_for_s if name == "reflexarc" else for_s
        summary[name] = {"applied_s": _stats(applied),
                         "beyond_for_s": _stats([a - wait for a in applied if a is not None]),
                         "detected_s": _stats([t.get("detected_s") for t in mine]),
                         "decided_s": _stats([t.get("decided_s") for t in mine]),
                         "lost_s": _stats([t["lost_s"] for t in mine]),
                         "trials": len(mine), "censored": sum(1 for t in mine if t["censored"])}
    ratios = {}
    ours = summary.get("reflexarc")
    for name, s in summary.items():
        if name == "reflexarc" or not ours:
            continue
        ratios[name] = {key.removesuffix("_s"): (round(s[key]["median"] / ours[key]["median"], 1)
                                                 if s[key] and ours[key] and ours[key]["median"] > 0 else None)
                        for key in ("applied_s", "beyond_for_s", "lost_s")}
    return summary, ratios


def table(doc: dict) -> str:
    """The table of docs/benchmarks.md: per pipeline, median (min-max) seconds after onset and the
    ratio of the medians to reflexarc's."""
    def cell(st: dict | None) -> str:
        return f"{st['median']:.1f} ({st['min']:.1f}-{st['max']:.1f})" if st else "-"

    rows = [("pipeline", "scrape / eval / group_wait", "detected s", "decided s", "applied s", "x",
             f"applied beyond its for ({doc.get('policy_for_s', doc['for_s']):g} s / {doc['for_s']:g} s)", "x",
             "step time lost s", "x")]
    for name, st in doc["summary"].items():
        cfg = doc["settings"].get(name)
        knobs = (f"{cfg['scrape_s']:g} s / {cfg['eval_s']:g} s / {cfg['group_wait_s']:g} s" if cfg
                 else f"probe -> rule, {doc['interval_s']:g} s ticks"
                 + (f", arrivals {doc['arrivals_s']:g} s" if doc.get("arrivals_s") else ""))
        r = doc["ratios"].get(name, {})
        ratio = lambda key: ("1" if name == "reflexarc" else f"{r[key]:g}" if r.get(key) is not None  # noqa: E731
                             else "-")
        rows.append((name, knobs, cell(st["detected_s"]), cell(st["decided_s"]), cell(st["applied_s"]),
                     ratio("applied"), cell(st["beyond_for_s"]), ratio("beyond_for"), cell(st["lost_s"]),
                     ratio("lost")))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    line = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    return "\n".join([line(rows[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows[1:])])


def run(args) -> dict:
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    unknown = [s for s in settings if s not in ORDER]
    if unknown or "reflexarc" not in settings:
        raise TestbedError(f"--settings: {', '.join(unknown) or 'reflexarc is missing'}; known: {', '.join(ORDER)}")
    out_dir = Path(args.work)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    trials: list[dict] = []
    with Testbed(ranks=2) as tb, Alertmanager() as am, ExitStack() as stack:
        job = tb.start_job(duration=None)
        _first_steps(job)
        bench = Bench(tb, job, out_dir, f"127.0.0.1:{free_port()}", am.url, args.seed,
                      args.interval, args.arrivals)
        bench.export()
        time.sleep(args.settle)
        bench.base_ms = _median_ms(job, time.time() - args.settle + 5.0, time.time())
        log(f"testbed {tb.prefix} up; healthy step {bench.base_ms:.0f} ms")
        receiver = stack.enter_context(Receiver(bench.act_argv()))
        rule_args = {"iface": tb.rank_iface(0), "netns": tb.rank_netns(0), "job": job.name,
                     "base_step_s": bench.base_ms / 1000.0}
        pipelines = {name: stack.enter_context(Pipeline(
            SETTINGS[name], bench.exporter, receiver,
            lambda episode, setting=SETTINGS[name]: rules_yaml(bench.rule, setting, episode=episode, **rule_args)))
            for name in settings if name != "reflexarc"}
        up_at = time.time()
        stack.callback(lambda: bench.exporting.stop())
        for name, p in pipelines.items():     # kept beside the audit logs
            stack.callback(lambda n=name, p=p: (out_dir / f"{n}.log").write_text(
                f"== prometheus\n{p.prom.log()}\n== alertmanager\n{p.am.log()}"))
        order = [s for s in ORDER if s in settings]
        for rnd in range(args.rounds):
            for name in order[rnd % len(order):] + order[:rnd % len(order)]:
                log(f"round {rnd + 1}/{args.rounds}: {name}")
                if name == "reflexarc":
                    trial = bench.reflexarc(TIMEOUT_S[name], len(trials))
                else:
                    p = pipelines[name]
                    time.sleep(max(0.0, up_at + p.setting.window_s(bench.rule.window_s) + p.setting.scrape_s
                                   - time.time()))                  # its first window holds samples
                    trial = bench.conventional(p, receiver, TIMEOUT_S[name], episode=len(trials) + 1)
                trial = {"round": rnd, "setting": name, **trial}
                trials.append(trial)
                log(f"  applied {trial['applied_s']} s after onset, {trial['lost_s']} s of step time lost")
        (out_dir / "steps.jsonl").write_text("".join(json.dumps(s) + "\n" for s in job.steps()))
        job.stop()
    summary, ratios = summarize(trials, bench.rule.for_s, bench.rule.policy_for_s)
    return {"machine": {**machine(), "loadavg_at_end": os.getloadavg()},
            "method": __doc__.split("\n\n")[1].replace("\n", " "),
            "started": datetime.fromtimestamp(started).isoformat(timespec="seconds"),
            "wall_s": round(time.time() - started, 1), "quick": args.quick, "rounds": args.rounds,
            "fault": "a: bulk upload on the bottleneck, DSCP CS1 demotion", "policy": bench.rule.policy,
            "for_s": bench.rule.for_s, "policy_for_s": bench.rule.policy_for_s, "window_s": bench.rule.window_s,
            "interval_s": args.interval, "arrivals_s": args.arrivals,
            "seed": args.seed,
            "healthy_step_ms": round(bench.base_ms, 1), "testbed": tb.prefix,
            "settings": {name: SETTINGS[name].describe() | {"window_s": SETTINGS[name].window_s(bench.rule.window_s)}
                         for name in settings if name != "reflexarc"},
            "summary": summary, "ratios": ratios, "trials": trials}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--settings", default=",".join(ORDER), help="pipelines to run (default %(default)s)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default %(default)s)")
    ap.add_argument("--settle", type=float, default=20.0, help="seconds of healthy steps before the first trial")
    ap.add_argument("--interval", type=float, default=1.0,
                    help="the controller's tick, for reflexarc and the exporter alike (default %(default)s s)")
    ap.add_argument("--arrivals", type=float, default=0.2,
                    help="how often the controllers take the step signals between two ticks, as run --arrivals "
                         "(default %(default)s s; 0: only on the tick)")
    ap.add_argument("--seed", type=int, default=11, help="of the onsets' random phases (default %(default)s)")
    ap.add_argument("--quick", action="store_true", help="reflexarc and tightest, one round (proves the harness)")
    ap.add_argument("--out", default=str(ROOT / "bench/results/reaction.json"))
    ap.add_argument("--work", default=str(ROOT / "out/reaction"), help="policies, audit logs, journals")
    args = ap.parse_args(argv)
    if args.quick:
        args.settings, args.rounds = "reflexarc,tightest", 1
    try:
        doc = run(args)
    except KeyboardInterrupt:
        print("error: interrupted; the testbed was torn down", file=sys.stderr)
        return 130
    except (TestbedError, RuntimeError, OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"machine: {doc['machine']}")
    print(table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
