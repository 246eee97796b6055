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


def suggest(word: str, choices) -> str | None:
    """Closest choice to ``word``, or None."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return match[0] if match else None
