"""The fleet budget against a real etcd cluster (three members on loopback,
``simulations/testbed/etcd.py``) and real ``reflexarc run`` controllers.

Each controller is a node of its own (its state directory, its node name, its
fixture ``/proc/sys`` tree that the ``sysctl`` actuator writes, so the machine
is left alone) replaying slow steps, so every one of them wants to act at once
under an enforcing policy whose pool has 2 slots. What is checked comes from
what the nodes wrote: their journals (when each change was journaled, applied
and closed), their audits (the refusals) and the keys left in etcd.

- six controllers, the etcd leader SIGKILLed mid-run: never more than 2 changes
  on the fleet at any instant, every node served;
- a SIGKILLed controller that holds a slot: the slot is free within its TTL;
- the whole store out of reach: refused, audited, counted, nothing applied,
  and the change is made once the store answers again;
- one slot per node in a pool; the queue serves nodes in the order they asked;
  a slot given back while the store is away is freed when it returns.

The limit's arithmetic and the endpoints' parsing need no server (fast tier).
"""
from __future__ import annotations

import json
import math
import shutil
import signal
import time
import urllib.request

import pytest
from prometheus_client import CollectorRegistry

from conftest import require, run_cli, wait_until
from fleet_nodes import TTL, Node, fresh_prefix, one_error_at, reason_of
from reflexarc.controller.fleet.budget import FleetBudget, Refused
from reflexarc.controller.fleet.store import ClientTls, EtcdStore, StoreError, StoreUnavailable, parse_endpoint
from reflexarc.controller.policy.loader import validate_paths
from reflexarc.controller.runtime.exporter import FleetCollector
from reflexarc.core.budget import BudgetSpec
from reflexarc.core.outcomes import Outcome
from reflexarc.simulations.testbed.etcd import EtcdCluster
from reflexarc.simulations.testbed.tls import make_certificates
from reflexarc.simulations.testbed.local_server import free_port

SLOTS = 2
POLICY = """\
policies:
  - name: fleet-test
    mode: enforce
    selector: {{match: {{job: j}}}}
    rules:
      - name: slow-steps
        by: [rank]
        when: {{signal: step_time_ms, agg: max, window: 2s, op: ">", threshold: 300}}
        actions:
          - actuator: sysctl
            params: {{key: kernel.numa_balancing, value: "0"}}
        rollback: {rollback}
        cooldown: 1s
"""
BRIEF = "{on: [ttl, shutdown], ttl: 2s}"         # each node acts for ~2 s, then gives its slot back
HOLD = "{on: [shutdown]}"                        # the change stays until the controller stops
ADOPT = "{on: [clear], on_restart: adopt}"       # the steps stay slow: it stays, and a restart adopts it
LIMIT = ("--fleet-max-nodes", str(SLOTS))


def _policy(rollback: str) -> str:
    return POLICY.format(rollback=rollback)



