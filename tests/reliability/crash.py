"""SIGKILL trials per actuator: a real change through the real command line, a
SIGKILL at a random point of it, a restart that reconciles the journal, and a
count of what was left behind.

Each trial, on a fresh state directory:

1. starts ``reflexarc act ... --mode enforce`` or a controller (``reflexarc run``
   with an enforcing policy fed a replay or the training script's own hook
   signals), with one kill point: the executor's own (``REFLEXARC_FAULT_INJECT``
   ``after-intent`` / ``after-apply``), one inside the actuator
   (``killrun.py``: e.g. ``dscp.filter``, between the filter attach and the
   journal write), a random delay after the start, or a random delay after the
   journal took the intent;
2. notes whether a change was live on the system right after the kill, and how
   far the journal got (``journal_at_kill``: none, intent, applied): a deep
   probe is never live after it, since the kernel removes a dead process's
   uprobes, so for deep_tracing the journal tells;
3. restarts the controller (``run --duration 0``: it reconciles the journal);
   every third trial the restart itself is killed at a point of the revert
   (``dscp.revert-filter``, ``affinity.set`` N, ``hook.undo``, a delay) and
   restarted again;
4. counts as a leak anything still changed: a thread's CPU mask, a clsact
   qdisc, a tc filter, a pin under ``/sys/fs/bpf/reflexarc``, the deep probe's
   breakpoints (int3 on the probed instructions, an entry in ``uprobe_events``),
   a hook setting not undone (or a call without its undo), an open journal entry.
   A leak is recorded with what was found, then cleaned, so the next trial
   starts clean.

The kill point of trial ``i`` is ``specs[i % len(specs)]`` with its random
parameters drawn from a seeded generator: the first specs of each bed are the
ones CI's five trials must cover.

Example::

    summary = run_trials("dscp", trials=5, tmp=Path("/tmp/x"), seed=1)
    summary["leaks"]        # 0
    summary["by_point"]     # {"point:dscp.filter/act": {"trials": 1, "killed": 1, "leaks": 0}, ...}

Needs root; dscp needs bpffs, tc and network namespaces (``tests/netns.py``);
deep_tracing needs bcc, uprobes and gcc (``tests/fixtures/fakeverbs.c``).
Pins are global: a concurrent user of ``/sys/fs/bpf/reflexarc`` would be seen,
so the dscp bed only claims pins that hold no other namespace's rules.

Overhead: per trial one or two children of the CLI (~0.5-1 s each; dscp adds a
~1 s LLVM compile when nothing is pinned, deep_tracing ~3 s of light probes per
controller and ~1 s per deep session).
"""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
ROOT = TESTS.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from reliability.workloads import (CHANGED_FACTOR, HOOK_SCRIPT, IDLE_WORKER, ORIGINAL_FACTOR, QUIET,  # noqa: E402
                                   TRAINER)

KILLRUN = [sys.executable, str(HERE / "killrun.py")]
FAULT_ENV = "REFLEXARC_FAULT_INJECT"
POINT_ENV, NTH_ENV, DELAY_ENV = "REFLEXARC_RELIABILITY_KILL", "REFLEXARC_RELIABILITY_KILL_N", \
    "REFLEXARC_RELIABILITY_KILL_DELAY"
PIN_ROOT = Path("/sys/fs/bpf/reflexarc")
UPROBE_EVENTS = Path("/sys/kernel/tracing/uprobe_events")
CHILD_LIMIT = 120.0     # seconds any child may take: past it, it hangs (a failure)
RUN_DURATION = 20       # seconds a controller runs when its kill point is never reached
JOB = "rj"
INT3 = 0xCC
STEPS = 600             # replayed step_time_ms samples, every 0.1 s


class Unavailable(RuntimeError):
    """The machine lacks what a bed needs (the message says what)."""


