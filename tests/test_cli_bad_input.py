"""Every verb, every option, every kind of bad file: one ``error:`` line and exit 1
(2 for a bad command line), never exit 70, never a traceback, never a wait.

Bad files are a missing path, a directory, a FIFO, a directory holding a FIFO,
a character device, binary data, an empty file and a file past the size limits.
``run`` starts for real where it must (``--no-probes``, a short ``--duration``);
each case that reads a file runs the real CLI in a child, whose ``timeout``
turns a hang into a failure that names the case. A bad command line (exit 2)
is refused by the parser before anything is read: those cases ask the parser
in this process (``parse_cli``), as ``reflexarc`` does first thing.
"""
from __future__ import annotations

import os

import pytest

from conftest import parse_cli, run_cli

HANG = 60          # seconds: a case that has not answered by then hangs

POLICY = """\
policies:
  - name: pager
    mode: dry-run
    rules:
      - name: slow
        when: {signal: step_time_ms, agg: max, window: 30s, op: ">", threshold: 400}
        actions:
          - {actuator: log, params: {message: slow steps}}
"""
AUDIT = ('{"ts": 0, "kind": "run", "source": "simulation:x", "policies": []}\n'
         '{"ts": 1, "kind": "end", "summary": {}}\n')
BIG = "1" + "0" * 400


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """name -> path of every kind of bad file, and a few good ones."""
    tmp = tmp_path_factory.mktemp("bad")
    paths = {"missing": tmp / "missing.yaml", "dir": tmp / "empty-dir", "fifo": tmp / "fifo.yaml",
             "fifo-dir": tmp / "fifo-dir", "device": "/dev/zero", "binary": tmp / "binary.yaml",
             "empty": tmp / "empty.yaml", "huge": tmp / "huge.yaml", "policy": tmp / "policy.yaml",
             "audit": tmp / "audit.jsonl", "file": tmp / "plain", "hooks": tmp / "hooks", "state": tmp / "state",
             "big-threshold": tmp / "big.yaml", "blocked": tmp / "blocked"}
    paths["dir"].mkdir()
    paths["fifo-dir"].mkdir()
    os.mkfifo(paths["fifo"])
    os.mkfifo(paths["fifo-dir"] / "case.yaml")
    paths["binary"].write_bytes(bytes(range(128, 256)) * 64)
    paths["empty"].write_text("")
    paths["huge"].write_text("x" * (9 << 20))        # past the policy (1 MiB) and audit line (8 MiB) limits
    paths["policy"].write_text(POLICY)
    paths["big-threshold"].write_text(POLICY.replace("threshold: 400", f"threshold: {BIG}"))
    paths["audit"].write_text(AUDIT)
    paths["file"].write_text("x\n")
    paths["hooks"].mkdir(mode=0o755)
    (paths["blocked"] / "report.json").mkdir(parents=True)     # a report cannot be written there
    return {k: str(v) for k, v in paths.items()}


def rx(files, *args, child: bool = True):
    """``reflexarc ARGS`` on the test's state and hook directories: in a child, or
    (``child=False``) the parser's answer alone, in this process."""
    argv = ["--state-dir", files["state"], "--hook-dir", files["hooks"], *(a.format(**files) for a in args)]
    return run_cli(*argv, timeout=HANG) if child else parse_cli(*argv)


RUN = ("run", "--no-probes", "--duration", "0.2", "--interval", "0.1", "--kill-switch", "{state}/off",
       "--policy", "{policy}")
BAD_FILES = ("missing", "dir", "fifo", "fifo-dir", "device", "binary", "empty", "huge")
# what the error says of each bad file where a verb reads it itself
TEST_FILE_WORDS = {"missing": "no such file", "dir": "no policy test files", "fifo": "is a FIFO",
                   "fifo-dir": "is a FIFO", "device": "is a character device", "binary": "not UTF-8",
                   "empty": "empty test file", "huge": "larger than"}
AUDIT_WORDS = {"missing": "no such file", "dir": "no audit.jsonl", "fifo": "is a FIFO", "fifo-dir": "no audit.jsonl",
               "device": "is a character device", "binary": "not an audit log", "empty": "not an audit log",
               "huge": "not an audit log"}
REPLAY_WORDS = {**AUDIT_WORDS, "dir": "is a directory", "fifo-dir": "is a directory", "binary": "bad replay record",
                "huge": "bad replay record"}
