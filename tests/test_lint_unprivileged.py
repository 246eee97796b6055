"""Policies are linted by a user who is not root (a CI job, an engineer's own
account): ``validate``, ``explain`` and ``test-policies`` of the shipped
policies run as nobody (uid 65534), for real, and judge from the signal
catalogue with one note naming the node checks they skipped; ``--node`` adds
this node's checks as nobody sees them. ``run``, ``probes`` and ``top`` say in
one line what loading probes needs, with or without capabilities, instead of
a tracefs path they could not read."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from conftest import ROOT, require, require_root, run_cli

pytestmark = [pytest.mark.kernel]

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
NOTE = ("note: not root: this node's checks skipped (whether each signal's producers can run here, required "
        "devices, interfaces and network namespaces, running jobs): judged from the signal catalogue; --node "
        "checks this node")
NEEDS = "needs root, or CAP_BPF and CAP_PERFMON with read access to /sys/kernel/tracing, to load its eBPF probes"


@pytest.fixture(scope="module")
def place():
    """A directory nobody can read holding a copy of the shipped policies and
    their tests; fails naming what is missing when nobody cannot run the CLI."""
    require_root()
    require(shutil.which("setpriv") is not None, "setpriv (util-linux)")
    path = Path(tempfile.mkdtemp(prefix="rxlint-"))
    path.chmod(0o755)
    shutil.copytree(ROOT / "policies", path / "policies", ignore=shutil.ignore_patterns("__pycache__"))
    probe = run_cli("--version", timeout=60, cwd=path, prefix=AS_NOBODY)
    require(probe.returncode == 0, f"the project's Python and tree usable by nobody ({probe.stderr.strip()[-300:]})")
    yield path
    shutil.rmtree(path, ignore_errors=True)


def nobody(place: Path, *args: str, caps: str = "") -> subprocess.CompletedProcess:
    """The CLI as nobody in ``place``; ``caps``: capabilities it keeps (e.g. "+bpf,+perfmon")."""
    kept = [f"--inh-caps={caps}", f"--ambient-caps={caps}"] if caps else []
    return run_cli(*args, timeout=300, cwd=place, prefix=[*AS_NOBODY, *kept])


def clean(r: subprocess.CompletedProcess) -> None:
    out = r.stdout + r.stderr
    assert "Permission denied" not in out and "Traceback" not in out and "/sys/kernel/tracing/events/" not in out, out


def test_validate_of_the_shipped_policies_as_nobody(place):
    r = nobody(place, "validate", "policies/")
    clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.splitlines()[-1].startswith("ok: 10 policies, "), r.stdout
    assert r.stderr.splitlines() == [NOTE], r.stderr
    assert "error:" not in r.stdout and "has no producer" not in r.stdout, r.stdout


def test_validate_with_node_checks_this_node_as_nobody_sees_it(place):
    r = nobody(place, "validate", "--node", "policies/")
    clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "note: not root" not in r.stderr, r.stderr
    unproduced = [line for line in r.stdout.splitlines() if "has no producer on this node" in line]
    assert unproduced and all("not running as root" in line for line in unproduced), r.stdout
    strict = nobody(place, "validate", "--node", "--strict", "policies/")
    assert strict.returncode == 1 and "not running as root" in strict.stdout, strict.stdout + strict.stderr


def test_explain_as_nobody(place):
    r = nobody(place, "explain", "policies/")
    clean(r)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr.splitlines() == [NOTE], r.stderr
    for name in ("dataloader-starvation", "dataloader-numa-repin", "nccl-congestion-dscp", "gpu-submit-gap",
                 "rank-straggler", "rdma-deep-tracing"):
        assert f"\n{name} (policies/" in "\n" + r.stdout, name
    assert "from probe dataloader_io (light tier, always on): not checked (not root)" in r.stdout
    assert "can run here" not in r.stdout and "not here:" in r.stdout     # only the PromQL source is judged


def test_test_policies_as_nobody_as_for_root(place, cli):
    """Nobody runs every case, and each comes out as it does for root."""
    r = nobody(place, "test-policies", "policies/tests/")
    clean(r)
    root = cli("test-policies", "policies/tests/", timeout=300, cwd=place)
    assert (r.returncode, r.stdout) == (root.returncode, root.stdout), r.stdout + r.stderr
    passed, failed = (int(word) for word in r.stdout.splitlines()[-1].split()[::2])
    assert passed + failed >= 12, r.stdout


@pytest.mark.parametrize("args,hint", [
    (("run",), "; --no-probes runs without them"),
    (("run", "--mode", "policy", "--state-dir", "/nonexistent"), "; --no-probes runs without them"),
    (("probes",), ""),
    (("probes", "--dump-bpf"), ""),            # the C follows the attach points tracefs offers
    (("top", "--once"), "; --no-probes runs without them"),
])
def test_commands_that_load_probes_say_what_they_need(place, args, hint):
    r = nobody(place, *args)
    clean(r)
    assert r.returncode == 1 and r.stdout == "", r.stdout
    assert r.stderr.splitlines() == [f"error: {args[0]} {NEEDS} (not running as root){hint}"], r.stderr
    with_caps = nobody(place, *args, caps="+bpf,+perfmon")     # tracefs itself stays root's
    assert with_caps.stderr.splitlines() == [
        f"error: {args[0]} {NEEDS} (cannot read /sys/kernel/tracing/events){hint}"], with_caps.stderr


def test_no_probes_needs_no_privilege(place):
    r = nobody(place, "top", "--no-probes", "--once", "--hook-dir", str(place))
    clean(r)
    assert r.returncode == 0 and "training processes" in r.stdout, r.stdout + r.stderr