@dataclass(frozen=True)
class Spec:
    """One kind of kill: ``kill`` is ``fault:<executor point>``, ``point:<killrun point>``,
    ``delay`` (seconds after the start) or ``delay-after-intent``; ``driver`` is
    ``act``, ``run`` or ``restart``; ``nth``/``delay`` are ranges drawn per trial."""

    kill: str
    driver: str
    nth: tuple[int, int] = (1, 1)
    delay: tuple[float, float] | None = None

    @property
    def label(self) -> str:
        return f"{self.kill}/{self.driver}"


def _sh(*argv: str, check: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(list(argv), capture_output=True, text=True, timeout=60, check=check)


def two_node_sys(root: Path) -> Path:
    """A fixture sysfs with two NUMA nodes: cpu0 on node0, cpu1 on node1."""
    for node in (0, 1):
        d = root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "cpulist").write_text(f"{node}\n")
    return root


def steps_replay(path: Path) -> Path:
    with open(path, "w") as f:
        for i in range(STEPS):
            f.write(json.dumps({"t": i * 0.1, "name": "step_time_ms", "labels": {"job": JOB, "rank": "0"},
                                "value": 520}) + "\n")
    return path


def policy_text(name: str, selector: str, action: str) -> str:
    return (f"policies:\n  - name: {name}\n    mode: enforce\n    selector: {selector}\n    rules:\n"
            f"      - name: slow-steps\n"
            f"        when: {{signal: step_time_ms, agg: max, window: 2s, op: \">\", threshold: 300}}\n"
            f"        actions:\n          - {action}\n"
            f"        rollback: {{on: [shutdown]}}\n")




def open_entries(state: Path) -> list[str]:
    """The journal's open entries, each described, read as the next start reads them."""
    from reflexarc.controller.engine.journal import Journal
    path = state / "journal.jsonl"
    if not path.exists():
        return []
    journal = Journal(path)
    try:
        return [f"journal entry {e.id} ({e.change.get('actuator')}) left {e.state}" for e in journal.open_entries()]
    finally:
        journal.close()


def journal_state(state: Path) -> str:
    """How far the journal got: the last state of its last entry, or "none"."""
    entries = []
    path = state / "journal.jsonl"
    if path.exists():
        from reflexarc.controller.engine.journal import Journal
        journal = Journal(path)
        entries = journal.entries()
        journal.close()
    return entries[-1].state if entries else "none"


