"""Statistics of interleaved A/B rounds: the median of paired ratios with a
distribution-free confidence interval, and the rule for when to stop.

Each B measurement is paired with the A measurements taken right before and
after it (their mean), so slow drift in the machine's load cancels out; the
ratio B/A of a pair is one sample. The interval is the one for a median from
order statistics (binomial, no assumption on the distribution): with n pairs
sorted, [r_(k), r_(n+1-k)] where k is the largest index with
P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2.

Example::

    ci = median_ci([1.004, 0.998, 1.010, 1.002, 0.995, 1.007, 1.001, 1.003])
    ci.median, ci.low, ci.high     # 1.0025, 0.995, 1.010 (95 %)
    ci.half_width_pct              # 0.75: the interval is within +-0.75 %
    precise_enough(ci, 1.0)        # True: stop adding rounds

Overhead: sorting n numbers.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class MedianCI:
    median: float
    low: float
    high: float
    n: int
    confidence: float

    @property
    def half_width_pct(self) -> float:
        """The interval's larger distance from the median, in % of the median."""
        if self.n == 0 or not self.median:
            return math.inf
        return 100 * max(self.median - self.low, self.high - self.median) / self.median

    def as_dict(self) -> dict:
        return {**asdict(self), "half_width_pct": self.half_width_pct}


def _rank(n: int, confidence: float) -> int:
    """The order statistic (1-based) of the interval's low end; 0 when n is too
    small for the confidence asked."""
    alpha = (1 - confidence) / 2
    k, below = 0, 0.0
    for i in range(n + 1):
        below += math.comb(n, i) / 2 ** n          # P(X <= i)
        if below > alpha:
            break
        k = i + 1
    return k


def median_ci(values: list[float], confidence: float = 0.95) -> MedianCI:
    """The median of ``values`` and its distribution-free interval; with too few
    values for the confidence, the interval is the whole range and infinite."""
    xs = sorted(values)
    n = len(xs)
    if n == 0:
        return MedianCI(math.nan, -math.inf, math.inf, 0, confidence)
    k = _rank(n, confidence)
    if k < 1:
        return MedianCI(statistics.median(xs), -math.inf, math.inf, n, confidence)
    return MedianCI(statistics.median(xs), xs[k - 1], xs[n - k], n, confidence)


def paired_ratios(sequence: list[tuple[str, float]]) -> list[float]:
    """B/A for each B in a measured sequence of ("A" | "B", value), against the
    mean of the nearest A before and after it (one side only at the ends)."""
    out = []
    for i, (side, value) in enumerate(sequence):
        if side != "B":
            continue
        before = next((v for s, v in reversed(sequence[:i]) if s == "A"), None)
        after = next((v for s, v in sequence[i + 1:] if s == "A"), None)
        around = [v for v in (before, after) if v is not None]
        if around:
            out.append(value / statistics.fmean(around))
    return out


def precise_enough(ci: MedianCI, target_pct: float) -> bool:
    """Whether the interval is within +-``target_pct`` % of the median."""
    return ci.half_width_pct <= target_pct
