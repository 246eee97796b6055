"""Every real actuator's dry-run diff reaches the audit report: ``reflexarc act
... --mode dry-run`` plans against the real system (real processes, a real veth
in a real namespace, a live hook socket, a fixture /proc/sys), changes nothing,
and ``reflexarc report`` lists each would-be change with its before and after."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import require_bpf, two_node_sys
from netns import NetnsPair
import pytest

pytestmark = [pytest.mark.kernel, pytest.mark.netns]

WORKER = r"""
import ctypes, sys, threading
ctypes.CDLL(None).prctl(15, b"pt_data_worker", 0, 0, 0)
t = threading.Thread(target=sys.stdin.read, daemon=True); t.start()
print("ready", flush=True)
sys.stdin.read()
"""

SCRIPT = r"""
import sys, time
from reflexarc.actuators.hooks import Hooks
state = {"prefetch_factor": 2}
with Hooks.start(job="dry", rank=0, hook_dir=sys.argv[1]) as hooks:
    @hooks.handler("dataloader.prefetch", undo=lambda **kw: None,
                   preview=lambda **kw: {"before": dict(state), "after": {"prefetch_factor": kw["prefetch_factor"]}})
    def prefetch(prefetch_factor=2):
        state["prefetch_factor"] = prefetch_factor
    print("ready", flush=True)
    while True:
        hooks.step_boundary()
        time.sleep(0.05)
"""


def test_each_actuator_dry_run_diff_is_in_the_report(tmp_path, cli):
    require_bpf()
    proc = tmp_path / "proc"
    (proc / "sys" / "kernel").mkdir(parents=True)
    (proc / "sys" / "kernel" / "numa_balancing").write_text("1\n")
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    base = ["--state-dir", str(tmp_path / "state"), "--sys-root", str(two_node_sys(tmp_path / "sys")),
            "--hook-dir", str(hooks)]
    worker = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    script = subprocess.Popen([sys.executable, "-c", SCRIPT, str(hooks)], stdout=subprocess.PIPE, text=True)
    try:
        assert worker.stdout.readline().strip() == "ready"
        assert script.stdout.readline().strip() == "ready"
        with NetnsPair("dry") as pair:
            tc_before = pair.run("a", "tc", "qdisc", "show", "dev", pair.if_a).stdout
            plans = {
                "affinity": ["node=1", "--label", f"pid={worker.pid}"],
                "dscp": ["dscp=CS1", f"interfaces={pair.if_a}", f"netns={pair.ns_a}", "ports=443"],
                "sysctl": ["key=kernel.numa_balancing", "value=0"],
                "framework_hook": ["handler=dataloader.prefetch", '{"prefetch_factor": 8}'],
                "alert": ["severity=warning", "summary=loader starved"],
                "deep_tracing": ["ttl=5m"],
            }
            for actuator, args in plans.items():
                if actuator == "framework_hook":
                    args = [args[0], "args=" + args[1], "--job", "dry"]
                extra = ["--proc-root", str(proc)] if actuator == "sysctl" else []
                r = cli(*extra, *base, "act", actuator, *args, "--json")
                assert r.returncode == 0, f"{actuator}: {r.stderr}"
                assert json.loads(r.stdout)["outcome"] == "planned", r.stdout
            assert pair.run("a", "tc", "qdisc", "show", "dev", pair.if_a).stdout == tc_before
        assert (proc / "sys" / "kernel" / "numa_balancing").read_text() == "1\n"
        allowed = Path(f"/proc/{worker.pid}/status").read_text()
        assert "Cpus_allowed_list:\t1\n" not in allowed
        out = tmp_path / "report"
        r = cli("report", str(tmp_path / "state" / "audit.jsonl"), "--out", str(out))
        assert r.returncode == 0, r.stderr
        data = json.loads((out / "report.json").read_text())
        text = json.dumps(data)
        md = (out / "report.md").read_text()
        html = (out / "report.html").read_text()
        section = html[html.index("What dry-run would have changed"):]
        for actuator in plans:
            assert actuator in section, f"{actuator} missing from the dry-run section"
        assert "kernel.numa_balancing" in md and "CS1" in text and "prefetch_factor" in text
    finally:
        worker.stdin.close()
        worker.wait(timeout=30)
        script.terminate()
        script.wait(timeout=30)