def masks(pid: int) -> dict[int, tuple[int, ...]]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = tuple(sorted(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:
            continue
    return out


# --- beds: one per actuator ------------------------------------------------------------------
class Bed:
    """What an actuator's trials act on, and how to tell that nothing was left."""

    name = ""
    drivers = ("act", "run")
    specs: list[Spec] = []
    restart_specs: list[Spec] = []
    probes = False          # the controller needs the probe manager (deep tier)

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.hooks = tmp / "hooks"
        self.hooks.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.sysroot = two_node_sys(tmp / "sys")
        self.replay = steps_replay(tmp / "steps.jsonl")
        (tmp / "quiet.yaml").write_text(QUIET)
        self.policy = tmp / f"{self.name}.yaml"
        self.rng = random.Random()

    # the system under test
    def setup(self) -> None: ...
    def teardown(self) -> None: ...
    def before_trial(self, tdir: Path) -> None: ...
    def after_trial(self) -> None: ...
    def live(self) -> bool: raise NotImplementedError
    def leaks(self) -> list[str]: raise NotImplementedError
    def cleanup(self) -> None: ...

    # command lines
    def globals(self, state: Path) -> list[str]:
        return ["--state-dir", str(state), "--hook-dir", str(self.hooks), "--sys-root", str(self.sysroot)]

    def act_args(self) -> list[str]:
        raise NotImplementedError

    def run_args(self) -> list[str]:
        return ["--replay", str(self.replay)]

    def command(self, driver: str, state: Path) -> list[str]:
        probes = [] if self.probes else ["--no-probes"]
        if driver == "act":
            return self.globals(state) + self.act_args()
        if driver == "run":
            return self.globals(state) + ["run", *probes, *self.run_args(), "--policy", str(self.policy),
                                          "--mode", "policy", "--interval", "0.2", "--duration", str(RUN_DURATION),
                                          "--kill-switch", str(state / "off")]
        # a restart reconciles; a controller of the same policies comes back in their own mode
        policy = self.policy if self._last_driver == "run" else self.tmp / "quiet.yaml"
        return self.globals(state) + ["run", *probes, "--policy", str(policy), "--mode", "policy",
                                      "--duration", "0", "--kill-switch", str(state / "off")]

    _last_driver = "act"


class AffinityBed(Bed):
    name = "affinity"
    specs = [Spec("point:affinity.set", "act", nth=(1, 6)), Spec("fault:after-intent", "act"),
             Spec("fault:after-apply", "run"), Spec("delay", "act"), Spec("point:affinity.set", "run", nth=(1, 6)),
             Spec("fault:after-apply", "act"), Spec("delay-after-intent", "run", delay=(0.0, 0.05)),
             Spec("delay", "run"), Spec("fault:after-intent", "run")]
    restart_specs = [Spec("point:affinity.set", "restart", nth=(1, 6)), Spec("delay", "restart")]

    def setup(self) -> None:
        cpus = os.sched_getaffinity(0)
        if not {0, 1} <= cpus:
            raise Unavailable(f"CPUs 0 and 1 to pin workers to one of them (this process may use {sorted(cpus)})")
        self.trainer = subprocess.Popen([sys.executable, "-c", TRAINER, IDLE_WORKER], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True)
        info = json.loads(self.trainer.stdout.readline())
        self.workers = info["workers"]
        self.original = {pid: masks(pid) for pid in self.workers}
        self.policy.write_text(policy_text(
            "rel-affinity", f"{{match: {{job: {JOB}}}, pids: [{self.trainer.pid}], processes: [pt_data_worker]}}",
            "{actuator: affinity, params: {node: 1}}"))

    def teardown(self) -> None:
        self.trainer.stdin.close()
        self.trainer.wait(timeout=30)

    def act_args(self) -> list[str]:
        return ["act", "affinity", "node=1", "--pid", str(self.trainer.pid), "--mode", "enforce"]

    def _diff(self) -> list[tuple[int, int, tuple, tuple]]:
        out = []
        for pid, threads in self.original.items():
            now = masks(pid)
            if set(now) != set(threads):
                raise RuntimeError(f"worker {pid} lost or gained threads: {sorted(threads)} -> {sorted(now)}")
            out += [(pid, tid, now[tid], cpus) for tid, cpus in threads.items() if now[tid] != cpus]
        return out

    def live(self) -> bool:
        return bool(self._diff())

    def leaks(self) -> list[str]:
        return [f"thread {tid} of worker {pid} left on CPUs {list(now)} (was {list(was)})"
                for pid, tid, now, was in self._diff()]

    def cleanup(self) -> None:
        for pid, threads in self.original.items():
            for tid, cpus in threads.items():
                os.sched_setaffinity(tid, cpus)


class DscpBed(Bed):
    name = "dscp"
    specs = [Spec("point:dscp.filter", "act"), Spec("point:dscp.rules", "act"), Spec("point:dscp.pinned", "run"),
             Spec("fault:after-intent", "act"), Spec("point:dscp.compiled", "act"), Spec("delay", "act"),
             Spec("point:dscp.clsact", "act"), Spec("fault:after-apply", "run"),
             Spec("delay-after-intent", "run", delay=(0.0, 0.3)), Spec("fault:after-apply", "act"),
             Spec("point:dscp.filter", "run"), Spec("point:dscp.pinned", "act"), Spec("delay", "run")]
    restart_specs = [Spec("point:dscp.revert-filter", "restart"), Spec("point:dscp.revert-rules", "restart"),
                     Spec("point:dscp.unpin", "restart"), Spec("delay", "restart")]

    def setup(self) -> None:
        from netns import NetnsPair
        from reflexarc.actuators.dscp import _Link
        self.pair = NetnsPair("rel").__enter__()
        link = _Link(self.pair.ns_a)
        try:
            self.cookie = link.cookie()
        finally:
            link.close()
        self.pins_before = PIN_ROOT.exists()
        self.policy.write_text(policy_text(
            "rel-dscp", f"{{match: {{job: {JOB}}}, interfaces: [{self.pair.if_a}], netns: {self.pair.ns_a}}}",
            '{actuator: dscp, params: {dscp: EF, ports: ["5201"], protocol: udp}}'))

    def teardown(self) -> None:
        self.pair.__exit__(None, None, None)

    def act_args(self) -> list[str]:
        return ["act", "dscp", "dscp=EF", f"interfaces={self.pair.if_a}", f"netns={self.pair.ns_a}", "ports=5201",
                "protocol=udp", "--mode", "enforce"]

    def _tc(self) -> tuple[str, str]:
        q = self.pair.run("a", "tc", "qdisc", "show", "dev", self.pair.if_a).stdout
        f = self.pair.run("a", "tc", "filter", "show", "dev", self.pair.if_a, "egress").stdout
        return q, f

    def _pins(self) -> list[str]:
        """Pins this bed's changes left: all of them when there were none before the
        bed started and no other namespace's rules are in them, else the rules and
        interface entries of this bed's namespace."""
        if not PIN_ROOT.exists():
            return []
        names = sorted(str(p.relative_to(PIN_ROOT)) for p in PIN_ROOT.rglob("*") if not p.is_dir())
        if not names:                           # directories without a pin: nothing is held
            return []
        from reflexarc.actuators.dscp import DscpActuator
        try:
            pinned = DscpActuator()._open_pins()
        except Exception as exc:                # noqa: BLE001 - unreadable pins are left pins
            return [f"pins under {PIN_ROOT} that cannot be opened ({exc}): {names}"]
        if pinned is None:
            return [] if self.pins_before else [f"pins left under {PIN_ROOT}: {names}"]
        try:
            slots = pinned.slots()
            keys = pinned.ifaces.keys()
        finally:
            pinned.close()
        ours = [r for _, r in slots if r.netns == self.cookie] + [k for k in keys if k.netns == self.cookie]
        foreign = [r for _, r in slots if r.netns != self.cookie] + [k for k in keys if k.netns != self.cookie]
        if ours:
            return [f"{len(ours)} rule(s)/interface entries of netns {self.pair.ns_a} left in the pinned maps"]
        if not foreign and not self.pins_before:
            return [f"pins left under {PIN_ROOT} with no rule: {names}"]
        return []

    def live(self) -> bool:
        q, f = self._tc()
        return "clsact" in q or bool(f.strip())

    def leaks(self) -> list[str]:
        q, f = self._tc()
        out = []
        if "clsact" in q:
            out.append(f"clsact qdisc left on {self.pair.ns_a}:{self.pair.if_a}")
        if f.strip():
            out.append(f"tc filter left on {self.pair.ns_a}:{self.pair.if_a} egress: {' '.join(f.split())[:160]}")
        return out + self._pins()

    def cleanup(self) -> None:
        self.pair.run("a", "tc", "qdisc", "del", "dev", self.pair.if_a, "clsact", check=False)
        if self.pins_before or not PIN_ROOT.exists():
            return
        for path in sorted(PIN_ROOT.rglob("*"), key=lambda p: -len(p.parts)):
            path.rmdir() if path.is_dir() else path.unlink()
        PIN_ROOT.rmdir()


class HookBed(Bed):
    name = "framework_hook"
    specs = [Spec("point:hook.call", "act", delay=(0.0, 0.15)), Spec("point:hook.called", "act"),
             Spec("point:hook.called", "run"), Spec("fault:after-intent", "act"), Spec("delay", "act"),
             Spec("fault:after-apply", "run"), Spec("point:hook.call", "run", delay=(0.0, 0.15)),
             Spec("fault:after-apply", "act"), Spec("delay-after-intent", "run", delay=(0.0, 0.15)),
             Spec("delay", "run")]
    restart_specs = [Spec("point:hook.undo", "restart", delay=(0.0, 0.15)), Spec("delay", "restart")]

    def setup(self) -> None:
        self.script = None
        self.policy.write_text(policy_text(
            "rel-hook", f"{{match: {{job: {JOB}}}}}",
            "{actuator: framework_hook, params: {handler: loader.prefetch, args: {factor: %d}}}" % CHANGED_FACTOR))

    def before_trial(self, tdir: Path) -> None:
        tdir.mkdir(parents=True, exist_ok=True)
        self.state_file = tdir / "hook-state.json"
        self.boundary = self.rng.random() < 0.7
        self.script = subprocess.Popen([sys.executable, "-c", HOOK_SCRIPT, str(self.hooks), JOB,
                                        str(self.state_file)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True, start_new_session=True)
        line = self.script.stdout.readline()
        if not line:
            raise RuntimeError(f"the training script did not start: {self.script.stderr.read()[-1500:]}")
        self.socket = Path(json.loads(line)["ready"])

    def after_trial(self) -> None:
        if self.script is not None:
            self.script.kill()
            self.script.wait(timeout=30)
            self.script.stdout.close()
            self.script.stderr.close()
            self.script = None
            # a killed script leaves its socket; the next trial's script is another process
            self.socket.unlink(missing_ok=True)

    def teardown(self) -> None:
        self.after_trial()

    def act_args(self) -> list[str]:
        return ["act", "framework_hook", "handler=loader.prefetch", f"args={json.dumps({'factor': CHANGED_FACTOR})}",
                f"at_step_boundary={'true' if self.boundary else 'false'}", "--job", JOB, "--mode", "enforce"]

    def run_args(self) -> list[str]:
        return []                    # the script's own step signals drive the controller

    def _state(self) -> dict:
        if self.script.poll() is not None:
            raise RuntimeError(f"the training script exited: {self.script.stderr.read()[-1500:]}")
        return json.loads(self.state_file.read_text())

    def live(self) -> bool:
        return self._state()["factor"] != ORIGINAL_FACTOR

    def leaks(self) -> list[str]:
        # a call queued for the step boundary runs at the next step: wait for one
        time.sleep(0.25)
        s = self._state()
        out = []
        if s["factor"] != ORIGINAL_FACTOR:
            out.append(f"the script's prefetch factor left at {s['factor']} (was {ORIGINAL_FACTOR})")
        if s["calls"] != s["undos"]:
            out.append(f"the handler ran {s['calls']} time(s), its undo {s['undos']} time(s)")
        return out


class DeepBed(Bed):
    name = "deep_tracing"
    drivers = ("run",)
    probes = True
    specs = [Spec("point:deep.enabled", "run"), Spec("point:deep.start", "run", delay=(0.0, 1.5)),
             Spec("fault:after-intent", "run"), Spec("fault:after-apply", "run"),
             Spec("delay-after-intent", "run", delay=(0.0, 2.0)), Spec("delay", "run")]
    restart_specs = [Spec("delay", "restart")]

    def setup(self) -> None:
        from fixtures.fakeverbs import POLL, POST, FakeVerbs
        try:
            self.verbs = FakeVerbs.build(self.tmp)
        except (RuntimeError, subprocess.CalledProcessError) as exc:
            raise Unavailable(f"gcc to build the stand-in verbs library: {exc}") from None
        self.symbols = (POST, POLL)
        lib = self.verbs.path
        self.policy.write_text(policy_text(
            "rel-deep", f"{{match: {{job: {JOB}}}}}",
            "{actuator: deep_tracing, params: {probe: rdma_qp, ttl: 10m, "
            f'uprobes: ["{lib}:{POST}", "{lib}:{POLL}"]}}}}'))
        self.policy.write_text(self.policy.read_text().replace("rollback: {on: [shutdown]}",
                                                               "rollback: {on: [shutdown, ttl], ttl: 10m}"))

    def _events(self) -> list[str]:
        try:
            text = UPROBE_EVENTS.read_text()
        except OSError:
            return []
        return [line for line in text.splitlines() if str(self.verbs.path) in line]

    def live(self) -> bool:
        return any(self.verbs.first_byte(s) == INT3 for s in self.symbols)

    def leaks(self) -> list[str]:
        out = [f"breakpoint (int3) left on {s} of {self.verbs.path}" for s in self.symbols
               if self.verbs.first_byte(s) == INT3]
        return out + [f"uprobe event left: {line}" for line in self._events()]

    def cleanup(self) -> None:
        for line in self._events():
            name = line.split()[0].split(":", 1)[1]
            with open(UPROBE_EVENTS, "a") as f:
                f.write(f"-:{name}\n")


BEDS = {bed.name: bed for bed in (AffinityBed, DscpBed, HookBed, DeepBed)}


# --- one trial -----------------------------------------------------------------------------
def _env(spec: Spec, rng: random.Random) -> tuple[dict, dict]:
    """The child's environment for ``spec`` and what was drawn for it."""
    env = {k: v for k, v in os.environ.items() if k not in (FAULT_ENV, POINT_ENV, NTH_ENV, DELAY_ENV)}
    drawn: dict = {}
    kind, _, what = spec.kill.partition(":")
    if kind == "fault":
        env[FAULT_ENV] = what
    elif kind == "point":
        env[POINT_ENV] = what
        drawn["nth"] = env[NTH_ENV] = str(rng.randint(*spec.nth))
        if spec.delay:
            drawn["delay_s"] = round(rng.uniform(*spec.delay), 4)
            env[DELAY_ENV] = str(drawn["delay_s"])
    return env, drawn


def _child(argv: list[str], env: dict, log: Path) -> tuple[subprocess.Popen, object]:
    out = open(log, "w+")
    return subprocess.Popen(KILLRUN + argv, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            cwd=log.parent), out


def _wait(proc: subprocess.Popen, limit: float) -> bool:
    """Whether ``proc`` ended within ``limit`` seconds (else it is killed: a hang)."""
    try:
        proc.wait(timeout=limit)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


def _kill_after(proc: subprocess.Popen, delay: float) -> None:
    try:
        proc.wait(timeout=delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)


def _intent_seen(journal: Path, proc: subprocess.Popen, limit: float) -> bool:
    end = time.monotonic() + limit
    while time.monotonic() < end and proc.poll() is None:
        try:
            if b'"intent"' in journal.read_bytes():
                return True
        except FileNotFoundError:
            pass
        time.sleep(0.002)
    return False


def _execute(bed: Bed, spec: Spec, state: Path, rng: random.Random, log: Path, timing: dict) -> dict:
    """Runs one child of ``spec`` (its own kill included); what happened."""
    env, drawn = _env(spec, rng)
    began = time.monotonic()
    proc, out = _child(bed.command(spec.driver, state), env, log)
    rec: dict = {**drawn}
    try:
        if spec.kill == "delay":
            longest = timing.get(spec.driver, 1.0)
            rec["delay_s"] = round(rng.uniform(0.0, longest * 1.1), 4)
            _kill_after(proc, rec["delay_s"])
        elif spec.kill == "delay-after-intent":
            if _intent_seen(state / "journal.jsonl", proc, CHILD_LIMIT):
                rec["delay_s"] = round(rng.uniform(*spec.delay), 4)
                _kill_after(proc, rec["delay_s"])
        rec["hung"] = not _wait(proc, CHILD_LIMIT)
        rec["rc"] = proc.returncode
        rec["killed"] = proc.returncode == -signal.SIGKILL and not rec["hung"]
        rec["seconds"] = round(time.monotonic() - began, 3)
        out.seek(0)
        text = out.read()
        rec["traceback"] = "Traceback" in text
        if rec["traceback"] or (not rec["killed"] and proc.returncode not in (0,)):
            rec["output"] = text[-1500:]
        return rec
    finally:
        out.close()


def trial(bed: Bed, n: int, spec: Spec, restart: Spec | None, rng: random.Random, timing: dict) -> dict:
    tdir = bed.tmp / f"trial{n}"
    tdir.mkdir(parents=True, exist_ok=True)
    state = tdir / "state"
    bed.before_trial(tdir)
    try:
        rec: dict = {"n": n, "point": spec.label}
        dirty = bed.leaks()
        if dirty:                        # the previous trial's cleanup failed: not this trial's leak
            bed.cleanup()
            rec["dirty_start"] = dirty
        bed._last_driver = spec.driver
        rec["first"] = _execute(bed, spec, state, rng, tdir / "first.log", timing)
        rec["live_at_kill"] = bed.live()
        rec["journal_at_kill"] = journal_state(state)
        rec["restarts"] = []
        if restart is not None:
            res = _execute(bed, restart, state, rng, tdir / "restart-killed.log", timing)
            rec["restarts"].append({"point": restart.label, **res})
        res = _execute(bed, Spec("none", "restart"), state, rng, tdir / "restart.log", timing)
        rec["restarts"].append({"point": "none", **res})
        leaks = bed.leaks() + open_entries(state)
        rec["leaks"] = leaks
        if leaks:
            bed.cleanup()
        return rec
    finally:
        bed.after_trial()


def calibrate(bed: Bed, driver: str, rng: random.Random) -> tuple[dict, float, float]:
    """A trial without a kill: how long the driver takes to apply (act: to exit;
    run: until the journal says applied, then SIGKILL) and the restart to revert."""
    tdir = bed.tmp / f"calibrate-{driver}"
    tdir.mkdir(parents=True, exist_ok=True)
    state = tdir / "state"
    bed.before_trial(tdir)
    try:
        bed._last_driver = driver
        env, _ = _env(Spec("none", driver), rng)
        began = time.monotonic()
        proc, out = _child(bed.command(driver, state), env, tdir / "first.log")
        try:
            if driver == "run":
                end = time.monotonic() + CHILD_LIMIT
                while time.monotonic() < end and proc.poll() is None:
                    if state.joinpath("journal.jsonl").exists() and \
                            b'"applied"' in state.joinpath("journal.jsonl").read_bytes():
                        break
                    time.sleep(0.005)
                took = time.monotonic() - began
                applied = bed.live()
                proc.send_signal(signal.SIGKILL)
            else:
                took = None
            hung = not _wait(proc, CHILD_LIMIT)
            took = took if took is not None else time.monotonic() - began
            out.seek(0)
            text = out.read()
        finally:
            out.close()
        if driver != "run":
            applied = bed.live()
        res = _execute(bed, Spec("none", "restart"), state, rng, tdir / "restart.log", {})
        rec = {"driver": driver, "apply_s": round(took, 3), "hung": hung, "applied": applied,
               "rc": proc.returncode, "restart": res, "leaks": bed.leaks() + open_entries(state)}
        if not applied:
            rec["output"] = text[-1500:]
        if rec["leaks"]:
            bed.cleanup()
        return rec, took, res["seconds"]
    finally:
        bed.after_trial()


def run_trials(actuator: str, trials: int, tmp: Path, seed: int) -> dict:
    """``trials`` SIGKILL trials of ``actuator``; the figures and every trial."""
    bed = BEDS[actuator](tmp)
    rng = random.Random(f"{seed}/{actuator}")
    bed.rng = random.Random(f"{seed}/{actuator}/bed")
    bed.setup()
    began = time.monotonic()
    records, calibration, timing = [], [], {}
    try:
        for driver in bed.drivers:
            rec, took, restart = calibrate(bed, driver, rng)
            calibration.append(rec)
            timing[driver] = took
            timing["restart"] = max(timing.get("restart", 0.0), restart)
        for n in range(trials):
            spec = bed.specs[n % len(bed.specs)]
            restart = bed.restart_specs[(n // 3) % len(bed.restart_specs)] if n % 3 == 2 else None
            records.append(trial(bed, n, spec, restart, rng, timing))
    finally:
        bed.teardown()
    return summarize(actuator, records, calibration, time.monotonic() - began)


def summarize(actuator: str, records: list[dict], calibration: list[dict], seconds: float) -> dict:
    by_point: dict = {}
    errors = []
    for r in records:
        p = by_point.setdefault(r["point"], {"trials": 0, "killed": 0, "live_at_kill": 0, "journal_at_kill": {},
                                             "leaks": 0})
        p["trials"] += 1
        p["killed"] += r["first"]["killed"]
        p["live_at_kill"] += r["live_at_kill"]
        p["journal_at_kill"][r["journal_at_kill"]] = p["journal_at_kill"].get(r["journal_at_kill"], 0) + 1
        p["leaks"] += bool(r["leaks"])
        injected = not r["point"].startswith(("delay", "none"))
        if injected and not r["first"]["killed"]:
            errors.append(f"trial {r['n']} ({r['point']}): the kill point was never reached "
                          f"(exit {r['first']['rc']}): {r['first'].get('output', '')[-300:]}")
        for child in [r["first"], *r["restarts"]]:
            if child["hung"]:
                errors.append(f"trial {r['n']} ({r['point']}): a child hung past {CHILD_LIMIT:g}s")
            if child["traceback"]:
                errors.append(f"trial {r['n']} ({r['point']}): a traceback: {child.get('output', '')[-600:]}")
        final = r["restarts"][-1]
        if final["rc"] != 0:
            errors.append(f"trial {r['n']} ({r['point']}): the restart exited {final['rc']}: "
                          f"{final.get('output', '')[-600:]}")
        if r.get("dirty_start"):
            errors.append(f"trial {r['n']}: started dirty (the previous cleanup failed): {r['dirty_start']}")
    for c in calibration:
        if not c["applied"] or c["hung"] or c["restart"]["rc"] != 0:
            errors.append(f"calibration ({c['driver']}): applied {c['applied']}, exit {c['rc']}, restart exit "
                          f"{c['restart']['rc']}: {c.get('output', '')[-600:]} {c['restart'].get('output', '')[-600:]}")
    leaks = [f"trial {r['n']} ({r['point']}"
             + (f", restart killed at {r['restarts'][0]['point']}" if len(r["restarts"]) > 1
                and r["restarts"][0]["killed"] else "")
             + f"): {leak}" for r in records for leak in r["leaks"]]
    leaks += [f"calibration ({c['driver']}, no kill): {leak}" for c in calibration for leak in c["leaks"]]
    return {
        "actuator": actuator,
        "trials": len(records),
        "killed": sum(r["first"]["killed"] for r in records),
        "live_at_kill": sum(r["live_at_kill"] for r in records),
        "journal_at_kill": {state: sum(r["journal_at_kill"] == state for r in records)
                            for state in sorted({r["journal_at_kill"] for r in records})},
        "restarts_killed": sum(len(r["restarts"]) > 1 and r["restarts"][0]["killed"] for r in records),
        "leaks": len(leaks),
        "leak_details": leaks[:40],
        "errors": errors[:40],
        "by_point": by_point,
        "worst_trial_s": max((round(r["first"]["seconds"] + sum(x["seconds"] for x in r["restarts"]), 3)
                              for r in records), default=None),
        "seconds": round(seconds, 1),
        "calibration": calibration,
        "records": records,
    }
