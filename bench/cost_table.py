"""The whole cost table: what reflexarc costs and how fast it reacts on this
machine, gathered from the benchmarks' results, beside the figures peer
systems publish (``peers.py``), each with its source.

Rows, each of ours as "median (min-max, n=runs)" where the file holds several
runs, with the file and key it comes from:

- reaction: fault onset to action applied on the testbed's fault a, from
  ``reaction.json`` (``bench/reaction.py``, with the Prometheus + Alertmanager
  pipelines measured on the same fault); beside it every peer's interval or
  reaction time;
- rule engine: milliseconds per tick and evaluations per second
  (``engine.json``);
- probe overhead: CPU per item of the training loader and per operation of
  the syscall and TCP loops with the light tier on over off, the in-kernel time
  per event, and the deep tier's added time per verbs post and poll
  (``probe_overhead.json``);
- footprint: start to armed, RSS, CPU on the testbed and under DataLoader
  churn, and the churn job's throughput with the controller over without
  (``closed_loop.json``, ``churn.json``).

Usage (from the repository)::

    .venv/bin/python bench/cost_table.py                      # Markdown on stdout
    .venv/bin/python bench/cost_table.py --out out/cost_table.md
    .venv/bin/python bench/cost_table.py --json               # the rows as JSON
    .venv/bin/python bench/cost_table.py --results /tmp/results

A missing or unreadable results file, or one without a figure the table
needs, is one ``error:`` line on stderr naming the file and the ``make bench``
step that writes it (exit 1).

Overhead: reading four or five JSON files (~150 kB); nothing is measured.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from peers import PEERS, Peer

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
ENGINE, PROBE, CLOSED, CHURN = "engine.json", "probe_overhead.json", "closed_loop.json", "churn.json"
REACTION = "reaction.json"
WRITERS = {   # the `make bench` step that writes each file
    ENGINE: ".venv/bin/python bench/engine.py",
    CHURN: ".venv/bin/python bench/churn.py",
    PROBE: ".venv/bin/python bench/probe_overhead.py",
    CLOSED: ".venv/bin/python -m reflexarc.simulations.testbed loop --also-unmodified --two-jobs "
            "--out out/closed-loop --results bench/results/closed_loop.json",
    REACTION: ".venv/bin/python bench/reaction.py",
}
PIPELINES = ("tightest", "production", "defaults")   # reaction.json's Prometheus + Alertmanager settings
MODES = ("idle", "busy")
LOADER = "training loader"
LIGHT_TIER = "light tier (every probe)"
NONE_PUBLISHED = "none published"
HEADER = ("measure", "reflexarc (this machine)", "peers' published figure", "source")


class ResultsError(Exception):
    """A results file missing, unreadable, or without a figure the table needs."""


@dataclass(frozen=True)
class Row:
    measure: str
    ours: str
    peers: str
    source: str


@dataclass(frozen=True)
class Table:
    machine: str
    rows: list[Row]


# --- reading the results ---------------------------------------------------

def shown(path: Path) -> str:
    """``path`` relative to the repository when it is inside it."""
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def read(results: Path, name: str) -> dict:
    """The JSON object in ``results/name``."""
    path = results / name
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{shown(path)} is missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(f"{shown(path)} is not readable JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{shown(path)} is not a JSON object")
    return data


def required(results: Path, name: str) -> dict:
    try:
        return read(results, name)
    except ResultsError as exc:
        raise ResultsError(f"{exc}; `make bench` writes it (step: {WRITERS[name]})") from None


def get(data: object, *keys: str | int) -> object:
    """``data[k1][k2]...``, or None where a key is missing."""
    for key in keys:
        if isinstance(data, dict):
            data = data.get(key)
        elif isinstance(data, list) and isinstance(key, int) and -len(data) <= key < len(data):
            data = data[key]
        else:
            return None
    return data


def key_path(keys: tuple[str | int, ...]) -> str:
    """``keys`` as a path: headline['training loader'].cpu_ratio."""
    text = ""
    for key in keys:
        text += f".{key}" if isinstance(key, str) and key.isidentifier() else f"[{key!r}]"
    return text.lstrip(".")


def missing(name: str, where: str) -> ResultsError:
    return ResultsError(f"{name} has no {where}; rerun: {WRITERS[name]}")


def is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def number(data: object, name: str, *keys: str | int) -> float:
    value = get(data, *keys)
    if not is_number(value):
        raise missing(name, "number at " + key_path(keys))
    return float(value)


def items(data: object, name: str, *keys: str | int) -> list:
    value = get(data, *keys)
    if not isinstance(value, list) or not value:
        raise missing(name, "list at " + key_path(keys))
    return value


def numbers(rows: list, name: str, where: str, *keys: str | int) -> list[float]:
    """The numbers at ``keys`` in each of ``rows`` (rows without one are left out)."""
    values = [float(v) for v in (get(row, *keys) for row in rows) if is_number(v)]
    if not values:
        raise missing(name, where)
    return values


def fault(closed: dict, key: str) -> dict:
    """The closed loop's result for fault ``key``."""
    for result in items(closed, CLOSED, "faults"):
        if isinstance(result, dict) and result.get("fault") == key:
            return result
    raise missing(CLOSED, f"fault {key!r} in faults")