def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The most intervals open at one instant (one that ends as another starts: not both)."""
    events = sorted([(a, 1) for a, _ in intervals] + [(b, -1) for _, b in intervals], key=lambda e: (e[0], e[1]))
    now = peak = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def slots(store: EtcdStore, prefix: str) -> list:
    return store.prefix(f"{prefix}/pools/policy:fleet-test/slots/")


# --- six controllers, two slots, the leader killed ---------------------------------------------------
@pytest.mark.slow
def test_six_controllers_share_two_slots_through_a_leader_kill(tmp_path, etcd):
    prefix = fresh_prefix()
    nodes = [Node(tmp_path, f"node-{i}", etcd.endpoints, prefix, _policy(BRIEF), LIMIT) for i in range(6)]
    observer = EtcdStore(etcd.endpoints)
    try:
        wait_until("two nodes acting", lambda: sum(n.applied() > 0 for n in nodes) >= 2
                   or [n for n in nodes if not n.alive()], timeout=90)
        assert all(n.alive() for n in nodes), [n.stderr() for n in nodes if not n.alive()]
        leader = etcd.leader()
        assert leader is not None
        killed_at = time.time()
        etcd.kill(leader)                                   # mid-run: slots held, nodes waiting
        wait_until("every node served", lambda: all(n.applied() for n in nodes)
                   or [n for n in nodes if not n.alive()], timeout=150)
        assert all(n.alive() for n in nodes), [n.stderr() for n in nodes if not n.alive()]
        after = [t for n in nodes for t, _ in n.intervals() if t > killed_at]
        assert after, "no slot was taken after the leader was killed"
    finally:
        codes = [n.stop() for n in nodes]
    assert codes == [0] * 6, [n.stderr() for n in nodes]
    everything = [iv for n in nodes for iv in n.intervals()]
    assert all(b < math.inf for _, b in everything), "a change left open after the controllers stopped"
    assert most_at_once(everything) <= SLOTS, sorted(everything)
    assert all(n.knob.read_text().strip() == "1" for n in nodes), "every change reverted at the end"
    refused = [r for n in nodes for r in n.audit()
               if r.get("kind") == "action" and r.get("outcome") == Outcome.REFUSED]
    assert refused and all("budget-full" in r["error"] for r in refused), \
        [r["error"] for r in refused if "budget-full" not in r["error"]]
    assert slots(observer, prefix) == [], "every slot given back, the leases revoked"
    assert observer.count(f"{prefix}/nodes/") == 0


def test_the_overlap_count_can_fail():
    assert most_at_once([(0, 2), (1, 3), (1.5, 4)]) == 3
    assert most_at_once([(0, 1), (1, 2), (2, 3)]) == 1


# --- a holder SIGKILLed ------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_killed_holders_slot_is_freed_within_its_ttl(tmp_path, etcd):
    prefix = fresh_prefix()
    node = Node(tmp_path, "holder", etcd.endpoints, prefix, _policy(HOLD), LIMIT)
    observer = EtcdStore(etcd.endpoints)
    try:
        wait_until("the change applied", lambda: node.applied() or not node.alive(), timeout=60)
        assert node.alive(), node.stderr()
        (slot,) = slots(observer, prefix)
        assert json.loads(slot.value)["node"] == "holder"
        node.proc.send_signal(signal.SIGKILL)
        node.proc.wait()
        killed = time.monotonic()
        # the lease was renewed at most TTL/3 before the kill; etcd checks expiry every 0.5 s and
        # commits the revoke through raft: the deadline is the TTL and that
        wait_until("the slot freed", lambda: not slots(observer, prefix), timeout=TTL + 3, every=0.1)
        freed = time.monotonic() - killed
    finally:
        node.stop()
    assert observer.count(f"{prefix}/nodes/holder") == 0, "the node key went with its lease"
    assert node.knob.read_text().strip() == "0", "the killed node's change is still on it (its journal says so)"
    other = FleetBudget(EtcdStore(etcd.endpoints), "other", max_nodes=1, ttl=TTL, prefix=prefix)
    other.start()
    try:
        assert other.take("policy:fleet-test", "h").endswith("/slots/0"), "the freed slot can be taken"
    finally:
        other.stop()
    print(f"slot freed {freed:.2f} s after the SIGKILL (TTL {TTL} s)")


# --- the store unreachable ---------------------------------------------------------------------------
def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return response.read().decode()


def _sample(text: str, series: str) -> float | None:
    """The value of ``series`` (name and labels as exposed) in a scrape; None when absent."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.split()[-1])
    return None


def _refused_count(text: str, reason: str) -> float:
    return _sample(text, f'reflexarc_budget_refused_total{{reason="{reason}"}}') or 0.0


@pytest.mark.slow
def test_the_store_out_of_reach_refuses_audits_counts_and_applies_nothing(tmp_path, etcd):
    prefix = fresh_prefix()
    etcd.stop()                                           # every member down: nothing answers
    port = free_port()
    node = Node(tmp_path, "cut-off", etcd.endpoints, prefix, _policy(HOLD),
                LIMIT + ("--metrics-addr", f"127.0.0.1:{port}"))
    try:
        wait_until("a refusal audited", lambda: [r for r in node.audit() if r.get("outcome") == Outcome.REFUSED]
                   or not node.alive(), timeout=60)
        assert node.alive(), node.stderr()
        counted = wait_until("the refusal counted", lambda: _refused_count(_scrape(port), "store-unreachable"),
                             timeout=30)
        assert counted >= 1
        cut_off = _scrape(port)
        assert _sample(cut_off, "reflexarc_fleet_registered") == 0.0, "the dashboard sees the node unregistered"
        assert 'reflexarc_fleet_slots_held{' not in cut_off
        assert node.knob.read_text().strip() == "1", "nothing applied"
        assert node.journal() == [], "nothing journaled: the slot comes before the intent"
        (first, *_) = [r for r in node.audit() if r.get("outcome") == Outcome.REFUSED]
        assert first["mode"] == "enforce" and first["refusal"] == "store-unreachable", first
        assert "store-unreachable" in first["error"], first
        moves = [(r["from"], r["to"], r["trigger"]) for r in node.audit() if r.get("kind") == "transition"]
        assert ("acting", "firing", "refused") in moves, moves
        etcd.start()                                       # the store is back: the next try gets a slot
        wait_until("the change applied once the store answers", lambda: node.applied() or not node.alive(),
                   timeout=60)
        assert node.knob.read_text().strip() == "0"
        assert len(slots(EtcdStore(etcd.endpoints), prefix)) == 1
        back = _scrape(port)
        assert _sample(back, "reflexarc_fleet_registered") == 1.0
        assert _sample(back, 'reflexarc_fleet_slots_held{pool="policy:fleet-test"}') == 1.0
    finally:
        assert node.stop() == 0, node.stderr()
    assert node.knob.read_text().strip() == "1", "reverted at the stop"
    assert slots(EtcdStore(etcd.endpoints), prefix) == []


