"""A policy's progressive rollout across a fleet, and its circuit breaker: the
spec a policy declares (``rollout:``) and the arithmetic every node and the
CLI share.

- **Stages**: how many nodes may enforce the policy, widening one stage at a
  time: a count (``1``), a share of the live nodes (``"10%"``, rounded up, at
  least 1) or ``all``. A stage widens once ``promote_after`` remediations were
  verified in it and the verify-success rate over the fleet's last ``window``
  outcomes is at least ``success_rate`` per cent.
- **The breaker**: it opens when more of the last ``window`` outcomes failed
  than the rate allows (``allowed_failures``); open, no node makes a new
  enforce change of the policy until an operator resets it.
- **The version**: a digest of what the policy does (its rules, selector and
  rollout). A policy changed on its nodes is a new version: its rollout
  starts over at the first stage, and a node still running the version it
  replaced is refused until its policies are reloaded.

Example::

    spec = RolloutSpec(stages=(Stage(nodes=1), Stage(percent=10), Stage()), promote_after=3)
    spec.stages[1].size(live=40)         # 4
    spec.allowed_failures()              # 1 of the last 10 at a 90 % success rate
    spec.breaks([True, False, False])    # True: two failures, one allowed
    spec.describe()                      # "1 node, then 10 %, then all; ..."

Overhead: arithmetic on a few numbers.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .budget import PERCENT_PATTERN, parse_percent

ALL = "all"


@dataclass(frozen=True)
class Stage:
    """How many nodes a stage admits: ``nodes``, ``percent`` of the live ones, or (neither) all."""

    nodes: int | None = None
    percent: float | None = None

    def size(self, live: int) -> int | None:
        """The nodes it admits in a fleet of ``live`` nodes; None: every node."""
        if self.nodes is not None:
            return self.nodes
        if self.percent is not None:
            return max(1, math.ceil(self.percent * live / 100 - 1e-9))
        return None

    def text(self) -> str:
        if self.nodes is not None:
            return f"{self.nodes} node{'s' if self.nodes != 1 else ''}"
        if self.percent is not None:
            return f"{self.percent:g} %"
        return ALL

    def to_value(self) -> int | str:
        """As a policy file writes it."""
        if self.nodes is not None:
            return self.nodes
        return f"{self.percent:g}%" if self.percent is not None else ALL


def parse_stage(value) -> Stage:
    """A stage from a policy's value: an int >= 1, ``"P%"`` (0 < P <= 100) or ``all``; ValueError saying why."""
    if isinstance(value, bool):
        raise ValueError("a stage is a node count, a share such as '10%', or 'all'")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"a stage of {value} nodes admits none; a count is >= 1")
        return Stage(nodes=value)
    if isinstance(value, str):
        if value.strip() == ALL:
            return Stage()
        match = re.match(PERCENT_PATTERN, value)
        if match:
            percent = float(match.group(1))
            if not 0 < percent <= 100:
                raise ValueError(f"a share of {value.strip()} is not > 0 % and <= 100 %")
            return Stage(percent=percent)
    raise ValueError(f"a stage is a node count, a share such as '10%', or 'all', got {value!r}")


def parse_success_rate(value) -> float:
    """A success rate: ``"90%"`` or a number, > 0 and <= 100; ValueError saying why."""
    return parse_percent(value, "a success rate")


@dataclass(frozen=True)
class RolloutSpec:
    stages: tuple[Stage, ...] = (Stage(),)
    promote_after: int = 3
    success_rate: float = 90.0
    window: int = 10
    version: str = ""     # the digest of the policy it rolls out (the engine's); a new one starts over

    def allowed_failures(self) -> int:
        """Failures the last ``window`` outcomes may hold before the breaker opens."""
        return self.window - math.ceil(self.window * self.success_rate / 100 - 1e-9)

    def breaks(self, recent: list[bool]) -> bool:
        """Whether the fleet's outcomes (oldest first, True: verified) open the breaker."""
        return sum(not ok for ok in recent[-self.window:]) > self.allowed_failures()

    def widens(self, recent: list[bool], verified_in_stage: int, stage: int) -> bool:
        """Whether stage ``stage`` (0-based) widens to the next one."""
        last = recent[-self.window:]
        return (stage < len(self.stages) - 1 and verified_in_stage >= self.promote_after and bool(last)
                and 100 * sum(last) / len(last) >= self.success_rate - 1e-9)

    def describe(self) -> str:
        stages = ", then ".join(s.text() for s in self.stages)
        return (f"{stages}; a stage widens after {self.promote_after} verified remediation(s) with at least "
                f"{self.success_rate:g} % of the fleet's last {self.window} verified; more than "
                f"{self.allowed_failures()} failure(s) among them open the breaker")

    def to_dict(self) -> dict:
        return {"stages": [s.to_value() for s in self.stages], "promote_after": self.promote_after,
                "success_rate": f"{self.success_rate:g}%", "window": self.window}
