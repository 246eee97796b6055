"""Change-point conditions (``change: {signal, up|down, false_alarms}``): the
CUSUM's threshold from the false-alarm rate, how many shifted points fire it,
that a lone outlier never does, and the rule driven by it in simulated time."""
from __future__ import annotations

import math
import random

import pytest

from engine_fixtures import registry
from reflexarc.controller.engine.bus import SignalBus
from reflexarc.controller.engine.changepoint import MIN_POINTS, ChangeDetector, cusum_limit
from reflexarc.controller.engine.clock import SimClock
from reflexarc.controller.engine.engine import Controller
from reflexarc.controller.policy.loader import validate_paths
from reflexarc.controller.policy.model import (Action, ChangeSpec, Condition, Policy, Rollback, Rule, Selector)

DAY = 86400.0


def change_cond(direction="up", factor=1.3, amount=None, per_day=1.0):
    spec = ChangeSpec(direction, factor, amount, per_day / DAY, f"{direction} {factor}x, {per_day:g}/day")
    return Condition("step_time_ms", "change", 30.0, ">", None, change=spec)


def feed(det, bus, values, start=0.0, learning=True, labels=None):
    """Publish one point a second and update; the update's result per point."""
    out = []
    for i, v in enumerate(values):
        t = start + i
        bus.publish("step_time_ms", labels or {"job": "j"}, v, t)
        out.append(det.update(bus.series("step_time_ms"), t, learning))
    return out


def noisy(n, mean=200.0, sd=0.03, seed=1):
    rng = random.Random(seed)
    return [mean * (1 + rng.gauss(0, sd)) for _ in range(n)]


def test_the_limit_gives_the_declared_run_length():
    """Siegmund's approximation, solved for h, reproduces the run length asked;
    a rarer false alarm needs a higher limit."""
    for k in (0.25, 0.5, 1.0, 3.0):
        for arl0 in (1e3, 86400.0, 1e7):
            h = cusum_limit(k, arl0)
            b = 2 * k * (h + 1.166)
            assert (math.exp(b) - b - 1) / (2 * k * k) == pytest.approx(arl0, rel=1e-6)
    assert cusum_limit(0.5, 86400.0) < cusum_limit(0.5, 86400.0 * 7)


def test_a_doubling_fires_after_the_minimum_points_and_marks_where_it_began():
    bus = SignalBus()
    det = ChangeDetector(change_cond().change, window=600.0, min_history=60.0)
    before = feed(det, bus, noisy(120))
    assert not any(r[3] for r in before)
    after = feed(det, bus, noisy(10, mean=400.0, seed=2), start=120.0)
    fired = [i for i, r in enumerate(after) if r[3]]
    assert fired and fired[0] == MIN_POINTS - 1, [round(r[0], 2) for r in after]
    statistic, limit, reference, ok, extra = after[fired[0]]
    assert reference == pytest.approx(200.0, rel=0.02)
    assert extra["change_at"] == 120.0 and extra["shift"] == pytest.approx(2.0, rel=0.05)


def test_a_lone_outlier_or_two_never_fires_and_noise_for_a_day_stays_quiet():
    """An epoch turn's 3x step, a checkpoint's 10x pause, each alone or in a pair,
    in a day of 3 % noise: no alarm."""
    bus = SignalBus()
    det = ChangeDetector(change_cond().change, window=600.0, min_history=60.0)
    values = noisy(DAY_POINTS := 20_000, seed=3)
    for i in range(500, DAY_POINTS, 997):
        values[i] = 600.0
        if i % 2:
            values[i + 1] = 2000.0
    results = feed(det, bus, values)
    assert not any(r[3] for r in results)


def test_a_shift_smaller_than_declared_does_not_fire():
    """A 10 % rise against a 1.3x rule (1 % noise): below the CUSUM's reference
    value, so the statistic never leaves 0."""
    bus = SignalBus()
    det = ChangeDetector(change_cond().change, window=600.0, min_history=60.0)
    feed(det, bus, noisy(120, sd=0.01))
    results = feed(det, bus, noisy(60, mean=220.0, sd=0.01, seed=4), start=120.0)
    assert not any(r[3] for r in results) and max(r[0] for r in results) == 0.0


