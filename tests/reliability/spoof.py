"""Hook spoofing by another local user: processes running as nobody (uid 65534,
through ``setpriv``) forge hook sockets beside a real training script of root's
job ``victim``, and the controller must trust none of them.

The hook directory is root's (0755) with one job directory root made for
nobody (``scratch``, 0700, nobody's), as ``docs/hooks.md`` says. Nobody tries:

- a socket in root's hook directory, a job directory of its own making there,
  a hard link to the victim's socket (the kernel refuses each: counted as
  ``refused``);
- in its own job directory: a socket claiming job ``victim``; one claiming the
  victim's pid (SO_PEERCRED says otherwise); one whose replies state a start
  time that is not its own; a symbolic link to the victim's socket, under
  either name; a regular file named like a socket; replies for another job,
  with NaN, too long, not JSON; a ``describe`` reply that says ``ok`` but breaks
  the schema (no ``has_undo``/``instance``);
- a second job directory it made writable by others.

Each forged socket must be rejected by the hook channel with its reason
(``read_signals``: counted per reason, as ``reflexarc_hook_rejected_total`` does);
``reflexarc act framework_hook --job victim|scratch --mode enforce`` must call
none of them (each fake logs every request it gets) and end with one
``error:`` line when nothing trusted is left; ``reflexarc run`` enforcing
policies on both jobs must act on nothing while the fakes report 5 s steps
and the real script 50 ms, and must log each as ignored.

Example::

    figures = run_spoof(Path(tempfile.mkdtemp(dir="/tmp")))
    figures["trusted"]       # 0: forged sockets called or believed

Needs root and ``setpriv`` (util-linux). Overhead: ~15 short-lived processes
and three CLI runs (~10 s).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from conftest import run_cli
from reliability.workloads import CHANGED_FACTOR, HOOK_SCRIPT, ORIGINAL_FACTOR

NOBODY = 65534
AS_NOBODY = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]

FAKE_SCRIPT = Path(__file__).resolve().parents[1] / "workloads" / "fake_hook_socket.py"
FAKE = FAKE_SCRIPT.read_text()     # run as nobody with ``python -c``: it need not reach the file

# One file-system step as nobody: symlink, link, mkdir, chmod or write a file.
STEP = textwrap.dedent(r"""
    import json, os, sys
    op, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
    try:
        {"symlink": lambda: os.symlink(b, a), "link": lambda: os.link(b, a), "mkdir": lambda: os.mkdir(a),
         "chmod": lambda: os.chmod(a, int(b, 8)), "file": lambda: open(a, "w").close()}[op]()
    except OSError as exc:
        print(json.dumps({"refused": type(exc).__name__}))
    else:
        print(json.dumps({"ready": a}))
""")


def signals_reply(job: str, value: str = "5000", pid: str = '"{pid}"', start: str = '"{start}"', rank: int = 0) -> str:
    return ('{"ok": true, "instance": "f00d", "pid": %s, "start": %s, "job": "%s", "rank": %d, "iteration": 1, '
            '"queued": 0, "signals": {"step_time_ms": {"value": %s, "ts": 1.0, "steps": 1}}}'
            % (pid, start, job, rank, value))


def start_time(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()[19])


POLICY = """\
policies:
  - name: slow-victim
    mode: enforce
    selector: {match: {job: victim}}
    rules:
      - name: r
        when: {signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: 300}
        actions:
          - {actuator: framework_hook, params: {handler: loader.prefetch, args: {factor: 8}, at_step_boundary: false}}
        rollback: {on: [shutdown]}
  - name: slow-scratch
    mode: enforce
    selector: {match: {job: scratch}}
    rules:
      - name: r
        when: {signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: 300}
        actions:
          - {actuator: framework_hook, params: {handler: loader.prefetch, args: {factor: 8}, at_step_boundary: false}}
        rollback: {on: [shutdown]}
