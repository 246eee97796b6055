"""The controller's rule runs stay bounded while a DataLoader churns workers.

A training process whose DataLoader has no ``persistent_workers`` starts two new
``pt_data_worker`` processes (new pids) every epoch. The controller must track
the training process, not every pid it ever saw: its rule runs may not grow
with the number of epochs. Here ``tests/workloads/epoch_loader.py`` runs 5 short
epochs (default DataLoader, 2 workers, real preads, hook signals on) beside a
controller built in-process as ``reflexarc run`` builds it: the shipped
policies, the probes' selection from their selectors, live bcc probes
(ProbeManager + ProbeSource), framework hook signals (HookSource), dry-run,
ticked at 1 Hz on wall time. Outcomes asserted, nothing timed:

* the churn happened: the job started >= 2 workers per epoch, and the probes
  delivered DataLoader read signals;
* rule runs after 5 epochs (plus two ticks for the last epoch's signals) are at
  most ``RUNS_PER_RULE`` per rule of the shipped policies (one training process
  and one job here), and at most ``SLACK`` more than after epoch 2.

Other tests on the machine may run DataLoaders of their own; the probes select
every ``pt_data_worker``, so samples of workers that demonstrably belong to
another process (seen under /proc with another parent; by ``pid`` label, or
``trainer`` label where the probes add one) are not published to the
controller's bus.

Needs root, BPF and torch; ~25 s on an idle 2-core VM (torch import, probe
compile ~3 s, 5 epochs of ~1.4 s, more on a loaded machine).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from conftest import ROOT, require, require_bpf
import pytest

pytestmark = [pytest.mark.kernel]

EPOCHS = 5
RUNS_PER_RULE = 2
SLACK = 2
TICK_S = 1.0
WORKER_COMM = "pt_data_worker"


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


class Workers:
    """Polls /proc: the job's DataLoader workers (children named pt_data_worker)
    and other processes of that name (foreign: another test's DataLoader), with
    their parents (foreign training processes)."""

    def __init__(self, job_pid: int) -> None:
        self.job_pid = job_pid
        self.mine: set[int] = set()
        self.foreign: set[str] = set()
        self.foreign_trainers: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    with open(f"/proc/{entry}/stat") as f:
                        text = f.read()
                except OSError:
                    continue
                if text[text.index("(") + 1:text.rindex(")")] != WORKER_COMM:
                    continue
                ppid = int(text.rpartition(")")[2].split()[1])
                if ppid == self.job_pid:
                    self.mine.add(int(entry))
                else:
                    self.foreign.add(entry)
                    self.foreign_trainers.add(str(ppid))

    def is_foreign(self, labels: dict) -> bool:
        """A sample of another process's workers: by its ``pid`` label, or by
        ``trainer`` (the worker's training process) where the probes add one."""
        return labels.get("pid") in self.foreign or labels.get("trainer") in self.foreign_trainers

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def test_rule_runs_bounded_under_worker_churn(tmp_path):
    require_bpf()
    require(torch_available(), "torch (pip install -e .[test])")
    from reflexarc.actuators.registry import ActuatorConfig, build_registry
    from reflexarc.bpf.manager import ProbeManager
    from reflexarc.controller.engine.audit import AuditLog
    from reflexarc.controller.engine.bus import SignalBus
    from reflexarc.controller.cli.shared import _selection
    from reflexarc.controller.engine.clock import WallClock
    from reflexarc.controller.engine.engine import Controller
    from reflexarc.controller.engine.journal import Journal
    from reflexarc.controller.engine.limits import LimitSettings
    from reflexarc.controller.policy.loader import load_policies
    from reflexarc.controller.runtime.simulate import BUILTIN_POLICIES
    from reflexarc.controller.sources.readers import HookSource, ProbeSource

    job = f"churn{os.getpid()}"
    hooks, state = tmp_path / "hooks", tmp_path / "state"
    hooks.mkdir()
    state.mkdir()
    policies = load_policies([str(BUILTIN_POLICIES)])
    n_rules = sum(len(p.rules) for p in policies)
    clock = WallClock()
    manager = ProbeManager(_selection(policies, job), interval=TICK_S)
    statuses = manager.start()
    assert statuses["dataloader_io"].state in ("ok", "degraded"), statuses
    config = ActuatorConfig(state_dir=str(state), hook_dir=str(hooks), deep_tier=manager)
    sources = [HookSource(str(hooks), job), ProbeSource(manager)]
    journal = Journal(state / "journal.jsonl", clock)
    ctl = Controller(policies, SignalBus(), build_registry(config), clock, mode_override="dry-run",
                     journal=journal, audit=AuditLog(state / "audit.jsonl", clock),
                     limits=LimitSettings(str(tmp_path / "disable"), 4, 20))
    ctl.start(source="live")

    train = subprocess.Popen([sys.executable, str(ROOT / "tests" / "workloads" / "epoch_loader.py"),
                              "--epochs", str(EPOCHS), "--hook-dir", str(hooks), "--job", job],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    workers = Workers(train.pid)
    lines: list[dict] = []
    reader = threading.Thread(target=lambda: lines.extend(json.loads(x) for x in train.stdout), daemon=True)
    reader.start()
    ticks: list[tuple[int, int]] = []          # (epochs done before the tick, len(ctl.runs) after it)
    loader_samples, sample_pids, dropped = 0, set(), 0
    try:
        deadline = time.monotonic() + 150      # a bound on a broken run, not a timing assertion
        after_exit = 0
        while after_exit < 2:                  # two more ticks once the job exited
            assert time.monotonic() < deadline, f"the job did not finish {EPOCHS} epochs: {lines[-1:]}"
            began = clock.now()
            done = max([r["epochs"] for r in lines if "epochs" in r], default=0)
            for src in sources:
                for name, labels, value in src.poll(began):
                    if workers.is_foreign(labels):
                        dropped += 1
                        continue
                    if name.startswith("dataloader_read"):
                        loader_samples += 1
                        sample_pids.add(labels.get("pid"))
                    ctl.bus.publish(name, labels, value, began)
            ctl.tick(began)
            ticks.append((done, len(ctl.runs)))
            if train.poll() is not None:
                after_exit += 1
            time.sleep(max(0.0, TICK_S - (clock.now() - began)))
    finally:
        if train.poll() is None:
            os.killpg(train.pid, signal.SIGKILL)
        train.wait()
        workers.stop()
        for src in sources:
            src.close()
        ctl.shutdown()
        journal.close()

    assert train.returncode == 0, train.stderr.read()[-2000:]
    reader.join(10)
    final = lines[-1]
    runs_by_epoch = {k: max([r for d, r in ticks if d <= k], default=0) for k in range(EPOCHS + 1)}
    final_runs = ticks[-1][1]
    measured = (f"runs by epoch {runs_by_epoch}, final {final_runs}, {n_rules} rules; job workers "
                f"{final['workers']} (seen under /proc: {len(workers.mine)}); worker pids in loader samples "
                f"{len(sample_pids - {None})}; foreign worker samples dropped {dropped}; "
                f"run keys: {sorted('/'.join(k) if isinstance(k, tuple) else str(k) for k in ctl.runs)}")
    print(measured)
    assert final["epochs"] == EPOCHS
    assert final["workers"] >= 2 * EPOCHS, f"no churn: {measured}"
    assert loader_samples > 0, f"the probes delivered no DataLoader read signals: {measured}"
    exceeded = []
    if final_runs > RUNS_PER_RULE * n_rules:
        exceeded.append(f"{final_runs} > {RUNS_PER_RULE} per rule x {n_rules} rules")
    if final_runs > runs_by_epoch[2] + SLACK:
        exceeded.append(f"{final_runs} > {runs_by_epoch[2]} after epoch 2 + {SLACK}")
    assert not exceeded, f"rule runs grow with the worker churn ({'; '.join(exceeded)}): {measured}"
