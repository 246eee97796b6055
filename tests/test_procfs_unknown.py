"""/proc that cannot be read is not /proc saying "gone": ProcFS and the affinity
actuator against real processes and a real EMFILE.

Each check under descriptor exhaustion runs in a child Python process (so this
process keeps its descriptors): it imports and builds what it needs, lowers
RLIMIT_NOFILE to 64, opens /dev/null until ``open`` fails with EMFILE, then
calls ProcFS, the actuator or the executor and prints what each returned or
raised as one JSON line. The processes looked at are real: a sleeping Python
process, and a training process (``tests/reliability/workloads.py`` TRAINER)
with two workers named ``pt_data_worker`` of three threads each, pinned to
node 1 of a fixture sysfs ``{node0: cpu0, node1: cpu1}``; masks are checked
from this process with ``sched_getaffinity``.

What EMFILE does here: ``open`` fails before the path is looked up, so the
``stat`` of a live process reads as unknown (``ProcUnreadable``, errno EMFILE)
while the lenient calls still answer None or empty as before. A strict read
that fails looks the path up again with ``stat(2)``, which needs no
descriptor: a pid (or thread id) whose /proc entry is missing still reads as
gone under EMFILE, so a change whose workers all exited is still closed as
``target-gone``.

Needs CPUs 0 and 1 both allowed to this process; no root.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import require, two_node_sys
from reliability.workloads import IDLE_WORKER, TRAINER

from reflexarc.actuators.affinity import AffinityActuator
from reflexarc.actuators.base import Change, PermanentActuatorError, Registry, Target
from reflexarc.controller.engine.clock import WallClock
from reflexarc.controller.engine.executor import Executor, RetrySettings
from reflexarc.controller.engine.journal import Journal
from reflexarc.core.outcomes import Outcome
from reflexarc.core.procfs import ProcFS

# Run before each child's own lines: exhaust() leaves it at EMFILE, free() ends that.
PRELUDE = textwrap.dedent(r"""
    import errno, json, os, resource, sys

    def exhaust():
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(64, hard), hard))
        held = []
        while True:
            try:
                held.append(os.open("/dev/null", os.O_RDONLY | os.O_CLOEXEC))
            except OSError as exc:
                assert exc.errno == errno.EMFILE, exc
                return held

    def free(held):
        for fd in held:
            os.close(fd)

    def outcome(call):
        try:
            return {"value": call()}
        except Exception as exc:
            return {"raised": [c.__name__ for c in type(exc).__mro__], "errno": getattr(exc, "errno", None),
                    "message": str(exc)}

    def say(obj):
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()
""")


def in_child(body: str, *args) -> dict:
    """Run ``body`` (after PRELUDE) in a fresh Python process; its JSON line."""
    done = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(body), *map(str, args)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"child exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def require_cpus_0_and_1() -> None:
    have = os.sched_getaffinity(0)
    require({0, 1} <= have, f"CPUs 0 and 1 both allowed to this process (allowed: {sorted(have)})")


def masks(pids: list[int]) -> dict[int, list[int]]:
    """The mask of every thread of ``pids``, by tid."""
    return {int(tid): sorted(os.sched_getaffinity(int(tid))) for pid in pids for tid in os.listdir(f"/proc/{pid}/task")}


def raised(result: dict, cls: str) -> bool:
    return cls in result.get("raised", ())


class Job:
    """A training process with two ``pt_data_worker`` workers of three threads each."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", TRAINER, IDLE_WORKER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        ready = json.loads(self.proc.stdout.readline())
        self.trainer, self.workers = ready["trainer"], ready["workers"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def job():
    j = Job()
    try:
        yield j
    finally:
        j.stop()


@pytest.fixture
def sleeper():
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


def test_procfs_under_emfile_reads_a_live_process_as_unknown_and_a_missing_one_as_gone(sleeper):
    procfs = ProcFS()
    live, start = sleeper.pid, procfs.start_time(sleeper.pid)
    comm = procfs.comm(live)
    done = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    gone, gone_start = done.pid, procfs.start_time(done.pid)
    done.stdin.close()
    done.wait(timeout=30)
    assert start is not None and gone_start is not None and comm

    out = in_child(r"""
        from reflexarc.core.procfs import ProcFS
        live, start, gone, gone_start = map(int, sys.argv[1:5])
        comm = sys.argv[5]
        procfs = ProcFS()
        held = exhaust()
        out = {
            "lenient_start": outcome(lambda: procfs.start_time(live)),
            "lenient_threads": outcome(lambda: procfs.threads(live)),
            "lenient_find": outcome(lambda: procfs.find((comm,), pid=live)),
            "strict_start": outcome(lambda: procfs.start_time(live, strict=True)),
            "strict_threads": outcome(lambda: procfs.threads(live, strict=True)),
            "strict_find": outcome(lambda: procfs.find((comm,), pid=live, strict=True)),
            "alive": outcome(lambda: procfs.alive(live, start)),
            "alive_thread": outcome(lambda: procfs.alive(live, start, live)),
            "gone_alive": outcome(lambda: procfs.alive(gone, gone_start)),
            "gone_start": outcome(lambda: procfs.start_time(gone, strict=True)),
            "gone_threads": outcome(lambda: procfs.threads(gone, strict=True)),
            "gone_thread_of_live": outcome(lambda: procfs.alive(live, start, gone)),
        }
        free(held)
        out["alive_again"] = outcome(lambda: procfs.alive(live, start))
        out["start_again"] = outcome(lambda: procfs.start_time(live, strict=True))
        say(out)
    """, live, start, gone, gone_start, comm)

    # The lenient calls answer as before: nothing read.
    assert out["lenient_start"] == {"value": None}
    assert out["lenient_threads"] == {"value": []}
    assert out["lenient_find"] == {"value": []}
    # Strict ones and alive(pid, start) cannot tell: ProcUnreadable, errno EMFILE, path named.
    for key, path in (("strict_start", f"/proc/{live}/stat"), ("strict_threads", f"/proc/{live}/task"),
                      ("strict_find", f"/proc/{live}/status"), ("alive", f"/proc/{live}/stat"),
                      ("alive_thread", f"/proc/{live}/task/{live}/stat")):
        assert raised(out[key], "ProcUnreadable") and raised(out[key], "OSError"), (key, out[key])
        assert out[key]["errno"] == 24, (key, out[key])
        assert out[key]["message"] == f"{path}: Too many open files", (key, out[key])
    # A missing /proc entry is gone even under EMFILE: the path lookup needs no descriptor.
    assert out["gone_alive"] == {"value": False}
    assert out["gone_start"] == {"value": None}
    assert out["gone_threads"] == {"value": []}
    assert out["gone_thread_of_live"] == {"value": False}
    # With descriptors back, the same process reads as alive.
    assert out["alive_again"] == {"value": True}
    assert out["start_again"] == {"value": start}


def test_a_pinned_change_is_not_gone_and_not_reverted_while_proc_cannot_be_read(tmp_path, job):
    require_cpus_0_and_1()
    sys_root = two_node_sys(tmp_path / "sys")
    act = AffinityActuator(sys_root=str(sys_root))
    originals = masks(job.workers)
    assert len(originals) == 6 and all(0 in m for m in originals.values()), originals

    change = act.plan(Target(selector={"pids": [job.trainer]}), {"node": 1})
    act.apply(change)
    assert set(map(tuple, masks(job.workers).values())) == {(1,)}
    by_trainer = act.plan(Target({"trainer": str(job.trainer)}), {"node": 1})

    path = tmp_path / "journal.jsonl"
    journal = Journal(path)
    jid = journal.intent(change.to_dict(), "p", "r")
    journal.mark(jid, Outcome.APPLIED)
    journal.close()
    (tmp_path / "change.json").write_text(json.dumps(change.to_dict()))
    (tmp_path / "by_trainer.json").write_text(json.dumps(by_trainer.to_dict()))

    out = in_child(r"""
        from reflexarc.actuators.affinity import AffinityActuator
        from reflexarc.actuators.base import Change, Registry
        from reflexarc.controller.engine.clock import WallClock
        from reflexarc.controller.engine.executor import Executor, RetrySettings
        from reflexarc.controller.engine.journal import Journal
        change = Change.from_dict(json.load(open(sys.argv[1])))
        by_trainer = Change.from_dict(json.load(open(sys.argv[2])))
        act = AffinityActuator(sys_root=sys.argv[3])
        journal = Journal(sys.argv[4])          # its lock and append descriptor taken now
        registry = Registry()
        registry.register(act.spec, lambda: act)
        executor = Executor(registry, journal, WallClock(), RetrySettings(attempts=2, wait_min=0.01, wait_max=0.02))

        def refreshed():
            grown = act.refresh(change)
            return None if grown is None else grown.to_dict()

        held = exhaust()
        out = {
            "exists": outcome(lambda: act.exists(change)),
            "exists_by_trainer": outcome(lambda: act.exists(by_trainer)),
            "refresh": outcome(refreshed),
            "revert": outcome(lambda: act.revert(change)),
        }
        step = executor.revert(change, sys.argv[5], "enforce")
        out["executor"] = {"outcome": str(step.outcome), "error": step.error}
        free(held)
        say(out)
    """, tmp_path / "change.json", tmp_path / "by_trainer.json", sys_root, path, jid)

    assert raised(out["exists"], "TemporaryActuatorError"), out["exists"]
    assert "Too many open files" in out["exists"]["message"], out["exists"]
    assert raised(out["exists_by_trainer"], "TemporaryActuatorError"), out["exists_by_trainer"]
    assert out["refresh"] == {"value": None}        # nothing dropped from the change
    assert raised(out["revert"], "ActuatorError"), out["revert"]
    assert "Too many open files" in out["revert"]["message"], out["revert"]
    assert out["executor"]["outcome"] == Outcome.FAILED, out["executor"]
    assert "Too many open files" in out["executor"]["error"], out["executor"]
    # Nothing was restored, and the journal still lists the change as applied.
    assert set(map(tuple, masks(job.workers).values())) == {(1,)}
    journal = Journal(path)
    try:
        assert [(e.id, e.state) for e in journal.open_entries()] == [(jid, Outcome.APPLIED)]
        # With descriptors available again the same entry reverts, and the masks are the originals.
        registry = Registry()
        registry.register(act.spec, lambda: act)
        executor = Executor(registry, journal, WallClock(), RetrySettings(attempts=2, wait_min=0.01, wait_max=0.02))
        step = executor.revert(Change.from_dict(journal.get(jid).change), jid, "enforce")
        assert step.outcome == Outcome.REVERTED, step
        assert masks(job.workers) == originals
        assert journal.open_entries() == []
    finally:
        journal.close()


def test_a_change_whose_workers_exited_is_gone_even_under_emfile(tmp_path, job):
    require_cpus_0_and_1()
    sys_root = two_node_sys(tmp_path / "sys")
    act = AffinityActuator(sys_root=str(sys_root))
    change = act.plan(Target(selector={"pids": [job.trainer]}), {"node": 1})
    act.apply(change)
    job.stop()
    (tmp_path / "change.json").write_text(json.dumps(change.to_dict()))

    out = in_child(r"""
        from reflexarc.actuators.affinity import AffinityActuator
        from reflexarc.actuators.base import Change
        change = Change.from_dict(json.load(open(sys.argv[1])))
        act = AffinityActuator(sys_root=sys.argv[2])
        held = exhaust()
        out = {"exists": outcome(lambda: act.exists(change)), "revert": outcome(lambda: act.revert(change))}
        free(held)
        say(out)
    """, tmp_path / "change.json", sys_root)

    assert out == {"exists": {"value": False}, "revert": {"value": None}}


def test_revert_fails_naming_the_thread_whose_mask_reads_back_otherwise(tmp_path, job):
    require_cpus_0_and_1()
    absent = os.cpu_count()          # a CPU id this machine does not have: the kernel drops it from a mask
    require(absent not in os.sched_getaffinity(0), f"CPU {absent} not allowed to this process")
    act = AffinityActuator(sys_root=str(two_node_sys(tmp_path / "sys")))
    originals = masks(job.workers)
    change = act.plan(Target(selector={"pids": [job.trainer]}), {"node": 1})
    act.apply(change)

    # The recorded original of one thread names a CPU that does not exist.
    odd = Change.from_dict(change.to_dict())
    thread = odd.before["processes"][0]["threads"][0]
    thread["cpus"] = [0, absent]
    with pytest.raises(PermanentActuatorError) as err:
        act.revert(odd)
    assert str(err.value) == (f"thread {thread['tid']} of pid {odd.before['processes'][0]['pid']}: mask set to "
                              f"CPUs 0,{absent} but read back as 0")
    # Every other thread was still restored.
    now = masks(job.workers)
    assert now.pop(thread["tid"]) == [0]
    assert now == {tid: cpus for tid, cpus in originals.items() if tid != thread["tid"]}
    # The true originals revert and read back without error.
    act.revert(change)
    assert masks(job.workers) == originals


def test_the_affinity_guard_never_takes_unreadable_proc_for_nothing_to_refuse(sleeper):
    """The lenient guard of old answered None (nothing to refuse) for a process
    it could not read; the affinity actuator's guard reads strictly."""
    out = in_child(r"""
        from reflexarc.actuators.affinity import AffinityActuator
        from reflexarc.core.procfs import ProcFS
        from reflexarc.core.targets import ProcessGuard
        live = int(sys.argv[1])
        strict, lenient = AffinityActuator().guard, ProcessGuard(ProcFS())
        held = exhaust()
        out = {"strict": outcome(lambda: strict.touch(live)), "lenient": outcome(lambda: lenient.touch(live)),
               "strict_kthread": outcome(lambda: strict.touch(2))}
        free(held)
        out["strict_again"] = outcome(lambda: strict.touch(live))
        say(out)
    """, sleeper.pid)
    assert raised(out["strict"], "ProcUnreadable") and out["strict"]["errno"] == 24, out["strict"]
    assert out["lenient"] == {"value": None}
    assert raised(out["strict_kthread"], "ProcUnreadable"), out["strict_kthread"]
    assert out["strict_again"] == {"value": None}
