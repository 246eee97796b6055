"""Quantiles from the log-linear histograms the probes keep in BPF maps.

The C side (the same ``hist_slot`` function in every ``*.bpf.c`` that keeps a
latency histogram) gives values 0-3 a slot each and every power of two above
that four equal sub-slots, so a slot is at most 25 % wide; ``SLOTS`` slots cover
values up to 2^40. A quantile is read by walking the cumulative counts and
interpolating linearly inside the slot that holds the wanted rank.

Example::

    counts = {44: 199}                     # {slot: count} read from the map (5000 lands in slot 44)
    quantiles(counts)                      # [("0.5", 5120.0...), ("0.99", ...)]

Overhead: a sort of at most ``SLOTS`` entries per histogram per interval.
"""
from __future__ import annotations

SLOTS = 160
QUANTILES = (0.5, 0.99)


def slot_bounds(slot: int) -> tuple[float, float]:
    """Lower (inclusive) and upper (exclusive) value of a slot."""
    if slot < 4:
        return float(slot), float(slot + 1)
    e, m = slot // 4 + 1, slot % 4
    width = 1 << (e - 2)
    low = (4 + m) * width
    return float(low), float(low + width)


def quantile(counts: dict[int, int], q: float) -> float | None:
    """The ``q`` quantile (0..1) of a {slot: count} histogram; None when empty."""
    total = sum(counts.values())
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for slot in sorted(counts):
        c = counts[slot]
        if c and seen + c >= rank:
            low, high = slot_bounds(slot)
            return low + (high - low) * max(rank - seen, 0.0) / c
        seen += c
    return slot_bounds(max(counts))[1]


def quantiles(counts: dict[int, int], qs: tuple[float, ...] = QUANTILES) -> list[tuple[str, float]]:
    """``[(label, value)]`` for each wanted quantile, labels as in the catalogue
    ("0.5", "0.99"); empty when the histogram is."""
    out = []
    for q in qs:
        v = quantile(counts, q)
        if v is not None:
            out.append((str(q), v))
    return out
