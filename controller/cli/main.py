"""The ``reflexarc`` command line: ``main``, the parser and what every verb shares.

    reflexarc validate FILE|DIR... [--node]  check policies (file:line:col: error: ...)
    reflexarc simulate --list | SCENARIO     run a scenario in simulated time, write audit + report
    reflexarc test-policies FILE|DIR...      policy unit tests (scenario + expected actions)
    reflexarc report AUDIT... --out DIR      HTML/JSON/Markdown report of an audit log, or across nodes
    reflexarc run [--policy P] [--mode M]    the controller on live probes (default dry-run;
                                             --mode policy honours each file's mode; SIGHUP
                                             or a changed policy file reloads: reload.py)
    reflexarc probes [--dump-bpf]            each probe's tier, status and attach points
    reflexarc top                            live signals per target
    reflexarc act ACTUATOR key=value...      one actuator by hand, through plan/diff/journal
                                             (a summary; --json the whole result)
    reflexarc rollback ID|--all              revert journaled changes
    reflexarc journal                        list journaled changes
    reflexarc fleet status|reset POLICY      the fleet's budget, rollouts and breakers in etcd

Each verb's ``cmd_<verb>`` lives in the module named after it (``validate.py``,
``explain.py``, ``simulate.py`` with test-policies, ``report.py``, ``run.py``,
``probes.py``, ``top.py``, ``jobs.py``, ``act.py``, ``rollback.py``,
``journal.py``, ``status.py`` with pause and resume, ``fleet.py``); what several verbs
share is in ``shared.py``, the argument types in ``args.py``.

The global options (``--state-dir``, ``-v``, ...) go before the command or
after it (``VerbParser``), ``--version`` says which reflexarc this is, and
every command and option has its ``--help``. ``validate``, ``explain`` and
``test-policies`` need no privilege (without root they skip this node's
checks, with a note, unless ``--node``); ``run``, ``probes`` and ``top`` say
in one line that loading probes needs root (``_missing_privilege``).

Bad input gives one ``error:`` line and exit 1 (2 for a bad command line),
never a traceback (``REFLEXARC_DEBUG=1`` shows it) and never a wait: intervals
are finite and > 0, durations finite and >= 0, counts whole and >= 0, paths not
empty, and an input file is read only when it is a regular file (a FIFO or a
device is refused before it is opened for reading).

Example::

    sys.exit(main(["validate", "policies/"]))

Overhead: argument parsing only; each command imports what it needs.
"""
from __future__ import annotations

import argparse
import os
import sys

from reflexarc.actuators.base import ActuatorError
from reflexarc.core.input_files import InputFileError

from ..policy.model import MODES
from ..runtime.narrate import LOG_FORMATS, configure_logging
from .act import actuators_help, cmd_act
from .args import (_address_arg, _count_arg, _duration_arg, _endpoints_arg, _interval_arg, _key_prefix_arg,
                   _node_name_arg, _park_ttl_arg, _path_arg, _percent_arg, _port_arg, _positive_count_arg,
                   _size_mb_arg, _ttl_arg)
from .explain import cmd_explain
from .fleet import cmd_fleet
from .jobs import cmd_jobs
from .journal import cmd_journal
from .probes import cmd_probes
from .report import cmd_report
from .rollback import cmd_rollback
from .run import cmd_run
from .shared import EARLY_HUPS, CliError, _set_hup
from .simulate import cmd_simulate, cmd_test_policies
from .status import cmd_pause, cmd_resume, cmd_status
from .top import cmd_top
from .validate import cmd_validate

