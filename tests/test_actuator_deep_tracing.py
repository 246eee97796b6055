"""deep_tracing actuator through the real ProbeManager deep tier.

There is no RDMA NIC here: the deep probe's uprobes go on ``fixtures/fakeverbs.c``,
a stand-in verbs library the test builds and drives through ctypes (see
test_probe_rdma_qp.py). Whether a uprobe is installed is read from the live
mapping: the kernel puts int3 (0xcc) on the probed instruction.
"""
from __future__ import annotations

import pytest
from conftest import require_bpf
from fixtures.fakeverbs import POST, FakeVerbs

from reflexarc.actuators.base import PermanentActuatorError, Target
from reflexarc.actuators.deep_tracing import DeepTracingActuator
from reflexarc.actuators.registry import ActuatorConfig, build_registry
from reflexarc.bpf.manager import ProbeManager
from reflexarc.bpf.probe import Selection

pytestmark = [pytest.mark.kernel]

INT3 = 0xCC


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def setup(tmp_path):
    require_bpf()
    verbs = FakeVerbs.build(tmp_path)
    clock = Clock()
    tier = ProbeManager(Selection(), probes=[], node="n1", clock=clock)
    yield verbs, clock, tier
    tier.stop()


def test_apply_attaches_and_revert_detaches(setup):
    verbs, clock, tier = setup
    act = DeepTracingActuator(tier, clock=clock)
    target = Target({"job": "llama", "rank": "0"})
    change = act.plan(target, {"ttl": 30, "uprobes": verbs.uprobes()})
    assert change.before == {"active": False}
    assert change.after == {"active": True, "probe": "rdma_qp", "ttl": 30.0, "expires_at": 1030.0,
                            "uprobes": verbs.uprobes()}
    assert verbs.first_byte(POST) != INT3        # planning touches nothing

    act.apply(change)
    assert verbs.first_byte(POST) == INT3
    assert act.read_current(target) == {"active": True, "probe": "rdma_qp", "expires_at": 1030.0}
    qp = verbs.create_qp("fake_0", qp_num=7, delay_us=300)
    verbs.run(qp, 50)
    samples = tier.collect(clock())
    p50 = [v for n, l, v in samples
           if n == "rdma_qp_completion_latency_us" and l["qp"] == "7" and l["quantile"] == "0.5"]
    assert len(p50) == 1 and 150 <= p50[0] <= 600

    act.revert(change)
    assert verbs.first_byte(POST) != INT3
    assert act.read_current(target) == {"active": False}
    act.revert(change)                           # already off: fine


def test_ttl_expiry_switches_off(setup):
    verbs, clock, tier = setup
    act = DeepTracingActuator(tier, clock=clock)
    change = act.plan(Target({"job": "llama"}), {"ttl": 10, "uprobes": verbs.uprobes()})
    act.apply(change)
    clock.now += 9
    assert tier.expire_deep(clock()) == []
    assert verbs.first_byte(POST) == INT3
    clock.now += 2
    assert tier.expire_deep(clock()) == [act.session_key(change.target)]
    assert verbs.first_byte(POST) != INT3
    assert act.read_current(change.target) == {"active": False}
    act.revert(change)                           # rollback after expiry: nothing left to do


def test_refuses_beyond_concurrency_and_overhead_budget(setup):
    verbs, clock, tier = setup
    params = {"ttl": 60, "uprobes": verbs.uprobes()}
    first, second = Target({"job": "a"}), Target({"job": "b"})
    act = DeepTracingActuator(tier, max_concurrent=1, clock=clock)
    act.apply(act.plan(first, params))
    with pytest.raises(PermanentActuatorError, match="at most 1 at once"):
        act.plan(second, params)
    # The same target again is an extension, not a second session.
    act.apply(act.plan(first, params))
    assert list(tier.active_deep()) == [act.session_key(first)]

    # Two may run, but not while the first already costs more than the budget.
    budgeted = DeepTracingActuator(tier, max_concurrent=2, max_events_per_s=1000, clock=clock)
    qp = verbs.create_qp("fake_0", qp_num=9, delay_us=0)
    tier.collect(clock())
    verbs.run(qp, 5000)
    clock.now += 1
    tier.collect(clock())
    assert tier.active_deep()[act.session_key(first)]["events_per_s"] >= 10_000
    with pytest.raises(PermanentActuatorError, match="overhead budget"):
        budgeted.plan(second, params)
    assert len(tier.active_deep()) == 1


def test_bad_parameters_and_unavailable_probe_are_permanent(setup):
    verbs, clock, tier = setup
    act = DeepTracingActuator(tier, clock=clock)
    target = Target({"job": "llama"})
    for params, message in (({}, "needs a 'ttl'"), ({"ttl": 0}, "positive"),
                            ({"ttl": 5, "uprobes": ["nocolon"]}, "two '<library>:<symbol>'"),
                            ({"ttl": 5, "probe": "gpu_submit"}, "unknown deep probe")):
        with pytest.raises(PermanentActuatorError, match=message):
            act.plan(target, params)
    change = act.plan(target, {"ttl": 5, "uprobes": [f"{verbs.path}:{POST}", f"{verbs.path}:no_such_fn"]})
    with pytest.raises(PermanentActuatorError, match="no_such_fn not in"):
        act.apply(change)
    assert tier.active_deep() == {}
    with pytest.raises(PermanentActuatorError, match="no deep probe tier"):
        DeepTracingActuator(None).plan(target, {"ttl": 5})


def test_registry_builds_it_with_the_configured_tier(setup):
    _, _, tier = setup
    act = build_registry(ActuatorConfig(deep_tier=tier)).get("deep_tracing")
    assert isinstance(act, DeepTracingActuator) and act.deep_tier is tier
    assert act.read_current(Target({"job": "x"})) == {"active": False}
