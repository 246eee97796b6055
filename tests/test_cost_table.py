"""The cost table (``bench/cost_table.py``) is built from the benchmarks' result
files: small files shaped like the real ones in a temporary directory, and the
real ``bench/results/`` once. No root, no measurement; a second or less."""
from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import cost_table  # noqa: E402
from peers import PEERS, Peer  # noqa: E402

CI = {"median": 0.995, "low": 0.986, "high": 1.001, "n": 12, "confidence": 0.95}


def ratio(median: float) -> dict:
    return {"cpu_ratio": {**CI, "median": median, "n": 6}}


def engine_run(rules: int, mode: str, ms: float) -> dict:
    return {"rules": rules, "targets": 10, "mode": mode, "ms_per_tick": ms, "evaluations_per_s": 100_000}


ENGINE = {
    "machine": {"kernel": "6.1.0-test", "cpus": 2}, "rounds": 3,
    "throughput": [{**engine_run(rules, mode, 1.0), "evaluations_per_s_min": 90_000,
                    "evaluations_per_s_max": 110_000} for rules in (10, 100) for mode in ("idle", "busy")],
    "raw": {f"{rules}:{mode}": [engine_run(rules, mode, ms) for ms in (1.0, 2.0, 3.0)]
            for rules in (10, 100) for mode in ("idle", "busy")},
    "targets": {"evaluations_per_s_at_100x10": 50_000},
}
PROBE = {
    "machine": {"kernel": "6.1.0-test", "cpus": 2},
    "headline": {"training loader": {"cpu_ratio": CI}, "control": {"training loader": {"cpu_ratio": CI}}},
    "table": {"rows": [{"group": "reflexarc", "name": "light tier (every probe)", "training loader": ratio(0.996),
                        "syscall loop (fio psync)": ratio(1.79), "start_s": 0.99}]},
    "events": {"training loader": {"events_per_s": 14852.8, "kernel_ns_per_event": 693.1,
                                   "kernel_share_of_op_cpu_pct": 0.554}},
    "deep_tier": {"runs": [{"round": r, "mode": mode, "pairs_per_s": pairs}
                           for r, mode, pairs in ((0, "A", 1e6), (0, "B", 2.5e5), (1, "B", 2e5), (1, "A", 1e6))]},
}


def closed_loop_fault(key: str, applied: float | None, cpu: float) -> dict:
    return {"fault": key, "armed_s": 2.0, "after_onset_s": {"pending": 1.5, "applied": applied},
            "controller": {"cpu_pct": cpu, "rss_mb": 192.5, "peak_rss_mb": 195.5, "wall_s": 600.0}}


CLOSED = {"machine": {"kernel": "6.1.0-test", "cpus": 2},
          "faults": [closed_loop_fault("a", 6.55, 1.9), closed_loop_fault("b", 12.03, 1.55),
                     closed_loop_fault("e", None, 0.74)]}
CHURN = {
    "machine": {"kernel": "6.1.0-test", "cpus": 2},
    "ab_windows": [{"pair": 0, "mode": "on", "controller_cpu_pct": 0.28, "launch_to_ready_s": 1.23},
                   {"pair": 0, "mode": "off", "controller_cpu_pct": 0.0, "launch_to_ready_s": None},
                   {"pair": 1, "mode": "on", "controller_cpu_pct": 0.32, "launch_to_ready_s": 1.45}],
    "long_run": {"launch_to_ready_s": 1.25,
                 "samples": [{"t": 10.0 * i, "controller_cpu_pct": 0.4, "controller_rss_mib": 170.0 + i}
                             for i in range(1, 4)]},
    "summary": {"ab_pair_ratios": [1.03, 1.02, 0.94], "rss_last_over_second": 1.004},
}
REACTION = {
    "settings": {"tightest": {"scrape_s": 1, "eval_s": 1, "group_wait_s": 0},
                 "defaults": {"scrape_s": 60, "eval_s": 60, "group_wait_s": 30}},
    "for_s": 5.0,
    "summary": {"reflexarc": {"applied_s": {"median": 6.5, "min": 6.1, "max": 7.2, "n": 3}},
                "tightest": {"applied_s": {"median": 9.1, "min": 8.0, "max": 9.9, "n": 3}},
                "defaults": {"applied_s": None}},
    "ratios": {"tightest": {"applied": 1.4, "beyond_for": 2.6, "lost": 1.5}},
}
FILES = {"engine.json": ENGINE, "probe_overhead.json": PROBE, "closed_loop.json": CLOSED, "churn.json": CHURN,
         "reaction.json": REACTION}


def write(results: Path, files: dict[str, dict]) -> Path:
    results.mkdir(exist_ok=True)
    for name, data in files.items():
        (results / name).write_text(json.dumps(data))
    return results


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return write(tmp_path / "results", copy.deepcopy(FILES))


