"""Jobs found from the node alone (``core/launchers.py``, ``core/cgroup_jobs.py``,
``core/jobs.py``, ``reflexarc jobs``): launcher environments and kubelet/Slurm
cgroup layouts read from real processes placed in real cgroups (v2 and v1), two
jobs on one node kept apart, bad input skipped with a counted reason, and no
byte of an environment beyond the recognised keys kept anywhere."""
from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from conftest import require, require_root

from reflexarc.core.cgroup_jobs import from_cgroups, placement
from reflexarc.core.cgroups import cgroup2_root
from reflexarc.core.jobs import Discovery
from reflexarc.core.launchers import Malformed, from_environ, recognised

pytestmark = [pytest.mark.kernel]

SECRET = "hunter2-s3cr3t-token-value"
# A training process that forks one DataLoader-like worker (renamed as torch names
# its workers) and a helper child that keeps the environment, then waits.
TRAINER = r"""
import ctypes, os, sys, time
def child(name):
    if os.fork() == 0:
        if name:
            ctypes.CDLL(None).prctl(15, name, 0, 0, 0)
        time.sleep(120); os._exit(0)
child(b"pt_data_worker")
child(b"")
print("ready", flush=True)
time.sleep(120)
"""


def env_blob(**env: str) -> bytes:
    return b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())


# --- what launchers set -----------------------------------------------------------
def test_each_launcher_names_job_and_rank():
    cases = {
        "torchrun": (dict(TORCHELASTIC_RUN_ID="llama-7b", RANK="3", LOCAL_RANK="1", WORLD_SIZE="16",
                          MASTER_ADDR="10.0.0.1", MASTER_PORT="29500"), ("llama-7b", 3, 1, 16)),
        "slurm": (dict(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID="5", SLURM_LOCALID="1",
                       SLURM_NTASKS="8"), ("slurm-4242", 5, 1, 8)),
        "openmpi": (dict(OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_LOCAL_RANK="0", OMPI_COMM_WORLD_SIZE="4",
                         OMPI_MCA_ess_base_jobid="3840475137"), ("3840475137", 2, 0, 4)),
        "pmix": (dict(PMIX_RANK="7", PMIX_NAMESPACE="prterun-n1-811@1"), ("prterun-n1-811@1", 7, None, None)),
        "deepspeed": (dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", MASTER_ADDR="n1", MASTER_PORT="29500",
                           CROSS_RANK="0", CROSS_SIZE="1", LOCAL_SIZE="2"), ("n1:29500", 1, 1, 2)),
        "accelerate": (dict(TORCHELASTIC_RUN_ID="ft-run", RANK="0", LOCAL_RANK="0", WORLD_SIZE="2",
                            ACCELERATE_MIXED_PRECISION="bf16"), ("ft-run", 0, 0, 2)),
    }
    for launcher, (env, want) in cases.items():
        launch = from_environ(recognised(env_blob(**env, HF_TOKEN=SECRET)))
        assert launch is not None and launch.launcher == launcher, (launcher, launch)
        assert (launch.job, launch.rank, launch.local_rank, launch.world_size) == want, launcher


def test_torchrun_inside_slurm_is_the_slurm_job_with_torchruns_rank():
    launch = from_environ(recognised(env_blob(SLURM_JOB_ID="99", SLURM_PROCID="0", TORCHELASTIC_RUN_ID="none",
                                              RANK="6", LOCAL_RANK="2", WORLD_SIZE="8")))
    assert (launch.job, launch.rank, launch.local_rank) == ("slurm-99", 6, 2)


def test_no_launcher_no_job_and_torchruns_default_run_id_is_no_id():
    assert from_environ(recognised(env_blob(HOME="/root", PATH="/bin"))) is None
    assert from_environ(recognised(env_blob(TORCHELASTIC_RUN_ID="none", RANK="0"))) is None


def test_only_recognised_keys_survive():
    env = recognised(env_blob(RANK="0", AWS_SECRET_ACCESS_KEY=SECRET, PET_NNODES="2", ACCELERATE_X=SECRET) +
                     b"garbage-without-equals\0\xff\xfe=\x00")
    assert env == {"RANK": "0", "PET_": "", "ACCELERATE_": ""}
    assert SECRET not in repr(env)


