"""Bad input for every verb of the command line: a table of bad arguments and
files, each run as the real ``reflexarc`` in a child.

Every case must end with exit code 1 or 2, exactly one line starting with
``error:`` on stderr, no ``Traceback`` and no ``internal error`` anywhere, and
within ``LIMIT`` seconds (a child still running then is killed and counts as a
hang). Children run with stdin closed and their data segment capped
(``MEMORY_LIMIT``), so a verb that reads an endless file fails instead of
filling the machine's memory.

Bad files: missing, a directory, a FIFO, a directory holding a FIFO, a
character device, binary data, empty, past the size limits (9 MiB), a policy
whose numbers are NaN, negative or huge; bad state directories (a file, a
journal that is a directory, a FIFO, a link to ``/dev/zero``); bad numbers on
the command line (NaN, inf, negative, 10**400, not a number, empty).

Example::

    figures = run_table(Path("/tmp/t"), full=False)      # CI's share: every third case, all bad state dirs
    figures["cases"], figures["failures"]      # e.g. 100, []

Overhead: one child per case (~0.2-0.6 s each; ``run`` cases start for real
with ``--no-probes`` and a 0.2 s duration, ``probes`` compiles the light probes).
"""
from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path

from conftest import run_cli
from test_cli_bad_input import BIG, POLICY as GOOD_POLICY

LIMIT = 15.0                       # seconds: past this a case hangs (the slowest good case: ~2 s)
MEMORY_LIMIT = 1 << 30             # bytes of data segment per child

BAD_POLICIES = {     # name -> text: one bad number each
    "nan-threshold": GOOD_POLICY.replace("threshold: 400", "threshold: .nan"),
    "inf-threshold": GOOD_POLICY.replace("threshold: 400", "threshold: -.inf"),
    "huge-threshold": GOOD_POLICY.replace("threshold: 400", f"threshold: {BIG}"),
    "negative-window": GOOD_POLICY.replace("window: 30s", "window: -30s"),
    "nan-window": GOOD_POLICY.replace("window: 30s", "window: .nan"),
    "huge-window": GOOD_POLICY.replace("window: 30s", f"window: {BIG}"),
    "negative-node": GOOD_POLICY.replace("{actuator: log, params: {message: slow steps}}",
                                         "{actuator: affinity, params: {node: -1}}\n        rollback: never"),
    "huge-cpu": GOOD_POLICY.replace("{actuator: log, params: {message: slow steps}}",
                                    f"{{actuator: affinity, params: {{cpus: [{BIG}]}}}}\n        rollback: never"),
    "nan-ttl": GOOD_POLICY.replace("{actuator: log, params: {message: slow steps}}",
                                   "{actuator: deep_tracing, params: {ttl: .nan}}\n        rollback: never"),
    "negative-count": GOOD_POLICY.replace("      - name: slow\n",
                                          "      - name: slow\n        max_actions: {count: -3, window: 1h}\n"),
}
AUDIT = ('{"ts": 0, "kind": "run", "source": "simulation:x", "policies": []}\n'
         '{"ts": 1, "kind": "end", "summary": {}}\n')
BAD_FILES = ("missing", "dir", "fifo", "fifo-dir", "device", "binary", "empty", "huge")
BAD_STATES = ("state-file", "state-journal-dir", "state-journal-fifo", "state-journal-zero")
NUMBERS = ("nan", "-1", "inf", BIG, "x", "")


def make_files(tmp: Path) -> dict[str, str]:
    tmp.mkdir(parents=True, exist_ok=True)
    p = {name: tmp / name for name in ("missing.yaml", "empty-dir", "fifo.yaml", "fifo-dir", "binary.yaml",
                                       "empty.yaml", "huge.yaml", "policy.yaml", "audit.jsonl", "plain", "hooks",
                                       "state", "state-file", "state-journal-dir", "state-journal-fifo",
                                       "state-journal-zero")}
    p["empty-dir"].mkdir()
    p["fifo-dir"].mkdir()
    os.mkfifo(p["fifo.yaml"])
    os.mkfifo(p["fifo-dir"] / "case.yaml")
    p["binary.yaml"].write_bytes(bytes(range(128, 256)) * 64)
    p["empty.yaml"].write_text("")
    p["huge.yaml"].write_text("x" * (9 << 20))
    p["policy.yaml"].write_text(GOOD_POLICY)
    p["audit.jsonl"].write_text(AUDIT)
    p["plain"].write_text("x\n")
    p["hooks"].mkdir(mode=0o755)
    p["state"].mkdir()
    p["state-file"].write_text("not a directory\n")
    (p["state-journal-dir"] / "journal.jsonl").mkdir(parents=True)
    p["state-journal-fifo"].mkdir()
    os.mkfifo(p["state-journal-fifo"] / "journal.jsonl")
    p["state-journal-zero"].mkdir()
    (p["state-journal-zero"] / "journal.jsonl").symlink_to("/dev/zero")
    files = {"missing": p["missing.yaml"], "dir": p["empty-dir"], "fifo": p["fifo.yaml"], "fifo-dir": p["fifo-dir"],
             "device": "/dev/zero", "binary": p["binary.yaml"], "empty": p["empty.yaml"], "huge": p["huge.yaml"],
             "policy": p["policy.yaml"], "audit": p["audit.jsonl"], "file": p["plain"], "hooks": p["hooks"],
             "state": p["state"], **{k: p[k] for k in BAD_STATES}}
    knob = tmp / "proc" / "sys" / "vm" / "swappiness"      # a fixture /proc: act never touches the node's
    knob.parent.mkdir(parents=True)
    knob.write_text("60\n")
    files["proc"] = tmp / "proc"
    for name, text in BAD_POLICIES.items():
        (tmp / f"{name}.yaml").write_text(text)
        files[name] = tmp / f"{name}.yaml"
    return {k: str(v) for k, v in files.items()}