def fault_number(closed: dict, key: str, *keys: str) -> float:
    """A number in the closed loop's result for fault ``key``."""
    value = get(fault(closed, key), *keys)
    if not is_number(value):
        raise missing(CLOSED, f"number at faults[fault={key}]." + key_path(keys))
    return float(value)


# --- formatting --------------------------------------------------------------

def decimals(value: float) -> int:
    """Decimals for three significant figures (none from 100 up)."""
    return 0 if value == 0 or abs(value) >= 100 else 2 - math.floor(math.log10(abs(value)))


def fmt(value: float, places: int) -> str:
    return f"{value:,.{places}f}"


def span(median: float, low: float, high: float, n: int | None, unit: str) -> str:
    """'median unit (low-high, n=N)'; ``unit`` carries its own leading space."""
    places = decimals(median)
    count = f", n={n}" if n is not None else ""
    return f"{fmt(median, places)}{unit} ({fmt(low, places)}-{fmt(high, places)}{count})"


def spread(values: list[float], unit: str, runs: str = "run") -> str:
    """The median and range of several runs, or the one value."""
    if len(values) == 1:
        return f"{fmt(values[0], decimals(values[0]))}{unit} (one {runs})"
    return span(statistics.median(values), min(values), max(values), len(values), unit)


def interval(ci: object, name: str, *keys: str | int) -> str:
    """A ratio with its 95 % interval from an ``ab_stats`` dict (median, low, high, n)."""
    median, low, high = (number(ci, name, *keys, k) for k in ("median", "low", "high"))
    n = get(ci, *keys, "n")
    return span(median, low, high, n if isinstance(n, int) else None, "x")


def peer_cell(peers: tuple[Peer, ...]) -> str:
    """Every peer's figure and what it measures, with its note number."""
    return "; ".join(f"{p.name} {p.what}: {p.figure}{'' if p.verified else ' (unverified)'} [{i}]"
                     for i, p in enumerate(peers, 1))


# --- the rows ----------------------------------------------------------------

def reaction_measured(data: dict) -> str:
    """reflexarc's onset -> applied from reaction.json."""
    ours = get(data, "summary", "reflexarc", "applied_s")
    if not is_number(get(ours, "median")):
        raise missing(REACTION, "summary.reflexarc.applied_s.median")
    return stat_text(ours, " s")


def reaction_beside(data: dict) -> str:
    """The conventional pipelines measured on the same fault, then the peers' figures."""
    parts = [part for part in (pipeline(data, name) for name in PIPELINES) if part]
    measured = f"measured here on the same fault, Prometheus + Alertmanager + script: {'; '.join(parts)}. " \
        if parts else ""
    return measured + "Published: " + peer_cell(PEERS)


def stat_text(stat: object, unit: str) -> str:
    """A reaction.json summary dict (median, min, max, n) as text; min, max and n may be missing."""
    median, low, high, n = (get(stat, k) for k in ("median", "min", "max", "n"))
    if is_number(low) and is_number(high):
        return span(median, low, high, n if isinstance(n, int) else None, unit)
    return f"{fmt(median, decimals(median))}{unit}"