CASES = [
    # (args, exit code, a word of the error line)
    *[(("validate", f"{{{kind}}}"), 1, "error(s)") for kind in ("missing", "fifo", "device", "binary", "empty",
                                                                  "huge", "big-threshold")],
    *[(("test-policies", f"{{{kind}}}"), 1, TEST_FILE_WORDS[kind]) for kind in BAD_FILES],
    *[(("simulate", "numa-remote-worker", "--out", "{state}/sim", "--policy", f"{{{kind}}}"), 1, "polic")
      for kind in BAD_FILES],
    *[(("report", f"{{{kind}}}", "--out", "{state}/report"), 1, AUDIT_WORDS[kind]) for kind in BAD_FILES],
    *[(("run", "--no-probes", "--duration", "0.2", "--policy", f"{{{kind}}}"), 1, "polic") for kind in BAD_FILES],
    *[((*RUN, "--replay", f"{{{kind}}}"), 1, REPLAY_WORDS[kind]) for kind in BAD_FILES if kind != "empty"],
    *[((*RUN, "--audit", f"{{{kind}}}"), 1, "audit log") for kind in ("dir", "fifo", "device")],
    *[((verb, "--policy", f"{{{kind}}}"), 1, "polic") for verb in ("probes", "top") for kind in ("fifo", "binary")],
    (("simulate", "{fifo}"), 1, "FIFO"),
    (("simulate", "{binary}"), 1, "UTF-8"),
    (("simulate", "no-such-scenario"), 1, "no scenario"),
    (("simulate", "numa-remote-worker", "--out", "{file}"), 1, "not a directory"),
    (("report", "{audit}", "--out", "{file}"), 1, "not a directory"),
    (("report", "{audit}", "--out", "{blocked}"), 1, "report.json: Is a directory"),
    *[((verb, "--interval", value), 2, "--interval") for verb in ("run", "probes", "top")
      for value in ("0", "-1", "nan", "inf", "1e400", BIG, "x", "")],
    *[((*RUN, "--duration", value), 2, "--duration") for value in ("-1", "nan", "inf", "x", "")],
    *[(("top", "--count", value), 2, "--count") for value in ("-1", "1.5", "x", "")],
    *[((*RUN, option, value), 2, option) for option in ("--max-active", "--actions-per-hour")
      for value in ("-1", "1.5", "nan", "x")],
    *[((*RUN, "--metrics-port", value), 2, "--metrics-port") for value in ("0", "99999", "-1", "x")],
    *[((*RUN, option, value), 2, option) for option, value in (
        ("--audit-sample", "nan"), ("--audit-sample", "-1"), ("--target-grace", "-5"), ("--target-grace", "inf"),
        ("--audit-max-mb", "0"), ("--audit-max-mb", "-1"), ("--audit-max-mb", "inf"), ("--audit-max-mb", "nan"),
        ("--mode", "bogus"), ("--arrivals", "-1"), ("--arrivals", "nan"), ("--arrivals", "x"))],
    *[(args, 2, "empty path") for args in (
        ("validate", ""), ("validate", " "), ("test-policies", ""), ("report", "", "--out", "{state}/r"),
        ("report", "{audit}", "--out", ""), ("simulate", "numa-remote-worker", "--policy", ""),
        ("simulate", "numa-remote-worker", "--out", ""), ("run", "--policy", ""), ("top", "--policy", ""),
        ("probes", "--policy", ""), (*RUN, "--replay", ""), (*RUN, "--audit", ""), (*RUN, "--kill-switch", ""),
        ("--sys-root", "", "validate", "{policy}"), ("--proc-root", "", "validate", "{policy}"),
        ("validate", "{policy}", "--sys-root", ""), ("act", "log", "message=x", "--state-dir", ""))],
    # the fleet budget's options: each value checked by the parser, the combinations by run
    *[((*RUN, option, value), 2, option) for option, value in (
        ("--fleet-etcd", ""), ("--fleet-etcd", "ftp://127.0.0.1:2379"), ("--fleet-etcd", "127.0.0.1:99999"),
        ("--fleet-etcd", "http://127.0.0.1:2379,"), ("--fleet-etcd", "http://127.0.0.1:2379/v3"),
        ("--fleet-etcd", "http://:2379"), ("--fleet-max-nodes", "0"), ("--fleet-max-nodes", "-1"),
        ("--fleet-max-nodes", "1.5"), ("--fleet-max-nodes", "x"), ("--fleet-max-percent", "0"),
        ("--fleet-max-percent", "101"), ("--fleet-max-percent", "nan"), ("--fleet-max-percent", "inf"),
        ("--fleet-max-percent", "x"), ("--fleet-ttl", "1"), ("--fleet-ttl", "2.5"), ("--fleet-ttl", "2h"),
        ("--fleet-ttl", "nan"), ("--fleet-ttl", "x"), ("--fleet-park-ttl", "1"), ("--fleet-park-ttl", "2d"),
        ("--fleet-park-ttl", "x"), ("--fleet-prefix", ""), ("--fleet-prefix", "reflexarc"),
        ("--fleet-prefix", "/"), ("--fleet-prefix", "/a b"), ("--node-name", ""), ("--node-name", "a/b"),
        ("--node-name", "a b"))],
    ((*RUN, "--fleet-max-nodes", "2"), 1, "--fleet-max-nodes needs --fleet-etcd"),
    ((*RUN, "--fleet-max-percent", "10"), 1, "--fleet-max-percent needs --fleet-etcd"),
    ((*RUN, "--fleet-etcd", "http://127.0.0.1:2379"), 1, "needs a limit"),
    # CPU lists: one parser for policies and act; a huge range is refused before it is expanded
    (("act", "affinity", "cpus=0-99999999999", "--pid", "1"), 1, "CPU 99999999999 is out of range"),
    (("act", "affinity", "cpus=3-1", "--pid", "1"), 1, "runs backwards"),
    (("act", "affinity", "cpus=0", "--pid", "999999"), 1, "no such process 999999"),
]


