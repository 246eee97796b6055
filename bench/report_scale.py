"""``reflexarc report`` on large audit trails: seconds, records/s and peak RSS.

Three trails of ``--records`` lines each (``tests/fixtures/audit/synthetic.py``:
a live dry-run of one rule over 40 training processes, Unix timestamps):

- ``steady``: a node where little happens; 97 % of the records are evaluations.
- ``flapping``: the rule takes a step on every tick; 59 % of the records are
  transitions, actions and limits, each with its evidence (23,520 held-back
  actions at 200,000 records).
- ``wide``: ``flapping`` with re-pins of 64 threads, so each action carries a
  64-entry before/after and its diff.

Each trail is reported by the real CLI in a child process (``reflexarc.controller.cli.main.main``
with ``report``), timed from start to exit; its peak RSS is the child's own
``VmHWM`` (``/proc/self/status`` as it ends: ``wait4`` would also count the
memory of this process, which the child's address space started as). The report is then checked against what the generator
wrote (records, evaluations, transitions, actions, every decision in
report.json), so a fast run that lost rows does not count. ``--baseline
DIR`` measures the same trails with the ``reflexarc`` package in ``DIR`` too,
for a before/after table: an older tree laid out as ``DIR/reflexarc/<folder>``,
e.g. ``git archive COMMIT | tar -x -C DIR/src`` and a symlink
``DIR/reflexarc/controller -> DIR/src/controller`` for each of core,
controller, bpf, actuators, simulations and policies. The trails take 125-180 MB each in a temporary directory.

Usage (from the repository)::

    .venv/bin/python bench/report_scale.py                 # writes bench/results/report_scale.json
    .venv/bin/python bench/report_scale.py --baseline /tmp/before
    .venv/bin/python bench/report_scale.py --quick         # 20,000 records, results in $TMPDIR

Overhead of the benchmark itself: writing the trails (~2 s each at 200,000
records) and reading report.json once per run to check it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "fixtures" / "audit"))

from synthetic import write_audit  # noqa: E402

SHAPES = {"steady": {"events_every": 50}, "flapping": {"events_every": 1},
          "wide": {"events_every": 1, "threads": 64}}
TARGET_S = 10.0           # the goal for 200,000 records on the 2-core test machine
CHILD = """\
import sys
from reflexarc.controller.cli.main import main
code = main(["report", *sys.argv[1:]])
status = open("/proc/self/status").read().split("VmHWM:")[1].split()[0]
print(f"VmHWM {status}", file=sys.stderr)
sys.exit(code)
"""


def run_report(audit: Path, out: Path, pythonpath: str | None) -> dict:
    """One ``reflexarc report`` in a child: wall seconds, peak RSS, exit status."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    t0 = time.perf_counter()
    child = subprocess.run([sys.executable, "-c", CHILD, str(audit), "--out", str(out)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True, env=env)
    seconds = time.perf_counter() - t0
    lines = child.stderr.splitlines()
    hwm = next((int(line.split()[1]) for line in lines if line.startswith("VmHWM ")), 0)
    return {"seconds": round(seconds, 2), "peak_rss_mb": round(hwm / 1024, 1), "exit": child.returncode,
            "stderr": "\n".join(line for line in lines if not line.startswith("VmHWM "))[-500:]}


def check(out: Path, truth: dict) -> list[str]:
    """What report.json gets wrong about the trail (empty: nothing)."""
    data = json.loads((out / "report.json").read_text())
    counts = data["summary"]["counts"]
    problems = []
    for name, seen, want in (("records", counts["records"], truth["records"]),
                             ("evals", counts["evals"], truth["evals"]),
                             ("transitions", counts["transitions"], truth["transitions"]),
                             ("actions", counts["actions"], truth["actions"]),
                             ("decisions", len(data["decisions"]),
                              truth["transitions"] + sum(truth["actions"].values())),
                             ("dry_run", len(data["dry_run"]), truth["dry_run"]),
                             ("warnings", data["summary"]["warnings"], [])):
        if seen != want:
            problems.append(f"{name}: report {seen!r}, trail {want!r}")
    return problems


def measure(shape: str, records: int, tmp: Path, baseline: str | None) -> dict:
    audit = tmp / f"{shape}.jsonl"
    truth = write_audit(audit, records, **SHAPES[shape])
    row = {"shape": shape, "records": records, "audit_mb": round(audit.stat().st_size / 1e6, 1),
           "transitions": truth["transitions"], "actions": sum(truth["actions"].values()),
           "limits": truth["limits"]}
    for label, path in (("now", None), ("baseline", baseline)):
        if label == "baseline" and not baseline:
            continue
        out = tmp / f"{shape}-{label}"
        result = run_report(audit, out, path)
        result["records_per_s"] = round(records / result["seconds"])
        result["problems"] = check(out, truth) if result["exit"] == 0 else [f"exit {result['exit']}"]
        row[label] = result
    audit.unlink()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--quick", action="store_true", help="20,000 records; results in $TMPDIR")
    ap.add_argument("--baseline", help="directory holding the reflexarc package to compare with")
    ap.add_argument("--out", type=Path, help="results JSON (default bench/results/report_scale.json)")
    args = ap.parse_args()
    records = 20_000 if args.quick else args.records
    out = args.out or (Path(tempfile.gettempdir()) / "reflexarc-report-scale-quick.json" if args.quick
                       else ROOT / "bench" / "results" / "report_scale.json")
    with tempfile.TemporaryDirectory(prefix="reflexarc-report-scale-") as tmp:
        rows = [measure(shape, records, Path(tmp), args.baseline) for shape in SHAPES]
    print(f"{'shape':9s} {'records':>8s} {'MB':>6s} {'':9s} {'seconds':>8s} {'records/s':>10s} "
          f"{'peak RSS MB':>12s}  check")
    for row in rows:
        for label in ("baseline", "now"):
            if label in row:
                r = row[label]
                print(f"{row['shape']:9s} {row['records']:8d} {row['audit_mb']:6.1f} {label:9s} {r['seconds']:8.2f} "
                      f"{r['records_per_s']:10d} {r['peak_rss_mb']:12.1f}  {'; '.join(r['problems']) or 'ok'}")
    result = {"machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "python": platform.python_version(),
                          "loadavg": list(os.getloadavg())},
              "records": records, "target_s": TARGET_S, "baseline": args.baseline, "runs": rows}
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {out}")
    return 1 if any(row["now"]["problems"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