def row(table: cost_table.Table, start: str) -> cost_table.Row:
    return next(r for r in table.rows if r.measure.startswith(start))


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cost_table.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_each_figure_comes_from_its_file_and_follows_it(results):
    table = cost_table.build(results)
    assert row(table, "rule engine: one tick, 10 rules").ours == \
        "idle 2.00 ms (1.00-3.00, n=3); busy 2.00 ms (1.00-3.00, n=3)"
    assert row(table, "footprint: start").ours == "testbed 2.00 s (2.00-2.00, n=3); churn job 1.25 s (1.23-1.45, n=3)"
    assert row(table, "footprint: churn job's").ours == "1.02x (0.94-1.03, n=3)"
    assert "no fault (fault e, 600 s) 0.740 %" in row(table, "footprint: controller CPU on the testbed").ours
    assert row(table, "deep tier").ours == "3.50 µs (3.00-4.00, n=2) per pair"     # 1/2.5e5 - 1/1e6 s, 1/2e5 - 1/1e6 s

    engine = copy.deepcopy(ENGINE)
    engine["raw"]["10:busy"][0]["ms_per_tick"] = 9.0
    churn = copy.deepcopy(CHURN)
    churn["summary"]["ab_pair_ratios"] = [0.5, 0.6, 0.7]
    write(results, {"engine.json": engine, "churn.json": churn})
    changed = cost_table.build(results)
    assert row(changed, "rule engine: one tick, 10 rules").ours.endswith("busy 3.00 ms (2.00-9.00, n=3)")
    assert row(changed, "footprint: churn job's").ours == "0.600x (0.500-0.700, n=3)"


def test_reaction_json_gives_the_reaction_row_with_the_pipelines_beside_it(results):
    reaction = row(cost_table.build(results), "reaction")
    assert reaction.ours == "6.50 s (6.10-7.20, n=3)"
    assert "tightest (1/1/0 s) 9.10 s (8.00-9.90, n=3), 1.4x reflexarc's" in reaction.peers
    assert "defaults" not in reaction.peers, "a pipeline without a figure is left out"
    assert "Minder" in reaction.peers
    assert reaction.source.startswith("reaction.json summary.reflexarc.applied_s")

    faster = copy.deepcopy(REACTION)
    faster["summary"]["reflexarc"]["applied_s"]["median"] = 5.9
    write(results, {"reaction.json": faster})
    assert row(cost_table.build(results), "reaction").ours == "5.90 s (6.10-7.20, n=3)"


@pytest.mark.parametrize("name, step", [("engine.json", "bench/engine.py"), ("churn.json", "bench/churn.py"),
                                        ("probe_overhead.json", "bench/probe_overhead.py"),
                                        ("closed_loop.json", "--results bench/results/closed_loop.json"),
                                        ("reaction.json", "bench/reaction.py")])
def test_a_missing_results_file_is_one_error_line_naming_its_step(results, capsys, name, step):
    (results / name).unlink()
    code, out, err = run(capsys, "--results", str(results))
    assert code == 1 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert name in err and "make bench" in err and step in err


@pytest.mark.parametrize("text", ["{", "[1, 2]", ""])
def test_a_damaged_results_file_is_one_error_line(results, capsys, text):
    (results / "churn.json").write_text(text)
    code, out, err = run(capsys, "--results", str(results))
    assert code == 1 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and "churn.json" in err


def test_a_missing_figure_is_one_error_line_naming_the_key(results, capsys):
    without_ours = copy.deepcopy(REACTION)
    del without_ours["summary"]["reflexarc"]
    write(results, {"reaction.json": without_ours})
    code, out, err = run(capsys, "--results", str(results))
    assert code == 1 and out == ""
    assert err == ("error: reaction.json has no summary.reflexarc.applied_s.median; rerun: "
                   f"{cost_table.WRITERS['reaction.json']}\n")


def test_markdown_json_and_out_file(results, tmp_path, capsys):
    out_file = tmp_path / "table" / "cost.md"
    code, out, err = run(capsys, "--results", str(results), "--out", str(out_file))
    assert code == 0 and err == ""
    assert out_file.read_text() == out
    lines = out.splitlines()
    assert lines[0] == "Measured on: kernel 6.1.0-test, 2 CPUs."
    assert lines[2] == "| measure | reflexarc (this machine) | peers' published figure | source |"
    table_lines = [line for line in lines if line.startswith("| ")]
    assert len(table_lines) == 1 + len(cost_table.build(results).rows)
    assert all(line.count(" | ") == 3 for line in table_lines), "no cell breaks the columns"
    for i, peer in enumerate(PEERS, 1):
        assert f"{i}. {peer.name}, {peer.what}: {peer.figure}. Source: {peer.source}" in out

    code, out, _ = run(capsys, "--results", str(results), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["rows"][0]["measure"].startswith("reaction")
    assert [p["name"] for p in doc["peers"]] == [p.name for p in PEERS]


def test_every_peer_has_a_figure_and_a_source():
    assert PEERS
    for peer in PEERS:
        assert peer.name and peer.figure and peer.what and peer.source.strip(), peer
        assert peer.verified or peer.note, f"{peer.name}: an unverified figure says what was searched"
        if isinstance(peer.seconds, tuple):
            assert peer.seconds[0] <= peer.seconds[1]


def test_an_unverified_peer_is_marked():
    peer = Peer("Example", "1 s", 1.0, "interval", "a source", verified=False, note="searched the docs")
    assert cost_table.peer_cell((peer,)) == "Example interval: 1 s (unverified) [1]"
    table = cost_table.Table("a machine", [])
    assert "Not verified" in cost_table.markdown(table, (peer,))


def test_the_real_results_give_every_row_a_figure(capsys):
    code, out, err = run(capsys)      # the default --results: bench/results beside the script
    assert code == 0 and err == "" and out.startswith("Measured on: ")
    table = cost_table.build(ROOT / "bench" / "results")
    measures = [r.measure for r in table.rows]
    assert len(measures) == len(set(measures))
    for r in table.rows:
        assert r.ours.strip() and r.ours.strip() != "-", r.measure
        assert r.source.strip(), r.measure