@pytest.mark.parametrize("blob, why", [
    (env_blob(RANK="A" * 300), "bytes long"),
    (env_blob(RANK="-1"), "not a number"),
    (env_blob(WORLD_SIZE=str(1 << 30)), "not a number"),
    (b"TORCHELASTIC_RUN_ID=caf\xc3\xa9\0", "not ASCII"),
    (env_blob(TORCHELASTIC_RUN_ID="a b;rm -rf /"), "characters"),
])
def test_malformed_values_are_refused_without_the_value(blob, why):
    with pytest.raises(Malformed) as err:
        recognised(blob)
    assert why in str(err.value) and "rm -rf" not in str(err.value) and "AAAA" not in str(err.value)


# --- cgroup layouts -------------------------------------------------------------------
UID = "1b2c3d4e-0000-4a4a-8b8b-0123456789ab"
CID = "ab" * 32


@pytest.mark.parametrize("path, pod, container, qos", [
    (f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID.replace('-', '_')}.slice/"
     f"cri-containerd-{CID}.scope", UID, CID, "burstable"),
    (f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope", UID, CID, ""),
    (f"/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID.replace('-', '_')}.slice/"
     f"docker-{CID}.scope", UID, CID, "besteffort"),
    (f"/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-conmon-{CID}.scope", UID, "", ""),
    (f"/kubepods/burstable/pod{UID}/{CID}", UID, CID, "burstable"),
    (f"/kubepods/pod{UID}/{CID}", UID, CID, ""),
    (f"/system.slice/containerd.service/kubepods/pod{UID}/{CID}", UID, CID, ""),   # a node in a container
])
def test_kubelet_layouts(path, pod, container, qos):
    place = placement(path)
    assert (place.pod, place.container, place.qos) == (pod, container, qos)


def test_slurm_layouts_and_unrelated_paths():
    v2 = placement("/system.slice/slurmstepd.scope/job_42/step_0/user/task_0")
    v1 = placement("/slurm/uid_1000/job_43/step_batch/task_1")
    assert (v2.slurm_job, v2.slurm_step, v1.slurm_job, v1.slurm_step) == ("42", "0", "43", "batch")
    for path in ("/", "/user.slice/user-1000.slice/session-3.scope", "/job_42/step_0", "/kubepods/podnotauid"):
        assert placement(path) is None, path
    best = from_cgroups(["/kubepods/pod" + UID, f"/kubepods/pod{UID}/{CID}"])
    assert best.container == CID, "the most specific line wins"


# --- real processes in real cgroups ----------------------------------------------------
class Cgroups:
    """Directories made under the real cgroup2 (and one v1) hierarchy, below a
    prefix of this test's own; processes moved in; all removed at the end."""

    def __init__(self) -> None:
        self.made: list[Path] = []

    def make(self, root: Path, rel: str) -> Path:
        path = root / rel
        for parent in reversed([path, *path.parents]):
            if parent != root and root in parent.parents and not parent.exists():
                parent.mkdir()
                self.made.append(parent)
        return path

    def move(self, path: Path, pid: int) -> None:
        (path / "cgroup.procs").write_text(str(pid))

    def close(self, procs) -> None:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        for d in reversed(self.made):
            for _ in range(50):
                try:
                    d.rmdir()
                    break
                except OSError:
                    import time
                    time.sleep(0.1)


