"""The pipeline a user would build instead of reflexarc, on the testbed: a real
Prometheus scraping an exporter of the same signals, an alerting rule with the
policy's condition and its ``for``, a real Alertmanager, and a webhook receiver
that runs a script applying the same action (``reflexarc act``), at the
pipeline's interval settings (``SETTINGS``).

The rule is the shipped policy's rule in PromQL (``rule_of``, ``rules_yaml``),
for fault a (``nccl-congestion-dscp``); its step-time change point
(``up: 1.3x``) becomes a fixed factor of the healthy median with a ``for``
(``PROMQL_FOR_S``), as a Prometheus user would write it::

    max(max_over_time(reflexarc_link_utilization_ratio{iface=I,netns=N,traffic="other"}[W])) > 0.2
      and on() max(max_over_time(reflexarc_step_time_seconds{job=J}[W])) > 1.3 * BASE
    for: 5s

``W`` is the policy's window (10 s), widened to two scrape intervals where
scrapes are sparser (a shorter range would often hold no sample). ``BASE`` is
the job's healthy median step time, measured before the first fault and
written into the rule as a constant: nothing to learn and nothing a long fault
could drag up, the most favourable choice for this pipeline.

Each fault is an episode: the rule's alert carries an ``episode`` label,
Alertmanager groups by it and starts afresh, so a fault meets no group (nor
resolved alert) left by the one before and is notified after ``group_wait``
alone, as the first fault in a long while would be (a group still open would
wait for its ``group_interval``, 5 min by default: not counted here, in the
pipeline's favour). Prometheus sends the alert
when it fires; Alertmanager waits ``group_wait`` from then.

The receiver runs the script for the armed setting's first firing alert of the
armed episode, in a thread of its own, and records when the alert arrived and
when the script returned (``Delivery``); other alerts are only counted.

Example::

    rules = lambda episode: rules_yaml(rule, setting, episode=episode, iface=..., netns=..., job=..., base_step_s=0.19)
    with Receiver(act_argv) as rx, Pipeline(SETTINGS["tightest"], "127.0.0.1:9101", rx, rules) as p:
        p.quiet(timeout=420); p.episode(1); rx.arm("tightest", 1)   # quiet first: a new episode
                                                                      # that saw the last fault waits 5 min
        ...                                   # the fault
        rx.wait(timeout=60).applied           # wall-clock seconds, or None

Overhead: one Prometheus (~60 MB) and one Alertmanager (~20 MB) per setting;
the script is a Python process (~1 s of CPU) per applied action.
"""
from __future__ import annotations

import json
import subprocess
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import yaml

from reflexarc.core.durations import parse_duration

from .alertmanager import Alertmanager, webhook_config
from .prometheus import PrometheusServer

ALERT = "BulkCompetesWithCollective"


@dataclass(frozen=True)
class Setting:
    name: str
    scrape_s: float
    eval_s: float
    group_wait_s: float
    source: str

    def window_s(self, policy_window_s: float) -> float:
        return max(policy_window_s, 2 * self.scrape_s)

    def describe(self) -> dict:
        return {"scrape_s": self.scrape_s, "eval_s": self.eval_s, "group_wait_s": self.group_wait_s,
                "source": self.source}


SETTINGS = {s.name: s for s in (
    Setting("defaults", 60.0, 60.0, 30.0, "Prometheus scrape_interval and evaluation_interval default 1m; "
                                         "Alertmanager group_wait default 30s"),
    Setting("production", 15.0, 15.0, 30.0, "the common 15 s scrape and evaluation, Alertmanager's group_wait"),
    Setting("tightest", 1.0, 1.0, 0.0, "1 s scrape and evaluation, no group_wait: the tightest practical"),
)}


def _go(seconds: float) -> str:
    """A duration as Prometheus writes it: ``1m``, ``15s``, ``0s``, ``500ms``."""
    ms = round(seconds * 1000)
    if ms % 60000 == 0 and ms:
        return f"{ms // 60000}m"
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


# PromQL has no change points: its rule compares the step time with a fixed
# factor of the healthy median, and needs a ``for`` so that one slow step (an
# epoch turn) does not fire it: the 5 s the policy had before its change point.
PROMQL_FOR_S = 5.0