def pipeline(data: dict, name: str) -> str | None:
    """One pipeline's onset -> applied and its ratio to reflexarc's, or None when it was not measured."""
    stat = get(data, "summary", name, "applied_s")
    if not is_number(get(stat, "median")):
        return None
    knobs = [get(data, "settings", name, k) for k in ("scrape_s", "eval_s", "group_wait_s")]
    label = f"{name} ({'/'.join(f'{k:g}' for k in knobs)} s)" if all(map(is_number, knobs)) else name
    ratio = get(data, "ratios", name, "applied")
    return f"{label} {stat_text(stat, ' s')}" + (f", {ratio:g}x reflexarc's" if is_number(ratio) else "")


def reaction_row(reaction: dict) -> Row:
    return Row("reaction: fault onset -> action applied (testbed fault a)", reaction_measured(reaction),
               reaction_beside(reaction), "reaction.json summary.reflexarc.applied_s, summary[*].applied_s, "
                                          f"ratios[*].applied; peers: notes 1-{len(PEERS)}")


def engine_rows(engine: dict) -> list[Row]:
    throughput = items(engine, ENGINE, "throughput")
    sizes = dict.fromkeys((get(row, "rules"), get(row, "targets")) for row in throughput)
    rows = []
    for rules, targets in sizes:
        cells = []
        for mode in MODES:
            where = f"raw['{rules}:{mode}'][*].ms_per_tick"
            runs = items(engine, ENGINE, "raw", f"{rules}:{mode}")
            cells.append(f"{mode} {spread(numbers(runs, ENGINE, where, 'ms_per_tick'), ' ms')}")
        rows.append(Row(f"rule engine: one tick, {rules} rules x {targets} targets", "; ".join(cells),
                        NONE_PUBLISHED, f"engine.json raw['{rules}:idle'], raw['{rules}:busy'] [*].ms_per_tick"))
    rows.append(evaluations_row(engine, throughput))
    return rows


def evaluations_row(engine: dict, throughput: list) -> Row:
    """Evaluations per second at 100 rules x 10 targets, the size the product's target is set at."""
    cells = []
    for mode in MODES:
        row = next((r for r in throughput if get(r, "rules") == 100 and get(r, "targets") == 10
                    and get(r, "mode") == mode), None)
        if row is None:
            raise missing(ENGINE, f"throughput row for 100 rules x 10 targets, {mode}")
        median, low, high = (number(row, ENGINE, key) for key in
                             ("evaluations_per_s", "evaluations_per_s_min", "evaluations_per_s_max"))
        rounds = get(engine, "rounds")
        cells.append(f"{mode} {span(median, low, high, rounds if isinstance(rounds, int) else None, '/s')}")
    target = get(engine, "targets", "evaluations_per_s_at_100x10")
    goal = f" (target >= {fmt(target, 0)}/s)" if is_number(target) else ""
    return Row("rule engine: evaluations per second, 100 rules x 10 targets", "; ".join(cells) + goal,
               NONE_PUBLISHED, "engine.json throughput[rules=100].evaluations_per_s, _min, _max")


def probe_rows(probe: dict) -> list[Row]:
    return [headline_row(probe), light_tier_row(probe), events_row(probe), deep_tier_row(probe)]


def headline_row(probe: dict) -> Row:
    ours = interval(probe, PROBE, "headline", LOADER, "cpu_ratio")
    control = interval(probe, PROBE, "headline", "control", LOADER, "cpu_ratio")
    return Row("probe overhead: training loader CPU per item, light tier on / off (95 % interval)",
               f"{ours}; A/A control {control}", NONE_PUBLISHED,
               f"probe_overhead.json headline['{LOADER}'].cpu_ratio, headline.control['{LOADER}'].cpu_ratio")


def light_tier_row(probe: dict) -> Row:
    row = next((r for r in items(probe, PROBE, "table", "rows") if get(r, "name") == LIGHT_TIER), None)
    if row is None:
        raise missing(PROBE, f"table row {LIGHT_TIER!r}")
    workloads = [key for key, value in row.items() if isinstance(value, dict) and "cpu_ratio" in value]
    if not workloads:
        raise missing(PROBE, f"cpu_ratio in table row {LIGHT_TIER!r}")
    cells = [f"{workload} {interval(row, PROBE, workload, 'cpu_ratio')}" for workload in workloads]
    return Row("probe overhead: CPU per item or operation, light tier on / off, per workload (95 % interval)",
               "; ".join(cells), NONE_PUBLISHED, f"probe_overhead.json table.rows[name={LIGHT_TIER!r}][*].cpu_ratio")