@pytest.mark.slow
def test_a_change_adopted_at_a_restart_takes_a_slot_again(tmp_path, etcd):
    """A controller SIGKILLed with its change applied: its slot frees with its
    lease and another node takes the pool's only slot. Restarted, it adopts
    its change, finds the pool full, says so once (log, audit) and takes the
    slot, past the queue, as soon as it is free: what is applied is counted."""
    prefix = fresh_prefix()
    observer = EtcdStore(etcd.endpoints)
    one = ("--fleet-max-nodes", "1")
    adopter = Node(tmp_path, "adopter", etcd.endpoints, prefix, _policy(ADOPT), one)
    other = None
    try:
        wait_until("the change applied", lambda: adopter.applied() or not adopter.alive(), timeout=60)
        adopter.proc.send_signal(signal.SIGKILL)
        adopter.proc.wait()
        wait_until("its slot freed with its lease", lambda: slots(observer, prefix) == [], timeout=TTL + 10)
        other = Node(tmp_path, "other", etcd.endpoints, prefix, _policy(HOLD), one)
        wait_until("the other node holding the slot", lambda: other.applied() or not other.alive(), timeout=60)
        adopter.start()
        unslotted = wait_until("the adopted change audited without a slot", lambda: [
            r for r in adopter.audit() if r.get("kind") == "limit" and "adopted without a slot" in r.get("note", "")]
            or not adopter.alive(), timeout=60)
        assert adopter.alive(), adopter.stderr()
        assert len(unslotted) == 1 and "budget-full" in unslotted[0]["note"], unslotted
        assert "adopted at the start, has no slot" in adopter.stderr()
        assert adopter.knob.read_text().strip() == "0", "adopted: still applied"
        assert other.stop() == 0, other.stderr()                    # reverted, its slot given back
        wait_until("the adopter holding the slot", lambda: [json.loads(e.value)["node"]
                                                           for e in slots(observer, prefix)] == ["adopter"],
                   timeout=30)
        time.sleep(6)                                               # passes of its housekeeping: said once
        assert len([r for r in adopter.audit() if "adopted without a slot" in r.get("note", "")]) == 1
    finally:
        codes = [adopter.stop()] + ([other.stop()] if other is not None else [])
    assert codes[0] == 0, adopter.stderr()
    assert adopter.knob.read_text().strip() == "0", "left applied at the stop, for the next start to adopt"
    (kept,) = slots(observer, prefix)
    assert json.loads(kept.value)["node"] == "adopter" and "parked" in json.loads(kept.value), kept
    assert "stay taken for up to 3600 s" in adopter.stderr(), "the stop says it keeps the slot"


# --- the budget itself, in this process --------------------------------------------------------------
@pytest.fixture
def budgets(etcd):
    """``make(node, **limits)``: started budgets on one prefix, stopped at the end."""
    prefix, made = fresh_prefix(), []

    def make(node: str, **limits) -> FleetBudget:
        b = FleetBudget(EtcdStore(etcd.endpoints), node, ttl=TTL, prefix=prefix, **limits)
        b.start()
        made.append(b)
        return b
    make.prefix = prefix
    yield make
    for b in made:
        b.stop()



