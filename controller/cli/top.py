"""``reflexarc top``: live signals, grouped by job and training process.

Jobs, ranks and pods are those discovery finds on the node
(``reflexarc.core.jobs``, through the probe manager); ``--job`` names only the
training processes it finds no job for.

Every interval it reads the probes (bcc, light tier) and the step signals the
training scripts report through the hooks (``step_time_ms``,
``dataloader_batch_wait_ms``, ``step_pre_collective_ms``; each labelled with
the script's pid as ``trainer``, which is what the probes call a training
process), keeps the latest value of every series, and prints them in the manner
of bcc's interval tools (``biolatency 1``, ``runqlat 1``)::

    12:00:01  2 training processes, 13 series
    job llama (pod 1b2c3d4e-...)
      trainer 4242 (rank 0, python)
        locality: nvidia1 remote (node 1; CPUs on node 0)
        step_time_ms                                          182  ms     0.2 s ago
        dataloader_batch_wait_ms                             12.3  ms     0.2 s ago
        step_pre_collective_ms                                 40  ms     0.2 s ago
        dataloader_read_latency_us{quantile=0.99}  pid=4250   812  us     0.9 s ago
    node
        link_utilization_pct{iface=eth0,traffic=other}         45  %      0.9 s ago

The ``locality`` line sums up ``device_numa_local_ratio``
(``bpf/device_locality.py``) for the training process: each device it uses
that is not wholly on the NUMA node of its CPUs, or ``all local``.

followed by the most recent discrete probe events (cross-NUMA migrations), e.g.::

    12:00:01 cross-NUMA migration pid=123 tid=124 (pt_data_worker) cpu0/node0 -> cpu1/node1

A target that is gone is not shown: a series whose ``trainer``, ``pid`` or
``tid`` names a process that exited (no ``<proc_root>/<pid>``, a zombie, or a
pid now reused by a process that started later) is dropped at once, as is a
series with no new sample for ``stale_after`` seconds. The process table is
read under ``proc_root`` (``--proc-root``), so tests can give their own.

When a controller runs on the state directory, ``top`` shows *its* view
instead, over its control socket (``run_top_remote``): the signals on its bus
(a counter as a rate per second: ``dataloader_reads_total/s``), the rules
that are not ``ok`` with their state and evidence, the changes it holds and
whether enforcement is held. No probe is loaded then.

Example::

    reflexarc top --interval 1 --count 5
    reflexarc --hook-dir /run/reflexarc/hooks top --once --no-probes   # the hooks only, one table

    view = TopView(proc_root="/proc")
    view.update(samples, now)            # (name, labels, value[, ts]) tuples
    print(view.render(now))

Overhead: the light probe tier, one Unix-socket request per training script
per interval, the device-locality reads every 30 s, a ``stat`` per distinct
process in the table, and one print.
"""
from __future__ import annotations

import os
import sys
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from reflexarc.bpf.device_locality import KINDS as DEVICE_KINDS
from reflexarc.bpf.device_locality import LOCALITY, DeviceLocality

from ..signals.catalogue import CATALOGUE
from .shared import CliError, _ask, _load_policies, _selection

TARGET_LABELS = ("job", "rank", "trainer", "pid", "tid", "dev", "flow", "port", "qp", "iface")
PROCESS_LABELS = ("trainer", "pid", "tid")        # labels naming a process: the series goes when it does
GROUP_LABELS = ("job", "trainer", "rank", "pod")  # shown in the group headings, not in the rows
HIDDEN_LABELS = ("node",)                         # the same on every row: in the heading
HOOK_SIGNALS = ("step_time_ms", "dataloader_batch_wait_ms", "step_pre_collective_ms")
RECENT_EVENTS = 5
STALE_AFTER = 30.0
RATE = "/s"
LIVE_FOR_REMOTE = 60.0      # the controller sends series fed within this long                 # a counter shown as its rate: the name ends so
HOOK_TIMEOUT = 1.0