RUN = ("run", "--no-probes", "--duration", "0.2", "--interval", "0.1", "--kill-switch", "{state}/off",
       "--policy", "{policy}")


def cases() -> list[tuple[str, tuple[str, ...]]]:
    """(verb, arguments after the global options); ``{name}`` stands for a file of ``make_files``."""
    out: list[tuple[str, tuple[str, ...]]] = []

    def add(verb: str, *args: str) -> None:
        out.append((verb, args))

    bad_policy_files = BAD_FILES[:1] + BAD_FILES[2:] + tuple(BAD_POLICIES)
    for kind in bad_policy_files:
        if kind != "fifo-dir":       # for validate a directory without policy files is a warning, as an empty one
            add("validate", "validate", f"{{{kind}}}")
        add("explain", "explain", f"{{{kind}}}")
        add("run", "run", "--no-probes", "--duration", "0.2", "--kill-switch", "{state}/off", "--policy", f"{{{kind}}}")
        add("simulate", "simulate", "numa-remote-worker", "--out", "{state}/sim", "--policy", f"{{{kind}}}")
    add("explain", "explain", "{dir}")
    for kind in BAD_FILES:
        add("validate", "validate", "{policy}", "--promql-config", f"{{{kind}}}")
        add("explain", "explain", "{policy}", "--promql-config", f"{{{kind}}}")
        add("test-policies", "test-policies", f"{{{kind}}}")
        add("report", "report", f"{{{kind}}}", "--out", "{state}/report")
        if kind != "empty":                             # an empty replay is a replay of nothing
            add("run", *RUN, "--replay", f"{{{kind}}}")
        add("run", *RUN, "--promql-config", f"{{{kind}}}")
    for kind in ("fifo", "binary", "huge", "nan-threshold"):
        add("probes", "probes", "--policy", f"{{{kind}}}")
        add("top", "top", "--count", "1", "--policy", f"{{{kind}}}")
    for kind in ("dir", "fifo", "device"):
        add("run", *RUN, "--audit", f"{{{kind}}}")
    add("explain", "explain", "{policy}", "--policy-name", "no-such-policy")
    add("simulate", "simulate", "no-such-scenario")
    add("simulate", "simulate", "{fifo}")
    add("simulate", "simulate", "numa-remote-worker", "--out", "{file}")
    add("simulate", "simulate", "numa-remote-worker", "--mode", "bogus")
    add("report", "report", "{audit}", "--out", "{file}")
    add("report", "report", "{audit}", "--out", "")
    add("report", "report", "{audit}")
    for value in NUMBERS:
        add("run", "run", "--interval", value)
        add("probes", "probes", "--interval", value)
        add("top", "top", "--interval", value)
        add("run", *RUN, "--duration", value)
        add("run", *RUN, "--metrics-port", value)
        add("run", *RUN, "--audit-max-mb", value)
        if value != BIG:             # a count of 10**400 is a whole number: good input, and top would keep going
            add("run", *RUN, "--max-active", value)
            add("top", "top", "--count", value)
    for option, value in (("--audit-sample", "nan"), ("--target-grace", "-5"), ("--actions-per-hour", "1.5"),
                          ("--metrics-port", "99999"), ("--metrics-port", "0"), ("--mode", "bogus")):
        add("run", *RUN, option, value)
    # act: one actuator by hand
    for args in (("no_such_actuator",), ("affinity", "node"), ("affinity", "node=nan", "--pid", "{pid}"),
                 ("affinity", "node=-1", "--pid", "{pid}"), ("affinity", f"node={BIG}", "--pid", "{pid}"),
                 ("affinity", "node=1e400", "--pid", "{pid}"), ("affinity", "cpus=x", "--pid", "{pid}"),
                 ("affinity", "cpus=-1", "--pid", "{pid}"), ("affinity", "node=0"),
                 ("affinity", "node=0", "--pid", "-1"), ("affinity", "node=0", "--pid", "x"),
                 ("affinity", "node=0", "--pid", BIG), ("affinity", "node=0", "--label", "x"),
                 ("affinity", "node=0", "--label", "pid=nan"), ("affinity", "bogus=1", "--pid", "{pid}"),
                 ("dscp", "dscp=64", "interfaces=lo"), ("dscp", "dscp=nan", "interfaces=lo"),
                 ("dscp", "dscp=-1", "interfaces=lo"), ("dscp", "dscp=EF", "interfaces=lo", "ports=99999"),
                 ("dscp", "dscp=EF", "interfaces=lo", "ports=a-b"), ("dscp", "dscp=EF", "interfaces=lo", "class=x"),
                 ("dscp", "dscp=EF", "interfaces=lo", "addresses=300.1.1.1"),
                 ("dscp", "dscp=EF", "interfaces=lo", "netns=../x"), ("dscp", "dscp=EF"),
                 ("deep_tracing", "ttl=nan"), ("deep_tracing", "ttl=-5"), ("deep_tracing", f"ttl={BIG}"),
                 ("deep_tracing", "ttl=5m", "--mode", "enforce"),
                 ("framework_hook", "handler=x"), ("framework_hook", "handler=x", "args=[1", "--job", "j"),
                 ("framework_hook", "handler=x", "timeout=nan", "--job", "j"),
                 ("sysctl", "key=kernel.bogus", "value=1"), ("sysctl", "key=vm.swappiness"),
                 ("alert", "severity=bogus"), ("log", "level=loud"),
                 ("affinity", "node=0", "--pid", "{pid}", "--mode", "bogus"),
                 ("affinity", "node=0", "--pid", "{pid}", "--port", "99999")):
        add("act", "act", *args)
    for state in BAD_STATES:
        add("act", "--state-dir", f"{{{state}}}", "act", "sysctl", "key=vm.swappiness", "value=1", "--mode",
            "enforce")
        add("rollback", "--state-dir", f"{{{state}}}", "rollback", "--all")
        add("journal", "--state-dir", f"{{{state}}}", "journal")
        add("run", "--state-dir", f"{{{state}}}", *RUN)
    add("rollback", "rollback")
    add("rollback", "rollback", "no-such-id")
    add("rollback", "rollback", "--bogus")
    add("journal", "journal", "extra")
    for verb in ("validate", "test-policies", "explain"):
        add(verb, verb, "")
    add("validate", "--sys-root", "", "validate", "{policy}")
    add("validate", "--state-dir", "", "validate", "{policy}")
    add("-", "no-such-verb")
    add("-", )
    return out


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_DATA, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_case(files: dict[str, str], args: tuple[str, ...]) -> dict:
    argv = [a.format(**files) for a in args]
    if argv[:1] != ["--state-dir"]:
        argv = ["--state-dir", files["state"], *argv]
    argv = ["--hook-dir", files["hooks"], "--proc-root", files["proc"], *argv]
    began = time.monotonic()
    try:
        r = run_cli(*argv, timeout=LIMIT, preexec_fn=_limits, errors="replace")
        code, out, err, hung = r.returncode, r.stdout, r.stderr, False
    except subprocess.TimeoutExpired as exc:
        code, hung = None, True
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        err = (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
    seconds = time.monotonic() - began
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    traceback = "Traceback" in out + err or "internal error" in err
    problems = []
    if hung:
        problems.append(f"no answer within {LIMIT:g}s (a hang)")
    elif code not in (1, 2):
        problems.append(f"exit {code}")
    if not hung and len(errors) != 1:
        problems.append(f"{len(errors)} 'error:' lines")
    if traceback:
        problems.append("a traceback")
    return {"args": " ".join(argv[4:]).replace(BIG, "10**400"), "exit": code, "seconds": round(seconds, 3),
            "hung": hung, "traceback": traceback, "problems": problems,
            "stderr": err[-400:] if problems else err.splitlines()[-1:] and err.splitlines()[-1][:200]}


def short_cases() -> list[tuple[str, tuple[str, ...]]]:
    """CI's share of the table: every third case, the first two of each verb, and
    every bad state directory."""
    out, seen = [], {}
    for i, (verb, args) in enumerate(cases()):
        seen[verb] = seen.get(verb, 0) + 1
        if i % 3 == 0 or seen[verb] <= 2 or any(a.startswith("{state-") for a in args):
            out.append((verb, args))
    return out


def run_table(tmp: Path, full: bool = True) -> dict:
    files = make_files(tmp)
    sleeper = subprocess.Popen(["sleep", "600"])
    files["pid"] = str(sleeper.pid)
    results: list[dict] = []
    began = time.monotonic()
    try:
        for verb, args in (cases() if full else short_cases()):
            results.append({"verb": verb, **run_case(files, args)})
    finally:
        sleeper.kill()
        sleeper.wait()
    by_verb: dict = {}
    for r in results:
        v = by_verb.setdefault(r["verb"], {"cases": 0, "failures": 0})
        v["cases"] += 1
        v["failures"] += bool(r["problems"])
    return {
        "cases": len(results), "by_verb": by_verb,
        # a traceback, or the CLI's "internal error" line that stands for one
        "tracebacks": sum(r["traceback"] for r in results), "hangs": sum(r["hung"] for r in results),
        "failures": [f"{r['verb']}: reflexarc {r['args']}: {'; '.join(r['problems'])}: {r['stderr']!r}"
                     for r in results if r["problems"]],
        "worst_case_s": max(r["seconds"] for r in results if not r["hung"]),
        "seconds": round(time.monotonic() - began, 1),
        "results": results,
    }