"""


class Spoof:
    def __init__(self, base: Path) -> None:
        self.base = base
        base.chmod(0o755)                        # nobody must reach its job directory
        self.hooks = base / "hooks"
        self.hooks.mkdir(mode=0o755)
        self.scratch = self.hooks / "scratch"    # the job directory root made for nobody's job
        self.scratch.mkdir(mode=0o700)
        os.chown(self.scratch, NOBODY, NOBODY)
        self.logs = base / "logs"                # where the fakes log what they were asked
        self.logs.mkdir(mode=0o777)
        self.logs.chmod(0o777)
        self.procs: list[subprocess.Popen] = []
        self.forged: list[dict] = []             # {name, path, expect, outcome}
        self.acts = 0                            # act runs against forged sockets

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
            for stream in (proc.stdout, proc.stderr):
                if stream:
                    stream.close()

    def _spawn(self, argv: list[str]) -> tuple[subprocess.Popen, dict]:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                start_new_session=True)
        self.procs.append(proc)
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError(f"no output from {argv[-2:]}: {proc.stderr.read()[-1500:]}")
        return proc, json.loads(line)

    def victim(self) -> None:
        self.victim_state = self.base / "victim-state.json"
        _, out = self._spawn([sys.executable, "-c", HOOK_SCRIPT, str(self.hooks), "victim", str(self.victim_state),
                              "50"])
        self.victim_pid, self.victim_socket = out["pid"], out["ready"]

    def fake(self, name: str, path: Path | str, reply: str, expect: str) -> None:
        log = self.logs / f"{name}.log"
        _, out = self._spawn(AS_NOBODY + [sys.executable, "-c", FAKE,
                                          json.dumps({"path": str(path), "reply": reply, "log": str(log)})])
        self.forged.append({"name": name, "path": out.get("ready", str(path)), "expect": expect, "log": str(log),
                            "refused": out.get("refused")})

    def step(self, name: str, op: str, a: Path, b: str, expect: str) -> None:
        r = subprocess.run(AS_NOBODY + [sys.executable, "-c", STEP, op, str(a), b], capture_output=True, text=True,
                           timeout=60)
        out = json.loads(r.stdout or "{}")
        self.forged.append({"name": name, "path": str(a), "expect": expect, "log": None, "refused": out.get("refused"),
                            "error": None if out else r.stderr[-500:]})

    def forge(self) -> None:
        v, sc = self.victim_pid, self.scratch
        vstart = start_time(v)
        # what the kernel refuses nobody
        self.fake("root-dir", self.hooks / f"victim-0-{v}.sock", signals_reply("victim"), "refused")
        self.fake("root-dir-own-pid", self.hooks / "victim-0-{pid}.sock", signals_reply("victim"), "refused")
        self.step("job-dir-in-root-dir", "mkdir", self.hooks / "victim", "", "refused")
        self.step("hard-link", "link", sc / f"scratch-0-{v}.sock", self.victim_socket, "refused-or-peer")
        # what the hook channel must refuse
        self.fake("claims-other-job", sc / "victim-0-{pid}.sock", signals_reply("victim"), "place")
        self.fake("claims-victim-pid", sc / f"scratch-1-{v}.sock",
                  signals_reply("scratch", pid=str(v), start=str(vstart), rank=1), "peer")
        self.fake("forged-start", sc / "scratch-2-{pid}.sock", signals_reply("scratch", start="12345", rank=2), "stale")
        self.step("symlink-as-own-job", "symlink", sc / f"scratch-3-{v}.sock", self.victim_socket, "place")
        self.step("symlink-as-victim", "symlink", sc / f"victim-0-{v}.sock", self.victim_socket, "place")
        self.step("regular-file", "file", sc / "scratch-4-1.sock", "", "place")
        self.fake("reply-for-other-job", sc / "scratch-5-{pid}.sock", signals_reply("victim", rank=5), "reply")
        self.fake("reply-nan", sc / "scratch-6-{pid}.sock", signals_reply("scratch", value="NaN", rank=6), "reply")
        self.fake("reply-too-long", sc / "scratch-7-{pid}.sock",
                  signals_reply("scratch", value='"' + "x" * 20000 + '"', rank=7), "reply")
        self.fake("reply-not-json", sc / "scratch-8-{pid}.sock", "<html>not json", "reply")
        self.fake("describe-breaks-schema", sc / "scratch-9-{pid}.sock",
                  '{"ok": true, "pid": "{pid}", "start": "{start}"}', "reply")
        other = self.hooks / "scratch2"
        other.mkdir(mode=0o700)
        os.chown(other, NOBODY, NOBODY)
        self.step("writable-job-dir", "chmod", other, "777", "place")
        made = self.forged.pop()
        if made["refused"] or made.get("error"):
            raise RuntimeError(f"nobody could not make its job directory writable by others: {made}")
        self.fake("in-writable-job-dir", other / "scratch2-0-{pid}.sock", signals_reply("scratch2"), "place")

    def rx(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return run_cli("--state-dir", str(self.base / "state"), "--hook-dir", str(self.hooks), *args, timeout=timeout)

    def called(self) -> dict[str, list[str]]:
        """Forged sockets asked to call or undo a handler (by name: the requests' ops)."""
        out = {}
        for f in self.forged:
            if f["log"] and Path(f["log"]).exists():
                ops = [json.loads(line).get("op") for line in Path(f["log"]).read_text().splitlines() if line.strip()]
                acted = [op for op in ops if op in ("call", "undo")]
                if acted:
                    out[f["name"]] = acted
        return out


def _one_error(r: subprocess.CompletedProcess) -> bool:
    return (r.returncode in (1, 2) and len([x for x in r.stderr.splitlines() if x.startswith("error:")]) == 1
            and "Traceback" not in r.stdout + r.stderr and "internal error" not in r.stderr)


def run_spoof(base: Path) -> dict:
    if shutil.which("setpriv") is None:
        raise RuntimeError("setpriv (util-linux) is needed to run processes as nobody")
    from reflexarc.actuators.framework_hook import read_signals
    s = Spoof(base)
    began = time.monotonic()
    problems: list[str] = []
    try:
        s.victim()
        s.forge()
        # 1. the hook channel: every forged socket that exists is rejected, with its reason
        read = read_signals(str(s.hooks))
        reasons = {}
        for rej in read.rejected:
            reasons.setdefault(rej.where, set()).add(str(rej.reason))
        believed = [sig for sig in read.signals if sig["labels"]["job"] != "victim" or sig["value"] == 5000.0]
        for f in s.forged:
            # a socket is rejected by its own path, or with the directory it is in
            got = reasons.get(f["path"], set()) | reasons.get(os.path.dirname(f["path"]), set())
            f["outcome"] = "refused" if f["refused"] else (",".join(sorted(got)) or "trusted")
            expected = {"refused-or-peer": {"refused", "peer"}}.get(f["expect"], {f["expect"]})
            if not (set(f["outcome"].split(",")) & expected):
                problems.append(f"{f['name']} ({f['path']}): {f['outcome']}, expected {f['expect']}")
        if believed:
            problems.append(f"signals believed from forged sockets: {believed[:3]}")
        # 2. act on each job: the victim is called, no forged socket is
        act = s.rx("act", "framework_hook", "handler=loader.prefetch", f'args={{"factor": {CHANGED_FACTOR}}}',
                   "at_step_boundary=false", "--job", "victim", "--mode", "enforce", "--json")
        endpoints = []
        if act.returncode == 0:
            endpoints = [e["socket"] for e in json.loads(act.stdout)["after"]["endpoints"]]
        if act.returncode != 0 or endpoints != [s.victim_socket]:
            problems.append(f"act --job victim: exit {act.returncode}, endpoints {endpoints}: {act.stderr[-400:]}")
        back = s.rx("rollback", "--all")
        factor = json.loads(s.victim_state.read_text())["factor"]
        if back.returncode != 0 or factor != ORIGINAL_FACTOR:
            problems.append(f"rollback --all: exit {back.returncode}, victim's factor {factor}: {back.stderr[-400:]}")
        for rank in ("", *map(str, range(1, 10))):      # the whole job, then each forged socket alone
            label = ["--label", f"rank={rank}"] if rank else []
            r = s.rx("act", "framework_hook", "handler=loader.prefetch", f'args={{"factor": {CHANGED_FACTOR}}}',
                     "at_step_boundary=false", "--job", "scratch", *label, "--mode", "enforce")
            s.acts += 1
            if not _one_error(r):
                problems.append(f"act --job scratch {' '.join(label)} (only forged sockets): exit {r.returncode}, "
                                f"want 1 and one error line: {r.stderr.strip()[-300:]}")
        # 3. the controller: forged slow steps drive nothing
        policy = base / "policy.yaml"
        policy.write_text(POLICY)
        run = s.rx("run", "--no-probes", "--mode", "policy", "--policy", str(policy), "--duration", "3",
                   "--interval", "0.5", "--kill-switch", str(base / "off"))
        audit = base / "state" / "audit.jsonl"
        records = [json.loads(x) for x in audit.read_text().splitlines()] if audit.exists() else []
        actions = [a for a in records if a.get("kind") == "action" and a.get("policy") != "manual"]
        ignored = [line for line in run.stderr.splitlines() if "hook channel: ignored" in line]
        unlogged = [f["name"] for f in s.forged if not f["refused"]
                    and not any(f"{where}:" in x for x in ignored for where in (f["path"], os.path.dirname(f["path"])))]
        if run.returncode != 0 or "Traceback" in run.stderr:
            problems.append(f"run: exit {run.returncode}: {run.stderr[-600:]}")
        if actions:
            problems.append(f"run acted on forged signals: {[(a['policy'], a['outcome']) for a in actions][:5]}")
        if unlogged:
            problems.append(f"run did not log as ignored: {unlogged}")
        factor = json.loads(s.victim_state.read_text())["factor"]
        if factor != ORIGINAL_FACTOR:
            problems.append(f"the victim's factor is {factor} after run")
        called = s.called()
        if called:
            problems.append(f"forged sockets were asked to act: {called}")
    finally:
        s.close()
    by_outcome: dict = {}
    for f in s.forged:
        by_outcome[f.get("outcome", "?")] = by_outcome.get(f.get("outcome", "?"), 0) + 1
    return {
        "forged": len(s.forged),
        "refused_by_kernel": sum(bool(f["refused"]) for f in s.forged),
        "rejected": sum(not f["refused"] and f.get("outcome") not in ("trusted", None) for f in s.forged),
        "trusted": sum(f.get("outcome") == "trusted" for f in s.forged) + len(s.called()),
        "by_outcome": by_outcome,
        "act_runs": s.acts,
        "cases": [{k: f.get(k) for k in ("name", "expect", "outcome")} for f in s.forged],
        "problems": problems,
        "seconds": round(time.monotonic() - began, 1),
    }
