"""What reflexarc's probe tiers cost, measured so that 1 % can be told apart.

Light tier. Four workloads (``cost_workloads.py``), each measured by its own
CPU time per item as well as its throughput:

* the loaded training loader: a 2-worker DataLoader doing pread + decode +
  augment (~0.7 ms of CPU per item), kept running across rounds in its own
  cgroup, CPU per item from the cgroup's ``cpu.stat``;
* two syscall-bound loops: one fio thread doing 4 KiB cached reads as
  ``pread`` syscalls (psync) or as io_uring requests;
* a TCP stream over loopback (fio net, 16 KiB writes), for the TCP hooks.

Rounds are short and interleaved: A (nothing on), B (one observer on), A, B,
... so each B is compared with the A right before and after it, and drift in
the machine's load cancels. An observer is started (compiled, attached) before
its window opens and stopped after it. Each ratio is CPU per item with the
observer on over off; reported is the median of the ratios with a
distribution-free 95 % interval (``ab_stats.py``).

1. Headline, on the loader alone (nothing else runs between its windows):
   the whole light tier, as ``reflexarc run`` starts it (``python -m
   reflexarc.bpf.manager``, selecting ``pt_data_worker`` and ``fio`` by name),
   pairs added until the interval is within +-``--target-pct`` (1 %) or
   ``--max-pairs`` is reached (the result then says the target was not reached).
2. The table, every workload, in one shuffled sequence per repetition: the
   whole tier again, the tier with fio not selected (what a neighbour's syscall loop pays), each light probe alone,
   each attach point the probes use with a no-op program (``noop_attach.py``),
   and what a user would run instead: bcc's tools (``runqlat``, ``tcpretrans``,
   ``syscount -L``; ``biolatency`` needs kprobes, absent here) and bpftrace
   one-liners making the same observations.
3. One more light-tier pass with ``kernel.bpf_stats_enabled`` (restored after):
   BPF events/s and the programs' own in-kernel time per item.

Deep tier (``deep_overhead.py``): the ``rdma_qp`` uprobes on the tests'
stand-in verbs library, A/B interleaved.

Usage (root, from the repository)::

    .venv/bin/python bench/probe_overhead.py                   # ~35 min on 2 cores
    .venv/bin/python bench/probe_overhead.py --only "sched:sched_switch" --reps 8
    .venv/bin/python bench/probe_overhead.py --quick --out /tmp/p.json   # the harness, ~2 min

Writes ``bench/results/probe_overhead.json`` and prints Markdown tables, with
the machine it ran on. The machine should be otherwise idle.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ab_stats import median_ci, paired_ratios
from cost_workloads import LoaderWorkload, SyscallLoop, TcpStream, make_file, training_item_ms, warm
from deep_overhead import markdown_deep, run_deep_rounds, summarise_deep
from observers import Observer, ObserverFailed

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results" / "probe_overhead.json"
FAILED = "failed"                   # a row's key: the configuration could not be measured (why)
STATS_SYSCTL = Path("/proc/sys/kernel/bpf_stats_enabled")
LOADER = LoaderWorkload.name

READ_SYSCALLS = ("read", "pread64", "readv", "preadv", "preadv2", "recvfrom", "recvmsg")
BT_RUNQLAT = ("tracepoint:sched:sched_wakeup,tracepoint:sched:sched_wakeup_new { @q[args->pid] = nsecs; } "
              "tracepoint:sched:sched_switch { if (args->prev_state == 0) { @q[args->prev_pid] = nsecs; } "
              "$t = @q[args->next_pid]; if ($t) { @usecs = hist((nsecs - $t) / 1000); "
              "delete(@q[args->next_pid]); } }")
BT_BIOLAT = ("tracepoint:block:block_rq_issue { @s[args->dev, args->sector] = nsecs; } "
             "tracepoint:block:block_rq_complete /@s[args->dev, args->sector]/ { "
             "@usecs = hist((nsecs - @s[args->dev, args->sector]) / 1000); delete(@s[args->dev, args->sector]); }")
BT_READLAT = ("tracepoint:syscalls:sys_enter_read,tracepoint:syscalls:sys_enter_pread64 "
              '/comm == "pt_data_worker"/ { @s[tid] = nsecs; } '
              "tracepoint:syscalls:sys_exit_read,tracepoint:syscalls:sys_exit_pread64 /@s[tid]/ { "
              "@usecs[pid] = hist((nsecs - @s[tid]) / 1000); delete(@s[tid]); }")
BT_TCPRETRANS = "tracepoint:tcp:tcp_retransmit_skb { @retransmits[args->sport, args->dport] = count(); }"


@dataclass(frozen=True)
class Config:
    group: str          # "reflexarc", "attach point", "bcc tool", "bpftrace"
    name: str
    start: Callable[[], Observer]
    peer_of: str = ""   # the reflexarc probe making the same observation


def light_probes() -> list[str]:
    from reflexarc.bpf import catalog
    return catalog.names(catalog.LIGHT)


def table_configs() -> list[Config]:
    tp = "tracepoint:"
    from reflexarc.core.devices import Devices
    idle = {"link_traffic"}                  # attaches nothing without interfaces selected
    if Devices().missing("gpu"):
        idle.add("gpu_submit")               # attaches nothing without a GPU; its tracepoint is a row below
    if Devices().missing("rdma"):
        idle.add("rdma_counters")            # polls nothing without an RDMA device
    if Devices().missing("pcie_aer"):
        idle.add("pcie_aer")                 # polls nothing without a device reporting AER
    configs = [TIER, UNSELECTED]
    configs += [Config("reflexarc", f"probe {name}", lambda name=name: Observer.light_tier([name]))
                for name in light_probes() if name not in idle]
    points = {
        "syscalls:sys_enter_pread64 + sys_exit_pread64": [tp + "syscalls:sys_enter_pread64",
                                                           tp + "syscalls:sys_exit_pread64"],
        "the 14 read-syscall tracepoints": [f"{tp}syscalls:sys_{side}_{name}" for name in READ_SYSCALLS
                                            for side in ("enter", "exit")],
        "io_uring submit + complete": [tp + "io_uring:io_uring_submit_req", tp + "io_uring:io_uring_complete"],
        "syscalls:sys_enter_ioctl": [tp + "syscalls:sys_enter_ioctl"],
        "sched:sched_switch": [tp + "sched:sched_switch"],
        "sched:sched_wakeup + wakeup_new": [tp + "sched:sched_wakeup", tp + "sched:sched_wakeup_new"],
        "sched:sched_migrate_task": [tp + "sched:sched_migrate_task"],
        "sched_process_exit + task_rename": [tp + "sched:sched_process_exit", tp + "task:task_rename"],
        "block_rq_issue + complete": [tp + "block:block_rq_issue", tp + "block:block_rq_complete"],
        "tcp_retransmit_skb + tcp_probe": [tp + "tcp:tcp_retransmit_skb", tp + "tcp:tcp_probe"],
        "raw_tracepoint:sched_switch": ["raw_tracepoint:sched_switch"],
        "raw_tracepoint:sys_enter + sys_exit": ["raw_tracepoint:sys_enter", "raw_tracepoint:sys_exit"],
    }
    configs += [Config("attach point", name, lambda specs=specs: Observer.noop(*specs))
                for name, specs in points.items()]
    configs += [
        Config("bcc tool", "runqlat", lambda: Observer.bcc("runqlat", "1"), "sched_numa"),
        Config("bcc tool", "tcpretrans", lambda: Observer.bcc("tcpretrans"), "net_tcp"),
        Config("bcc tool", "syscount -L", lambda: Observer.bcc("syscount", "-L", "-i", "1"), "dataloader_io"),
        Config("bpftrace", "run-queue latency", lambda: Observer.bpftrace(BT_RUNQLAT), "sched_numa"),
        Config("bpftrace", "block I/O latency", lambda: Observer.bpftrace(BT_BIOLAT), "block_io"),
        Config("bpftrace", "read latency of pt_data_worker", lambda: Observer.bpftrace(BT_READLAT),
               "dataloader_io"),
        Config("bpftrace", "tcp retransmits", lambda: Observer.bpftrace(BT_TCPRETRANS), "net_tcp"),
    ]
    return configs


TIER = Config("reflexarc", "light tier (every probe)", Observer.light_tier)
CONTROL = Config("control", "control: a process attaching nothing", Observer.control)
# the tier selecting only the loader's workers: what a neighbour's syscall loop pays
UNSELECTED = Config("reflexarc", "light tier, fio not selected",
                    lambda: Observer.light_tier(comms=["pt_data_worker"]))


SETTLE_S = 0.3     # idle before each window: what the window before left running (sockets closing,
                   # writeback, the observer's compile) drains, alike for A and B


class Rounds:
    """Interleaved measurements of the workloads: ``baseline()`` (A) and
    ``observed(config)`` (B), each workload measured in turn, recorded in order.
    The loader, the one whose figure is the target, is measured last."""

    def __init__(self, workloads: dict, seconds: dict[str, float]) -> None:
        self.workloads = dict(sorted(workloads.items(), key=lambda kv: kv[0] == LOADER))
        self.seconds = seconds
        self.sequence: dict[str, list[tuple[str, str, dict]]] = {name: [] for name in workloads}
        self.failures: dict[str, str] = {}
        self.start_s: dict[str, list[float]] = {}

    def _measure(self, side: str, label: str) -> None:
        for name, workload in self.workloads.items():
            time.sleep(SETTLE_S)
            self.sequence[name].append((side, label, workload.measure(self.seconds[name])))

    def baseline(self) -> None:
        self._measure("A", "")

    def observed(self, config: Config) -> bool:
        try:
            with config.start() as observer:
                self.start_s.setdefault(config.name, []).append(observer.start_s)
                self._measure("B", config.name)
            return True
        except ObserverFailed as exc:
            self.failures[config.name] = str(exc)
            return False

    def ratios(self, workload: str, label: str, key: str = "cpu_us_per_op") -> list[float]:
        """B/A of ``key`` for the B windows of ``label``, each against the A windows
        right before and after it (dropping other labels' Bs keeps those adjacent)."""
        return paired_ratios([(side, m[key]) for side, lab, m in self.sequence[workload]
                              if side == "A" or lab == label])

    def values(self, workload: str, side: str, label: str, key: str) -> list[float]:
        return [m[key] for s, lab, m in self.sequence[workload] if s == side and (side == "A" or lab == label)]


def summary_of(rounds: Rounds, workload: str, label: str) -> dict:
    cpu, thr = rounds.ratios(workload, label), rounds.ratios(workload, label, "throughput")
    ci = median_ci(cpu)
    return {"cpu_ratio": ci.as_dict(), "cpu_ratios": [round(r, 4) for r in cpu],
            "throughput_ratio": median_ci(thr).as_dict(),
            "cpu_us_per_op_on": median_ci(rounds.values(workload, "B", label, "cpu_us_per_op")).median}


def run_headline(workloads: dict, seconds: dict, target_pct: float, min_pairs: int, max_pairs: int) -> dict:
    """The whole light tier against nothing, and the control (a process that
    attaches nothing) the same way, alternating; pairs added until the tier's
    interval on the loader is within +-target_pct or max_pairs is reached."""
    rounds = Rounds(workloads, seconds)
    rounds.baseline()
    pairs = 0
    while pairs < max_pairs:
        for config in (CONTROL, TIER):
            if not rounds.observed(config):
                raise SystemExit(f"error: {config.name} did not start:\n{rounds.failures[config.name]}")
            rounds.baseline()
        pairs += 1
        ci = median_ci(rounds.ratios(LOADER, TIER.name))
        print(f"headline pair {pairs}: loader CPU ratio {ci.median:.4f} +-{ci.half_width_pct:.2f} %",
              file=sys.stderr, flush=True)
        if pairs >= min_pairs and ci.half_width_pct <= target_pct:
            break
    out = {name: summary_of(rounds, name, TIER.name) for name in workloads}
    loader = out[LOADER]["cpu_ratio"]
    out["control"] = {name: summary_of(rounds, name, CONTROL.name) for name in workloads}
    out["pairs"] = pairs
    out["target_pct"] = target_pct
    out["target_reached"] = loader["half_width_pct"] <= target_pct
    out["tier_start_s"] = rounds.start_s.get(TIER.name, [])
    out["a_cpu_us_per_op"] = {name: median_ci(rounds.values(name, "A", "", "cpu_us_per_op")).median
                              for name in workloads}
    return out


def run_table(workloads: dict, seconds: dict, configs: list[Config], reps: int, seed: int) -> dict:
    rounds = Rounds(workloads, seconds)
    rng = random.Random(seed)
    rounds.baseline()
    for rep in range(reps):
        order = configs[:]
        rng.shuffle(order)
        for config in order:
            if config.name in rounds.failures:
                continue
            if rounds.observed(config):
                rounds.baseline()
            print(f"table rep {rep + 1}/{reps}: {config.group} {config.name}", file=sys.stderr, flush=True)
    rows = []
    for config in configs:
        row = {"group": config.group, "name": config.name, "peer_of": config.peer_of}
        if config.name in rounds.failures:
            row[FAILED] = rounds.failures[config.name].splitlines()[0][:300]
        else:
            row.update({name: summary_of(rounds, name, config.name) for name in workloads})
            row["start_s"] = median_ci(rounds.start_s.get(config.name, [])).median
        rows.append(row)
    return {"reps": reps, "rows": rows}


# --- the in-kernel cost of the programs ----------------------------------------
def bpf_run_stats(pid: int) -> tuple[int, int]:
    """(run_cnt, run_time_ns) summed over the BPF programs the process holds."""
    seen, count, ns = set(), 0, 0
    for fd in os.listdir(f"/proc/{pid}/fdinfo"):
        try:
            text = Path(f"/proc/{pid}/fdinfo/{fd}").read_text()
        except OSError:
            continue
        info = dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)
        if "prog_id" in info and "run_cnt" in info and info["prog_id"] not in seen:
            seen.add(info["prog_id"])
            count += int(info["run_cnt"])
            ns += int(info["run_time_ns"])
    return count, ns


