"""The figures peer systems publish for how often they look and how fast they
react, each with where it is published, for the cost table
(``bench/cost_table.py``) to set beside reflexarc's own measurements.

Each ``Peer`` is one published figure: ``figure`` as the source writes it,
``seconds`` its interval or reaction part in seconds (a float, a (min, max)
pair, or None where the figure is not a duration), ``what`` it measures and
``source`` (a URL with the file, option or sentence, or a paper's title,
venue, year and section). ``verified`` says whether the figure was read in
that source; ``note`` says what else the reader should know, or, for an
unverified figure, what was searched.

Example::

    from peers import PEERS
    for peer in PEERS:
        print(f"{peer.name}: {peer.figure} ({peer.what}) - {peer.source}")

Overhead: none; this module is data.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Peer:
    name: str
    figure: str
    seconds: float | tuple[float, float] | None
    what: str
    source: str
    verified: bool = True
    note: str = ""


PROMETHEUS_CONFIG = ("Prometheus documentation, Configuration, section <global> "
                     "(https://prometheus.io/docs/prometheus/latest/configuration/configuration/; "
                     "docs/configuration/configuration.md in github.com/prometheus/prometheus)")
ALERTMANAGER_ROUTE = ("Alertmanager documentation, Configuration, section <route> "
                      "(https://prometheus.io/docs/alerting/latest/configuration/; "
                      "docs/configuration.md in github.com/prometheus/alertmanager)")

PEERS: tuple[Peer, ...] = (
    Peer("Prometheus", "1m", 60.0, "default scrape interval",
         f"{PROMETHEUS_CONFIG}: `[ scrape_interval: <duration> | default = 1m ]`"),
    Peer("Prometheus", "1m", 60.0, "default rule evaluation interval",
         f"{PROMETHEUS_CONFIG}: `[ evaluation_interval: <duration> | default = 1m ]`"),
    Peer("Prometheus", "none by default", None, "wait before a pending alert fires (rule `for`)",
         "Prometheus documentation, Alerting rules "
         "(https://prometheus.io/docs/prometheus/latest/configuration/alerting_rules/): \"Alerting rules "
         "without the for clause will become active on the first evaluation.\"",
         note="a rule's `for` adds its own duration on top of the intervals"),
    Peer("Alertmanager", "30s", 30.0, "default group_wait (first notification of a new group)",
         f"{ALERTMANAGER_ROUTE}: `[ group_wait: <duration> | default = 30s ]`"),
    Peer("Alertmanager", "5m", 300.0, "default group_interval (next notification of a group)",
         f"{ALERTMANAGER_ROUTE}: `[ group_interval: <duration> | default = 5m ]`"),
    Peer("numad", "5-15 s", (5.0, 15.0), "interval between system scans",
         "numad(8) man page, option `-i <[min_interval:]max_interval>`: \"Default <max_interval> is 15 seconds, "
         "default <min_interval> is 5 seconds\" (e.g. https://manpages.ubuntu.com/manpages/noble/man8/numad.8.html)"),
    Peer("TuneD", "10 s", 10.0, "dynamic tuning update interval",
         "tuned-main.conf(5) man page, option `update_interval`: \"By default the INT is set to 10 seconds\" "
         "(man/tuned-main.conf.5 and tuned/consts.py `CFG_DEF_UPDATE_INTERVAL = 10` in "
         "github.com/redhat-performance/tuned)",
         note="only with dynamic tuning on; the shipped tuned-main.conf sets dynamic_tuning = 0"),
    Peer("Node Problem Detector", "30 s", 30.0, "custom plugin invoke interval",
         "github.com/kubernetes/node-problem-detector, pkg/custompluginmonitor/types/config.go: "
         "`defaultInvokeInterval = 30 * time.Second`; config/custom-plugin-monitor.json: "
         "`\"invoke_interval\": \"30s\"`",
         note="config/health-checker-kubelet.json sets 10s"),
    Peer("Minder", "3.6 s", 3.6, "time to react to a faulty machine, on average",
         "Deng et al., \"Minder: Faulty Machine Detection for Large-scale Distributed Model Training\", "
         "USENIX NSDI '25 (2025), Abstract: \"Minder can accurately and efficiently react to faults within "
         "3.6 seconds on average, with a precision of 0.904 and F1-score of 0.893\" (arXiv:2411.01791)",
         note="authors from Tsinghua University, ByteDance, Northeastern University and Harvard University"),
    Peer("Holmes", "30.3 s", 30.3, "time to localize an irregular iteration (production prototype)",
         "Yao et al., \"Holmes: Localizing Irregularities in LLM Training with Mega-scale GPU Clusters\", "
         "USENIX NSDI '25 (2025), Abstract: \"Production-level prototype evaluation results show Holmes can "
         "localize irregularity within 30.3 seconds\" (https://www.usenix.org/conference/nsdi25/presentation/yao)",
         note="authors from Fudan University, Tencent and the University of Chicago; not mosn/holmes, "
              "a Go profiling library whose default interval is 5 s (consts.go defaultInterval)"),
)