def events_row(probe: dict) -> Row:
    ns, rate, share = (number(probe, PROBE, "events", LOADER, key) for key in
                       ("kernel_ns_per_event", "events_per_s", "kernel_share_of_op_cpu_pct"))
    return Row("probe cost per event in the kernel, training loader (bpf_stats)",
               f"{fmt(ns, 0)} ns per event at {fmt(rate, 0)} events/s: {fmt(share, decimals(share))} % "
               "of the loader's CPU per item (one pass)", NONE_PUBLISHED,
               f"probe_overhead.json events['{LOADER}'].kernel_ns_per_event, events_per_s, "
               "kernel_share_of_op_cpu_pct")


def deep_tier_row(probe: dict) -> Row:
    """Microseconds the deep tier's uprobes add per verbs post + poll, per round (B against the A of its round)."""
    rounds: dict[object, dict[object, float]] = {}
    for run in items(probe, PROBE, "deep_tier", "runs"):
        if is_number(get(run, "pairs_per_s")) and get(run, "pairs_per_s") > 0:
            rounds.setdefault(get(run, "round"), {})[get(run, "mode")] = float(run["pairs_per_s"])
    added = [1e6 / r["B"] - 1e6 / r["A"] for r in rounds.values() if "A" in r and "B" in r]
    if not added:
        raise missing(PROBE, "deep_tier.runs with an A and a B round")
    return Row("deep tier: time added per verbs post + poll (uprobes, worst case: no work between them)",
               f"{spread(added, ' µs', 'round')} per pair", NONE_PUBLISHED,
               "probe_overhead.json deep_tier.runs[*].pairs_per_s (B against A, per round)")


def footprint_rows(closed: dict, churn: dict) -> list[Row]:
    return [armed_row(closed, churn), rss_row(closed, churn), testbed_cpu_row(closed), churn_cpu_row(churn),
            churn_throughput_row(churn)]


def on_windows(churn: dict) -> list:
    return [w for w in items(churn, CHURN, "ab_windows") if get(w, "mode") == "on"]


def armed_row(closed: dict, churn: dict) -> Row:
    testbed = numbers(items(closed, CLOSED, "faults"), CLOSED, "faults[*].armed_s", "armed_s")
    launches = [*on_windows(churn), get(churn, "long_run")]
    ready = numbers(launches, CHURN, "launch_to_ready_s in ab_windows or long_run", "launch_to_ready_s")
    return Row("footprint: start -> probes armed", f"testbed {spread(testbed, ' s')}; churn job {spread(ready, ' s')}",
               NONE_PUBLISHED, "closed_loop.json faults[*].armed_s; churn.json ab_windows[mode=on].launch_to_ready_s, "
               "long_run.launch_to_ready_s")


def rss_row(closed: dict, churn: dict) -> Row:
    faults = items(closed, CLOSED, "faults")
    rss = numbers(faults, CLOSED, "faults[*].controller.rss_mb", "controller", "rss_mb")
    peak = numbers(faults, CLOSED, "faults[*].controller.peak_rss_mb", "controller", "peak_rss_mb")
    samples = items(churn, CHURN, "long_run", "samples")
    long_run = numbers(samples, CHURN, "long_run.samples[*].controller_rss_mib", "controller_rss_mib")
    growth = get(churn, "summary", "rss_last_over_second")
    grew = f", last third / second third {fmt(growth, 3)}x" if is_number(growth) else ""
    return Row("footprint: RSS",
               f"testbed {spread(rss, ' MB')}, peak {spread(peak, ' MB')}; churn long run "
               f"{spread(long_run, ' MiB', 'sample')}{grew}", NONE_PUBLISHED,
               "closed_loop.json faults[*].controller.rss_mb, peak_rss_mb; churn.json "
               "long_run.samples[*].controller_rss_mib, summary.rss_last_over_second")


