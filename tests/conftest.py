"""Shared test helpers.

Tests that need root, BPF, tracefs or network namespaces run for real. When the
machine lacks a capability the test fails and says which, unless the run sets
REFLEXARC_ALLOW_SKIP=1 (CI never does).
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


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