@pytest.mark.slow
def test_a_stop_that_leaves_changes_applied_keeps_their_slots_until_the_node_is_back(etcd, budgets):
    """Stopped with a change still applied, a node keeps its slot (moved to a
    lease of its own), and only that one; started again it takes it back past
    the queue; one it does not take back is freed once its adopted changes
    hold theirs, and one whose node never returns frees with its lease."""
    observer = EtcdStore(etcd.endpoints)

    def held(pool: str) -> list[dict]:
        return [json.loads(e.value) | {"lease": e.lease}
                for e in observer.prefix(f"{budgets.prefix}/pools/{pool}/slots/")]

    a = budgets("a", max_nodes=1, park_ttl=8)
    key = a.take("p", "r/pid=1")
    a.take("q", "r2/pid=2")
    a.stop(keep={"r/pid=1", "not-held"})
    (parked,) = held("p")
    assert parked["node"] == "a" and "parked" in parked and parked["lease"], parked
    assert held("q") == [], "a slot of a change undone at the stop is freed"
    b = budgets("b", max_nodes=1, park_ttl=8)
    assert reason_of(lambda: b.take("p", "x")) == "budget-full", "the parked slot still counts"
    status = run_cli("fleet", "status", "--fleet-etcd", ",".join(etcd.endpoints), "--fleet-prefix", budgets.prefix)
    assert "pool p: held by a (slot 0, parked at " in status.stdout, status.stdout
    again = budgets("a", max_nodes=1, park_ttl=8)
    assert again.take("p", "r/pid=1", ahead=True) == key, "its own slot back, past the node waiting for it"
    (back,) = held("p")
    assert back["lease"] == again.lease and "parked" not in back and back["holder"] == "r/pid=1", back
    assert again.drop_parked() == 0
    again.stop(keep={"r/pid=1"})
    third = budgets("a", max_nodes=1, park_ttl=8)       # its change was reverted at this start: nothing takes it
    assert third.drop_parked() == 1 and held("p") == [], "freed at once, not after the park lease"
    b.take("p", "x")
    b.stop(keep={"x"})                                  # a node that never comes back
    assert [h["node"] for h in held("p")] == ["b"]
    wait_until("the parked slot freed with its lease", lambda: held("p") == [], timeout=8 + 10)


@pytest.mark.slow
def test_a_share_of_the_jobs_own_nodes_counts_the_nodes_that_registered_the_job(etcd, budgets):
    """``of: job``: 50 % of the nodes that run the job, not of the fleet.
    Two nodes run llama and two run another job: llama's pool has one slot
    (of the fleet's four it would have two). A node that no longer runs the
    job unregisters it at its next renewal, and a job seen on no node yet
    counts the node that asks."""
    observer = EtcdStore(etcd.endpoints)
    on = {"a": ["llama"], "b": ["llama"], "c": ["other"], "d": ["other"]}
    later = [0.0]                                        # seconds added to node b's clock
    nodes = {n: budgets(n, jobs=lambda n=n: on[n], wall=lambda: time.time() + later[0]) for n in "abcd"}
    for b in nodes.values():
        b.renew()                                          # the keep-alive registers the jobs it runs
    assert observer.count(f"{budgets.prefix}/jobs/llama/") == 2
    of_job = BudgetSpec(max_percent=50, per="job", of="job")
    llama = of_job.pool("p", {"job": "llama"})
    nodes["a"].take(llama, "r/pid=1", of_job)
    assert reason_of(lambda: nodes["b"].take(llama, "r/pid=2", of_job)) == "budget-full"
    assert "50 % of the 2 node(s) running the job" in nodes["b"].why_full
    of_fleet = BudgetSpec(max_percent=50, per="job")
    nodes["b"].take(of_fleet.pool("q", {"job": "llama"}), "r/pid=2", of_fleet)   # 50 % of 4: two slots
    on["b"] = []
    nodes["b"].renew()
    assert [e.key.rsplit("/", 1)[1] for e in observer.prefix(f"{budgets.prefix}/jobs/llama/")] == ["a", "b"], \
        "b still holds a slot of llama's pool q: it still counts"
    nodes["b"].give_back("r/pid=2")
    nodes["b"].renew()
    assert observer.count(f"{budgets.prefix}/jobs/llama/") == 2, "b asked for a slot of llama's: it waits for one"
    later[0] = 30.0                                      # past WAITER_FRESH_S: it stopped asking
    nodes["b"].renew()
    assert [e.key.rsplit("/", 1)[1] for e in observer.prefix(f"{budgets.prefix}/jobs/llama/")] == ["a"]
    fresh = of_job.pool("p", {"job": "new job/x"})
    assert nodes["c"].take(fresh, "r/pid=3", of_job)
    assert observer.count(f"{budgets.prefix}/jobs/new%20job%2Fx/") == 1, "the asking node counts itself"
    status = run_cli("fleet", "status", "--fleet-etcd", ",".join(etcd.endpoints), "--fleet-prefix", budgets.prefix)
    assert "job llama: on 1 node(s): a\n" in status.stdout and "job new job/x: on 1 node(s): c" in status.stdout, \
        status.stdout


@pytest.mark.slow
def test_one_slot_per_node_in_a_pool(etcd, budgets):
    a, b, c = (budgets(n, max_nodes=2) for n in "abc")
    observer = EtcdStore(etcd.endpoints)
    pool_slots = f"{budgets.prefix}/pools/p/slots/"
    first = a.take("p", "rule-1/pid=1")
    assert a.take("p", "rule-2/pid=2") == first, "a second holder on the node shares its slot"
    assert observer.count(pool_slots) == 1
    b.take("p", "rule-1/pid=9")
    assert reason_of(lambda: c.take("p", "x")) == "budget-full"
    assert a.held() == {"p": ["rule-1/pid=1", "rule-2/pid=2"]}
    a.give_back("rule-1/pid=1")
    assert observer.count(pool_slots) == 2, "the node still acts through its other holder"
    assert reason_of(lambda: c.take("p", "x")) == "budget-full"
    a.give_back("rule-2/pid=2")
    assert observer.count(pool_slots) == 1 and a.held() == {}
    assert c.take("p", "x") == first, "the waiting node gets the slot given back"
    assert c.take("q", "y").startswith(f"{budgets.prefix}/pools/q/"), "another pool has slots of its own"


