"""What the fleet budget costs and how it behaves under faults, against a real
3-member etcd cluster on loopback (``simulations/testbed/etcd.py``).

Measured, each with the budget's real client (``controller/fleet/``):

1. **Added latency per acting step**: ``take`` then ``give_back`` of one slot,
   what an enforce change adds before its intent and after its close; six
   nodes registered, the pool free. Two limits: ``--fleet-max-nodes`` alone
   (take: a read and a transaction) and with ``--fleet-max-percent`` too (one
   more read, the fleet's size). Median and p99; the target is p99 <= 50 ms.
   The same for a policy with a rollout (``rollout_admit_and_report``): its
   admission before the change (the rollout's state read, the node's seat
   written once) and its verify outcome reported after (one compare-and-swap).
2. **etcd requests per node per minute**, idle (only the lease renewals) and
   acting: six nodes, a 2-slot pool, each node acting as a controller does
   (takes a slot, holds it ``--hold`` s, gives it back, asks again after 1 s;
   refused, it asks again after ``BUDGET_RETRY_S``).
3. **The leader SIGKILLed while six nodes act**: the takes and give-backs
   across the failover (their slowest), refusals, and whether the slots in
   etcd are still exactly those the nodes hold.
4. **A SIGKILLed holder**: a child process takes a slot and is SIGKILLed; how
   long until etcd frees the slot, against the TTL (the lease was renewed at
   most TTL/3 before the kill).
5. **Refusal latency with the store unreachable**: every member stopped (a
   connection refused at once) and every member frozen (SIGSTOP: connections
   accepted, never answered, each request waits out its timeout).

Usage (from the repository)::

    .venv/bin/python bench/fleet.py            # ~4 min; writes bench/results/fleet.json
    .venv/bin/python bench/fleet.py --quick    # ~1 min; writes $TMPDIR/reflexarc-fleet-quick.json

Overhead of the benchmark itself: three etcd members and the nodes' threads in
this process (a few % of a core while idle).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from provenance import code_version, interrupted

from reflexarc.controller.engine.lifecycle import BUDGET_RETRY_S
from reflexarc.core.outcomes import Outcome
from reflexarc.controller.fleet.budget import FleetBudget, Refused
from reflexarc.controller.fleet.rollout import FleetRollout
from reflexarc.core.rollout import RolloutSpec, Stage
from reflexarc.controller.fleet.store import EtcdStore
from reflexarc.simulations.testbed.etcd import EtcdCluster

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "fleet.json"
TARGET_P99_MS = 50.0
NODES = 6
SLOTS = 2
POOL = "policy:bench"
HOLDER_CHILD = """
import sys, time
from reflexarc.controller.fleet.budget import FleetBudget
from reflexarc.controller.fleet.store import EtcdStore
b = FleetBudget(EtcdStore(sys.argv[1].split(",")), "doomed", max_nodes=1, ttl=int(sys.argv[2]), prefix=sys.argv[3])
b.start()
print(b.take("policy:bench", "h"), flush=True)
time.sleep(3600)
"""


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def quantiles(values: list[float]) -> dict:
    """Median, p99 and max of ``values`` (ms), and how many."""
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))]
    return {"n": len(ordered), "median": round(statistics.median(ordered), 2), "p99": round(p99, 2),
            "max": round(ordered[-1], 2)}


def ms(seconds: float) -> float:
    return seconds * 1000.0


def fleet(etcd: EtcdCluster, prefix: str, n: int = NODES, **limits) -> list[FleetBudget]:
    """``n`` started budgets on ``prefix``, the default TTL (15 s)."""
    nodes = [FleetBudget(EtcdStore(etcd.endpoints), f"node-{i}", prefix=prefix, **limits) for i in range(n)]
    for node in nodes:
        node.start()
    return nodes


def stop_all(nodes: list[FleetBudget]) -> None:
    for node in nodes:
        node.stop()


# --- 1. added latency ----------------------------------------------------------------------
def added_latency(etcd: EtcdCluster, steps: int) -> dict:
    out = {}
    for name, limits in (("max_nodes", {"max_nodes": SLOTS}),
                         ("max_nodes_and_percent", {"max_nodes": SLOTS, "max_percent": 34})):
        nodes = fleet(etcd, f"/bench-latency-{name}", **limits)
        node = nodes[0]
        take, give, both = [], [], []
        before = node.store.requests
        for i in range(steps):
            t0 = time.perf_counter()
            node.take(POOL, f"r/pid={i}")
            t1 = time.perf_counter()
            node.give_back(f"r/pid={i}")
            t2 = time.perf_counter()
            take.append(ms(t1 - t0))
            give.append(ms(t2 - t1))
            both.append(ms(t2 - t0))
        out[name] = {"take_ms": quantiles(take), "give_back_ms": quantiles(give), "step_ms": quantiles(both),
                     "requests_per_step": round((node.store.requests - before) / steps, 2)}
        say(f"added latency ({name}): take+give_back median {out[name]['step_ms']['median']} ms, "
            f"p99 {out[name]['step_ms']['p99']} ms, {out[name]['requests_per_step']} requests")
        stop_all(nodes)
    nodes = fleet(etcd, "/bench-latency-rollout")          # no limit: the lease a rollout's seats hold
    rollout = FleetRollout(nodes[0])
    spec = RolloutSpec(stages=(Stage(nodes=NODES),), promote_after=10 ** 6, window=10)   # never widens
    admit, report, both = [], [], []
    before = nodes[0].store.requests
    for i in range(steps):
        t0 = time.perf_counter()
        rollout.admit("p", spec)
        t1 = time.perf_counter()
        rollout.report("p", spec, True, f"rank={i}")
        t2 = time.perf_counter()
        admit.append(ms(t1 - t0))
        report.append(ms(t2 - t1))
        both.append(ms(t2 - t0))
    out["rollout_admit_and_report"] = {"admit_ms": quantiles(admit), "report_ms": quantiles(report),
                                       "step_ms": quantiles(both),
                                       "requests_per_step": round((nodes[0].store.requests - before) / steps, 2)}
    say(f"added latency (rollout): admit+report median {out['rollout_admit_and_report']['step_ms']['median']} ms, "
        f"p99 {out['rollout_admit_and_report']['step_ms']['p99']} ms")
    stop_all(nodes)
    return out


# --- 2. requests per node per minute, and 3. the leader killed ------------------------------
class Actor(threading.Thread):
    """A node acting as a controller does: take, hold, give back, pause; refused:
    ask again after ``BUDGET_RETRY_S``. Every take and give-back timed and logged."""

    def __init__(self, budget: FleetBudget, hold: float, stop: threading.Event, log: list, lock) -> None:
        super().__init__(daemon=True)
        self.budget, self.hold, self.stop_event, self.log, self.lock = budget, hold, stop, log, lock
        self.served = self.refused = 0
        self.reasons: dict[str, int] = {}

    def _note(self, what: str, t0: float, t1: float, extra: str = "") -> None:
        with self.lock:
            self.log.append((what, self.budget.node, t0, t1, extra))

    def run(self) -> None:
        n = 0
        while not self.stop_event.is_set():
            n += 1
            t0 = time.monotonic()
            try:
                self.budget.take(POOL, f"r/{n}")
            except Refused as refused:
                self._note(Outcome.REFUSED, t0, time.monotonic(), refused.reason)
                self.refused += 1
                self.reasons[refused.reason] = self.reasons.get(refused.reason, 0) + 1
                self.stop_event.wait(BUDGET_RETRY_S)
                continue
            self._note("take", t0, time.monotonic())
            self.served += 1
            self.stop_event.wait(self.hold)
            t0 = time.monotonic()
            self.budget.give_back(f"r/{n}")
            self._note("give_back", t0, time.monotonic())
            self.stop_event.wait(1.0)


def requests_per_minute(nodes: list[FleetBudget], seconds: float, before: list[int]) -> dict:
    per_node = [(n.store.requests - b) * 60.0 / seconds for n, b in zip(nodes, before)]
    return {"median": round(statistics.median(per_node), 1), "max": round(max(per_node), 1),
            "seconds": seconds}


def most_at_once(log: list) -> int:
    """The most slots held at once as the nodes saw them: from each take's
    answer to its give-back's request (the tests check the bound itself)."""
    events = sorted([(t1, 1) for what, _, _, t1, _ in log if what == "take"]
                    + [(t0, -1) for what, _, t0, _, _ in log if what == "give_back"])
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def idle_and_acting(etcd: EtcdCluster, idle_s: float, acting_s: float, hold: float, kill_leader: bool) -> dict:
    nodes = fleet(etcd, "/bench-traffic", max_nodes=SLOTS)
    before = [n.store.requests for n in nodes]
    time.sleep(idle_s)
    idle = requests_per_minute(nodes, idle_s, before)
    say(f"idle: {idle['median']} etcd requests per node per minute (TTL 15 s: a renewal every 5 s)")
    stop, lock, log = threading.Event(), threading.Lock(), []
    actors = [Actor(n, hold, stop, log, lock) for n in nodes]
    before = [n.store.requests for n in nodes]
    began = time.monotonic()
    for actor in actors:
        actor.start()
    fault = None
    if kill_leader:
        time.sleep(acting_s / 3)
        leader = etcd.leader()
        killed = time.monotonic()
        etcd.kill(leader)
        say(f"leader m{leader} SIGKILLed while acting")
        time.sleep(acting_s - (time.monotonic() - began))
        after = [e for e in log if e[2] >= killed - 0.001 or e[3] >= killed]
        held = {n.node for n in nodes if n.held()}
        in_etcd = {json.loads(e.value)["node"] for e in EtcdStore(etcd.endpoints).prefix(
            f"/bench-traffic/pools/{POOL}/slots/")}
        fault = {"member_killed": f"m{leader}",
                 "slowest_take_ms_after_kill": round(max((ms(t1 - t0) for w, _, t0, t1, _ in after if w == "take"),
                                                         default=0.0), 1),
                 "slowest_give_back_ms_after_kill": round(max((ms(t1 - t0) for w, _, t0, t1, _ in after
                                                               if w == "give_back"), default=0.0), 1),
                 "refusals_after_kill": sorted({x for w, _, _, _, x in after if w == Outcome.REFUSED}),
                 "takes_after_kill": sum(1 for w, *_ in after if w == "take"),
                 "slots_in_etcd_match_the_holders": held == in_etcd,
                 "most_held_at_once": most_at_once(log)}
    else:
        time.sleep(acting_s)
    seconds = time.monotonic() - began
    stop.set()
    for actor in actors:
        actor.join(timeout=30)
    acting = requests_per_minute(nodes, seconds, before)
    acting.update({"served": [a.served for a in actors], "refusals": [a.refused for a in actors],
                   "refusal_reasons": {k: sum(a.reasons.get(k, 0) for a in actors)
                                       for k in {r for a in actors for r in a.reasons}},
                   "hold_s": hold, "most_held_at_once": most_at_once(log)})
    say(f"acting: {acting['median']} etcd requests per node per minute; served {acting['served']}, "
        f"most held at once {acting['most_held_at_once']} (limit {SLOTS})")
    stop_all(nodes)
    return {"idle": idle, "acting": acting, "leader_killed": fault}


