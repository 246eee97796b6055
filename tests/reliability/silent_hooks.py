"""Hook sockets that never answer: a user with a job directory (``nobody``)
listens on ``SILENT`` sockets there and never accepts, beside one script that
answers. What must hold:

- one read of the hook channel (``HookSource.poll``) costs about one deadline
  (1 s), not one per silent socket: it ends within ``POLL_BOUND`` seconds
  (read one after another, they took ``SILENT`` seconds), counts each silent
  socket as rejected (``timeout``), and still returns the answering script's
  step time;
- a controller reading that directory stops within ``EXIT_BOUND`` seconds of
  SIGTERM (the time is recorded).

The bounds are where a loop that reads the sockets one by one would be; the
figures (seconds per poll, seconds to exit) are recorded, not asserted closer.

Example::

    figures = run_silent(Path("/tmp/x"))
    figures["failures"], figures["poll_s"], figures["exit_s"]

Needs root (a job directory for nobody, setpriv).

Overhead: ~3 polls of ~1 s and a controller for ~4 s.
"""
from __future__ import annotations

import os
import pwd
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from conftest import spawn_cli  # noqa: E402
from reliability.clock_steps import HOOKED  # noqa: E402
from reliability.counts import record_sigterm  # noqa: E402
from reliability.workloads import QUIET as POLICY  # noqa: E402

SILENT = 30
POLL_BOUND = 10.0
EXIT_BOUND = 5.0
JOB = "silentjob"

LISTENER = r"""
import os, socket, sys, time
directory, job, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
socks = []
for rank in range(n):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(os.path.join(directory, f"{job}-{rank}-{os.getpid()}.sock"))
    s.listen(64)
    socks.append(s)
print("listening", flush=True)
time.sleep(3600)
"""


def run_silent(tmp: Path) -> dict:
    from reflexarc.controller.sources.readers import HookSource
    nobody = pwd.getpwnam("nobody")
    hooks = tmp / "hooks"
    hooks.mkdir(mode=0o755)
    jobdir = hooks / JOB
    jobdir.mkdir(mode=0o700)
    os.chown(jobdir, nobody.pw_uid, nobody.pw_gid)
    failures: list[str] = []
    listener = subprocess.Popen(["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}",
                                 "--clear-groups", sys.executable, "-c", LISTENER, str(jobdir), JOB, str(SILENT)],
                                stdout=subprocess.PIPE, text=True, cwd="/")
    good = subprocess.Popen([sys.executable, "-c", HOOKED, str(hooks), "goodjob"], stdout=subprocess.DEVNULL)
    figures = {"poll_s": [], "exit_s": None}
    try:
        if listener.stdout.readline().strip() != "listening":
            return {**figures, "failures": ["the silent listener did not start"]}
        source = HookSource(str(hooks))
        deadline = time.monotonic() + 60
        steps = []
        while not steps and time.monotonic() < deadline:
            began = time.monotonic()
            samples = source.poll(began)
            figures["poll_s"].append(round(time.monotonic() - began, 2))
            steps = [v for n, labels, v in samples if n == "step_time_ms" and labels.get("job") == "goodjob"]
        timeouts = source.rejected.labels("timeout")._value.get()
        figures["timeouts_counted"] = timeouts
        if not steps:
            failures.append("the answering script's step time was never read beside the silent sockets")
        if max(figures["poll_s"]) > POLL_BOUND:
            failures.append(f"a poll took {max(figures['poll_s'])} s with {SILENT} silent sockets: "
                            "they are read one after another")
        if timeouts < SILENT:
            failures.append(f"{timeouts:g} silent sockets counted as rejected (timeout), not {SILENT}")

        state = tmp / "state"
        state.mkdir(mode=0o700)
        policy = tmp / "quiet.yaml"
        policy.write_text(POLICY)
        ctl = spawn_cli("--state-dir", str(state), "--hook-dir", str(hooks), "run", "--no-probes", "--policy",
                        str(policy), "--duration", "120", stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                        stdin=subprocess.DEVNULL)
        while not (state / "audit.jsonl").exists() and ctl.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(2.5)                      # in the middle of its polls
        began = time.monotonic()
        ctl.send_signal(signal.SIGTERM)
        try:
            _, err = ctl.communicate(timeout=60)
            figures["exit_s"] = round(time.monotonic() - began, 2)
            record_sigterm("silent-hooks", figures["exit_s"])
            if ctl.returncode != 0:
                failures.append(f"the controller exited {ctl.returncode}: {err[-600:]}")
            if figures["exit_s"] > EXIT_BOUND:
                failures.append(f"SIGTERM took {figures['exit_s']} s with {SILENT} silent hook sockets")
        except subprocess.TimeoutExpired:
            ctl.kill()
            ctl.communicate()
            record_sigterm("silent-hooks", None)
            failures.append("the controller did not stop within 60 s of SIGTERM")
    finally:
        for proc in (listener, good):
            proc.kill()
            proc.wait()
    return {**figures, "failures": failures}
