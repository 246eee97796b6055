"""rdma_qp deep probe: attach-point fallback, latency per QP through uprobes,
clean detach. (The NIC counters are the light tier's: test_probe_rdma_counters.py.)

This is a stand-in: there is no RDMA NIC here (and no kprobes). The test builds
``fixtures/fakeverbs.c``, a library with ``ibv_post_send``/``ibv_poll_cq`` that
follow the libibverbs ABI where the probe reads it and complete each work
request after a per-QP delay, and drives it through ctypes from this process.
"""
from __future__ import annotations

import time
from pathlib import Path

from conftest import require_bpf
from fixtures.fakeverbs import POLL, POST, FakeVerbs

from reflexarc.bpf.probe import DEGRADED, STOPPED, UNSUPPORTED
from reflexarc.bpf.rdma_qp import RdmaQp
from reflexarc.controller.signals.catalogue import CATALOGUE
import pytest

pytestmark = [pytest.mark.kernel]

SLOW_US, FAST_US, ITERATIONS = 400, 2, 200


def latency(out: list) -> dict:
    return {(l["dev"], l["qp"], l["quantile"]): v for n, l, v in out if n == "rdma_qp_completion_latency_us"}


def test_uprobes_measure_and_separate_qp_latency(tmp_path):
    require_bpf()
    verbs = FakeVerbs.build(tmp_path)
    slow = verbs.create_qp("fake_0", qp_num=17, delay_us=SLOW_US)
    fast = verbs.create_qp("fake_1", qp_num=34, delay_us=FAST_US)
    original = verbs.first_byte(POST)
    probe = RdmaQp(uprobes=verbs.uprobes(), sys_root=str(tmp_path / "sys"), node="n1")
    try:
        status = probe.start()
        # No kprobes and no RDMA device here: usable, but degraded, saying why.
        assert status.state == DEGRADED, status
        assert "without kprobes" in status.reason
        assert f"no RDMA device under {tmp_path}/sys/class/infiniband" in status.reason
        assert status.attach_points == [f"uprobe:{verbs.path}:{POST}", f"uprobe:{verbs.path}:{POLL}",
                                        f"uretprobe:{verbs.path}:{POLL}"]
        assert verbs.first_byte(POST) == 0xCC

        t0 = time.monotonic()
        probe.collect(t0)
        polls = verbs.run(slow, ITERATIONS) + verbs.run(fast, ITERATIONS)
        t1 = time.monotonic()
        out = probe.collect(t1)
    finally:
        probe.stop()

    lat = latency(out)
    assert {(dev, qp) for dev, qp, _ in lat} == {("fake_0", "17"), ("fake_1", "34")}, out
    slow_p50, fast_p50 = lat[("fake_0", "17", "0.5")], lat[("fake_1", "34", "0.5")]
    assert SLOW_US / 2 <= slow_p50 <= SLOW_US * 2, slow_p50
    assert fast_p50 < 50, fast_p50            # below the field's 50 us alert threshold
    assert slow_p50 > 10 * fast_p50
    assert lat[("fake_0", "17", "0.99")] >= slow_p50

    # The tier's cost: one event per post, two per poll (entry and return).
    rate = [v for n, _, v in out if n == "deep_probe_events_per_s"]
    assert len(rate) == 1 and round(rate[0] * (t1 - t0)) == 2 * ITERATIONS + 2 * polls
    assert probe.events_per_s == rate[0]
    for name, labels, _ in out:
        assert set(labels) <= set(CATALOGUE[name].labels), (name, labels)

    # Detached: the breakpoint is gone from the live mapping and no uprobe is left.
    assert probe.status.state == STOPPED and probe.bpf is None
    assert verbs.first_byte(POST) == original != 0xCC
    assert str(verbs.path) not in Path("/sys/kernel/tracing/uprobe_events").read_text()


def test_unresolvable_symbols_and_no_device_is_unsupported(tmp_path):
    require_bpf()
    verbs = FakeVerbs.build(tmp_path)
    probe = RdmaQp(uprobes=[f"{verbs.path}:{POST}", f"{verbs.path}:mlx5_poll_cq"],
                   sys_root=str(tmp_path / "none"))
    status = probe.start()
    assert status.state == UNSUPPORTED and probe.bpf is None
    assert f"symbol mlx5_poll_cq not in {verbs.path}" in status.reason
    assert "kprobes" in status.reason and "no RDMA device" in status.reason
    assert verbs.first_byte(POST) != 0xCC