# --- 4. a killed holder ---------------------------------------------------------------------
def killed_holder(etcd: EtcdCluster, ttl: int, trials: int) -> dict:
    observer = EtcdStore(etcd.endpoints)
    freed = []
    for trial in range(trials):
        prefix = f"/bench-killed-{ttl}-{trial}"
        child = subprocess.Popen([sys.executable, "-c", HOLDER_CHILD, ",".join(etcd.endpoints), str(ttl), prefix],
                                 stdout=subprocess.PIPE, text=True)
        try:
            key = child.stdout.readline().strip()
            if not key:
                raise RuntimeError("the holder child took no slot")
            time.sleep(ttl / 3 * (trial % 3) / 3 + 0.2)    # kills at different points of the renewal cycle
            os.kill(child.pid, signal.SIGKILL)
            killed = time.monotonic()
        finally:
            child.wait()
        while observer.count(key):
            if time.monotonic() - killed > ttl + 30:
                raise RuntimeError(f"{key} not freed {ttl + 30} s after its holder was killed")
            time.sleep(0.05)
        freed.append(time.monotonic() - killed)
    result = {"ttl_s": ttl, "freed_after_s": [round(f, 2) for f in freed],
              "worst_over_ttl": round(max(freed) / ttl, 3)}
    say(f"killed holder, TTL {ttl} s: slot freed after {result['freed_after_s']} s")
    return result


