"""What a signal is: a named, labelled, timestamped value with a unit and a kind.

Each source declares the signals it emits as ``SignalSpec`` objects beside its
code (a probe class in ``bpf/``, the framework hooks); the controller's
catalogue is assembled from those declarations, and policies may use only the
names in it. ``suggest`` finds the closest name for did-you-mean messages.

Example::

    SignalSpec("block_requests_total", "1", ("node", "dev"), "counter", "Block requests completed")
    suggest("dataloader_read_latency", ["dataloader_read_latency_us", "step_time_ms"])
    # "dataloader_read_latency_us"

Overhead: none at run time beyond a dataclass; ``suggest`` is difflib over the
choices, for error messages only.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass

KINDS = ("gauge", "counter")
# Labels whose values the node's own sources take from a closed set: a probe's
# per-interval quantiles (bpf/loghist.py QUANTILES), link_traffic's split and
# pcie_aer's severities. A policy matching another value reads nothing the node
# produces (a PromQL source may still give other quantiles, so it is a warning,
# not an error).
LABEL_VALUES = {"quantile": ("0.5", "0.99"), "traffic": ("job", "other", "all"),
                "severity": ("correctable", "nonfatal", "fatal")}


@dataclass(frozen=True)
class SignalSpec:
    name: str
    unit: str
    labels: tuple[str, ...]
    kind: str  # "gauge" (a level) or "counter" (monotonic total)
    help: str

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"signal '{self.name}': kind '{self.kind}' is not one of {', '.join(KINDS)}")
        if not isinstance(self.labels, tuple):
            raise ValueError(f"signal '{self.name}': labels must be a tuple of names, got {self.labels!r}")


# A step signal the training script reports through the framework hooks, beside
# those ``reflexarc.actuators.hooks.SIGNALS`` lists: how long a step ran before
# it entered its collective (waiting for the batch, forward, the backward not
# overlapped with communication). In synchronous data parallelism every rank's
# step time is the same, since the collective waits for the slowest rank; this
# time is what differs, and the cluster's Prometheus compares it across ranks
# (``rank_pre_collective_ratio``, ``docs/promql.md``).
STEP_PRE_COLLECTIVE = SignalSpec("step_pre_collective_ms", "ms", ("node", "job", "rank"), "gauge",
                                 "Time a training step ran before entering its collective (framework hook)")


def suggest(word: str, choices) -> str | None:
    """Closest choice to ``word``, or None."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return match[0] if match else None