DEFAULT_STATE_DIR = "/var/lib/reflexarc"


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, no usage dump
        print(f"error: {message} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(2)


class VerbParser(Parser):
    """A command's parser: it takes the global options too (``_global_options``)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        _global_options(self, after_verb=True)


def _global_options(parser: argparse.ArgumentParser, after_verb: bool = False) -> None:
    """The options of the command line as a whole. Every command takes them
    too (``after_verb``): there they have no default of their own, so a value
    given after the command overrides one given before it."""
    state_dir = os.environ.get("REFLEXARC_STATE_DIR", DEFAULT_STATE_DIR)
    group = parser.add_argument_group("global options (before or after the command)") if after_verb else parser

    def add(*names, default=None, **kwargs):
        group.add_argument(*names, default=argparse.SUPPRESS if after_verb else default, **kwargs)

    add("-v", "--verbose", action="count", default=0,
        help="log what each step does (level INFO); -vv: everything at DEBUG, the libraries' records included")
    add("--log-format", choices=LOG_FORMATS, default="text",
        help="stderr as text lines (default) or one JSON object a line, for log shippers: the events told "
             "(transitions, actions, node events) and the log records alike")
    add("--state-dir", type=_path_arg, default=state_dir,
        help=f"journal and audit directory (default {state_dir}, or $REFLEXARC_STATE_DIR)")
    add("--proc-root", type=_path_arg, default="/proc",
        help="procfs tree to read processes from (default /proc; a fixture tree in tests)")
    add("--sys-root", type=_path_arg, default="/sys",
        help="sysfs tree describing the machine: NUMA nodes, online CPUs, PCI devices, interfaces "
             "(affinity actuator, sched_numa probe, readiness; default /sys)")
    add("--hook-dir", type=_path_arg, default="/run/reflexarc/hooks",
        help="where training scripts serve their hook sockets (docs/hooks.md; default /run/reflexarc/hooks)")
    add("--alertmanager-url", default=os.environ.get("REFLEXARC_ALERTMANAGER_URL"), metavar="URL",
        help="Alertmanager to send alerts to (default $REFLEXARC_ALERTMANAGER_URL)")
    add("--webhook-url", default=os.environ.get("REFLEXARC_WEBHOOK_URL"), metavar="URL",
        help="webhook to POST alerts to (default $REFLEXARC_WEBHOOK_URL)")


NODE_HELP = ("also check this node as this user sees it (what root gets anyway): whether each signal's "
             "producers can run here, required devices, interfaces, running jobs")


def _fleet_tls_args(group) -> None:
    """The client side of an etcd that serves HTTPS and asks for client certificates (docs/fleet.md)."""
    group.add_argument("--fleet-ca", type=_path_arg, metavar="FILE",
                       help="the CA file the etcd members' certificates are checked against (default: the "
                            "system's); needs https:// endpoints")
    group.add_argument("--fleet-cert", type=_path_arg, metavar="FILE",
                       help="this node's client certificate (PEM), for an etcd run with --client-cert-auth; "
                            "with --fleet-key")
    group.add_argument("--fleet-key", type=_path_arg, metavar="FILE",
                       help="the key of --fleet-cert (PEM, readable by root only)")


def build_parser() -> Parser:
    from importlib.metadata import version
    p = Parser(prog="reflexarc", description="Closed-loop remediation for training nodes.")
    p.add_argument("--version", action="version", version=f"reflexarc {version('reflexarc')}")
    _global_options(p)
    sub = p.add_subparsers(dest="command", required=True, parser_class=VerbParser, metavar="COMMAND",
                           help="one of these ('reflexarc COMMAND --help' describes it)")

    s = sub.add_parser("validate", help="check policy files, and what keeps them from working on this node",
                       description="Checks policy files (file:line:col: error: ...), then what keeps them from "
                                   "working on this node. A user who is not root gets the checks that need no "
                                   "node: the signal catalogue, the alert receivers; --node adds this node's.")
    s.add_argument("paths", nargs="+", type=_path_arg, metavar="POLICY_FILE_OR_DIR",
                   help="policy files, or directories of them (*.yaml, *.yml)")
    s.add_argument("--strict", action="store_true",
                   help="treat warnings (a signal nothing here produces, an alert with no receiver) as errors")
    s.add_argument("--promql-config", metavar="FILE",
                   help="the PromQL source's configuration: its signals count as produced (docs/promql.md)")
    s.add_argument("--node", action="store_true", help=NODE_HELP)
    s.set_defaults(fn=cmd_validate)

    s = sub.add_parser("explain", help="say in plain words what each policy will do, when, and what it needs "
                                       "on this node")
    s.add_argument("paths", nargs="+", type=_path_arg, metavar="POLICY_FILE_OR_DIR",
                   help="policy files, or directories of them (*.yaml, *.yml)")
    s.add_argument("--policy-name", metavar="NAME", help="explain only the policy of this name")
    s.add_argument("--promql-config", metavar="FILE",
                   help="the PromQL source's configuration: its signals count as produced (docs/promql.md)")
    s.add_argument("--node", action="store_true", help=NODE_HELP)
    s.set_defaults(fn=cmd_explain)

    s = sub.add_parser("simulate", help="run a scenario in simulated time",
                       description="Runs a scenario (a node, its jobs and a fault, in simulated time) through "
                                   "the controller and writes the audit log and a report.")
    s.add_argument("scenario", nargs="?", help="a scenario's name (--list shows them) or its file")
    s.add_argument("--list", action="store_true", help="list the scenarios and what each shows")
    s.add_argument("--policy", action="append", default=[], type=_path_arg, metavar="POLICY_FILE_OR_DIR",
                   help="run these policies instead of those the scenario names (repeatable)")
    s.add_argument("--mode", choices=MODES, help="overrides every policy's mode")
    s.add_argument("--out", type=_path_arg, metavar="DIR",
                   help="where the audit log and report go (default out/SCENARIO)")
    s.add_argument("--all-evals", action="store_true",
                   help="write every evaluation to the audit (charts show each tick; 100 rules x 10 targets "
                        "write about 1.9 GB per simulated hour); by default evaluations are sampled as run "
                        "samples them: each change and every tick on the way to acting, a quiet rule-target "
                        "once per 20 minutes")
    s.set_defaults(fn=cmd_simulate)

    s = sub.add_parser("test-policies", help="run policy unit tests",
                       description="Runs each case of each test file: the policies it names, through its "
                                   "scenario in simulated time, in the case's mode; PASS when the actions taken "
                                   "are the ones expected (actuator, outcome, target, when), else FAIL with the "
                                   "difference. Exit 1 when one fails. File format: controller/runtime/policy_tests.py.")
    s.add_argument("paths", nargs="+", type=_path_arg, metavar="TEST_FILE_OR_DIR",
                   help="policy test files, or directories of them (*.yaml, *.yml; e.g. policies/tests/)")
    s.set_defaults(fn=cmd_test_policies)

    s = sub.add_parser("report", help="write a report from an audit log, or one across nodes from several")
    s.add_argument("audit", type=_path_arg, nargs="+",
                   help="the audit log (STATE_DIR/audit.jsonl, or a simulation's); several, or a directory "
                        "(each audit.jsonl below it one node's), make one report across the nodes")
    s.add_argument("--out", required=True, type=_path_arg, metavar="DIR",
                   help="where report.html, report.json and report.md go")
    s.add_argument("--full", action="store_true",
                   help="full detail: a chart for every target (those that never fired folded away), longer "
                        "tables; by default the HTML reads at a glance and stays under about 1 MB")
    s.set_defaults(fn=cmd_report)

    for name, fn, helptext in (("run", cmd_run, "run the controller on live signals"),
                               ("probes", cmd_probes, "list probes and their status"),
                               ("top", cmd_top, "show live signals: the running controller's view (its signals, rules, changes) when one runs, else probes of its own")):
        s = sub.add_parser(name, help=helptext)
        s.add_argument("--policy", action="append", default=[], type=_path_arg, metavar="POLICY_FILE_OR_DIR",
                       help="policy files or directories (repeatable; default: the shipped policies)")
        s.add_argument("--job", default="", help="job label attached to probe signals")
        s.add_argument("--interval", type=_interval_arg, default=1.0, metavar="DURATION",
                       help="seconds between collections (default %(default)s)")
        if name == "run":
            s.add_argument("--mode", choices=MODES + ("policy",), default="dry-run",
                           help="overrides every policy's mode (default %(default)s: nothing is changed "
                                "unless asked); 'policy' honours each file's own mode")
            s.add_argument("--duration", type=_duration_arg, metavar="DURATION",
                           help="stop after this long (0: after one tick)")
            s.add_argument("--arrivals", type=_duration_arg, default=0.2, metavar="DURATION",
                           help="between two collections, take the step signals this often and evaluate the "
                                "rules that read them as they arrive (default %(default)s; 0: only each interval)")
            s.add_argument("--replay", type=_path_arg, help="also replay signals from a JSONL file")
            s.add_argument("--promql-config", metavar="FILE",
                           help="also evaluate PromQL queries against Prometheus (docs/promql.md)")
            s.add_argument("--no-probes", action="store_true", help="do not load the bcc probes")
            s.add_argument("--audit", type=_path_arg, help="audit log path (default STATE_DIR/audit.jsonl)")
            s.add_argument("--audit-sample", type=_duration_arg, default=1200.0, metavar="DURATION",
                           help="write a steady rule-target's evaluation at most this often; changes, "
                                "and every tick on the way to acting, are always written (default %(default)s)")
            s.add_argument("--audit-max-mb", type=_size_mb_arg, default=64.0, metavar="MB",
                           help="rotate the audit log past this size, keeping 4 older files (default %(default)s)")
            s.add_argument("--target-grace", type=_duration_arg, default=60.0, metavar="DURATION",
                           help="retire a rule's target this long after its series stopped, beyond the "
                                "rule's longest window, once it holds nothing (default %(default)s)")
            served = s.add_mutually_exclusive_group()
            served.add_argument("--metrics-addr", type=_address_arg, metavar="[HOST:]PORT",
                                help="serve Prometheus metrics (rule states, actions, live signals, probes, "
                                     "journal, loop lag) there; PORT alone is 127.0.0.1:PORT, IPv6 is [ADDR]:PORT")
            served.add_argument("--metrics-port", type=_port_arg,
                                help="deprecated: the same as --metrics-addr 127.0.0.1:PORT")
            s.add_argument("--kill-switch", type=_path_arg, default="/run/reflexarc/disable",
                           help="while this file exists no change is made to the system, refreshes included; "
                                "changes already applied stay until rolled back (default %(default)s)")
            s.add_argument("--control-group", metavar="GROUP",
                           help="besides root, members of this group may steer the controller over "
                                "STATE_DIR/control.sock (status, journal, rollback, act, pause, resume)")
            s.add_argument("--max-active", type=_count_arg, default=4,
                           help="at most this many active remediations on the node (default %(default)s)")
            s.add_argument("--actions-per-hour", type=_count_arg, default=20,
                           help="at most this many changes an hour on the node (default %(default)s)")
            fleet = s.add_argument_group("fleet budget", "at most N nodes, or P % of the live fleet, acting at "
                                                         "once per enforcing policy, held in etcd (docs/fleet.md)")
            fleet.add_argument("--fleet-etcd", type=_endpoints_arg, metavar="URL[,URL...]",
                               help="the etcd cluster's client URLs; with it, every enforce change first takes a "
                                    "slot, and is refused while etcd is out of reach")
            fleet.add_argument("--fleet-max-nodes", type=_positive_count_arg, metavar="N",
                               help="at most N nodes acting at once per policy")
            fleet.add_argument("--fleet-max-percent", type=_percent_arg, metavar="P",
                               help="at most P %% of the live nodes (rounded up, at least 1) acting at once per "
                                    "policy; with --fleet-max-nodes, the smaller of the two")
            fleet.add_argument("--fleet-ttl", type=_ttl_arg, default=15, metavar="SECONDS",
                               help="the node's lease: a dead node's slots are free this long after its last "
                                    "renewal (default %(default)s)")
            fleet.add_argument("--fleet-park-ttl", type=_park_ttl_arg, default=3600, metavar="DURATION",
                               help="a stop that leaves changes applied keeps their slots this long, until the "
                                    "node starts again and takes them back (default %(default)s s)")
            fleet.add_argument("--fleet-prefix", type=_key_prefix_arg, default="/reflexarc", metavar="PREFIX",
                               help="the etcd keys of this fleet (default %(default)s)")
            _fleet_tls_args(fleet)
            fleet.add_argument("--node-name", type=_node_name_arg, metavar="NAME",
                               help="this node's name in its audit's run records and in the fleet, where "
                                    "reports across nodes tell nodes apart by it (default: the host name)")
        if name == "probes":
            s.add_argument("--dump-bpf", action="store_true", help="print the final C of each probe")
        if name == "top":
            s.add_argument("--count", type=_count_arg, help="refresh this many times, then exit")
            s.add_argument("--once", action="store_true", help="print one table and exit (the same as --count 1)")
            s.add_argument("--local", action="store_true",
                           help="load this command's own probes even when a controller runs (by default "
                                "top shows the running controller's view: its signals, rules and changes)")
            s.add_argument("--no-probes", action="store_true",
                           help="do not load the bcc probes: only the step signals training scripts report "
                                "through the hook directory")
        s.set_defaults(fn=fn)

    s = sub.add_parser("jobs", help="list the training jobs on this node: ranks, processes, pod or cgroup, and "
                                    "the evidence each was found by",
                       description="Jobs are found from what launchers set (torchrun, Slurm, Open MPI, PMIx, "
                                   "DeepSpeed, Accelerate) and from kubelet's and Slurm's cgroups; nothing else "
                                   "of a process's environment is read out.")
    s.add_argument("--json", action="store_true", help="print JSON instead of a table")
    s.add_argument("--job", default="", help="the job of training processes discovery finds no job for")
    s.set_defaults(fn=cmd_jobs)

    s = sub.add_parser("act", help="apply one actuator by hand", epilog=actuators_help(),
                       formatter_class=argparse.RawDescriptionHelpFormatter,
                       description="Plan (default), alert about or apply one actuator step, journaled and "
                                   "audited like the controller's. Parameters are key=value. An actuator that "
                                   "acts on processes (affinity, framework_hook) needs its target named by "
                                   "--pid, --cgroup, --job or a pid/trainer label, never by a process name "
                                   "alone; init, kernel threads and the controller are always refused.")
    s.add_argument("actuator", help="one of the actuators listed below")
    s.add_argument("params", nargs="*", metavar="key=value", help="the actuator's parameters (below)")
    s.add_argument("--mode", choices=("dry-run", "alert-only", "enforce"), default="dry-run",
                   help="dry-run plans and shows the diff (default); enforce journals and applies")
    s.add_argument("--job", default="", help="the job the target belongs to")
    s.add_argument("--process", action="append", default=[],
                   help="process names it may touch inside the --pid/--cgroup scope (repeatable)")
    s.add_argument("--pid", action="append", type=int, default=[],
                   help="processes it may touch, with their descendants (repeatable)")
    s.add_argument("--cgroup", help="the job's cgroup path")
    s.add_argument("--interface", action="append", default=[], help="network interface (repeatable)")
    s.add_argument("--port", action="append", default=[], help="port or lo-hi range (repeatable)")
    s.add_argument("--label", action="append", default=[], metavar="key=value",
                   help="a target label, e.g. trainer=4242 (a training process) or pid=812 (repeatable)")
    s.add_argument("--audit", help="audit log to append to (default STATE_DIR/audit.jsonl)")
    s.add_argument("--json", action="store_true",
                   help="print the result as JSON (outcome, before, after, summary, journal_id, error), a "
                        "failed one included")
    s.set_defaults(fn=cmd_act)

    s = sub.add_parser("rollback", help="revert journaled changes",
                       description="Reverts changes the journal (STATE_DIR/journal.jsonl) lists open, one by its "
                                   "id or --all, and records each as reverted; one that cannot be reverted stays "
                                   "open, and the exit status is 1. A controller running on the state directory "
                                   "is asked to do it. 'reflexarc journal' lists the ids.")
    s.add_argument("id", nargs="?", help="the journal id of the change to revert (see 'reflexarc journal')")
    s.add_argument("--all", action="store_true", help="revert every open change")
    s.add_argument("--forget", metavar="ID", help="close entry ID without reverting it (one this version "
                                                 "cannot revert, e.g. of an actuator it does not know); "
                                                 "needs --reason, and is audited")
    s.add_argument("--reason", metavar="TEXT", help="why the entry is forgotten (with --forget)")
    s.set_defaults(fn=cmd_rollback)

    s = sub.add_parser("journal", help="list journaled changes",
                       description="Lists every change the journal (STATE_DIR/journal.jsonl) holds: its id, "
                                   "state (applied, reverted, kept, ...), actuator, policy/rule and what it changed. "
                                   "Applied ones are reverted by 'reflexarc rollback' or the next start.")
    s.add_argument("--check", action="store_true",
                   help="read back every open change and name those the system no longer shows (changed behind "
                        "the controller's back); exit 1 when any has drifted")
    s.set_defaults(fn=cmd_journal)

    s = sub.add_parser("status", help="what the running controller is doing: mode, rules that are not ok and "
                                      "their evidence, changes held, limits used, enforcement, probes",
                       description="Asks the controller running on --state-dir over its control socket "
                                   "(root, or the --control-group of run). With none running, says so and "
                                   "counts the journal's open changes.")
    s.add_argument("--json", action="store_true", help="print the controller's whole reply as JSON")
    s.set_defaults(fn=cmd_status)

    s = sub.add_parser("pause", help="hold the running controller's enforcement: no change is made until "
                                     "resume (or --for ends), refreshes included; audited",
                       description="Applied changes stay as they are: 'reflexarc rollback' reverts them. "
                                   "Rules still evaluate, plan and alert.")
    s.add_argument("--reason", metavar="TEXT", help="why (required; written to the audit with who asked)")
    s.add_argument("--for", dest="for_", type=_duration_arg, metavar="DURATION",
                   help="resume by itself after this long (e.g. 10m); default: until 'reflexarc resume'")
    s.set_defaults(fn=cmd_pause)

    s = sub.add_parser("resume", help="end a pause of the running controller's enforcement; audited")
    s.add_argument("--reason", metavar="TEXT", help="why (written to the audit)")
    s.set_defaults(fn=cmd_resume)

    s = sub.add_parser("fleet", help="the fleet's budget, rollouts and breakers in etcd; reset a breaker",
                       description="status: the live nodes, each pool's slots and queue, each policy's rollout "
                                   "stage, seats and breaker. reset POLICY --reason TEXT: close the policy's "
                                   "breaker (written to the rollout's history with who asked); --from-start "
                                   "goes back to the first stage too (docs/fleet.md).")
    s.add_argument("action", choices=("status", "reset"),
                   help="status: what the store holds; reset: close a policy's breaker")
    s.add_argument("policy", nargs="?", help="the policy whose breaker to reset (reset)")
    s.add_argument("--fleet-etcd", type=_endpoints_arg, required=True, metavar="URL[,URL...]",
                   help="the etcd cluster's client URLs")
    s.add_argument("--fleet-prefix", type=_key_prefix_arg, default="/reflexarc", metavar="PREFIX",
                   help="the etcd keys of this fleet (default %(default)s)")
    _fleet_tls_args(s)
    s.add_argument("--reason", metavar="TEXT", help="why the breaker is reset (reset; required)")
    s.add_argument("--from-start", action="store_true", help="reset: back to the first stage, its seats emptied")
    s.add_argument("--json", action="store_true", help="status: the whole view as JSON")
    s.set_defaults(fn=cmd_fleet)
    return p


def _actuator_help_asked(argv: list[str]) -> str | None:
    """``act ACTUATOR --help``: the actuator whose parameters alone to print."""
    from reflexarc.actuators.specs import SPECS
    if "act" not in argv or not {"-h", "--help"} & set(argv):
        return None
    rest = argv[argv.index("act") + 1:]
    return rest[0] if rest and rest[0] in SPECS else None


def _raise_fd_limit() -> None:
    """The soft limit on open files up to the hard one (systemd starts services
    with 1024 soft): descriptors held by clients or by a burst of work must not
    run out under the controller while it holds changes."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        except (ValueError, OSError):
            pass                              # e.g. above fs.nr_open: the soft limit stays


def _missing_privilege(args) -> str | None:
    """Why ``run``, ``probes`` or ``top`` cannot load the eBPF probes they would
    load (not with ``--no-probes``), said before anything starts; None when they
    can. ``probes --dump-bpf`` too: the C follows the attach points tracefs offers."""
    if args.command not in ("run", "probes", "top") or getattr(args, "no_probes", False):
        return None
    from reflexarc.bpf.probe import KernelFeatures
    features = KernelFeatures()
    why = features.missing_privilege()
    if why is None:
        return None
    instead = "" if args.command == "probes" else "; --no-probes runs without them"
    return (f"{args.command} needs root, or CAP_BPF and CAP_PERFMON with read access to {features.tracefs}, "
            f"to load its eBPF probes ({why}){instead}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    _set_hup(lambda *_: EARLY_HUPS.append(True))   # a reload asked while starting is not a hangup
    only = _actuator_help_asked(argv)
    if only is not None:
        print(f"usage: reflexarc act {only} PARAM=VALUE ... [--pid PID | --cgroup PATH | --job NAME] [--mode MODE]")
        print(actuators_help(only))
        return 0
    args = build_parser().parse_args(argv)
    unprivileged = _missing_privilege(args)
    if unprivileged:
        print(f"error: {unprivileged}", file=sys.stderr)
        return 1
    _raise_fd_limit()
    configure_logging(args.verbose, args.log_format)
    try:
        return args.fn(args)
    except (CliError, InputFileError, ActuatorError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # never a traceback for the user
        if os.environ.get("REFLEXARC_DEBUG") == "1":
            raise
        print(f"error: internal error: {type(exc).__name__}: {exc} (REFLEXARC_DEBUG=1 shows the traceback)",
              file=sys.stderr)
        return 70