@pytest.mark.slow
def test_the_queue_serves_nodes_in_the_order_they_asked(budgets):
    holder, *waiters = (budgets(f"n{i}", max_nodes=1) for i in range(4))
    holder.take("p", "h")
    for w in waiters:
        assert reason_of(lambda: w.take("p", "h")) == "budget-full"
    served = []
    for _ in waiters:
        (current,) = [b for b in (holder, *waiters) if b.held()]
        current.give_back("h")
        for w in reversed(waiters):       # asked in the opposite order: the queue decides, not who asks first
            if w in served or w is current:
                continue
            try:
                w.take("p", "h")
                served.append(w)
                break
            except Refused as refused:
                assert refused.reason == "budget-full"
    assert [w.node for w in served] == ["n1", "n2", "n3"]


@pytest.mark.slow
def test_a_percentage_of_the_live_nodes(budgets):
    nodes = [budgets(f"n{i}", max_percent=50) for i in range(5)]     # ceil(50 % x 5) = 3
    for n in nodes[:3]:
        n.take("p", "h")
    assert reason_of(lambda: nodes[3].take("p", "h")) == "budget-full"
    nodes[4].stop()                                                # 4 live: ceil(2) = 2, 3 held stay held
    assert reason_of(lambda: nodes[3].take("p", "h")) == "budget-full"
    nodes[0].give_back("h")
    assert reason_of(lambda: nodes[3].take("p", "h")) == "budget-full", "2 held: the limit, though slot 2 is above it"
    nodes[1].give_back("h")
    nodes[3].take("p", "h")


@pytest.mark.slow
def test_the_store_away_refuses_and_a_slot_given_back_meanwhile_is_freed_on_its_return(etcd, budgets):
    a = budgets("a", max_nodes=1)
    a.take("p", "applied-before")
    etcd.stop()
    assert reason_of(lambda: a.take("other", "new")) == "store-unreachable", "fail closed"
    assert a.take("p", "second-holder"), "a slot the node holds is shared without asking the store"
    a.give_back("applied-before")
    a.give_back("second-holder")                 # the store is away: freed later
    etcd.start()
    a.renew()
    observer = EtcdStore(etcd.endpoints)
    assert observer.count(f"{budgets.prefix}/pools/p/slots/") == 0
    b = budgets("b", max_nodes=1)
    assert b.take("p", "h")


@pytest.mark.slow
def test_a_lost_lease_registers_again_and_takes_its_slot_back(etcd, budgets):
    a = budgets("a", max_nodes=1)
    key = a.take("p", "h")
    observer = EtcdStore(etcd.endpoints)
    observer.revoke(a.lease)                     # as if it ran out while the store was out of reach
    assert observer.count(key) == 0
    a.renew()
    assert a.lost == 1 and observer.count(key) == 1 and observer.count(a.node_key) == 1
    assert json.loads(observer.prefix(key)[0].value)["node"] == "a"
    observer.revoke(a.lease)                     # again, and a take comes before the next renewal
    assert a.take("q", "h2").startswith(f"{budgets.prefix}/pools/q/"), "registered again, then taken"
    assert a.lost == 2 and observer.count(key) == 1, "the held slot taken back too"
    registry = CollectorRegistry()
    registry.register(FleetCollector(a))
    assert registry.get_sample_value("reflexarc_fleet_lease_lost_total") == 2
    assert registry.get_sample_value("reflexarc_fleet_slots_held", {"pool": "q"}) == 1


@pytest.mark.slow
def test_a_store_with_one_member_down_answers_through_the_others(etcd):
    store = EtcdStore(etcd.endpoints)
    etcd.kill(0)                                 # the first endpoint, where the client starts
    etcd.wait_healthy()
    assert store.grant(TTL) > 0 and store.endpoint != etcd.endpoints[0]
    etcd.stop()
    with pytest.raises(StoreUnavailable):
        store.count("/")