def start(env: dict, cgroups: list[tuple[Cgroups, Path]] = ()) -> subprocess.Popen:
    r, w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-c", "import os,sys; os.read(int(sys.argv[1]), 1); " +
                             f"exec(compile({TRAINER!r}, 'trainer', 'exec'))", str(r)],
                            env={"PATH": "/usr/bin:/bin", "DB_PASSWORD": SECRET, **env}, pass_fds=(r,),
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    os.close(r)
    for cg, path in cgroups:
        cg.move(path, proc.pid)                  # before it forks: its children are born there
    os.write(w, b"x")
    os.close(w)
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def two_jobs():
    require_root()
    v2 = cgroup2_root()
    require(v2 is not None, "a mounted cgroup2 hierarchy")
    v1 = Path("/sys/fs/cgroup/pids")
    require(v1.is_dir() and (v1 / "cgroup.procs").exists(), "a cgroup v1 pids hierarchy at /sys/fs/cgroup/pids")
    tag = f"rxjobs{os.getpid()}"
    uid = str(uuid.uuid4())
    cg = Cgroups()
    procs = []
    try:
        pod = cg.make(v2, f"{tag}/kubepods.slice/kubepods-burstable.slice/"
                          f"kubepods-burstable-pod{uid.replace('-', '_')}.slice/cri-containerd-{CID}.scope")
        step = cg.make(v1, f"{tag}/slurm/uid_0/job_4242/step_0/task_0")
        torchrun = dict(TORCHELASTIC_RUN_ID="llama-7b", RANK="1", LOCAL_RANK="0", WORLD_SIZE="2",
                        MASTER_ADDR="10.99.0.1", MASTER_PORT="29500")
        procs.append(start(torchrun, [(cg, pod)]))
        procs.append(start(dict(SLURM_JOB_ID="4242", SLURM_STEP_ID="0", SLURM_PROCID="0", SLURM_LOCALID="0",
                                SLURM_NTASKS="1"), [(cg, step)]))
        procs.append(start({}))                  # a job started by hand: no launcher, no pod
        yield uid, procs
    finally:
        cg.close(procs)


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_two_jobs_on_one_node_each_with_its_own_ranks_and_processes(two_jobs):
    uid, (pod_job, slurm_job, bare) = two_jobs
    d = Discovery()
    d.refresh()
    jobs = {j.name: j for j in d.jobs()}
    llama, slurm = jobs["llama-7b"], jobs["slurm-4242"]
    assert [(t.pid, t.rank) for t in llama.trainers] == [(pod_job.pid, 1)]
    assert [(t.pid, t.rank) for t in slurm.trainers] == [(slurm_job.pid, 0)]
    assert llama.pods == [uid] and slurm.pods == []
    assert set(llama.trainers[0].processes) == {pod_job.pid, *children(pod_job.pid)}
    assert set(slurm.trainers[0].processes) == {slurm_job.pid, *children(slurm_job.pid)}
    assert {"environ TORCHELASTIC_RUN_ID", "environ RANK", "kubelet systemd cgroup"} <= set(llama.evidence)
    assert "slurm cgroup" in slurm.evidence
    bare_job = jobs[f"python-{bare.pid}"]
    assert [(t.pid, t.rank) for t in bare_job.trainers] == [(bare.pid, None)], "started by hand: a job of its own"
    assert bare_job.evidence == ["process"] and "" not in jobs
    assert set(bare_job.trainers[0].processes) == {bare.pid, *children(bare.pid)}
    # every process is labelled through its training process, workers included
    worker = next(c for c in children(pod_job.pid) if Path(f"/proc/{c}/comm").read_text().strip() == "pt_data_worker")
    assert d.identity(worker).labels() == {"job": "llama-7b", "rank": "1", "pod": uid}
    assert d.identity(slurm_job.pid).labels() == {"job": "slurm-4242", "rank": "0"}
    assert [d.identity(p).labels() for p in (bare.pid, *children(bare.pid))] == [{"job": f"python-{bare.pid}"}] * 3
    assert Discovery(fallback="by-hand").identity(bare.pid).job == "by-hand"
    assert Discovery(fallback="by-hand").identity(pod_job.pid).job == "llama-7b", "--job never relabels a found job"
    assert SECRET not in repr(d._known) and SECRET not in repr(d.jobs())


def test_jobs_verb_names_each_job_and_keeps_secrets(two_jobs, tmp_path):
    uid, (pod_job, slurm_job, bare) = two_jobs
    rx = Path(sys.executable).parent / "reflexarc"
    table = subprocess.run([str(rx), "jobs"], capture_output=True, text=True)
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0] + ":" + line.split()[4] for line in table.stdout.splitlines()[1:] if len(line.split()) > 5}
    assert f"llama-7b:{pod_job.pid}" in rows and f"slurm-4242:{slurm_job.pid}" in rows
    assert f"pod {uid}" in table.stdout
    out = subprocess.run([str(rx), "jobs", "--json"], capture_output=True, text=True)
    doc = json.loads(out.stdout)
    llama = next(j for j in doc["jobs"] if j["job"] == "llama-7b")
    assert llama["ranks"][0]["container"] == CID and llama["ranks"][0]["launcher"] == "torchrun"
    for text in (table.stdout, table.stderr, out.stdout, out.stderr):
        assert SECRET not in text


# --- bad input ----------------------------------------------------------------------
def fixture_proc(root: Path, pid: int, comm: str, environ: bytes | None, ppid: int = 1) -> Path:
    d = root / str(pid)
    (d / "task" / str(pid)).mkdir(parents=True)
    (d / "stat").write_text(f"{pid} ({comm}) S {ppid} " + " ".join(["0"] * 17) + " 5000 0 0\n")
    (d / "comm").write_text(comm + "\n")
    (d / "cgroup").write_text("0::/\n")
    if environ is not None:
        (d / "environ").write_bytes(environ)
    return d


