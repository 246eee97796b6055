"""Cost of reflexarc's deep tier, measured A/B: the ``rdma_qp`` probe's uprobes
on a verbs provider's post and poll functions.

There is no RDMA NIC here, so the provider is the stand-in library the tests
build, ``tests/fixtures/fakeverbs.c`` (the libibverbs ABI in every field the
probe reads). Its ``fake_run`` plays NCCL's proxy thread: post one work request,
busy-poll the completion queue until it completes (immediately: completion
delay 0, so one poll per post), repeat. That is the worst case for uprobes: no
work between the traps, every pair is three BPF events (post uprobe, poll
uprobe, poll uretprobe).

Rounds interleave off (A) and on (B) (A/B, B/A, ...), with the light tier off.
Each B round starts a fresh ``RdmaQp`` as a ``deep_tracing`` session would
(compile + attach), reads ``probe.events_per_s`` from two ``collect`` calls
around the timed loop, and stops it (detach). Each row also records whether
the post function's first byte was the uprobe's int3, proving which side was
probed (concurrent tests probe their own copies of the library).

Example::

    runs = run_deep_rounds(rounds=3, seconds=3.0, workdir=tmp)
    summary = summarise_deep(runs)   # pairs/s off and on, µs added per pair, ...
    print(markdown_deep(summary))

Overhead: one gcc build (~0.1 s); per B round a compile (~1.4 s) and a detach
(~0.35 s); ``2 * rounds * seconds`` of one busy core.
"""
from __future__ import annotations

import importlib.util
import statistics
import sys
import time
from pathlib import Path

from reflexarc.bpf.rdma_qp import RdmaQp

FAKEVERBS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "fakeverbs.py"
INT3 = 0xCC


