"""The ``slope`` aggregation: each series' least-squares trend per minute over
the window, averaged weighted by points, so series at different levels trend
together without their levels mixing."""
from __future__ import annotations

import pytest

from reflexarc.controller.engine.bus import SignalBus
from reflexarc.controller.engine.evaluate import Input
from reflexarc.controller.policy.loader import validate_paths
from reflexarc.controller.policy.model import Condition


def slope_of(points_by_gpu: dict[str, list[tuple[float, float]]], now: float, window: float = 120.0):
    bus = SignalBus()
    for gpu, points in points_by_gpu.items():
        for ts, v in points:
            bus.publish("gpu_utilization_pct", {"job": "j", "gpu": gpu}, v, ts)
    cond = Condition("gpu_utilization_pct", "slope", window, "<", -3.0)
    return Input(cond, bus.series("gpu_utilization_pct")).value(now)


def test_two_gpus_at_different_levels_falling_5_points_a_minute_read_minus_5():
    line = lambda level: [(t, level - 5.0 * t / 60.0) for t in range(0, 121)]   # noqa: E731
    assert slope_of({"0": line(99.0), "1": line(60.0)}, now=120.0) == pytest.approx(-5.0)


def test_a_flat_series_reads_0_and_only_the_window_counts():
    flat = [(t, 90.0) for t in range(0, 121)]
    assert slope_of({"0": flat}, now=120.0) == pytest.approx(0.0)
    fell_then_flat = [(t, 99.0 - t) for t in range(0, 60)] + [(t, 40.0) for t in range(60, 181)]
    assert slope_of({"0": fell_then_flat}, now=180.0, window=60.0) == pytest.approx(0.0)


def test_no_value_without_two_points_at_distinct_times():
    assert slope_of({"0": [(10.0, 90.0)]}, now=20.0) is None
    assert slope_of({"0": [(10.0, 90.0)], "1": [(5.0, 80.0), (15.0, 70.0)]}, now=20.0) == pytest.approx(-60.0)


def test_the_loader_warns_for_a_counter_and_refuses_a_duration(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("""policies:
  - name: p
    rules:
      - name: r
        when:
          any:
            - {signal: dataloader_batches_total, agg: slope, window: 2m, op: "<", threshold: -1}
            - {signal: step_time_ms, agg: slope, window: 2m, op: ">", threshold: 5ms}
        actions:
          - actuator: log
            params: {message: x}
""")
    _, diags = validate_paths([str(path)])
    found = [(d.severity, d.line) for d in diags]
    assert ("warning", 7) in found and ("error", 8) in found, diags
    assert "'slope' of counter" in " ".join(d.message for d in diags)
