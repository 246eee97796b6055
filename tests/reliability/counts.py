"""How many of each kind of case a run makes: the shortened counts of CI, or the
full ones of a soak (``REFLEXARC_SOAK=1``, set by ``bench/reliability.py``).

Example::

    from reliability.counts import COUNTS
    COUNTS.kill_trials       # 5 in CI, 50 in a soak (per actuator)

A count here is what ``make test`` shortens and ``make soak`` runs in full:
every part runs in both, only its length differs.

``REFLEXARC_RELIABILITY_SEED`` changes the random choices (kill points, delays,
fuzz inputs); the default seed makes two runs of one tree choose alike.

Every part that ends a controller with SIGTERM hands the time it took to exit
to ``record_sigterm``, which appends it to ``SIGTERM_FILE`` in the
``REFLEXARC_RELIABILITY_OUT`` directory (when set) for ``bench/reliability.py``::

    record_sigterm("silent-hooks", 0.41)     # {"scenario": "silent-hooks", "seconds": 0.41}
    record_sigterm("full-disk sigterm", None)  # it did not exit within the part's limit

Overhead: none (constants read once at import; one line appended per SIGTERM).
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

SOAK_ENV = "REFLEXARC_SOAK"
SEED_ENV = "REFLEXARC_RELIABILITY_SEED"
OUT_ENV = "REFLEXARC_RELIABILITY_OUT"     # a directory: each part writes its figures there as JSON
SIGTERM_FILE = "sigterm.jsonl"            # in it: one SIGTERM-to-exit time a line


@dataclass(frozen=True)
class Counts:
    soak: bool
    kill_trials: int          # SIGKILL trials per actuator, at its bed's kill points in turn (each third
                              # one kills the restart too); under 4, no kill meets deep_tracing's change
                              # applied
    fuzz_cases: int           # fuzzed policy files
    storm_samples: int        # samples in the storm's replay
    storm_pids: int           # distinct DataLoader pids in it
    storm_span: float         # seconds its records are due within
    storm_delays: tuple       # seconds after the change is applied to send SIGTERM, one trial each
    churn_rounds: int         # one-second rounds of DataLoader worker churn (25: the fewest that start
                              # twice the series cap's worth of workers)
    full_disk_rounds: int     # rounds of the full-disk cases (SIGTERM, running on, restart)
    seed: int


def counts_for(soak: bool) -> Counts:
    seed = int(os.environ.get(SEED_ENV, "20240611"))
    if soak:
        return Counts(True, kill_trials=50, fuzz_cases=10_000, storm_samples=1_050_000, storm_pids=100_000,
                      storm_span=30.0, storm_delays=(0.0, 1.0, 3.0, 8.0, 13.0), churn_rounds=300,
                      full_disk_rounds=3, seed=seed)
    return Counts(False, kill_trials=5, fuzz_cases=100, storm_samples=150_000, storm_pids=15_000, storm_span=8.0,
                  storm_delays=(0.5,), churn_rounds=25, full_disk_rounds=1, seed=seed)


COUNTS = counts_for(os.environ.get(SOAK_ENV) == "1")


def record_sigterm(scenario: str, seconds: float | None) -> None:
    """Note how long a controller took from SIGTERM to its exit in ``scenario``
    (None: it had not exited when the part gave up on it)."""
    out = os.environ.get(OUT_ENV)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        with open(Path(out) / SIGTERM_FILE, "a") as f:
            f.write(json.dumps({"scenario": scenario,
                                "seconds": None if seconds is None else round(seconds, 3)}) + "\n")