def test_bad_environments_are_skipped_with_a_counted_reason(tmp_path):
    root = tmp_path / "proc"
    fixture_proc(root, 10, "python", env_blob(TORCHELASTIC_RUN_ID="ok", RANK="0"))
    fixture_proc(root, 11, "python", None)                                     # vanished before the read
    fixture_proc(root, 12, "python", env_blob(RANK="9" * 400))                # huge value
    fixture_proc(root, 13, "python", b"X=" + b"y" * (2 << 20))                # a 2 MiB environment
    fixture_proc(root, 14, "python", env_blob(SLURM_PROCID="zero", SLURM_JOB_ID="1"))
    d = Discovery(str(root))
    d.refresh()
    assert dict(d.skipped) == {"vanished": 1, "malformed": 2, "oversized": 1}
    assert [j.name for j in d.jobs()] == ["ok"]


def test_a_job_started_by_no_launcher_is_a_job_of_its_own(tmp_path):
    """A DataLoader owner with no launcher environment, pod or Slurm cgroup is a job
    named after its script and pid: its workers and helpers follow it, for its
    life, two such differ, ``--job`` comes first, and nothing else of its
    command line or environment is kept."""
    from reflexarc.controller.cli.jobs import format_jobs
    root = tmp_path / "proc"

    def proc(pid: int, comm: str, ppid: int, *argv: str, environ: bytes = env_blob(DB_PASSWORD=SECRET)) -> None:
        d = fixture_proc(root, pid, comm, environ, ppid)
        (d / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))

    proc(100, "bash", 1, "-bash")
    proc(20, "python3", 100, "/usr/bin/python3", "-u", "/srv/exp/sleepy_trainer.py", "--token", SECRET, "x.py")
    proc(21, "pt_data_worker", 20)
    proc(22, "pt_data_worker", 20)
    proc(23, "python3", 20, "/usr/bin/python3", "-c", "helper")            # a helper: follows its trainer
    proc(30, "python3", 100, "python3", "/srv/exp/sleepy_trainer.py")       # the same script, once more
    proc(31, "pt_data_worker", 30)
    proc(40, "python", 100, "python", "-m", "my pkg.train", "--lr=0.1")
    proc(41, "pt_data_worker", 40)
    proc(50, "python", 100, "python", "-c", f"run('{SECRET}.py')", "b.py")
    proc(51, "pt_data_worker", 50)
    proc(60, "python3", 100, "python3", "reader.py")                        # no workers: no job
    llama = env_blob(TORCHELASTIC_RUN_ID="llama", RANK="0")
    proc(70, "python3", 100, "python3", "train.py", environ=llama)
    proc(71, "pt_data_worker", 70, environ=llama)
    d = Discovery(str(root))
    d.refresh()
    jobs = {j.name: j for j in d.jobs()}
    assert sorted(jobs) == ["llama", "my_pkg.train-40", "python-50", "sleepy_trainer.py-20", "sleepy_trainer.py-30"]
    own = jobs["sleepy_trainer.py-20"]
    assert own.evidence == ["process"] and [(t.pid, t.rank) for t in own.trainers] == [(20, None)]
    assert sorted(own.trainers[0].processes) == [20, 21, 22, 23]
    assert own.as_dict()["ranks"][0]["launcher"] == ""
    assert [d.identity(p).labels() for p in (20, 21, 22, 23)] == [{"job": "sleepy_trainer.py-20"}] * 4
    assert d.identity(30).job == "sleepy_trainer.py-30", "two jobs started by hand are two jobs"
    assert d.identity(60) is None and d.identity(100) is None, "a process with no workers is no job"
    assert d.identity(71).job == "llama" and "environ TORCHELASTIC_RUN_ID" in jobs["llama"].evidence
    table = format_jobs(d.jobs(), d.skipped)
    assert "sleepy_trainer.py-20: found by process" in table
    assert ["sleepy_trainer.py-20", "-", "-", "-", "20", "4", "-", "-"] in [line.split() for line in table.splitlines()]
    assert SECRET not in repr(d._known) + repr(d.jobs()) + table
    # between two sets of workers (an epoch's turn), and with a new one: the same job
    for worker in ("21", "22"):
        for f in sorted((root / worker).rglob("*"), reverse=True):
            f.rmdir() if f.is_dir() else f.unlink()
        (root / worker).rmdir()
    d.refresh()
    assert sorted({j.name: j for j in d.jobs()}["sleepy_trainer.py-20"].trainers[0].processes) == [20, 23]
    proc(24, "pt_data_worker", 20)
    assert d.identity(24).job == "sleepy_trainer.py-20"
    # --job names the training processes with no launcher, pod or Slurm job, not a job that was found
    named = Discovery(str(root), fallback="by-hand")
    named.refresh()
    assert {j.name: sorted(t.pid for t in j.trainers) for j in named.jobs()} == {"by-hand": [20, 30, 40, 50],
                                                                                  "llama": [70]}
    assert [named.identity(p).job for p in (20, 24, 23, 30, 71)] == ["by-hand"] * 4 + ["llama"]