# --- 5. the store unreachable -----------------------------------------------------------------
def refusal_latency(etcd: EtcdCluster, trials: int, frozen_trials: int) -> dict:
    node = FleetBudget(EtcdStore(etcd.endpoints), "cut-off", max_nodes=SLOTS, prefix="/bench-refusal")
    node.start()
    out = {}
    try:
        for how, count in (("stopped", trials), ("frozen", frozen_trials)):
            if how == "stopped":
                etcd.stop()
            else:
                etcd.start()
                for proc in etcd.procs:
                    os.kill(proc.pid, signal.SIGSTOP)
            latencies, reasons = [], set()
            for i in range(count):
                t0 = time.perf_counter()
                try:
                    node.take(f"policy:p{i}", "h")
                    reasons.add("taken")
                except Refused as refused:
                    reasons.add(refused.reason)
                latencies.append(ms(time.perf_counter() - t0))
            out[how] = {"refusal_ms": quantiles(latencies), "outcomes": sorted(reasons)}
            say(f"store {how}: refused ({', '.join(sorted(reasons))}) after median "
                f"{out[how]['refusal_ms']['median']} ms, p99 {out[how]['refusal_ms']['p99']} ms")
    finally:
        for proc in etcd.procs:
            if proc is not None and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
        node.stop()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="~1 min proof run: fewer steps, shorter phases")
    ap.add_argument("--out", help="results file (default bench/results/fleet.json; "
                                  "--quick: $TMPDIR/reflexarc-fleet-quick.json)")
    args = ap.parse_args()
    p = ({"steps": 50, "idle_s": 10.0, "acting_s": 25.0, "hold_s": 2.0, "killed_trials": 1, "killed_ttls": [5],
          "refusals": 10, "frozen_refusals": 1} if args.quick else
         {"steps": 500, "idle_s": 60.0, "acting_s": 90.0, "hold_s": 3.0, "killed_trials": 3, "killed_ttls": [5, 15],
          "refusals": 50, "frozen_refusals": 3})
    out = Path(args.out) if args.out else (Path(tempfile.gettempdir()) / "reflexarc-fleet-quick.json"
                                           if args.quick else RESULTS)
    signal.signal(signal.SIGTERM, interrupted)
    load_at_start, began = os.getloadavg(), time.time()
    etcd_version = subprocess.run(["etcd", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    with EtcdCluster() as etcd:
        latency = added_latency(etcd, p["steps"])
        traffic = idle_and_acting(etcd, p["idle_s"], p["acting_s"], p["hold_s"], kill_leader=True)
        etcd.start()                       # the killed member back
    with EtcdCluster() as etcd:
        killed = [killed_holder(etcd, ttl, p["killed_trials"]) for ttl in p["killed_ttls"]]
        refusal = refusal_latency(etcd, p["refusals"], p["frozen_refusals"])
    worst = max(v["step_ms"]["p99"] for v in latency.values())
    result = {
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "etcd": etcd_version, "loadavg_at_start": load_at_start, "loadavg_at_end": os.getloadavg()},
        "parameters": {"quick": args.quick, "nodes": NODES, "slots": SLOTS, "budget_retry_s": BUDGET_RETRY_S,
                       "members": 3, "transport": "loopback", **p},
        "code": code_version(),
        "started": datetime.datetime.fromtimestamp(began, datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_s": round(time.time() - began, 1),
        "added_latency": latency,
        "requests_per_node_per_minute": {"idle": traffic["idle"], "acting": traffic["acting"]},
        "faults": {"leader_killed_while_acting": traffic["leader_killed"], "holder_killed": killed,
                   "store_unreachable": refusal},
        "targets": {f"added p99 <= {TARGET_P99_MS:g} ms": worst <= TARGET_P99_MS},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    say(f"added p99 {worst} ms: target {'met' if worst <= TARGET_P99_MS else 'NOT met'}; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