# --- no server --------------------------------------------------------------------------------------
def test_the_limit_is_the_smaller_of_the_count_and_the_share():
    store = EtcdStore(["127.0.0.1:1"])            # never asked
    by_share = FleetBudget(store, "n", max_percent=10)
    assert [by_share.limit(n) for n in (0, 1, 9, 10, 11, 100, 1000)] == [0, 1, 1, 1, 2, 10, 100]
    both = FleetBudget(store, "n", max_nodes=3, max_percent=10)
    assert [both.limit(n) for n in (5, 50, 1000)] == [1, 3, 3]
    assert FleetBudget(store, "n", max_nodes=2).limit(0) == 2
    assert not FleetBudget(store, "n").limited and both.limited
    for bad in ({"max_nodes": 0}, {"max_percent": 0}, {"max_percent": 101}, {"max_nodes": 1, "ttl": 1}):
        with pytest.raises(ValueError):
            FleetBudget(store, "n", **bad)
    with pytest.raises(ValueError):
        FleetBudget(store, "a/b", max_nodes=1)


def test_endpoints_are_urls_or_host_port():
    assert parse_endpoint("10.0.0.1") == ("http", "10.0.0.1", 2379)
    assert parse_endpoint("https://etcd-0.etcd:2379") == ("https", "etcd-0.etcd", 2379)
    assert parse_endpoint("[::1]:12379") == ("http", "::1", 12379)
    for bad in ("", "ftp://x", "http://x:99999", "http://x:2379/v3", "http://:2379"):
        with pytest.raises(ValueError):
            parse_endpoint(bad)


def test_a_budget_needs_a_journal():
    from reflexarc.controller.engine.executor import Executor
    budget = FleetBudget(EtcdStore(["127.0.0.1:1"]), "n", max_nodes=1)
    with pytest.raises(ValueError, match="journal"):
        Executor({}, None, None, budget=budget)


def test_the_store_unreachable_is_typed():
    with pytest.raises(StoreUnavailable, match="no etcd endpoint answers"):
        EtcdStore([f"127.0.0.1:{free_port()}"]).count("/")


# --- a policy's own budget ---------------------------------------------------------------------------
PER_JOB = """\
policies:
  - name: per-job
    mode: enforce
    budget: {max_nodes: 1, per: job}
    rules:
      - name: slow-steps
        by: [job, rank]
        when: {signal: step_time_ms, agg: max, window: 2s, op: ">", threshold: 300}
        actions:
          - actuator: sysctl
            params: {key: kernel.numa_balancing, value: "0"}
        rollback: {on: [shutdown]}
"""


@pytest.mark.slow
def test_a_per_job_budget_gives_each_job_its_own_slots(tmp_path, etcd):
    """Three controllers, a policy of one node at a time per job and no limit
    on the command line: of the two nodes of job x one acts and the other is
    refused; the node of job y acts beside it."""
    prefix = fresh_prefix()
    x1, x2 = (Node(tmp_path, f"x-{i}", etcd.endpoints, prefix, PER_JOB, job="x") for i in (1, 2))
    y1 = Node(tmp_path, "y-1", etcd.endpoints, prefix, PER_JOB, job="y")
    nodes = (x1, x2, y1)
    try:
        wait_until("job y's node and one of job x's acting, the other refused",
                   lambda: y1.applied() and (x1.applied() or x2.applied())
                   and [r for n in (x1, x2) for r in n.audit() if r.get("outcome") == Outcome.REFUSED]
                   or not all(n.alive() for n in nodes), timeout=90)
        assert all(n.alive() for n in nodes), [n.stderr() for n in nodes]
        assert sorted([x1.applied() > 0, x2.applied() > 0]) == [False, True], "one node of job x at a time"
        waiting = x2 if x1.applied() else x1
        refused = [r for r in waiting.audit() if r.get("outcome") == Outcome.REFUSED]
        assert all("budget-full: policy:per-job:job:x:" in r["error"] for r in refused), refused[:2]
        observer = EtcdStore(etcd.endpoints)
        for job in ("x", "y"):
            assert len(observer.prefix(f"{prefix}/pools/policy:per-job:job:{job}/slots/")) == 1
        status = run_cli("--state-dir", str(y1.dir / "state"), "status", check=0).stdout
        assert "fleet: node y-1 registered at http://127.0.0.1:" in status, status
        assert "slots held: policy:per-job:job:y (1 change(s))" in status, status
    finally:
        codes = [n.stop() for n in nodes]
    assert codes == [0, 0, 0], [n.stderr() for n in nodes]
    assert all(n.knob.read_text().strip() == "1" for n in nodes)