def process_figures(pid: int) -> dict:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    out = {"cpu_s": (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0])
    return out


def run_event_pass(workloads: dict, seconds: dict) -> dict:
    """The light tier on with ``kernel.bpf_stats_enabled``: BPF program runs per
    second and their in-kernel time (the statistics' own clock reads are
    included: an upper bound) per item of each workload; and the tier's own
    process: CPU while the workloads ran, RSS."""
    before_sysctl = STATS_SYSCTL.read_text().strip()
    STATS_SYSCTL.write_text("1")
    out = {}
    try:
        with TIER.start() as tier:
            for name, workload in workloads.items():
                runs0, ns0 = bpf_run_stats(tier.proc.pid)
                proc0, t0 = process_figures(tier.proc.pid), time.monotonic()
                measured = workload.measure(seconds[name])
                runs1, ns1 = bpf_run_stats(tier.proc.pid)
                proc1, dt = process_figures(tier.proc.pid), time.monotonic() - t0
                per_op = (ns1 - ns0) / 1e3 / max(measured["items"], 1)
                out[name] = {"events_per_s": (runs1 - runs0) / dt,
                             "kernel_ns_per_event": (ns1 - ns0) / max(runs1 - runs0, 1),
                             "kernel_us_per_op": per_op,
                             "kernel_share_of_op_cpu_pct": 100 * per_op / measured["cpu_us_per_op"],
                             "tier_cpu_pct": 100 * (proc1["cpu_s"] - proc0["cpu_s"]) / dt,
                             "tier_rss_mib": proc1["VmRSS"] / 1024, "tier_peak_rss_mib": proc1["VmHWM"] / 1024}
    finally:
        STATS_SYSCTL.write_text(before_sysctl)
    return out


