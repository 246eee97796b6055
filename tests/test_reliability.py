"""The reliability suite: what a crash, a bad file, a forged socket, a damaged
journal or a signal storm leaves behind, counted on the real system.

1. SIGKILL at random points of each actuator's change (affinity, dscp,
   deep_tracing, framework_hook), a restart that reconciles the journal: no
   leak (``reliability/crash.py``);
2. fuzzed policy files: the loader answers with policies or its located error
   type, never a traceback (``reliability/fuzz.py``);
3. bad input to every verb: exit 1 or 2, one ``error:`` line, no traceback, no
   hang (``reliability/cli_table.py``);
4. hook sockets forged by another user (nobody): none trusted, each counted
   (``reliability/spoof.py``);
5. a damaged or immutable/append-only journal: rollback still reverts
   (``reliability/journal_damage.py``);
6. a signal storm: SIGTERM still exits cleanly and reverts, every sample is
   accounted for (``reliability/storm.py``);
7. a state disk that fills up under an enforcing controller (SIGTERM at once,
   after running on, a SIGKILL and a restart while full), and another user
   holding more idle connections to the metrics port than the controller has
   descriptors: every change is reverted, nothing is closed as gone that is
   not (``reliability/exhaustion.py``);
8. links planted in the state directory, or a state directory another user
   owns: refused, nothing written through them (``reliability/planted.py``);
9. a journal entry of an actuator this version lacks (closed by ``rollback
   --forget``), a journal of a newer format (refused), SIGHUP while starting
   (``reliability/versions.py``);
10. the wall clock stepped under a controller and a hooked script, for real
    (libfaketime): the loop goes on and ends on time, ``max_actions`` still
    holds after a jump ahead, no false step (``reliability/clock_steps.py``);
11. thirty hook sockets that never answer, beside one that does: a read costs
    one deadline, each is counted, SIGTERM still ends the controller at once
    (``reliability/silent_hooks.py``);
12. DataLoader workers replaced 50 times a second under the real probes: a
    worker's series leave the bus a poll after it exits, none refused at the
    series cap (``reliability/churn.py``).

CI (``make test``) runs the shortened counts of ``reliability/counts.py``
(5 kill trials per actuator, 100 fuzzed files, ...); ``REFLEXARC_SOAK=1`` runs
the full ones (50 per actuator, 10,000 files, ...), which ``make soak``
(``bench/reliability.py``) does before writing ``bench/results/reliability.json``.
Times and memory are recorded (``REFLEXARC_RELIABILITY_OUT``), never asserted.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from conftest import require, require_bpf, require_root

from reliability import (churn, clock_steps, cli_table, crash, exhaustion, journal_damage, planted, silent_hooks,
                         spoof, storm, versions)
from reliability.counts import COUNTS, OUT_ENV

pytestmark = [pytest.mark.kernel, pytest.mark.slow]

LONG = 5400 if COUNTS.soak else 900          # seconds a part may take (pytest-timeout)


@pytest.fixture
def shared_tmp():
    """A directory under /tmp that nobody (the other user of these tests) can
    reach, unlike pytest's private ``tmp_path``; removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="reflexarc-reliability-", dir="/tmp"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


def record(name: str, figures: dict) -> None:
    """The part's figures, for ``bench/reliability.py`` to gather."""
    out = os.environ.get(OUT_ENV)
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / f"{name}.json").write_text(json.dumps(figures, indent=1, default=str) + "\n")


@pytest.mark.kernel
@pytest.mark.timeout(LONG)
@pytest.mark.parametrize("actuator", ["affinity", "dscp", "framework_hook", "deep_tracing"])
def test_sigkill_at_any_point_leaves_nothing_after_the_restart(actuator, tmp_path):
    require_root()
    if actuator in ("dscp", "deep_tracing"):
        require_bpf()
    try:
        figures = crash.run_trials(actuator, COUNTS.kill_trials, tmp_path, COUNTS.seed)
    except crash.Unavailable as exc:
        require(False, str(exc))
    record(f"crash-{actuator}", figures)
    assert figures["trials"] == COUNTS.kill_trials
    assert figures["errors"] == [], "\n".join(figures["errors"])
    assert figures["leaks"] == 0, f"{figures['leaks']} leak(s):\n" + "\n".join(figures["leak_details"])
    # the trials killed real changes: some were live (or journaled as applied) at the kill
    assert figures["live_at_kill"] + figures["journal_at_kill"].get("applied", 0) > 0
    if COUNTS.soak:
        assert figures["trials"] >= 50


@pytest.mark.timeout(LONG)
def test_fuzzed_policy_files_get_located_errors_never_a_traceback(tmp_path):
    try:
        from reliability import fuzz
    except ImportError as exc:
        require(False, f"hypothesis, of the test extras ({exc})")
    figures = fuzz.run_fuzz(COUNTS.fuzz_cases, COUNTS.seed, tmp_path)
    record("fuzz", figures)
    assert figures["cases"] == COUNTS.fuzz_cases, "hypothesis ran fewer cases than asked"
    assert figures["tracebacks"] == 0, json.dumps(figures["traceback_details"][:5], indent=1)
    assert figures["outcomes"]["loaded"] > 0 and figures["outcomes"]["located-error"] > 0


@pytest.mark.timeout(LONG)
def test_bad_input_to_every_verb_gets_one_error_line(tmp_path):
    figures = cli_table.run_table(tmp_path, full=COUNTS.soak)
    record("cli", figures)
    assert set(figures["by_verb"]) >= {"validate", "simulate", "test-policies", "report", "run", "probes", "top",
                                       "act", "rollback", "journal", "explain"}
    assert figures["failures"] == [], f"{len(figures['failures'])} of {figures['cases']} cases:\n" + \
        "\n".join(figures["failures"])


