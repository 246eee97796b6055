"""The reliability suite's parts: SIGKILL trials per actuator, policy fuzzing, bad
command-line input, hook spoofing, journal damage and a signal storm.

``tests/test_reliability.py`` runs each part with the shortened counts of
``counts.py`` (the CI run of ``make test``); with ``REFLEXARC_SOAK=1`` it runs
the full counts, which ``bench/reliability.py`` (``make soak``) does and then
writes ``bench/results/reliability.json``. Each part returns a plain dict of
figures, so the tests assert on them and the bench records them.

Overhead: each part spawns the real ``reflexarc`` command line in children;
see each module for its cost.
"""