def test_unreadable_environments_are_counted_not_raised():
    """As an unprivileged user, other users' environments cannot be read."""
    require_root()
    script = ("from reflexarc.core.jobs import Discovery; d = Discovery(); d.refresh(); d.jobs(); "
              "import json; print(json.dumps(d.skipped))")
    out = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
                          script], capture_output=True, text=True, cwd="/")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout).get("unreadable", 0) > 0


class NoDescriptorsLeft:
    """Every file descriptor this process may open is in use, for the block's length."""

    def __enter__(self):
        self.limits = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 8, self.limits[1]))
        self.held = []
        try:
            while True:
                self.held.append(os.open("/dev/null", os.O_RDONLY))
        except OSError:
            pass
        return self

    def __exit__(self, *exc):
        for fd in self.held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, self.limits)


def test_fd_exhaustion_is_not_taken_for_a_gone_process(tmp_path):
    root = tmp_path / "proc"
    fixture_proc(root, 10, "python", env_blob(TORCHELASTIC_RUN_ID="ok", RANK="0"))
    known, fresh = Discovery(str(root)), Discovery(str(root))
    known.refresh()
    with NoDescriptorsLeft():
        known.refresh()
        fresh.refresh()
        unread = fresh._environ(10)
        assert known.identity(10).job == "ok", "a known process is kept while descriptors are out"
    assert unread == "fd-exhausted"
    assert known.skipped["fd-exhausted"] >= 1 and known.skipped["vanished"] == 0, dict(known.skipped)
    assert [j.name for j in known.jobs()] == ["ok"]
    fresh.refresh()                                  # tried again once descriptors are back
    assert [j.name for j in fresh.jobs()] == ["ok"] and fresh.skipped["vanished"] == 0


def test_each_jobs_training_processes_are_a_metric(two_jobs):
    from prometheus_client import CollectorRegistry, generate_latest

    from reflexarc.bpf.manager import ProbeManager
    from reflexarc.bpf.probe import Selection
    from reflexarc.controller.runtime.exporter import ProbeCollector
    uid, (pod_job, slurm_job, bare) = two_jobs
    manager = ProbeManager(Selection(), probes=[])
    manager.start()
    registry = CollectorRegistry()
    registry.register(ProbeCollector(manager))
    assert registry.get_sample_value("reflexarc_job_info", {"job": "llama-7b", "rank": "1", "pod": uid,
                                                            "launcher": "torchrun", "pid": str(pod_job.pid)}) == 1
    assert registry.get_sample_value("reflexarc_job_info", {"job": "slurm-4242", "rank": "0", "pod": "",
                                                            "launcher": "slurm", "pid": str(slurm_job.pid)}) == 1
    assert registry.get_sample_value("reflexarc_job_discovery_skipped_total", {"reason": "malformed"}) == 0
    assert SECRET not in generate_latest(registry).decode()
    assert [t.pid for j in manager.jobs if j.name == "llama-7b" for t in j.trainers] == [pod_job.pid]
    assert pod_job.pid in manager.selection.trainers and slurm_job.pid in manager.selection.trainers


