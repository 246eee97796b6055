"""Command line of the testbed: bring it up, tear it down, sweep leftovers,
describe it, or run the smoke check.

Example::

    python -m reflexarc.simulations.testbed up --prefix rxtb1 --ranks 2 --bottleneck 200mbit
    python -m reflexarc.simulations.testbed describe --prefix rxtb1
    python -m reflexarc.simulations.testbed down --prefix rxtb1
    python -m reflexarc.simulations.testbed sweep --prefix rxtb1     # also when half of it is gone
    python -m reflexarc.simulations.testbed smoke --baseline 30 --fault 30

``up`` leaves the testbed running after it exits (``--hold`` keeps it in the
foreground until SIGINT/SIGTERM, then tears it down). ``smoke`` brings one up,
runs the job, injects a bulk upload (``--tos 0x20``: pre-marked CS1), prints the
baseline and fault step times as JSON lines and tears it down. SIGINT and SIGTERM
tear down whatever is up. Every outcome is JSON on stdout; a failure is one
``error:`` line on stderr and a non-zero exit (130 after SIGINT, 143 after SIGTERM).

Overhead: ``smoke`` takes its two phases plus ~10 s (job start, teardown).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

from .faults import BulkUpload
from .procs import TestbedError
from .topology import Testbed, default_prefix, sweep, workdir_of


class Interrupted(BaseException):
    """SIGINT or SIGTERM arrived; raised in the main thread so teardown runs."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.code = 128 + signum


def _interrupt(signum: int, _frame) -> None:
    raise Interrupted(signum)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def say(**fields) -> None:
    print(json.dumps({"ts": round(time.time(), 3), **fields}), flush=True)


def parser() -> Parser:
    ap = Parser(prog="python -m reflexarc.simulations.testbed", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="command", required=True, parser_class=Parser)
    build = Parser(add_help=False)
    build.add_argument("--prefix", default=None, help="names' prefix (default: rxtb<pid%%10000>)")
    build.add_argument("--ranks", type=int, default=2)
    build.add_argument("--bottleneck", default="200mbit", help="the switch uplink's rate")
    build.add_argument("--shape-reverse", action="store_true", help="shape the port towards rank 0 as well")
    named = Parser(add_help=False)
    named.add_argument("--prefix", required=True)
    up = sub.add_parser("up", parents=[build], help="bring a testbed up")
    up.add_argument("--hold", action="store_true", help="stay in the foreground; tear down on SIGINT/SIGTERM")
    sub.add_parser("down", parents=[named], help="tear down a testbed brought up by 'up'")
    sub.add_parser("sweep", parents=[named], help="remove everything named after a prefix")
    sub.add_parser("describe", parents=[named], help="print a running testbed's layout")
    smoke = sub.add_parser("smoke", parents=[build], help="baseline, then a bulk upload; tears down")
    smoke.add_argument("--baseline", type=float, default=30.0, help="seconds")
    smoke.add_argument("--fault", type=float, default=30.0, help="seconds of bulk upload")
    smoke.add_argument("--tos", type=lambda s: int(s, 0), default=0, help="IP TOS of the upload, e.g. 0x20")
    loop = sub.add_parser("loop", help="the closed loop: for each fault a fresh testbed, the controller in "
                                       "enforce, the fault, the outcome measured; tears down")
    loop.add_argument("--faults", default="a,b,c,d,e", help="which faults, comma-separated (default %(default)s)")
    loop.add_argument("--out", default="out/testbed", help="work directory: policies, audit, report")
    loop.add_argument("--results", help="also write the results to this JSON file")
    loop.add_argument("--baseline", type=_seconds, default=40.0, help="seconds before the fault")
    loop.add_argument("--quiet", type=_seconds, default=600.0, help="seconds of the no-fault run (e)")
    hooks = loop.add_mutually_exclusive_group()
    hooks.add_argument("--no-hooks", action="store_true",
                       help="an unmodified job: no framework hooks; every signal comes from the node")
    hooks.add_argument("--also-unmodified", action="store_true",
                       help="run each fault twice: on a job that serves the hooks, then on an unmodified one")
    loop.add_argument("--two-jobs", action="store_true",
                      help="also run fault b with an unmodified neighbour job on the node (Slurm-launched, its "
                           "own store): only the faulty job may be acted on")
    loop.add_argument("--merge", action="store_true",
                      help="keep the rows of --results that this run does not measure again")
    loop.add_argument("--launcher", choices=("torchrun", "slurm"), default="torchrun",
                      help="how the job's ranks are launched: the environment and cgroups they get")
    return ap


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 < value < 86400:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds (0-86400)")
    return value