def case_id(args: tuple) -> str:
    return " ".join(args).replace(" ".join(RUN), "run...").replace(BIG, "10**400")


@pytest.mark.parametrize("args,code,word", CASES, ids=[case_id(c[0]) for c in CASES])
def test_bad_input_gets_one_error_line(files, args, code, word):
    r = rx(files, *args, child=code != 2)
    assert r.returncode == code, (r.returncode, r.stdout[-500:], r.stderr[-500:])
    assert "Traceback" not in r.stdout + r.stderr and "internal error" not in r.stderr, r.stderr
    plain = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(plain) == 1, r.stderr
    assert word in r.stderr.splitlines()[-1] or word in r.stdout, (word, r.stdout[-300:], r.stderr[-300:])


def test_the_good_inputs_of_the_sweep_work(files):
    """The sweep's cases fail for their bad value, not for the rest of their command line."""
    assert rx(files, *RUN).returncode == 0
    assert rx(files, *RUN, "--replay", "{empty}", "--audit", "{state}/audit.jsonl").returncode == 0
    r = rx(files, "report", "{audit}", "--out", "{state}/good-report")
    assert r.returncode == 0, r.stderr
    assert rx(files, "validate", "{policy}").returncode == 0
    assert rx(files, "validate", "{dir}").returncode == 0          # an empty directory: a warning, no error


def test_test_policies_refuses_a_fifo_in_a_directory_before_running_anything(files):
    r = rx(files, "test-policies", "{fifo-dir}")
    assert r.returncode == 1
    assert r.stderr.strip() == f"error: {files['fifo-dir']}/case.yaml: is a FIFO, not a regular file"
    assert r.stdout == ""


def test_threshold_out_of_range_is_located_at_the_number(files):
    r = rx(files, "validate", "{big-threshold}")
    assert r.returncode == 1
    line = next(line for line in POLICY.splitlines() if "threshold" in line)
    col = line.index("threshold: 400") + len("threshold: ") + 1
    lineno = POLICY.splitlines().index(line) + 1
    assert r.stdout.startswith(f"{files['big-threshold']}:{lineno}:{col}: error: 'threshold' is out of range"), \
        r.stdout


def test_report_of_a_binary_file_says_it_is_no_audit(files):
    r = rx(files, "report", "{binary}", "--out", "{state}/bin-report")
    assert r.returncode == 1
    assert r.stderr.startswith(f"error: {files['binary']}: not an audit log: no audit record")
    assert not os.path.exists(os.path.join(files["state"], "bin-report", "report.html"))


def test_report_replaces_a_fifo_in_its_way(files, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    os.mkfifo(out / "report.html")
    r = rx(files, "report", "{audit}", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "report.html").is_file() and "<html" in (out / "report.html").read_text()


TEST_FILE = """\
policy: POLICY
scenario: SCENARIO
cases:
  - mode: dry-run
    actions:
      - {actuator: log, outcome: planned, at: AT}
"""


@pytest.mark.parametrize("scenario,at,where,message", [
    ("numa-remote-worker", BIG, (6, 47), "at: duration 100000000000000000000000... (401 characters) is out of range"),
    ("numa-remote-worker", ".nan", (6, 47), "at: duration nan is not finite"),
    ("no-such-scenario", "10s", (2, 11), "no scenario named 'no-such-scenario'"),
])
def test_policy_test_file_errors_are_located_at_the_value(files, tmp_path, scenario, at, where, message):
    f = tmp_path / "case.yaml"
    f.write_text(TEST_FILE.replace("POLICY", files["policy"]).replace("SCENARIO", scenario).replace("AT", at))
    r = rx(files, "test-policies", str(f))
    assert r.returncode == 1
    assert r.stdout.splitlines()[0].startswith(f"{f}:{where[0]}:{where[1]}: error: {message}"), r.stdout
    assert r.stdout.splitlines()[-1] == "0 passed, 1 failed"
    assert r.stderr.strip() == "error: 1 policy test(s) failed"