@dataclass(frozen=True)
class Rule:
    """The numbers of the policy's rule that the PromQL rule repeats."""
    policy: str
    for_s: float
    window_s: float
    util_pct: float
    step_factor: float
    action: dict = field(hash=False)
    job_pct: float = 0.0     # the share of the link the job's own traffic must exceed
    policy_for_s: float = 0.0    # the policy's own ``for`` (none beside a change point)


def rule_of(policy_file: Path, policy: str = "nccl-congestion-dscp") -> Rule:
    """The shipped policy's first rule: its ``for``, its window, the share of the
    link other traffic must exceed (and the job's own, when it says so), the
    step-time factor, and its DSCP action's parameters. ValueError when the file
    no longer has that shape."""
    doc = yaml.safe_load(Path(policy_file).read_text())
    rule = next(p for p in doc["policies"] if p["name"] == policy)["rules"][0]
    items = rule["when"]["all"]
    conds = {(c["signal"], (c.get("match") or {}).get("traffic")): c for c in items if "signal" in c}
    util, own = conds.get(("link_utilization_pct", "other")), conds.get(("link_utilization_pct", "job"))
    step = conds.get(("step_time_ms", None))
    change = next((c["change"] for c in items if c.get("change", {}).get("signal") == "step_time_ms"), None)
    if step and util and step["window"] == util["window"] and str(step["threshold"]).endswith("x baseline"):
        factor, for_s = float(str(step["threshold"]).split("x")[0]), parse_duration(rule.get("for", 0))
    elif change and util and str(change.get("up", "")).endswith("x"):
        factor, for_s = float(str(change["up"]).rstrip("x")), PROMQL_FOR_S
    else:
        raise ValueError(f"{policy_file}: {policy}'s rule is no longer 'link share and step time (over one "
                         "window, or a change point)'; the PromQL rule must be written again")
    action = next(a for a in rule["actions"] if a["actuator"] == "dscp")["params"]
    return Rule(policy, for_s, parse_duration(util["window"]), float(util["threshold"]), factor, action,
                float(own["threshold"]) if own else 0.0, parse_duration(rule.get("for", 0)))


def rules_yaml(rule: Rule, setting: Setting, *, iface: str, netns: str, job: str, base_step_s: float,
               episode: int = 0) -> str:
    """The alerting rule file for one setting (its evaluation interval, its window)
    and one episode."""
    w = _go(setting.window_s(rule.window_s))
    util = (f'max(max_over_time(reflexarc_link_utilization_ratio{{iface="{iface}",netns="{netns}",job="{job}",'
            f'traffic="other"}}[{w}])) > {rule.util_pct / 100:g}')
    step = f'max(max_over_time(reflexarc_step_time_seconds{{job="{job}"}}[{w}])) > {rule.step_factor * base_step_s:.4f}'
    own = (f'\n  and on() max(max_over_time(reflexarc_link_utilization_ratio{{iface="{iface}",netns="{netns}",'
           f'job="{job}",traffic="job"}}[{w}])) > {rule.job_pct / 100:g}') if rule.job_pct else ""
    return yaml.safe_dump({"groups": [{"name": "reflexarc-conventional", "interval": _go(setting.eval_s), "rules": [
        {"alert": ALERT, "expr": f"{util}\n  and on() {step}{own}", "for": _go(rule.for_s),
         "labels": {"severity": "warning", "episode": str(episode)},
         "annotations": {"summary": "bulk traffic competes with the collectives: demote it to DSCP CS1"}}]}]},
        sort_keys=False)


@dataclass
class Delivery:
    setting: str = ""
    armed_at: float | None = None
    delivered: float | None = None     # the first firing alert reached the receiver
    applied: float | None = None       # the script returned 0
    script_s: float | None = None
    error: str | None = None