def test_down_and_absolute_shifts():
    bus = SignalBus()
    down = ChangeDetector(change_cond("down", 0.7).change, window=600.0, min_history=60.0)
    feed(down, bus, noisy(120))
    assert any(r[3] for r in feed(down, bus, noisy(6, mean=100.0), start=120.0))
    bus2 = SignalBus()
    wait = ChangeDetector(ChangeSpec("up", None, 20.0, 1 / DAY, "up 20ms, 1/day"), window=600.0, min_history=60.0)
    feed(wait, bus2, [0.03 + 0.01 * (i % 3) for i in range(120)])      # a wait of ~0: no ratio to speak of
    assert any(r[3] for r in feed(wait, bus2, [60.0] * 6, start=120.0))


def test_nothing_holds_while_learning():
    bus = SignalBus()
    det = ChangeDetector(change_cond().change, window=600.0, min_history=60.0)
    results = feed(det, bus, noisy(30) + [800.0] * 10)
    assert not any(r[3] for r in results) and results[-1][0] is None


def test_a_rule_on_a_change_fires_within_seconds_of_the_shift_and_clears_after():
    """The whole engine, one point a second from each of two ranks pooled by
    job: the alert goes out within 2 s of the first slow second, with the
    change point in its evidence; the rule clears when the steps come back."""
    rule = Rule("slower", change_cond(), [Action("alert", {"summary": "slower"})],
                Rollback(frozenset(), alerts="resolve"), by=("job",))
    pol = Policy("p", [rule], mode="enforce", selector=Selector())
    clock, bus, sent = SimClock(), SignalBus(), []
    ctl = Controller([pol], bus, registry({}, sent), clock)
    ctl.start("test")
    rng = random.Random(5)
    for t in range(300):
        clock.set(float(t))
        mean = 400.0 if 200 <= t < 240 else 200.0
        for rank in ("0", "1"):
            bus.publish("step_time_ms", {"job": "j", "rank": rank}, mean * (1 + rng.gauss(0, 0.03)), t)
        ctl.tick()
    ctl.shutdown()
    acted = [r for r in ctl.audit.records if r["kind"] == "action" and r["outcome"] == "notified"]
    assert len(acted) == 1 and acted[0]["ts"] - 200 <= 2.0, acted
    firing = next(r for r in ctl.audit.records if r["kind"] == "transition" and r["to"] == "pending")
    item = firing["evidence"][0]
    assert item["change_at"] == 200.0 and item["shift"] > 1.8 and item["value"] > item["threshold"]
    cleared = [r for r in ctl.audit.records if r["kind"] == "transition" and r["from"] == "escalated"]
    assert cleared and 240 <= cleared[0]["ts"] <= 250, cleared


def test_the_loader_reads_change_and_reports_each_mistake_in_place(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text("""policies:
  - name: p
    rules:
      - name: r
        when:
          change: {signal: step_time_ms, up: 1.3x, false_alarms: 2/week, baseline: 5m, match: {rank: "0"}}
        actions:
          - actuator: alert
            params: {severity: warning, summary: x}
        rollback: {alerts: keep}
""")
    policies, diags = validate_paths([str(good)])
    assert not [d for d in diags if d.severity == "error"], diags
    cond = policies[0].rules[0].when
    assert cond.change.factor == 1.3 and cond.change.false_alarms == pytest.approx(2 / (7 * DAY))
    assert cond.baseline_window == 300.0 and cond.match == {"rank": "0"}
    assert cond.describe() == 'change(step_time_ms{rank="0"}) up 1.3x, 2/week'

    bad = tmp_path / "bad.yaml"
    bad.write_text("""policies:
  - name: p
    rules:
      - name: r
        when:
          any:
            - change: {signal: step_time_ms, up: 0.9x}
            - change: {signal: dataloader_batches_total, up: 2}
            - change: {signal: step_time_ms, up: 1.2x, down: 0.5x}
            - change: {signal: step_time_ms, up: 20ms, false_alarms: 1/fortnight}
            - change: {signal: step_time_ms, down: fast}
            - change: {signal: step_time_ms, up: 1.5x}
              window: 10s
        actions:
          - actuator: alert
            params: {severity: warning, summary: x}
""")
    _, diags = validate_paths([str(bad)])
    errors = [(d.line, d.message) for d in diags if d.severity == "error"]
    assert [line for line, _ in errors] == [7, 8, 9, 10, 11, 13], errors
    text = " | ".join(m for _, m in errors)
    for part in ("a rise is a factor above 1", "needs a gauge", "exactly one of 'up' or 'down'",
                 "bad 'false_alarms' '1/fortnight'", "bad 'down' 'fast'", "unknown key 'window'"):
        assert part in text, text