def testbed_cpu_row(closed: dict) -> Row:
    idle_pct = fault_number(closed, "e", "controller", "cpu_pct")
    wall = get(fault(closed, "e"), "controller", "wall_s")
    seconds = f", {fmt(wall, 0)} s" if is_number(wall) else ""
    faulted = [f for f in items(closed, CLOSED, "faults") if get(f, "fault") != "e"]
    during = numbers(faulted, CLOSED, "faults[fault!=e].controller.cpu_pct", "controller", "cpu_pct")
    return Row("footprint: controller CPU on the testbed (% of a core)",
               f"no fault (fault e{seconds}) {fmt(idle_pct, decimals(idle_pct))} %; "
               f"during faults {spread(during, ' %')}", NONE_PUBLISHED,
               "closed_loop.json faults[fault=e].controller.cpu_pct; faults[fault!=e].controller.cpu_pct")


def churn_cpu_row(churn: dict) -> Row:
    windows = numbers(on_windows(churn), CHURN, "ab_windows[mode=on].controller_cpu_pct", "controller_cpu_pct")
    samples = items(churn, CHURN, "long_run", "samples")
    long_run = numbers(samples, CHURN, "long_run.samples[*].controller_cpu_pct", "controller_cpu_pct")
    return Row("footprint: controller CPU under DataLoader churn, default DataLoader (% of a core)",
               f"A/B windows {spread(windows, ' %', 'window')}; long run {spread(long_run, ' %', 'sample')}",
               NONE_PUBLISHED, "churn.json ab_windows[mode=on].controller_cpu_pct; "
               "long_run.samples[*].controller_cpu_pct")


def churn_throughput_row(churn: dict) -> Row:
    ratios = [float(r) for r in items(churn, CHURN, "summary", "ab_pair_ratios") if is_number(r)]
    if not ratios:
        raise missing(CHURN, "numbers in summary.ab_pair_ratios")
    return Row("footprint: churn job's steps/s with the controller over without", spread(ratios, "x", "pair"),
               NONE_PUBLISHED, "churn.json summary.ab_pair_ratios")


def machine(docs: list[dict]) -> str:
    """The machines the results were measured on."""
    seen = dict.fromkeys(f"kernel {get(d, 'machine', 'kernel')}, {get(d, 'machine', 'cpus')} CPUs"
                         for d in docs if isinstance(get(d, "machine"), dict))
    return "; ".join(seen) or "not recorded"


def build(results: Path) -> Table:
    """The table from the results in ``results``; ResultsError names what is missing."""
    engine, probe, closed, churn, reaction = (required(results, name)
                                              for name in (ENGINE, PROBE, CLOSED, CHURN, REACTION))
    rows = [reaction_row(reaction), *engine_rows(engine), *probe_rows(probe), *footprint_rows(closed, churn)]
    return Table(machine([engine, probe, closed, churn, reaction]), rows)


# --- output ------------------------------------------------------------------

def cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown(table: Table, peers: tuple[Peer, ...] = PEERS) -> str:
    lines = [f"Measured on: {table.machine}.", "",
             "| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(cell(c) for c in (r.measure, r.ours, r.peers, r.source)) + " |" for r in table.rows]
    lines += ["", "Peers' sources:", ""]
    for i, p in enumerate(peers, 1):
        note = f" Note: {p.note}." if p.note else ""
        checked = "" if p.verified else " Not verified in this source."
        stop = "" if p.source.endswith((".", ".\"")) else "."
        lines.append(f"{i}. {p.name}, {p.what}: {p.figure}. Source: {p.source}{stop}{note}{checked}")
    return "\n".join(lines)


def as_json(table: Table, peers: tuple[Peer, ...] = PEERS) -> str:
    return json.dumps({"machine": table.machine, "rows": [asdict(r) for r in table.rows],
                       "peers": [asdict(p) for p in peers]}, indent=1, ensure_ascii=False)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="reflexarc's cost table: the benchmarks' results beside the peers' "
                                             "published figures")
    ap.add_argument("--results", type=Path, default=RESULTS, help="results directory (default bench/results)")
    ap.add_argument("--out", type=Path, help="also write the table to this file")
    ap.add_argument("--json", action="store_true", help="the rows as JSON instead of Markdown")
    args = ap.parse_args(argv)
    try:
        table = build(args.results)
    except ResultsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    text = as_json(table) if args.json else markdown(table)
    print(text)
    if args.out:
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text + "\n")
        except OSError as exc:
            print(f"error: cannot write {args.out}: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