def format_table(samples: list[tuple[str, dict, float]]) -> str:
    """One flat table of samples (target, signal, value, unit), sorted."""
    rows = []
    for name, labels, value in samples:
        target = ",".join(f"{k}={labels[k]}" for k in TARGET_LABELS if k in labels) or "-"
        q = labels.get("quantile")
        sig = f"{name}{{q={q}}}" if q else name
        unit = CATALOGUE[name].unit if name in CATALOGUE else ""
        rows.append((target, sig, f"{value:.6g}", unit))
    rows.sort()
    if not rows:
        return "(no samples yet: no selected task or flow was active)"
    w = [max(len(r[i]) for r in rows + [("target", "signal", "value", "unit")]) for i in range(4)]
    head = f"{'target':{w[0]}}  {'signal':{w[1]}}  {'value':>{w[2]}}  unit"
    return "\n".join([head] + [f"{t:{w[0]}}  {s:{w[1]}}  {v:>{w[2]}}  {u}" for t, s, v, u in rows])


def format_event(event: dict) -> str:
    """One line for a probe event (``ProbeManager.events()``): local time, what
    happened, and its fields."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event.get("time", 0)))
    if event.get("kind") == "cross_numa_migration":
        return (f"{stamp} cross-NUMA migration pid={event['tgid']} tid={event['tid']} ({event['comm']}) "
                f"cpu{event['orig_cpu']}/node{event['orig_node']} -> cpu{event['dest_cpu']}/node{event['dest_node']}")
    fields = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("kind", "time"))
    return f"{stamp} {event.get('kind', 'event')} {fields}"


def _unit(name: str) -> str:
    if name.endswith(RATE):
        base = _unit(name[:-len(RATE)])
        return f"{base}/s" if base else "/s"
    spec = CATALOGUE.get(name)
    return "" if spec is None or spec.unit == "1" else spec.unit


def _number(value: float) -> str:
    return f"{value:.4g}" if abs(value) < 1e6 else f"{value:.3e}"


class Processes:
    """Which pids are still the processes they were, read under ``proc_root``."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.root = proc_root
        self._start: dict[int, int | None] = {}      # pid -> start time when first seen

    def _stat(self, pid: int) -> tuple[str, int] | None:
        try:
            with open(os.path.join(self.root, str(pid), "stat"), "rb") as fh:
                raw = fh.read(4096)
        except OSError:
            return None
        fields = raw.rpartition(b")")[2].split()
        try:
            return fields[0].decode(), int(fields[19])
        except (IndexError, ValueError):
            return None

    def alive(self, pid: int) -> bool:
        """``pid`` runs (not a zombie) and is the process first seen under that pid."""
        st = self._stat(pid)
        if st is None or st[0] in ("Z", "X"):
            self._start.pop(pid, None)
            return False
        first = self._start.setdefault(pid, st[1])
        return first == st[1]

    def comm(self, pid: int) -> str:
        try:
            with open(os.path.join(self.root, str(pid), "comm"), encoding="utf-8", errors="replace") as fh:
                return fh.read(64).strip()
        except OSError:
            return ""

    def forget(self, keep: set[int]) -> None:
        for pid in list(self._start):
            if pid not in keep:
                del self._start[pid]


@dataclass
class Point:
    value: float
    ts: float          # when it was measured (the script's report time, or the collection time)
    seen: float        # when top last received it


