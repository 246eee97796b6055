"""Live sources: probe samples of a training process that serves framework
hooks carry its rank. The probe manager is a stand-in that returns fixed
samples (the probes themselves are tested against real workloads elsewhere);
the hook socket is a real listening Unix socket."""
from __future__ import annotations

import os
import socket

from reflexarc.controller.sources import ProbeSource


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
