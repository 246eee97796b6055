"""Live sources: probe samples of a training process that serves framework
hooks carry its rank. The probe manager is a stand-in that returns fixed
samples (the probes themselves are tested against real workloads elsewhere);
the hook socket is a real listening Unix socket. The replay source streams its
file: in file order, a bounded number of records a poll, impossible times
handed over at once (for the intake to reject), a malformed file refused when
it opens."""
from __future__ import annotations

import json
import math
import os
import socket

import pytest

from reflexarc.controller.sources.readers import ProbeSource, ReplaySource, SourceError


class FixedProbes:
    """Returns the same samples on every collect, each with its own labels dict."""

    def __init__(self, samples):
        self.samples = samples
        self.refreshed = 0

    def refresh_selection(self):
        self.refreshed += 1

    def expire_deep(self, now):
        return []

    def collect(self, now):
        return [(n, dict(labels), v) for n, labels, v in self.samples]


def test_probe_samples_of_a_hooked_trainer_carry_its_rank(tmp_path):
    trainer = os.getpid()
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / f"llama-3-{trainer}.sock"))
    server.listen(1)
    try:
        probes = FixedProbes([("dataloader_reads_total", {"pid": "99", "trainer": str(trainer)}, 5.0),
                              ("dataloader_reads_total", {"pid": "98", "trainer": "1"}, 2.0),
                              ("block_requests_total", {"dev": "loop0"}, 1.0)])
        samples = ProbeSource(probes, hook_dir=str(tmp_path)).poll(100.0)
    finally:
        server.close()
    by_pid = {labels.get("pid", labels.get("dev")): labels for _, labels, _ in samples}
    assert by_pid["99"]["rank"] == "3"
    assert "rank" not in by_pid["98"], "a training process without hooks has no rank"
    assert "rank" not in by_pid["loop0"]
    assert probes.refreshed == 1


def test_without_a_hook_directory_samples_pass_unchanged():
    probes = FixedProbes([("dataloader_reads_total", {"pid": "99", "trainer": "7"}, 5.0)])
    assert ProbeSource(probes).poll(1.0) == [("dataloader_reads_total", {"pid": "99", "trainer": "7"}, 5.0)]


def write_replay(path, records) -> None:
    path.write_text("".join(json.dumps({"name": "step_time_ms", "labels": {"rank": "0"}, **r}) + "\n"
                            for r in records))


def test_replay_delivers_due_records_in_file_order_a_bounded_batch_at_a_time(tmp_path):
    path = tmp_path / "r.jsonl"
    write_replay(path, [{"t": i * 0.1, "value": float(i)} for i in range(25)] + [{"t": 100.0, "value": 99.0}])
    src = ReplaySource(path, start=1000.0, limit=10)
    batches = [src.poll(1050.0) for _ in range(4)]
    assert [len(b) for b in batches] == [10, 10, 5, 0], "the rest waits for the next polls"
    values = [v for b in batches for _, _, v, _ in b]
    assert values == [float(i) for i in range(25)]
    assert batches[0][3] == ("step_time_ms", {"rank": "0"}, 3.0, 1000.0 + 3 * 0.1), "with the time it claims"
    assert src.poll(1100.0) == [("step_time_ms", {"rank": "0"}, 99.0, 1100.0)]
    assert src.poll(1e9) == []
    src.close()


def test_replay_hands_over_impossible_times_at_once_and_goes_on(tmp_path):
    path = tmp_path / "r.jsonl"
    write_replay(path, [{"t": 0.0, "value": 1.0}, {"t": math.nan, "value": 2.0}, {"t": math.inf, "value": 3.0},
                        {"t": 1e12, "value": 4.0}, {"t": -1e12, "value": 5.0}, {"t": 0.5, "value": 6.0},
                        {"t": 30.0, "value": 7.0}])
    src = ReplaySource(path, start=1000.0)
    got = src.poll(1001.0)
    assert [v for _, _, v, _ in got] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], "not due yet: only t=30"
    claimed = [ts for _, _, _, ts in got]
    assert math.isnan(claimed[1]) and claimed[2] == math.inf
    assert claimed[3] == 1000.0 + 1e12 and claimed[4] == 1000.0 - 1e12
    src.close()


def test_a_malformed_replay_record_is_refused_when_the_file_opens(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"t": 0, "name": "step_time_ms", "labels": {}, "value": 1}) + "\n"
                    + '{"t": 1, "name": "step_time_ms", "labels": {}, "value": "fast"}\n')
    with pytest.raises(SourceError, match=r"r.jsonl:2:1: error: bad replay record"):
        ReplaySource(path, start=0.0)
    path.write_text(json.dumps({"t": 0, "name": "step_time", "labels": {}, "value": 1}) + "\n")
    with pytest.raises(SourceError, match="did you mean 'step_time_ms'"):
        ReplaySource(path, start=0.0)


def test_replay_plays_only_what_was_checked_when_it_opened(tmp_path):
    path = tmp_path / "r.jsonl"
    write_replay(path, [{"t": 0.0, "value": 1.0}])
    src = ReplaySource(path, start=0.0)
    with open(path, "a") as f:
        f.write('{"t": 0.1, "name": "step_time_ms", "labels": {}, "val')     # a recorder mid-line
    assert [v for _, _, v, _ in src.poll(10.0)] == [1.0]
    assert src.poll(20.0) == []
    src.close()


def test_a_replay_file_rewritten_after_it_opened_ends_the_replay(tmp_path, caplog):
    path = tmp_path / "r.jsonl"
    write_replay(path, [{"t": i * 0.01, "value": float(i)} for i in range(2000)])     # beyond a read buffer
    src = ReplaySource(path, start=0.0)
    lines = path.read_bytes().splitlines(keepends=True)
    with open(path, "r+b") as f:                  # the same file, line 1500 overwritten in place
        f.seek(sum(len(line) for line in lines[:1499]))
        f.write(b"x" * (len(lines[1499]) - 1))
    assert [v for _, _, v, _ in src.poll(100.0)] == [float(i) for i in range(1499)]
    assert src.poll(200.0) == []
    assert "r.jsonl:1500:1: error: bad replay record" in caplog.text and "the replay ends there" in caplog.text
    src.close()


class Known:
    """Discovery's answer for each pid, as ``core.jobs.Discovery.identity`` gives it."""

    def __init__(self, identities):
        self.identities = identities

    def identity(self, pid):
        return self.identities.get(pid)


def test_a_hooked_trainer_started_by_no_launcher_takes_the_job_its_script_names(tmp_path):
    from reflexarc.core.jobs import Identity
    own, launched = os.getpid(), os.getppid()
    servers = []
    for name in (f"llama-0-{own}.sock", f"other-1-{launched}.sock"):
        servers.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
        servers[-1].bind(str(tmp_path / name))
        servers[-1].listen(1)
    try:
        probes = FixedProbes([("dataloader_reads_total", {"pid": "99", "trainer": str(own),
                                                          "job": f"train.py-{own}"}, 5.0),
                              ("dataloader_reads_total", {"pid": "98", "trainer": str(launched),
                                                          "job": "torch-17"}, 2.0)])
        probes.discovery = Known({own: Identity(f"train.py-{own}", evidence=("process",)),
                                  launched: Identity("torch-17", rank=1, evidence=("torchrun",))})
        samples = ProbeSource(probes, hook_dir=str(tmp_path)).poll(100.0)
    finally:
        for server in servers:
            server.close()
    jobs = {labels["pid"]: labels["job"] for _, labels, _ in samples}
    assert jobs == {"99": "llama", "98": "torch-17"}, "only a job named after its process gives way"