@dataclass
class TopView:
    """The latest value of every live series; see the module docstring."""

    proc_root: str = "/proc"
    stale_after: float = STALE_AFTER
    series: dict[tuple, Point] = field(default_factory=dict)   # (name, sorted label items) -> point
    dropped: int = 0                                             # series dropped since the last render

    def __post_init__(self) -> None:
        self.processes = Processes(self.proc_root)

    def update(self, samples, now: float) -> None:
        """Take samples ``(name, labels, value)`` or ``(name, labels, value, ts)``."""
        for sample in samples:
            name, labels, value = sample[0], sample[1], sample[2]
            ts = sample[3] if len(sample) > 3 else now
            key = (name, tuple(sorted((str(k), str(v)) for k, v in labels.items())))
            self.series[key] = Point(float(value), float(ts), now)

    def prune(self, now: float) -> None:
        """Drop the series of processes that exited, and those gone silent."""
        verdict: dict[int, bool] = {}
        for key in list(self.series):
            labels = dict(key[1])
            gone = now - self.series[key].seen > self.stale_after
            for label in PROCESS_LABELS:
                pid = _pid(labels.get(label))
                if pid is not None:
                    if pid not in verdict:
                        verdict[pid] = self.processes.alive(pid)
                    gone = gone or not verdict[pid]
            if gone:
                del self.series[key]
                self.dropped += 1
        self.processes.forget({pid for pid, ok in verdict.items() if ok})

    def groups(self) -> dict[str, dict[str, list[tuple[str, dict, Point]]]]:
        """job -> process heading -> rows (name, labels, point); the node's own series under job ``""``."""
        out: dict[str, dict[str, list]] = {}
        for (name, items), point in self.series.items():
            labels = dict(items)
            job = labels.get("job", "")
            process = labels.get("trainer") or ""
            out.setdefault(job, {}).setdefault(process, []).append((name, labels, point))
        return out

    def render(self, now: float, width: int = 100) -> str:
        trainers = {labels.get("trainer") for (_, items) in self.series for labels in [dict(items)]} - {None}
        head = (f"{time.strftime('%H:%M:%S', time.localtime(now))}  {len(trainers)} training process"
                f"{'' if len(trainers) == 1 else 'es'}, {len(self.series)} series")
        if self.dropped:
            head += f" ({self.dropped} of exited or silent targets dropped)"
            self.dropped = 0
        nodes = sorted({v for (_, items) in self.series for k, v in items if k == "node"})
        if nodes:
            head += f"  node {', '.join(nodes)}"
        lines = [head]
        if not self.series:
            lines.append("(no samples yet: no selected task, flow or training script reported)")
            return "\n".join(lines)
        groups = self.groups()
        for job in sorted(groups, key=lambda j: (j == "", j)):
            processes = groups[job]
            pods = sorted({r[1]["pod"] for rows in processes.values() for r in rows if r[1].get("pod")})
            lines.append(f"job {job}" + (f" (pod {', '.join(pods)})" if pods else "") if job else
                         ("(no job found: a training process whose environment could not be read; --job names it)"
                          if set(processes) - {""} else "node"))
            for process in sorted(processes, key=lambda p: (p == "", _pid(p) or 0, p)):
                rows = processes[process]
                if process:
                    ranks = sorted({r[1]["rank"] for r in rows if "rank" in r[1]})
                    comm = self.processes.comm(_pid(process)) if _pid(process) is not None else ""
                    about = ", ".join(([f"rank {'/'.join(ranks)}"] if ranks else []) + ([comm] if comm else []))
                    lines.append(f"  trainer {process}" + (f" ({about})" if about else ""))
                    locality = [r for r in rows if r[0] == LOCALITY.name]
                    if locality:
                        lines.append(f"    {locality_line(locality)}")
                        rows = [r for r in rows if r[0] != LOCALITY.name]
                elif len(processes) > 1:
                    lines.append("  other targets")
                if rows:
                    lines += _rows(rows, now)
        return "\n".join(lines)


def locality_line(rows: list[tuple[str, dict, Point]]) -> str:
    """A training process's ``device_numa_local_ratio`` rows in one line: each
    device not wholly local (``nvidia1 remote (node 1; CPUs on node 0)``,
    ``eth1 50% local (...)``), or ``all local``; of a device's series (one per
    set of CPU nodes) the newest counts."""
    newest: dict[str, tuple[dict, Point]] = {}
    for _, labels, point in rows:
        dev = labels.get("dev", "")
        if dev not in newest or point.ts > newest[dev][1].ts:
            newest[dev] = (labels, point)
    remote = []
    for dev, (labels, point) in sorted(newest.items(), key=lambda item: (_kind_order(item[1][0]), item[0])):
        if point.value >= 1.0:
            continue
        share = "remote" if point.value <= 0.0 else f"{point.value:.0%} local"
        cpu_nodes = labels.get("cpu_nodes", "?")
        nodes = f"node{'s' if ',' in cpu_nodes else ''} {cpu_nodes}"
        remote.append(f"{dev} {share} (node {labels.get('numa_node', '?')}; CPUs on {nodes})")
    return "locality: " + (", ".join(remote) if remote else "all local")