def _state(prefix: str) -> dict:
    path = workdir_of(prefix) / "testbed.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise TestbedError(f"no testbed {prefix} is up ({path} does not exist); 'sweep' removes leftovers") from None


def _build(args: argparse.Namespace) -> Testbed:
    return Testbed(ranks=args.ranks, bottleneck=args.bottleneck, prefix=args.prefix or default_prefix(),
                   shape_reverse=args.shape_reverse)


def _smoke(args: argparse.Namespace) -> None:
    with _build(args) as tb:
        say(event="up", prefix=tb.prefix, bottleneck=tb.describe()["bottleneck"])
        job = tb.start_job()
        say(event="job", **job.describe())
        settle = 5.0                  # the first steps start the workers and warm up TCP
        time.sleep(settle + args.baseline)
        t_fault = BulkUpload(tb, tos=args.tos).start()
        say(event="fault", fault="bulk", tos=args.tos, onset=t_fault)
        time.sleep(args.fault)
        t_end = time.time()
        t_base = t_fault - args.baseline
        base, fault = job.median_step_ms(t_base, t_fault), job.median_step_ms(t_fault + 2.0, t_end)
        say(event="result", baseline_median_ms=round(base, 1), fault_median_ms=round(fault, 1),
            baseline_mean_ms=round(job.mean_step_ms(t_base, t_fault), 1),
            fault_mean_ms=round(job.mean_step_ms(t_fault + 2.0, t_end), 1), ratio=round(fault / base, 2))
        job.stop()


def run(args: argparse.Namespace) -> None:
    if args.command == "up":
        tb = _build(args).up()
        say(event="up", **tb.describe())
        if args.hold:
            try:
                signal.pause()
            finally:
                tb.down()
                say(event="down", prefix=tb.prefix)
    elif args.command == "down":
        _state(args.prefix)
        say(event="down", prefix=args.prefix, removed=sweep(args.prefix))
    elif args.command == "sweep":
        say(event="swept", prefix=args.prefix, removed=sweep(args.prefix))
    elif args.command == "describe":
        print(json.dumps(_state(args.prefix), indent=1))
    elif args.command == "loop":
        _loop(args)
    else:
        _smoke(args)


def _loop(args: argparse.Namespace) -> None:
    from .closed_loop import FAULTS, format_actions, format_table, machine, run_fault
    keys = [k.strip() for k in args.faults.split(",") if k.strip()]
    unknown = [k for k in keys if k not in FAULTS]
    if unknown or not keys:
        raise TestbedError(f"unknown fault(s) {', '.join(unknown) or '(none)'}; known: {', '.join(FAULTS)}")
    variants = [(k, hooks, False) for k in keys
                for hooks in ((False,) if args.no_hooks else (True, False) if args.also_unmodified else (True,))]
    variants += [("b", True, True)] if args.two_jobs else []
    results = [run_fault(k, Path(args.out), baseline=args.baseline, quiet=args.quiet, hooks=hooks,
                         neighbour=neighbour, launcher=args.launcher,
                         log=lambda text: print(text, file=sys.stderr, flush=True))
               for k, hooks, neighbour in variants]
    rows = results
    if args.results and args.merge and Path(args.results).exists():
        def key(r: dict) -> tuple:
            return r["fault"], r.get("hooks", True), "neighbour" in r
        fresh = {key(r) for r in results}
        rows = [r for r in json.loads(Path(args.results).read_text())["faults"] if key(r) not in fresh] + results
    doc = {"machine": machine(), "faults": rows}
    if args.results:
        Path(args.results).parent.mkdir(parents=True, exist_ok=True)
        Path(args.results).write_text(json.dumps(doc, indent=1) + "\n")
    print(format_table(results))
    print(format_actions(results))
    for r in results:
        print(f"fault {r['fault']} report: {r['report']}")


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    args = parser().parse_args(argv)
    try:
        run(args)
    except Interrupted as exc:
        print(f"error: interrupted by {exc}; the testbed was torn down", file=sys.stderr)
        return exc.code
    except (TestbedError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