class Receiver:
    """The webhook receiver: ``/<setting>`` takes that setting's notifications."""

    def __init__(self, argv: list[str], timeout: float = 60.0) -> None:
        self.argv, self.timeout = list(argv), timeout
        self._lock = threading.Lock()
        self._done = threading.Event()
        self.delivery = Delivery()
        self.armed: tuple[str, str] | None = None
        self.notifications: dict[str, int] = {}
        self.server: ThreadingHTTPServer | None = None

    def __enter__(self) -> "Receiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):                      # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.end_headers()
                receiver._notified(self.path.strip("/"), body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, name="receiver", daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    def url(self, setting: str) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/{setting}"

    def arm(self, setting: str, episode: int = 0) -> None:
        with self._lock:
            self.armed, self.delivery = (setting, str(episode)), Delivery(setting, armed_at=time.time())
            self._done.clear()

    def disarm(self) -> None:
        with self._lock:
            self.armed = None

    def wait(self, timeout: float) -> Delivery:
        """The armed setting's delivery once its script returned, or as it is after ``timeout``."""
        self._done.wait(timeout)
        with self._lock:
            return Delivery(**vars(self.delivery))

    def _notified(self, setting: str, body: bytes) -> None:
        now = time.time()
        try:
            alerts = json.loads(body).get("alerts", [])
        except ValueError:
            alerts = []
        firing = {a.get("labels", {}).get("episode") for a in alerts
                  if a.get("status") == "firing" and a.get("labels", {}).get("alertname") == ALERT}
        with self._lock:
            self.notifications[setting] = self.notifications.get(setting, 0) + 1
            armed_setting, armed_episode = self.armed or (None, None)
            if not (setting == armed_setting and armed_episode in firing and self.delivery.delivered is None):
                return
            self.delivery.delivered = now
        self._run()

    def _run(self) -> None:
        t0 = time.time()
        try:
            r = subprocess.run(self.argv, capture_output=True, text=True, timeout=self.timeout)
            error = None if r.returncode == 0 else (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
        except subprocess.TimeoutExpired:
            error = f"the script did not return within {self.timeout:g} s"
        t1 = time.time()
        with self._lock:
            self.delivery.script_s = round(t1 - t0, 3)
            if error:
                self.delivery.error = error
            else:
                self.delivery.applied = t1
        self._done.set()


class Pipeline:
    """One setting's Prometheus and Alertmanager, scraping ``exporter`` (host:port)."""

    def __init__(self, setting: Setting, exporter: str, receiver: Receiver, rules: Callable[[int], str]) -> None:
        self.setting = setting
        self.am = Alertmanager(webhook_config(receiver.url(setting.name), _go(setting.group_wait_s),
                                              group_by=("alertname", "episode")))
        self._exporter, self._rules, self._loaded = exporter, rules, rules(0)
        self.prom: PrometheusServer | None = None

    def __enter__(self) -> "Pipeline":
        self.am.__enter__()
        try:
            self.prom = PrometheusServer({"reflexarc": [self._exporter]}, honor_labels=("reflexarc",),
                                         scrape=_go(self.setting.scrape_s), evaluation=_go(self.setting.eval_s),
                                         rules=self._loaded, alertmanager=f"127.0.0.1:{self.am.port}").__enter__()
        except BaseException:
            self.am.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.prom:
            self.prom.__exit__()
        self.am.__exit__()

    def alert_state(self) -> str:
        """``inactive``, ``pending`` or ``firing``, as Prometheus holds the alert now."""
        states = [r["metric"].get("alertstate") for r in self.prom.query(f'ALERTS{{alertname="{ALERT}"}}')]
        return "firing" if "firing" in states else "pending" if states else "inactive"

    def active_at(self) -> float | None:
        """When Prometheus first held the alert's condition (its ``activeAt``), or None."""
        with urllib.request.urlopen(f"{self.prom.url}/api/v1/alerts", timeout=5) as response:
            alerts = json.load(response)["data"]["alerts"]
        stamps = [a["activeAt"] for a in alerts if a["labels"].get("alertname") == ALERT]
        if not stamps:
            return None
        head, _, frac = stamps[0].rstrip("Z").partition(".")        # RFC 3339 with nanoseconds
        return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()

    def quiet(self, timeout: float) -> bool:
        """Wait until the alert is inactive and its condition no longer holds on the
        data in its windows (a previous fault's samples have left them). Call it
        before ``episode``: an episode whose alert fired on the last fault's samples
        has its group open, and the next fault waits that group's ``group_interval``."""
        expr = yaml.safe_load(self._loaded)["groups"][0]["rules"][0]["expr"]
        deadline = time.monotonic() + timeout
        while self.alert_state() != "inactive" or self.prom.query(expr):
            if time.monotonic() > deadline:
                return False
            time.sleep(1.0)
        return True

    def episode(self, n: int) -> None:
        """Load the rule whose alert carries ``episode=n`` (its ``for`` starts afresh)
        and give it a fresh Alertmanager, on the same port."""
        def loaded(groups: list[dict]) -> bool:
            return any(r.get("labels", {}).get("episode") == str(n) for g in groups for r in g["rules"])
        self._loaded = self._rules(n)
        self.prom.reload_rules(self._loaded, loaded)
        self.am.reset()