def test_no_byte_of_an_environment_beyond_the_launchers_keys_leaves_the_controller(two_jobs, tmp_path):
    """The controller runs (verbose, probes on, metrics served) beside jobs whose
    environments hold a secret; its output, log, audit, journal, metrics and
    report never show it, while they do name the jobs."""
    import time
    import urllib.request

    from conftest import require_bpf
    from reflexarc.simulations.testbed.local_server import free_port
    require_bpf()
    uid, (pod_job, slurm_job, bare) = two_jobs
    rx = str(Path(sys.executable).parent / "reflexarc")
    port = free_port()
    state = tmp_path / "state"
    run = subprocess.Popen([rx, "-v", "--state-dir", str(state), "--hook-dir", str(tmp_path / "hooks"), "run",
                            "--duration", "20", "--metrics-addr", f"127.0.0.1:{port}"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    scraped = ""
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and 'job="llama-7b"' not in scraped:
            time.sleep(0.5)
            try:
                scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                continue
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0, err
    assert 'job="llama-7b"' in scraped, "the jobs are exported"
    report = subprocess.run([rx, "report", str(state / "audit.jsonl"), "--out", str(tmp_path / "report")],
                            capture_output=True, text=True)
    assert report.returncode == 0, report.stderr
    texts = {"stdout": out, "stderr": err, "metrics": scraped, "report stdout": report.stdout}
    for path in [*state.rglob("*"), *(tmp_path / "report").rglob("*")]:
        if path.is_file():
            texts[str(path)] = path.read_bytes().decode(errors="replace")
    leaked = [where for where, text in texts.items() if SECRET in text]
    assert not leaked, f"the planted secret shows in {leaked}"


def test_validate_says_when_a_policy_names_a_job_no_process_runs(two_jobs, tmp_path):
    uid, _ = two_jobs
    policy = tmp_path / "p.yaml"
    rule = ("    rules:\n      - name: slow\n        when: {signal: step_time_ms, agg: max, window: 10s, op: \">\", "
            "threshold: 100}\n        actions: [{actuator: log}]\n        rollback: {on: [clear]}\n")
    rx = str(Path(sys.executable).parent / "reflexarc")
    for selector, note in (("{jobs: [\"llama-*\"]}", False), ("{match: {job: slurm-4242}}", False),
                           ("{jobs: [\"gpt-*\"]}", True), ("{match: {job: llama}}", True)):
        policy.write_text(f"policies:\n  - name: p\n    selector: {selector}\n{rule}")
        out = subprocess.run([rx, "validate", str(policy)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert ("no such job runs on this node now" in out.stdout + out.stderr) == note, (selector, out.stdout)


def test_a_label_value_no_source_gives_is_a_warning(tmp_path):
    from reflexarc.controller.policy.loader import validate_paths
    policy = tmp_path / "q.yaml"
    policy.write_text("policies:\n  - name: q\n    rules:\n      - name: r\n        when: {signal: "
                      "dataloader_read_latency_us, match: {quantile: \"p99\"}, agg: max, window: 10s, op: \">\", "
                      "threshold: 100}\n        actions: [{actuator: log}]\n        rollback: {on: [clear]}\n")
    _, diags = validate_paths([str(policy)])
    assert [(d.line, d.col, d.severity) for d in diags] == [(5, 70, "warning")]
    assert "quantile 'p99'" in diags[0].message and "did you mean '0.99'" in diags[0].message
    from reflexarc.bpf.loghist import QUANTILES
    from reflexarc.core.signals import LABEL_VALUES
    assert tuple(str(q) for q in QUANTILES) == LABEL_VALUES["quantile"], "the probes give what the loader knows"


def test_validate_names_an_interface_or_namespace_that_does_not_exist(tmp_path):
    rx = str(Path(sys.executable).parent / "reflexarc")
    rule = ("    rules:\n      - name: r\n        when: {signal: link_utilization_pct, match: {traffic: other}, "
            "agg: max, window: 10s, op: \">\", threshold: 20}\n        actions: [{actuator: log}]\n"
            "        rollback: {on: [clear]}\n")
    policy = tmp_path / "p.yaml"
    for selector, words in (("{interfaces: [rxnosuch0]}", "no interface rxnosuch0 on this node"),
                            ("{interfaces: [eth0], netns: rxnosuchns}", "network namespace rxnosuchns does not exist")):
        policy.write_text(f"policies:\n  - name: p\n    selector: {selector}\n{rule}")
        loose = subprocess.run([rx, "validate", str(policy)], capture_output=True, text=True)
        strict = subprocess.run([rx, "validate", "--strict", str(policy)], capture_output=True, text=True)
        assert loose.returncode == 0 and words in loose.stdout + loose.stderr, loose
        assert strict.returncode == 1 and words in strict.stdout + strict.stderr, strict
