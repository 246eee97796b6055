"""block_io probe against O_DIRECT reads of a loop device the test creates over
a file, plus its fallback choice on a fixture tracefs.

O_DIRECT bypasses the page cache, so each 4 KiB read is one 4 KiB request on
the loop device and each 1 MiB read becomes requests of 128 KiB or more.
"""
from __future__ import annotations

import mmap
import os
import time

import pytest
from conftest import loop_device as attached_loop
from conftest import require, require_bpf

from reflexarc.bpf.block_io import BlockIo
from reflexarc.bpf.probe import DEGRADED, OK, UNSUPPORTED, KernelFeatures
from reflexarc.controller.signals.catalogue import CATALOGUE

pytestmark = [pytest.mark.kernel]

SMALL_READS = 64
BIG_READS = 16


@pytest.fixture
def loop_device(tmp_path):
    require_bpf()
    with attached_loop(tmp_path / "disk.img", 64 << 20) as dev:
        yield dev


def direct_reads(dev: str, size: int, count: int, stride: int) -> None:
    buf = mmap.mmap(-1, size)                # page-aligned, as O_DIRECT needs
    fd = os.open(dev, os.O_RDONLY | os.O_DIRECT)
    try:
        for i in range(count):
            assert os.preadv(fd, [buf], i * stride) == size
    finally:
        os.close(fd)
        buf.close()


def for_dev(samples, dev: str) -> dict:
    out = {}
    for name, labels, value in samples:
        if labels.get("dev") == dev:
            out[(name, labels.get("quantile"))] = value
    return out


def test_signals_are_catalogued():
    for spec in BlockIo.signals:
        assert CATALOGUE[spec.name] == spec
        assert set(spec.labels) <= {"node", "dev", "quantile"}


def test_direct_reads_on_loop_device(loop_device):
    name = os.path.basename(loop_device)
    probe = BlockIo()
    assert probe.start().state == OK
    try:
        probe.collect(time.time())
        direct_reads(loop_device, 4096, SMALL_READS, stride=3 * 4096)
        small = for_dev(probe.collect(time.time()), name)
        direct_reads(loop_device, 1 << 20, BIG_READS, stride=1 << 20)
        big = for_dev(probe.collect(time.time()), name)
    finally:
        probe.stop()

    assert small[("block_requests_total", None)] >= SMALL_READS
    assert small[("block_small_io_ratio", None)] == 1.0
    assert 0 < small[("block_rq_latency_us", "0.5")] <= small[("block_rq_latency_us", "0.99")]

    big_requests = big[("block_requests_total", None)] - small[("block_requests_total", None)]
    assert big_requests >= BIG_READS      # at least one request per read (split at max_sectors_kb)
    assert big[("block_small_io_ratio", None)] == 0.0
    assert big[("block_rq_latency_us", "0.5")] > 0


class Hiding(KernelFeatures):
    def __init__(self, hidden: set[str]) -> None:
        super().__init__()
        self.hidden = hidden

    def has_tracepoint(self, category: str, event: str) -> bool:
        return event not in self.hidden and super().has_tracepoint(category, event)


def test_accounting_fallback_on_loop_device(loop_device):
    """Without block_rq_issue the probe runs on block_io_start/done, for real."""
    features = Hiding({"block_rq_issue"})
    require(features.has_tracepoint("block", "block_io_start"), "block:block_io_start (Linux 6.5+)")
    name = os.path.basename(loop_device)
    probe = BlockIo(features=features)
    status = probe.start()
    try:
        assert status.state == DEGRADED
        probe.collect(time.time())
        direct_reads(loop_device, 4096, SMALL_READS, stride=2 * 4096)
        small = for_dev(probe.collect(time.time()), name)
    finally:
        probe.stop()
    assert small[("block_requests_total", None)] >= SMALL_READS
    assert small[("block_small_io_ratio", None)] == 1.0
    assert small[("block_rq_latency_us", "0.5")] > 0


def test_device_names(tmp_path):
    uevent = tmp_path / "dev" / "block" / "7:3"
    uevent.mkdir(parents=True)
    (uevent / "uevent").write_text("MAJOR=7\nMINOR=3\nDEVNAME=loop3\nDEVTYPE=disk\n")
    probe = BlockIo(features=KernelFeatures(sysfs=str(tmp_path)))
    assert probe.device_name((7 << 20) | 3) == "loop3"
    assert probe.device_name((8 << 20) | 16) == "8:16"
    with pytest.raises(ValueError):
        BlockIo(small_io_bytes=100_000)


def test_fallback_order(tmp_path):
    def features(root, events):
        for e in events:
            d = root / "events" / "block" / e
            d.mkdir(parents=True)
            (d / "format").write_text(f"name: {e}\n")
        return KernelFeatures(tracefs=str(root))

    probe = BlockIo(features=features(tmp_path / "a", ["block_rq_issue", "block_rq_complete", "block_io_start",
                                                       "block_io_done"]))
    assert probe.choose_attach_points().state == OK
    assert "-DISSUE_TP=block_rq_issue" in probe.cflags()

    probe = BlockIo(features=features(tmp_path / "b", ["block_rq_complete", "block_io_start", "block_io_done"]))
    status = probe.choose_attach_points()
    assert status.state == DEGRADED and "queued" in status.reason
    assert "-DISSUE_TP=block_io_start" in probe.cflags() and "-DDONE_TP=block_io_done" in probe.cflags()

    probe = BlockIo(features=features(tmp_path / "c", ["block_rq_issue"]))
    assert probe.choose_attach_points().state == UNSUPPORTED