@pytest.mark.slow
def test_a_policys_budget_replaces_the_nodes_limit(budgets):
    wide = [budgets(f"n{i}", max_nodes=5) for i in range(3)]      # the node's command line: 5 at once
    one = BudgetSpec(max_nodes=1)
    pool = one.pool("strict", {})
    wide[0].take(pool, "h", one)
    assert reason_of(lambda: wide[1].take(pool, "h", one)) == "budget-full", "the policy's 1, not the node's 5"
    wide[1].take("policy:loose", "h")                             # another policy: the node's limit
    wide[2].take("policy:loose", "h")
    share = BudgetSpec(max_percent=50)                            # ceil(50 % of 3 live nodes) = 2
    for b in wide[:2]:
        b.take("policy:half", "h", share)
    assert reason_of(lambda: wide[2].take("policy:half", "h", share)) == "budget-full"


def test_the_pool_of_a_change():
    per_job = BudgetSpec(max_nodes=2, per="job")
    assert per_job.pool("p", {"job": "llama/7b", "rank": "3"}) == "policy:p:job:llama%2F7b"
    assert per_job.pool("p", {"rank": "3"}, job="from-selector") == "policy:p:job:from-selector"
    assert per_job.pool("p", {"rank": "3"}) == "policy:p:no-job"
    assert BudgetSpec(max_nodes=2).pool("p", {"job": "a"}) == "policy:p"
    assert per_job.describe() == "at most 2 nodes at once per job"
    assert BudgetSpec(max_nodes=3, max_percent=10).limit(100) == 3
    assert BudgetSpec(max_percent=10).limit(45) == 5 and BudgetSpec(max_percent=10).limit(0) == 0


def _budget_policy(budget: str, by: str = "[job, rank]", selector: str = "") -> str:
    return ("policies:\n  - name: p\n    mode: enforce\n" + selector + "    budget: " + budget + "\n    rules:\n"
            "      - name: r\n        by: " + by + "\n        when: {signal: step_time_ms, agg: max, window: 1s, "
            "op: '>', threshold: 1}\n        actions: [{actuator: sysctl, params: {key: vm.swappiness, "
            "value: '1'}}]\n        rollback: {on: [clear]}\n")


@pytest.mark.parametrize("budget, by, column, error", [
    ("{}", "[job]", 13, "a budget needs max_nodes, max_percent or both"),
    ("{max_nodes: 0}", "[job]", 25, "'max_nodes' must be >= 1"),
    ("{max_percent: '150%'}", "[job]", 27, "'max_percent' of 150 % is not > 0 % and <= 100 %"),
    ("{max_nodes: 2, per: jobs}", "[job]", 33, "'per' 'jobs' is not valid"),
    ("{max_nodes: 2, per: job, of: job}", "[job]", 42, "'of: job' is a share of each job's own nodes: it needs"),
    ("{max_percent: 5, of: job}", "[job]", 34, "it needs per: job and max_percent"),
    ("{max_percent: 5, per: job, of: nodes}", "[job]", 44, "'of' 'nodes' is not valid"),
    ("{max_nodes: 1, per: job}", "[rank]", 33, "a per-job budget needs each change's job, and rule(s) r make "
                                               "targets without one"),
])
def test_a_bad_budget_is_an_error_at_its_place(tmp_path, budget, by, column, error):
    path = tmp_path / "p.yaml"
    path.write_text(_budget_policy(budget, by))
    one_error_at(path, f"4:{column}: error:", error)