def _kind_order(labels: dict) -> int:
    kind = labels.get("kind", "")
    return DEVICE_KINDS.index(kind) if kind in DEVICE_KINDS else len(DEVICE_KINDS)


def _pid(value) -> int | None:
    try:
        pid = int(str(value))
    except (TypeError, ValueError):
        return None
    return pid if pid > 0 else None


def _rows(rows: list[tuple[str, dict, Point]], now: float) -> list[str]:
    cells = []
    for name, labels, point in rows:
        extra = {k: v for k, v in labels.items() if k not in GROUP_LABELS and k not in TARGET_LABELS
                 and k not in HIDDEN_LABELS and v != ""}
        signal = name + ("{" + ",".join(f"{k}={v}" for k, v in sorted(extra.items())) + "}" if extra else "")
        target = ",".join(f"{k}={labels[k]}" for k in TARGET_LABELS if k in labels and k not in GROUP_LABELS)
        age = max(0.0, now - point.ts)
        order = HOOK_SIGNALS.index(name) if name in HOOK_SIGNALS else len(HOOK_SIGNALS)
        cells.append((order, signal, target, _number(point.value), _unit(name), f"{age:.1f} s ago"))
    cells.sort()
    w = [0] + [max(len(c[i]) for c in cells) for i in range(1, 6)]
    return [f"    {c[1]:{w[1]}}  {c[2]:{w[2]}}  {c[3]:>{w[3]}}  {c[4]:{w[4]}}  {c[5]}".rstrip() for c in cells]


def read_hooks(hook_dir: str, job: str | None = None, proc_root: str = "/proc",
               timeout: float = HOOK_TIMEOUT) -> list[tuple[str, dict, float, float]]:
    """The step signals of every trusted training script in ``hook_dir``, each
    labelled with its job, rank and pid (``trainer``), with the time it reported
    them. Scripts that do not answer (exited, stopped) are left out."""
    from reflexarc.actuators.base import PermanentActuatorError, TemporaryActuatorError
    from reflexarc.actuators.framework_hook import MAX_SIGNALS_REPLY, HookClient, scan, signals_of
    from reflexarc.core.procfs import ProcFS

    procfs = ProcFS(proc_root)
    endpoints, _ = scan(hook_dir, job or None)
    out = []
    for ep in endpoints:
        try:
            reply = HookClient(ep, procfs, limit=MAX_SIGNALS_REPLY).request("signals", timeout)
            signals = signals_of(reply, ep)
        except (TemporaryActuatorError, PermanentActuatorError):   # HookRejected is one too: untrusted, left out
            continue
        for rec in signals:
            out.append((rec["name"], {**rec["labels"], "trainer": str(ep.pid)}, rec["value"], rec["ts"]))
    return out


def run_top(selection=None, interval: float = 1.0, count: int | None = None, hook_dir: str | None = None,
            job: str = "", sys_root: str = "/sys", proc_root: str = "/proc", probes: bool = True,
            out=None) -> int:
    """Probe signals (with the rank of hooked training processes) and, with a hook
    directory, the step signals training scripts report, every ``interval``
    seconds, ``count`` times (None: until interrupted). Without ``probes`` only the
    hooks are read, and the first table comes at once."""
    out = out or sys.stdout
    manager, sources, down = None, [], []
    if probes:
        from reflexarc.bpf.manager import ProbeManager

        from ..sources.readers import ProbeSource
        manager = ProbeManager(selection, interval=interval, sys_root=sys_root)
        sources.append(ProbeSource(manager, refresh_every=0.0, hook_dir=hook_dir,
                                   locality=DeviceLocality(proc_root=proc_root, sys_root=sys_root)))
        statuses = manager.start()
        down = [f"{n}: {s}" for n, s in statuses.items() if s.state != "ok"]
    view = TopView(proc_root=proc_root, stale_after=max(STALE_AFTER, 10 * interval))
    tty = out.isatty() if hasattr(out, "isatty") else False
    recent: deque[dict] = deque(maxlen=RECENT_EVENTS)
    n = 0
    try:
        while count is None or n < count:
            if probes or n:
                time.sleep(interval)
            now = time.time()
            view.update([sample for src in sources for sample in src.poll(now)], now)
            if hook_dir:
                view.update(read_hooks(hook_dir, job, proc_root), now)
            view.prune(now)
            if manager is not None:
                recent.extend(manager.events())
            if tty:
                out.write("\x1b[H\x1b[2J")
            text = view.render(now)
            if down:
                text += "\nnot ok: " + "; ".join(down)
            if recent:
                text += "\n\nrecent events:\n" + "\n".join(format_event(e) for e in recent)
            out.write(text + "\n")
            out.flush()
            n += 1
    except KeyboardInterrupt:
        pass
    finally:
        if manager is not None:
            manager.stop()
    return 0