# --- output --------------------------------------------------------------------
def ratio_cell(summary: dict) -> str:
    ci = summary["cpu_ratio"]
    if ci["n"] == 0:
        return "–"
    if ci["low"] == float("-inf"):
        return f"{ci['median']:.3f} (n={ci['n']})"
    return f"{ci['median']:.3f} [{ci['low']:.3f}, {ci['high']:.3f}]"


def markdown(result: dict) -> str:
    m, h, c = result["machine"], result["headline"], result["config"]
    lines = [f"Machine: {m['cpus']} CPUs, kernel {m['kernel']}, {m['virtualization']}, load at start "
             f"{m['loadavg_at_start'][0]:.2f}. Windows: headline {c['headline_seconds']}, table "
             f"{c['table_seconds']} (s per workload).", "",
             "Light tier, CPU per item on / off (median of interleaved pairs, 95 % interval):", "",
             "| workload | CPU per item, off | CPU ratio on/off | throughput ratio on/off | pairs |",
             "|---|---|---|---|---|"]
    for name in h["a_cpu_us_per_op"]:
        lines.append(f"| {name}, light tier | {h['a_cpu_us_per_op'][name]:.1f} µs | {ratio_cell(h[name])} | "
                     f"{h[name]['throughput_ratio']['median']:.3f} | {h['pairs']} |")
        lines.append(f"| {name}, control (attaches nothing) | | {ratio_cell(h['control'][name])} | "
                     f"{h['control'][name]['throughput_ratio']['median']:.3f} | {h['pairs']} |")
    names = sorted(result["events"], key=lambda n: n != LOADER)
    reached = "reached" if h["target_reached"] else "NOT reached"
    lines += ["", f"Target interval +-{h['target_pct']} % on the loader: {reached} "
                  f"(+-{h[LOADER]['cpu_ratio']['half_width_pct']:.2f} %).", "",
              "Each switched on alone (CPU per item on / off):", "",
              "| what | kind | " + " | ".join(names) + " | start (s) |", "|---|---|" + "---|" * len(names) + "---|"]
    for row in result["table"]["rows"]:
        name = row["name"] + (f" (cf. {row['peer_of']})" if row.get("peer_of") else "")
        if FAILED in row:
            lines.append(f"| {name} | {row['group']} | failed: {row[FAILED][:80]} |" + " |" * len(names))
            continue
        lines.append(f"| {name} | {row['group']} | " + " | ".join(ratio_cell(row[n]) for n in names)
                     + f" | {row['start_s']:.1f} |")
    ev = result["events"]
    lines += ["", "| light tier, BPF statistics on | " + " | ".join(ev) + " |", "|---|" + "---|" * len(ev)]
    for label, key, fmt in (("BPF events/s", "events_per_s", "{:,.0f}"),
                            ("in-kernel ns per event (upper bound)", "kernel_ns_per_event", "{:.0f}"),
                            ("in-kernel µs per item", "kernel_us_per_op", "{:.2f}"),
                            ("in-kernel share of an item's CPU (%)", "kernel_share_of_op_cpu_pct", "{:.2f}"),
                            ("tier process CPU (% of a core)", "tier_cpu_pct", "{:.2f}"),
                            ("tier process RSS (MiB)", "tier_rss_mib", "{:.0f}")):
        lines.append(f"| {label} | " + " | ".join(fmt.format(ev[n][key]) for n in ev) + " |")
    return "\n".join(lines)