@pytest.mark.kernel
@pytest.mark.timeout(LONG)
def test_hook_sockets_forged_by_another_user_are_never_trusted(shared_tmp):
    require_root()
    require(shutil.which("setpriv") is not None, "setpriv (util-linux) to run processes as nobody")
    figures = spoof.run_spoof(shared_tmp)
    record("spoof", figures)
    assert figures["trusted"] == 0
    assert figures["rejected"] + figures["refused_by_kernel"] == figures["forged"]
    assert figures["problems"] == [], "\n".join(figures["problems"])


@pytest.mark.kernel
@pytest.mark.timeout(LONG)
def test_a_damaged_journal_never_keeps_rollback_from_reverting(tmp_path):
    require_root()
    require_bpf()
    try:
        figures = journal_damage.run_damage(tmp_path, full=COUNTS.soak)
    except RuntimeError as exc:
        require(False, str(exc))
    record("journal", figures)
    assert figures["failures"] == [], "\n".join(figures["failures"])
    assert figures["reverted"] == figures["cases"]


@pytest.mark.timeout(LONG)
def test_a_signal_storm_still_shuts_down_cleanly_and_counts_every_sample(tmp_path):
    figures = storm.run_storm(tmp_path, COUNTS.storm_samples, COUNTS.storm_pids, COUNTS.storm_span,
                              COUNTS.storm_delays)
    record("storm", figures)
    assert figures["failures"] == [], "\n".join(figures["failures"])
    assert figures["trials_ok"] == figures["trials"]
    assert figures["accounted"] == figures["samples"], "samples neither published, rejected nor dropped"


@pytest.mark.timeout(LONG)
def test_a_full_state_disk_never_leaves_a_change_applied(tmp_path):
    require_root()
    figures = exhaustion.full_disk(tmp_path, rounds=COUNTS.full_disk_rounds)
    record("full-disk", figures)
    assert figures["failures"] == [], "\n".join(figures["failures"])
    assert figures["leaks"] == 0, "\n".join(figures["leak_details"])
    assert figures["trials"] == len(exhaustion.CASES) * COUNTS.full_disk_rounds


@pytest.mark.timeout(LONG)
def test_descriptors_taken_by_another_user_never_leave_a_change_applied(tmp_path):
    require_root()
    require(shutil.which("setpriv") is not None, "setpriv (util-linux) to run processes as nobody")
    figures = exhaustion.fd_exhaustion(tmp_path)
    record("fd-exhaustion", figures)
    assert figures["failures"] == [], "\n".join(figures["failures"])
    assert figures["leaks"] == 0, "\n".join(figures["leak_details"])
    assert figures["records"][0]["connected"] + figures["records"][0]["refused_connects"] == exhaustion.IDLE_CLIENTS


def test_links_planted_in_the_state_directory_are_never_written_through(shared_tmp):
    require_root()
    figures = planted.run_planted(shared_tmp)
    record("planted", figures)
    assert figures["failures"] == [], "\n".join(figures["failures"])
    assert len(figures["cases"]) == 7


@pytest.mark.parametrize("case", ["unknown_actuator", "newer_format", "hup_at_start"])
def test_journals_of_other_versions_and_a_hangup_while_starting(case, tmp_path):
    failures = getattr(versions, case)(tmp_path)
    assert failures == [], "\n".join(failures)


@pytest.mark.parametrize("case", ["controller_steps", "forward_step_limits", "hook_steps"])
def test_a_stepped_wall_clock_neither_stalls_the_loop_nor_cuts_limits_short_nor_fakes_a_step(case, tmp_path):
    require(clock_steps.libfaketime() is not None, "libfaketime (apt: faketime) to step a process's wall clock")
    if case == "forward_step_limits":
        require_root()
    failures = getattr(clock_steps, case)(tmp_path)
    assert failures == [], "\n".join(failures)


def test_a_metrics_port_taken_by_another_process_is_refused_after_the_reconcile(tmp_path):
    require_root()
    figures = exhaustion.port_taken(tmp_path)
    record("port-taken", figures)
    assert figures["failures"] == [], "\n".join(figures["failures"])
    assert figures["records"][0]["live_after_kill"], "the kill left nothing applied: the case proves nothing"
    assert figures["leaks"] == 0, "\n".join(figures["leak_details"])


@pytest.mark.timeout(LONG)
def test_hook_sockets_that_never_answer_cost_one_deadline_not_one_each(shared_tmp):
    require_root()
    require(shutil.which("setpriv") is not None, "setpriv (util-linux) to run processes as nobody")
    figures = silent_hooks.run_silent(shared_tmp)
    record("silent-hooks", figures)
    assert figures["failures"] == [], "\n".join(figures["failures"])


@pytest.mark.kernel
@pytest.mark.timeout(LONG)
def test_churned_workers_series_leave_the_bus_as_they_exit(tmp_path):
    require_bpf()
    figures = churn.run_churn(tmp_path, churn.ROUNDS)
    record("churn", figures)
    assert figures["failures"] == [], f"{len(figures['failures'])} failures:\n" + "\n".join(figures["failures"][:20])
    assert figures["started"] == churn.TRAINERS * churn.WORKERS * churn.ROUNDS
    assert figures["started"] > 2 * figures["cap_per_signal"], "the churn outgrows the series cap twice over"
    assert figures["series_limit"] == 0, \
        f"live workers' samples refused at the cap: {figures['series_limit_by_signal']}"