def test_a_good_budget_loads_and_a_per_job_one_may_take_the_selectors_job(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(_budget_policy("{max_nodes: 1, per: job}", "[rank]", "    selector: {match: {job: llama}}\n"))
    (policy,), diagnostics = validate_paths([str(path)])
    assert not [d for d in diagnostics if d.is_error], diagnostics
    assert policy.budget == BudgetSpec(max_nodes=1, per="job") and policy.selector.one_job() == "llama"
    path.write_text(_budget_policy("{max_percent: '10%'}"))
    (policy,), _ = validate_paths([str(path)])
    assert policy.budget == BudgetSpec(max_percent=10.0)
    path.write_text(_budget_policy("{max_percent: 5, per: job}"))        # of the fleet, in each job's pool
    (policy,), diagnostics = validate_paths([str(path)])
    assert not [d for d in diagnostics if d.is_error] and policy.budget == BudgetSpec(max_percent=5.0, per="job")
    path.write_text(_budget_policy("{max_percent: 25%, per: job, of: job}"))   # of the nodes that run the job
    (policy,), diagnostics = validate_paths([str(path)])
    assert not [d for d in diagnostics if d.is_error], diagnostics
    assert policy.budget == BudgetSpec(max_percent=25.0, per="job", of="job")
    assert policy.budget.describe() == "at most 25 % of the job's nodes at once per job"


def test_an_enforcing_budget_without_a_fleet_store_does_not_start(cli, tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(_budget_policy("{max_nodes: 1}"))
    done = cli("--state-dir", str(tmp_path / "state"), "run", "--no-probes", "--policy", str(path),
               "--mode", "policy", "--duration", "0", check=1)
    assert done.stderr.strip().splitlines()[-1] == (
        "error: policy p enforces under a fleet budget, which is held in etcd: give --fleet-etcd (docs/fleet.md), "
        "or run it in dry-run or alert-only")
    cli("--state-dir", str(tmp_path / "state"), "run", "--no-probes", "--policy", str(path), "--duration", "0",
        check=0)                                                  # dry-run: no store needed


# --- an etcd that serves HTTPS and asks for client certificates --------------------------------------
@pytest.fixture
def tls_etcd(tmp_path):
    """A real 3-member etcd serving its clients over HTTPS with ``--client-cert-auth``, and its certificates."""
    require(shutil.which("etcd") is not None, "etcd (apt:etcd-server, scripts/bootstrap)")
    require(shutil.which("openssl") is not None, "openssl (apt:openssl, scripts/bootstrap)")
    certs = make_certificates(tmp_path / "pki")
    with EtcdCluster(tls=certs) as cluster:
        yield cluster, certs


@pytest.mark.slow
def test_a_node_with_a_client_certificate_acts_through_an_etcd_that_asks_for_one(tmp_path, tls_etcd):
    etcd, certs = tls_etcd
    prefix = fresh_prefix()
    own = ClientTls(str(certs.ca), str(certs.client_cert), str(certs.client_key))
    flags = ("--fleet-ca", str(certs.ca), "--fleet-cert", str(certs.client_cert), "--fleet-key", str(certs.client_key))
    node = Node(tmp_path, "tls-node", etcd.endpoints, prefix, _policy(HOLD), ("--fleet-max-nodes", "1", *flags))
    try:
        wait_until("the change applied", lambda: node.applied() or not node.alive(), timeout=60)
        assert node.alive(), node.stderr()
        assert len(slots(EtcdStore(etcd.endpoints, tls=own), prefix)) == 1, "its slot, read over TLS"
        status = run_cli("fleet", "status", "--fleet-etcd", ",".join(etcd.endpoints), "--fleet-prefix", prefix,
                         *flags, check=0)
        assert "held by tls-node" in status.stdout, status.stdout
    finally:
        assert node.stop() == 0, node.stderr()
    for tls, why in ((ClientTls(str(certs.ca)), "the member refused this node's client certificate"),
                     (ClientTls(None, str(certs.client_cert), str(certs.client_key)), "certificate verify failed")):
        with pytest.raises(StoreError, match=f"TLS: {why}"):
            EtcdStore(etcd.endpoints, tls=tls).count("/")         # refused at once: never retried as "unreachable"
    stranger = ClientTls(str(certs.ca), str(certs.stranger_cert), str(certs.stranger_key))
    with pytest.raises(StoreError, match="TLS: the member refused this node's client certificate"):
        EtcdStore(etcd.endpoints, tls=stranger).count("/")
    bad = run_cli("fleet", "status", "--fleet-etcd", ",".join(etcd.endpoints), "--fleet-ca", str(certs.ca), check=1)
    assert bad.stderr.strip().startswith("error: fleet store: https://127.0.0.1:"), bad.stderr
    assert "TLS: the member refused this node's client certificate" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("args, error", [
    (("--fleet-cert", "{cert}"), "--fleet-cert and --fleet-key go together"),
    (("--fleet-ca", "{missing}"), "--fleet-ca {missing}: no such file or directory"),
    (("--fleet-ca", "{dir}"), "--fleet-ca {dir}: is a directory, not a regular file"),
])
def test_bad_tls_options_are_one_error_line(cli, tmp_path, args, error):
    (tmp_path / "c.pem").write_text("x")
    names = {"cert": str(tmp_path / "c.pem"), "missing": str(tmp_path / "nope.pem"), "dir": str(tmp_path)}
    done = cli("fleet", "status", "--fleet-etcd", "https://127.0.0.1:1", *(a.format(**names) for a in args),
               check=1)
    assert done.stderr.strip().startswith(f"error: {error.format(**names)}"), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    plain = cli("fleet", "status", "--fleet-etcd", "http://127.0.0.1:1", "--fleet-ca", names["cert"], check=1)
    assert plain.stderr.strip() == "error: --fleet-etcd: TLS options with an http:// endpoint: give every " \
                                   "endpoint as https://", plain.stderr
    run = cli("--state-dir", str(tmp_path / "s"), "run", "--no-probes", "--duration", "0", "--fleet-ca",
              names["cert"], check=1)
    assert run.stderr.strip().splitlines()[-1] == "error: --fleet-ca needs --fleet-etcd (the etcd cluster that " \
                                                  "holds the fleet's budget)", run.stderr
