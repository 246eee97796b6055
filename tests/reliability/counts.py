"""How many of each kind of case a run makes: the shortened counts of CI, or the
full ones of a soak (``REFLEXARC_SOAK=1``, set by ``bench/reliability.py``).

Example::

    from reliability.counts import COUNTS
    COUNTS.kill_trials       # 5 in CI, 50 in a soak (per actuator)

``REFLEXARC_RELIABILITY_SEED`` changes the random choices (kill points, delays,
fuzz inputs); the default seed makes two runs of one tree choose alike.

Overhead: none (constants read once at import).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

SOAK_ENV = "REFLEXARC_SOAK"
SEED_ENV = "REFLEXARC_RELIABILITY_SEED"
OUT_ENV = "REFLEXARC_RELIABILITY_OUT"     # a directory: each part writes its figures there as JSON


@dataclass(frozen=True)
class Counts:
    soak: bool
    kill_trials: int          # SIGKILL trials per actuator
    fuzz_cases: int           # fuzzed policy files
    storm_samples: int        # samples in the storm's replay
    storm_pids: int           # distinct DataLoader pids in it
    storm_span: float         # seconds its records are due within
    storm_delays: tuple       # seconds after the change is applied to send SIGTERM, one trial each
    seed: int


def counts_for(soak: bool) -> Counts:
    seed = int(os.environ.get(SEED_ENV, "20240611"))
    if soak:
        return Counts(True, 50, 10_000, 1_050_000, 100_000, 30.0, (0.0, 1.0, 3.0, 8.0, 13.0), seed)
    return Counts(False, 5, 300, 150_000, 15_000, 8.0, (0.5,), seed)


COUNTS = counts_for(os.environ.get(SOAK_ENV) == "1")
