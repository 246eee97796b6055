"""Shared test helpers.

Tests that need root, BPF, tracefs or network namespaces run for real. When the
machine lacks a capability the test fails and says which, unless the run sets
REFLEXARC_ALLOW_SKIP=1 (CI never does).

The controller's command line is spelled here only: the ``cli`` fixture in a
test, ``run_cli`` / ``spawn_cli`` in a helper module, and ``parse_cli`` for a
command line the parser alone answers (a refusal, exit 2, or ``--help``).

Example::

    def test_validate(cli, tmp_path):
        r = cli("validate", str(tmp_path / "p.yaml"), check=1)
        assert "unknown key" in r.stderr

    ctl = spawn_cli("--state-dir", str(state), "run", "--no-probes",
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    parse_cli("top", "--count", "x").returncode          # 2, in this process

Overhead: one ``python -m reflexarc.controller.cli`` child per ``cli`` call
(~0.2-0.6 s, mostly imports); ``parse_cli`` starts none (~1 ms).
"""
from __future__ import annotations

import contextlib
import io
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

RX = [sys.executable, "-m", "reflexarc.controller.cli"]   # the ``reflexarc`` command, as tests start it


def run_cli(*args: str, env: dict[str, str] | None = None, input: str | None = None, timeout: float = 120,
            check: int | None = None, prefix: tuple[str, ...] | list[str] = (),
            **options: object) -> subprocess.CompletedProcess:
    """``reflexarc ARGS`` run to its end in a child process, text captured.

    ``env`` replaces the environment (None: this one); stdin is ``input`` or
    empty; ``prefix`` is a command it runs under (``setpriv ...``, ``sh -c``);
    ``check`` is the exit status it must end with (AssertionError showing its
    output otherwise); ``options`` are ``subprocess.run``'s own (``cwd``,
    ``preexec_fn``...)."""
    r = subprocess.run([*prefix, *RX, *args], capture_output=True, text=True, env=env, timeout=timeout,
                       input=input, stdin=None if input is not None else subprocess.DEVNULL, **options)
    if check is not None:
        assert r.returncode == check, f"reflexarc {' '.join(args)} exited {r.returncode}, not {check}:\n" \
                                      f"{r.stdout}\n{r.stderr}"
    return r


def parse_cli(*args: str) -> subprocess.CompletedProcess:
    """What ``reflexarc ARGS`` answers when its parser alone decides (a bad
    command line, exit 2; ``--help``, exit 0), asked in this process; an
    AssertionError when the parser accepts ``args``."""
    from reflexarc.controller.cli.main import build_parser
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            build_parser().parse_args(list(args))
        except SystemExit as exited:
            return subprocess.CompletedProcess([*RX, *args], exited.code, out.getvalue(), err.getvalue())
    raise AssertionError(f"the parser accepted reflexarc {' '.join(args)}")


def spawn_cli(*args: str, prefix: tuple[str, ...] | list[str] = (), **popen: object) -> subprocess.Popen:
    """``reflexarc ARGS`` started in a child process and left running (a
    ``run``), text mode; ``popen`` are ``subprocess.Popen``'s own options."""
    return subprocess.Popen([*prefix, *RX, *args], text=True, **popen)


def require(ok: bool, capability: str) -> None:
    """Fail (or, with REFLEXARC_ALLOW_SKIP=1, skip) when ``capability`` is missing."""
    if ok:
        return
    if os.environ.get("REFLEXARC_ALLOW_SKIP") == "1":
        pytest.skip(f"missing capability: {capability} (skipped: REFLEXARC_ALLOW_SKIP=1)")
    pytest.fail(f"missing capability: {capability} (set REFLEXARC_ALLOW_SKIP=1 to skip instead)")


def wait_until(what: str, probe, timeout: float = 60.0, every: float = 0.2):
    """``probe()``'s first truthy value, polled every ``every`` s; AssertionError
    naming ``what`` after ``timeout`` s (a deadline, not a timed assertion)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def require_root() -> None:
    require(os.geteuid() == 0, "root (euid 0)")


def require_bpf() -> None:
    """Root, mounted tracefs, kernel headers for bcc and Debian's bcc module."""
    require_root()
    require(Path("/sys/kernel/tracing/events").is_dir(), "tracefs mounted at /sys/kernel/tracing")
    require(Path(f"/lib/modules/{os.uname().release}/build/include").exists(),
            f"kernel headers at /lib/modules/{os.uname().release}/build (run scripts/bootstrap)")
    try:
        import bcc  # noqa: F401
    except ImportError as exc:
        require(False, f"Debian's bcc Python module ({exc})")


@contextlib.contextmanager
def loop_device(image: Path, size: int):
    """A loop device over a new sparse file of ``size`` bytes (cold: nothing of
    it cached), detached when the block ends."""
    require(shutil.which("losetup") is not None, "losetup (util-linux)")
    with open(image, "wb") as f:
        f.truncate(size)
    dev = subprocess.run(["losetup", "--find", "--show", str(image)],
                         check=True, capture_output=True, text=True).stdout.strip()
    try:
        yield dev
    finally:
        subprocess.run(["losetup", "--detach", dev], check=False)


def two_node_sys(root: Path) -> Path:
    """A fixture sysfs with two NUMA nodes, cpu0 on node0 and cpu1 on node1."""
    for node in (0, 1):
        d = root / "devices" / "system" / "node" / f"node{node}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(f"{node}\n")
    return root


def allowed(pid: int) -> set[str]:
    """The CPU lists (``Cpus_allowed_list``) of a process's threads, e.g. ``{"0-1"}``."""
    out = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        for line in Path(f"/proc/{pid}/task/{tid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out.add(line.split()[1])
    return out


def fake_tracefs(root: Path, events: dict[str, dict[str, list[str]]], field: str = "void *", size: int = 8):
    """A tracefs tree declaring ``events`` (category -> event -> field names,
    each a ``field``-typed field of ``size`` bytes), and the KernelFeatures
    that read it: for probes' fallback orders."""
    from reflexarc.bpf.probe import KernelFeatures
    signed = 0 if "*" in field else 1
    for category, names in events.items():
        for event, fields in names.items():
            d = root / "events" / category / event
            d.mkdir(parents=True)
            lines = [f"\tfield:{field} {f};\toffset:8;\tsize:{size};\tsigned:{signed};" for f in fields]
            (d / "format").write_text(f"name: {event}\nformat:\n" + "\n".join(lines) + "\n")
    return KernelFeatures(tracefs=str(root))


def gpu_dev(root: Path) -> Path:
    """A stand-in ``/dev`` naming one NVIDIA GPU (``nvidia0``): there is no GPU
    here, and the gpu_submit probe attaches only on a node that has one."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "nvidiactl").touch()
    (root / "nvidia0").touch()
    return root


@pytest.fixture
def repo_root() -> Path:
    return ROOT


@pytest.fixture
def cli():
    """``cli(*args, env=None, input=None, timeout=120, check=None) -> CompletedProcess``: see ``run_cli``."""
    return run_cli


@pytest.fixture
def etcd():
    """A real 3-member etcd cluster on loopback (``simulations/testbed/etcd.py``), stopped after the test."""
    require(shutil.which("etcd") is not None, "etcd (apt:etcd-server, scripts/bootstrap)")
    from reflexarc.simulations.testbed.etcd import EtcdCluster
    with EtcdCluster() as cluster:
        yield cluster
