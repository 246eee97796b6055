"""The conventional pipeline the reaction benchmark compares reflexarc with: its
PromQL rule repeats the shipped policy's numbers and passes ``promtool``, the
webhook receiver runs its script only for the armed setting's first firing
alert, and a real Prometheus fires the rule into a real Alertmanager that
notifies the receiver."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest
import yaml
from conftest import require

from reflexarc.simulations.testbed.controller import POLICY_DIR
from reflexarc.simulations.testbed.conventional import ALERT, SETTINGS, Pipeline, Receiver, rule_of, rules_yaml
from reflexarc.simulations.testbed.prometheus import BINARY as PROMETHEUS

POLICY = POLICY_DIR / "nccl-congestion-dscp.yaml"


def rules(setting: str, episode: int = 0) -> str:
    return rules_yaml(rule_of(POLICY), SETTINGS[setting], iface="rxe0", netns="rxr0", job="tb", base_step_s=0.19,
                      episode=episode)


def test_the_rule_repeats_the_policy_and_promtool_accepts_it(tmp_path):
    require(bool(shutil.which("promtool")), "promtool (Debian prometheus)")
    rule = rule_of(POLICY)
    assert (rule.for_s, rule.window_s, rule.util_pct, rule.step_factor, rule.job_pct) == (5.0, 10.0, 20.0, 1.3, 5.0)
    assert rule.action == {"dscp": "CS1", "ports": ["443"], "protocol": "tcp"}
    for name, window in (("tightest", "[10s]"), ("production", "[30s]"), ("defaults", "[2m]")):
        path = tmp_path / f"{name}.yml"
        path.write_text(rules(name))
        group = yaml.safe_load(path.read_text())["groups"][0]
        assert group["interval"] == {"tightest": "1s", "production": "15s", "defaults": "1m"}[name]
        assert group["rules"][0]["for"] == "5s"
        assert window in group["rules"][0]["expr"] and "> 0.247" in group["rules"][0]["expr"]
        r = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True)
        assert r.returncode == 0, r.stdout + r.stderr


def test_a_policy_of_another_shape_is_refused_in_words(tmp_path):
    doc = yaml.safe_load(POLICY.read_text())
    items = doc["policies"][0]["rules"][0]["when"]["all"]
    step = next(i for i, c in enumerate(items) if c.get("change", {}).get("signal") == "step_time_ms")
    items[step] = {"change": {"signal": "step_time_ms", "down": "0.7x"}}      # not a slowdown
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ValueError, match="must be written again"):
        rule_of(tmp_path / "p.yaml")


def _post(url: str, alerts: list[dict]) -> None:
    req = urllib.request.Request(url, data=json.dumps({"alerts": alerts}).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).close()


def test_the_receiver_runs_its_script_once_for_the_armed_setting_and_episode_only(tmp_path):
    marker = tmp_path / "ran"
    script = [sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"]
    firing = [{"status": "firing", "labels": {"alertname": ALERT, "episode": "2"}}]
    with Receiver(script) as rx:
        rx.arm("tightest", 2)
        _post(rx.url("defaults"), firing)                      # another setting's alert
        _post(rx.url("tightest"), [{"status": "resolved", "labels": {"alertname": ALERT, "episode": "2"}}])
        _post(rx.url("tightest"), [{"status": "firing", "labels": {"alertname": ALERT, "episode": "1"}}])
        assert not marker.exists()
        _post(rx.url("tightest"), firing)
        d = rx.wait(timeout=30)
        _post(rx.url("tightest"), firing)                      # repeated: already handled
        time.sleep(0.5)
    assert marker.read_text() == "x"
    assert d.error is None and d.delivered <= d.applied and d.script_s > 0
    assert rx.notifications == {"defaults": 1, "tightest": 4}


def test_a_failing_script_is_recorded_not_applied():
    with Receiver([sys.executable, "-c", "import sys; sys.exit('error: no such interface')"]) as rx:
        rx.arm("production", 0)
        _post(rx.url("production"), [{"status": "firing", "labels": {"alertname": ALERT, "episode": "0"}}])
        d = rx.wait(timeout=30)
    assert d.applied is None and d.error == "error: no such interface"


class _Exporter:
    """A static exporter of the two signals the rule reads, the bulk flow taking the link."""

    TEXT = ('reflexarc_link_utilization_ratio{iface="rxe0",job="tb",netns="rxr0",traffic="other"} 0.6\n'
            'reflexarc_link_utilization_ratio{iface="rxe0",job="tb",netns="rxr0",traffic="job"} 0.35\n'
            'reflexarc_step_time_seconds{job="tb",rank="0"} 0.43\n')

    def __enter__(self):
        text = self.TEXT.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):                              # noqa: N802
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(text)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        Thread(target=self.server.serve_forever, daemon=True).start()
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
def test_real_prometheus_fires_each_episode_through_real_alertmanager_to_the_script(tmp_path):
    """Two faults in a row: the second is a new episode (its own alert, its own
    Alertmanager group), so it is notified after group_wait, not after the
    first group's 5 min group_interval."""
    require(os.path.exists(PROMETHEUS), f"{PROMETHEUS} (Debian prometheus)")
    marker = tmp_path / "ran"
    with _Exporter() as exp, Receiver([sys.executable, "-c", f"open({str(marker)!r}, 'a').write('x')"]) as rx, \
            Pipeline(SETTINGS["tightest"], exp.address, rx, lambda n: rules("tightest", n)) as p:
        rx.arm("tightest", 0)
        first = rx.wait(timeout=60)
        assert p.alert_state() == "firing"
        p.episode(1)
        rx.arm("tightest", 1)
        second = rx.wait(timeout=60)
    assert first.error is None and first.applied is not None, first
    assert second.error is None and second.applied is not None, second
    assert marker.read_text() == "xx"