def load_fakeverbs():
    """The tests' builder/driver of the stand-in library, loaded by path."""
    spec = importlib.util.spec_from_file_location("fakeverbs", FAKEVERBS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TimedRdmaQp(RdmaQp):
    """``RdmaQp`` that times its ``attach`` (the uprobe registration alone,
    without the compile that ``start`` does first)."""

    attach_s = 0.0

    def attach(self) -> None:
        began = time.perf_counter()
        super().attach()
        self.attach_s = time.perf_counter() - began


def pair_rate(verbs, qp: int, seconds: float) -> tuple[float, float]:
    """(post/poll pairs per second, polls per pair) over ``seconds``; calls into
    C in chunks grown until one lasts 20 ms, so ctypes costs nothing visible."""
    chunk, pairs, polls = 1000, 0, 0
    began = time.perf_counter()
    while time.perf_counter() - began < seconds:
        call = time.perf_counter()
        polls += verbs.run(qp, chunk)
        pairs += chunk
        if time.perf_counter() - call < 0.02:
            chunk *= 2
    return pairs / (time.perf_counter() - began), polls / pairs


def deep_round(verbs, qp: int, post: str, seconds: float, on: bool) -> dict:
    """One timed run; with ``on``, inside a fresh rdma_qp session. ``post`` is
    the post function's symbol, whose first byte shows whether it is probed."""
    if not on:
        rate, polls = pair_rate(verbs, qp, seconds)
        return {"mode": "A", "pairs_per_s": rate, "polls_per_pair": polls,
                "armed": verbs.first_byte(post) == INT3}
    probe = TimedRdmaQp(uprobes=verbs.uprobes())
    began = time.perf_counter()
    status = probe.start()
    start_s = time.perf_counter() - began
    try:
        armed = verbs.first_byte(post) == INT3
        probe.collect(time.monotonic())
        rate, polls = pair_rate(verbs, qp, seconds)
        probe.collect(time.monotonic())
    finally:
        began = time.perf_counter()
        probe.stop()
        detach_s = time.perf_counter() - began
    return {"mode": "B", "pairs_per_s": rate, "polls_per_pair": polls, "armed": armed,
            "events_per_s": probe.events_per_s, "start_s": start_s, "attach_s": probe.attach_s,
            "detach_s": detach_s, "state": status.state, "attach_points": status.attach_points}


def run_deep_rounds(rounds: int, seconds: float, workdir: str) -> list[dict]:
    """A/B interleaved rounds on a private build of the stand-in library."""
    fakeverbs = load_fakeverbs()
    verbs = fakeverbs.FakeVerbs.build(Path(workdir))
    qp = verbs.create_qp("fake_0", qp_num=4660, delay_us=0)
    runs = []
    for r in range(rounds):
        for mode in (("A", "B") if r % 2 == 0 else ("B", "A")):
            row = {"round": r, **deep_round(verbs, qp, fakeverbs.POST, seconds, on=mode == "B")}
            runs.append(row)
            print(f"round {r} {mode} deep tier: {row['pairs_per_s']:,.0f} pairs/s",
                  file=sys.stderr, flush=True)
    return runs


def summarise_deep(runs: list[dict]) -> dict:
    a = [x for x in runs if x["mode"] == "A"]
    b = [x for x in runs if x["mode"] == "B"]
    off = statistics.median(x["pairs_per_s"] for x in a)
    on = statistics.median(x["pairs_per_s"] for x in b)
    events = statistics.median(x["events_per_s"] for x in b)
    added_us = 1e6 * (1 / on - 1 / off)
    events_per_pair = events / on
    return {
        "pairs_per_s_off": off,
        "pairs_per_s_on": on,
        "ratio_on_off": on / off,
        "round_ratios": [bx["pairs_per_s"] / ax["pairs_per_s"] for ax, bx in zip(a, b)],
        "added_us_per_pair": added_us,
        "polls_per_pair": statistics.median(x["polls_per_pair"] for x in b),
        "events_per_s": events,
        "events_per_pair": events_per_pair,
        "added_us_per_event": added_us / events_per_pair,
        "core_share_at_100k_pairs_per_s": 1e5 * added_us / 1e6,
        "start_s": statistics.median(x["start_s"] for x in b),
        "attach_s": statistics.median(x["attach_s"] for x in b),
        "detach_s": statistics.median(x["detach_s"] for x in b),
        "armed_when_on": all(x["armed"] for x in b),
        "armed_when_off": any(x["armed"] for x in a),
        "state": b[0]["state"],
        "attach_points": b[0]["attach_points"],
    }


def markdown_deep(s: dict) -> str:
    rows = [
        ("post/poll pairs, deep tier off (/s)", f"{s['pairs_per_s_off']:,.0f}"),
        ("post/poll pairs, deep tier on (/s)", f"{s['pairs_per_s_on']:,.0f}"),
        ("ratio on/off (median)", f"{s['ratio_on_off']:.4f}"),
        ("ratio on/off per round", " ".join(f"{v:.4f}" for v in s["round_ratios"])),
        ("time added per pair (us)", f"{s['added_us_per_pair']:.2f}"),
        ("BPF events per pair", f"{s['events_per_pair']:.2f}"),
        ("time added per event (us)", f"{s['added_us_per_event']:.2f}"),
        ("events handled, probe.events_per_s (/s)", f"{s['events_per_s']:,.0f}"),
        ("share of a core at 100 000 pairs/s", f"{s['core_share_at_100k_pairs_per_s']:.2f}"),
        ("start: compile + attach (s)", f"{s['start_s']:.2f}"),
        ("attach alone, 3 uprobes (s)", f"{s['attach_s']:.3f}"),
        ("detach, stop() (s)", f"{s['detach_s']:.3f}"),
        ("uprobe int3 present on / off", f"{s['armed_when_on']} / {s['armed_when_off']}"),
        ("probe state", s["state"]),
    ]
    out = ["| deep tier: rdma_qp uprobes on fakeverbs post/poll | value |", "|---|---|"]
    out += [f"| {label} | {value} |" for label, value in rows]
    return "\n".join(out)