def remote_samples(reply: dict) -> list[tuple[str, dict, float, float]]:
    """A controller's ``top`` reply as samples: a counter as its rate (``NAME/s``)."""
    out = []
    for row in reply.get("signals", []):
        if "rate" in row:
            if row["rate"] is not None:
                out.append((row["name"] + RATE, row["labels"], row["rate"], row["ts"]))
        else:
            out.append((row["name"], row["labels"], row["value"], row["ts"]))
    return out


def remote_rules(reply: dict) -> list[str]:
    """The lines below the signals: enforcement, changes held, rules not ok."""
    held = reply["enforcement"]["held"]
    return ([f"enforcement held: {held.replace('_', ' ')}"] if held else []) + changes_and_rules(reply)


def changes_and_rules(reply: dict) -> list[str]:
    """A running controller's changes held and rules not ok, a line each
    (``top`` and ``status``)."""
    lines = [f"change {c['journal_id'] or '-'}: {c['policy']}/{c['rule']} {c['target']} {c['actuator']} "
             f"({c['mode']}): {c['summary']}" for c in reply["changes"]]
    rules = reply["rules"]
    lines.append(f"rules not ok: {len(rules)} of {reply['targets']} targets" if rules
                 else f"rules: all {reply['targets']} targets ok")
    lines += [f"  {r['state']:10s} {r['policy']}/{r['rule']} {r['target']}  {r['for_s']:g} s"
              + (f"  [{r['evidence']}]" if r["evidence"] else "") for r in rules]
    return lines


def run_top_remote(ask, interval: float = 1.0, count: int | None = None, proc_root: str = "/proc",
                   out=None) -> int:
    """The running controller's view, asked with ``ask()`` (its ``top`` reply)
    every ``interval`` seconds, ``count`` times (None: until interrupted)."""
    out = out or sys.stdout
    tty = out.isatty() if hasattr(out, "isatty") else False
    n = 0
    try:
        while count is None or n < count:
            if n:
                time.sleep(interval)
            reply = ask()
            now = time.time()
            view = TopView(proc_root=proc_root, stale_after=LIVE_FOR_REMOTE)
            view.update(remote_samples(reply), now)
            view.prune(now)
            if tty:
                out.write("\x1b[H\x1b[2J")
            out.write(f"the running controller's view (mode {reply['mode']})\n" + view.render(now) + "\n"
                      + "\n".join(remote_rules(reply)) + "\n")
            out.flush()
            n += 1
    except KeyboardInterrupt:
        pass
    return 0


def cmd_top(args) -> int:
    if not args.local and _ask(args, {"verb": "top"}) is not None:    # a controller runs: its view
        return run_top_remote(lambda: _ask(args, {"verb": "top"}) or _gone(args), args.interval,
                              1 if args.once else args.count, proc_root=args.proc_root)
    hook_dir = args.hook_dir if Path(args.hook_dir).is_dir() else None
    if args.no_probes and hook_dir is None:
        raise CliError(f"--no-probes: nothing to show without the hook directory {args.hook_dir}")
    selection = None if args.no_probes else _selection(_load_policies(args.policy), args.job)
    return run_top(selection, args.interval, 1 if args.once else args.count, hook_dir=hook_dir, job=args.job,
                   sys_root=args.sys_root, proc_root=args.proc_root, probes=not args.no_probes)


def _gone(args):
    raise CliError(f"the controller on {args.state_dir} stopped")