def virtualization() -> str:
    try:
        import subprocess
        return subprocess.run(["systemd-detect-virt"], capture_output=True, text=True).stdout.strip() or "none"
    except OSError:
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=5.0, help="the loader's window in the headline")
    ap.add_argument("--table-seconds", type=float, default=1.5, help="the loader's window in the table")
    ap.add_argument("--loop-seconds", type=float, default=0.7, help="a syscall loop's window")
    ap.add_argument("--target-pct", type=float, default=1.0, help="headline interval wanted, +- %% of the median")
    ap.add_argument("--min-pairs", type=int, default=12)
    ap.add_argument("--max-pairs", type=int, default=36)
    ap.add_argument("--reps", type=int, default=6, help="repetitions of the table's sequence (>= 6 for a 95 %% interval)")
    ap.add_argument("--deep-rounds", type=int, default=4)
    ap.add_argument("--deep-seconds", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--only", action="append", default=[], metavar="NAME",
                    help="only this table row (repeatable; its name as printed, e.g. 'sched:sched_switch')")
    ap.add_argument("--quick", action="store_true", help="prove the harness: tiny counts, a few table rows")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("error: needs root (BPF, cgroups)", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))     # unwinds: workloads and observers stop
    configs = table_configs()
    unknown = set(args.only) - {c.name for c in configs}
    if unknown:
        print(f"error: no table row named {', '.join(sorted(unknown))} (known: {', '.join(c.name for c in configs)})",
              file=sys.stderr)
        return 2
    if args.only:
        configs = [c for c in configs if c.name in args.only]
    if args.quick:
        args.seconds = args.table_seconds = 1.0
        args.loop_seconds, args.min_pairs, args.max_pairs, args.reps = 0.5, 1, 1, 1
        args.deep_rounds, args.deep_seconds = 2, 0.5
        keep = {"probe sched_numa", "sched:sched_switch", "runqlat", "run-queue latency"}
        configs = [c for c in configs if c.name in keep]

    load_at_start = os.getloadavg()
    began = time.time()
    with tempfile.TemporaryDirectory(prefix="rx-overhead-") as tmp:
        path = os.path.join(tmp, "data")
        make_file(path)
        warm(path)
        item_ms = training_item_ms(path)
        loops = [SyscallLoop(path, "psync"), SyscallLoop(path, "io_uring"), TcpStream()]
        headline_s = {LOADER: args.seconds, **{loop.name: args.loop_seconds for loop in loops}}
        table_s = {**headline_s, LOADER: args.table_seconds}
        with LoaderWorkload(path) as loader:
            workloads = {LOADER: loader, **{loop.name: loop for loop in loops}}
            # the headline is the loader's alone: nothing else runs between its windows
            headline = run_headline({LOADER: loader}, headline_s, args.target_pct, args.min_pairs, args.max_pairs)
            table = run_table(workloads, table_s, configs, args.reps, args.seed)
            events = run_event_pass(workloads, table_s)
        deep_runs = run_deep_rounds(args.deep_rounds, args.deep_seconds, tmp)
    result = {
        "method": "CPU time per item of the workload (loader: its cgroup's cpu.stat; loop: fio's own), "
                  "B (observer on) over the mean of the A (nothing on) windows right before and after; "
                  "median of the ratios with a distribution-free 95 % interval (order statistics)",
        "machine": {"kernel": platform.release(), "cpus": os.cpu_count(), "virtualization": virtualization(),
                    "loadavg_at_start": load_at_start, "python": platform.python_version()},
        "config": {"headline_seconds": headline_s, "table_seconds": table_s, "target_pct": args.target_pct, "min_pairs": args.min_pairs,
                   "max_pairs": args.max_pairs, "reps": args.reps, "quick": args.quick, "started": began},
        "training_item_cpu_ms": item_ms,
        "headline": headline, "table": table, "events": events,
        "deep_tier": {"summary": summarise_deep(deep_runs), "runs": deep_runs},
    }
    result["config"]["wall_s"] = time.time() - began
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    print()
    print(markdown_deep(result["deep_tier"]["summary"]))
    print(f"\n(wrote {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
