"""dataloader_io probe against a real PyTorch DataLoader and a real io_uring
workload (fio), plus its fallback choice on a fixture tracefs.

Latency injection is honest: each dataset item (``workloads/slow_reads.py``)
is read from a pipe whose writer (a separate process) sleeps 2 ms before
writing, so the ``read`` syscall itself blocks ~2 ms.
fio is started as ``sh -c 'read go; exec fio ...'`` so its pid is selected
before its first request; completions run in interrupt context, and must
still be attributed to fio's pid.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from conftest import ROOT, fake_tracefs, loop_device, require, require_bpf
from workloads.slow_reads import INDEX_READS, PipeDelayDataset

from reflexarc.actuators.framework_hook import served_by_pid
from reflexarc.bpf.dataloader_io import READ_SYSCALLS, DataloaderIo
from reflexarc.bpf.probe import DEGRADED, OK, UNSUPPORTED, KernelFeatures, Selection
from reflexarc.controller.signals.catalogue import CATALOGUE
import pytest

pytestmark = [pytest.mark.kernel]

DELAY_S = 0.002
ITEMS = 400


def as_list(batch: list[int]) -> list[int]:
    """Batches stay plain lists: tensors would travel through the workers'
    fd-passing threads, whose reads wait on the (busy) main process."""
    return batch


def by_pid(samples, name):
    out = {}
    for n, labels, value in samples:
        if n == name:
            out.setdefault(int(labels["pid"]), {})[labels.get("quantile")] = value
    return out


def test_signals_are_catalogued():
    for spec in DataloaderIo.signals:
        assert CATALOGUE[spec.name] == spec
        assert set(spec.labels) <= {"node", "job", "pid", "trainer", "rank", "pod", "quantile"}


def test_injected_2ms_read_shows_in_worker_p99(tmp_path):
    """The probe's P99 per worker matches the P99 of the same reads as the
    workers timed them themselves, within the histogram's slot width (25 %):
    on a loaded box the 2 ms reads take longer, in both."""
    require_bpf()
    import torch.utils.data as tud
    index = tmp_path / "index"
    index.write_bytes(os.urandom(4096))
    timings = tmp_path / "timings"
    timings.mkdir()

    probe = DataloaderIo(Selection(comms=("pt_data_worker",), job="t-dl"))
    assert probe.start().state == OK
    try:
        probe.collect(time.time())
        loader = tud.DataLoader(PipeDelayDataset(ITEMS, DELAY_S, str(index), str(timings)), batch_size=4, num_workers=2,
                                collate_fn=as_list)
        it = iter(loader)
        workers = [w.pid for w in it._workers]
        served = sum(len(batch) for batch in it)
        del it
        samples = probe.collect(time.time())
    finally:
        probe.stop()

    assert served == ITEMS
    latency = by_pid(samples, "dataloader_read_latency_us")
    reads = by_pid(samples, "dataloader_reads_total")
    for pid in workers:
        assert pid in latency, f"worker {pid} missing from {sorted(latency)}"
        p99 = latency[pid]["0.99"]
        assert p99 >= 1000, f"worker {pid} P99 {p99:.0f} us, injected 2000 us"
        assert latency[pid]["0.5"] <= p99
        # the probe also counts the worker's index-queue reads, which wait for the
        # next index: the truth's reads are a subset, their P99 a lower bound
        timed = sorted(int(line) / 1e3 for line in (timings / str(pid)).read_text().split())
        truth = timed[int(0.99 * (len(timed) - 1))]
        assert truth >= DELAY_S * 1e6, f"worker {pid}: its own P99 {truth:.0f} us, the feeder sleeps 2000 us"
        assert 0.75 * truth - 50 <= p99 <= 1.3 * truth + 100, f"worker {pid} P99 {p99:.0f} us, its own {truth:.0f} us"
    # Every item is INDEX_READS + 1 reads in some worker, plus the index-queue reads.
    assert sum(reads[pid][None] for pid in workers) >= ITEMS * (INDEX_READS + 1)
    for _, labels, _ in samples:
        assert labels["job"] == "t-dl" and labels["node"]


def test_socket_receive_from_a_slow_store_shows_as_read_latency():
    """A worker that fetches items over the network waits in recvfrom: a store
    answering after 30 ms reads as a ~30 ms read in the probe."""
    require_bpf()
    probe = DataloaderIo(Selection(pids=(os.getpid(),)))
    probe.start()
    try:
        ours, store = socket.socketpair()
        with ours, store:
            def answer():
                for _ in range(5):
                    store.recv(16)
                    time.sleep(0.03)
                    store.send(b"item")
            server = threading.Thread(target=answer)
            server.start()
            for _ in range(5):
                ours.send(b"get")
                assert ours.recvfrom(16)[0] == b"item"
            server.join()
        p99 = by_pid(probe.collect(time.time()), "dataloader_read_latency_us")[os.getpid()]["0.99"]
    finally:
        probe.stop()
    assert 25_000 <= p99 <= 60_000, p99


def test_workers_of_every_epoch_carry_their_training_process(tmp_path):
    """A DataLoader without persistent_workers (``workloads/epoch_loader.py``:
    num_workers=2, real preads) starts new workers every epoch: their samples
    change ``pid`` and keep ``trainer``, the job's main process, whose hook
    socket gives the rank. Other tests' DataLoaders may run meanwhile: only the
    workers the job reports are looked at."""
    require_bpf()
    hooks = tmp_path / "hooks"
    probe = DataloaderIo(Selection(comms=("pt_data_worker",), job="t-epochs"))
    assert probe.start().state == OK
    lines: list[dict] = []
    samples, ranks = [], {}
    try:
        job = subprocess.Popen([sys.executable, str(ROOT / "tests" / "workloads" / "epoch_loader.py"),
                                "--epochs", "3", "--epoch-items", "768", "--hook-dir", str(hooks)],
                               stdout=subprocess.PIPE, text=True, start_new_session=True)
        reader = threading.Thread(target=lambda: lines.extend(json.loads(x) for x in job.stdout), daemon=True)
        reader.start()
        deadline = time.monotonic() + 150      # a bound on a broken run, not a timing assertion
        while job.poll() is None:
            assert time.monotonic() < deadline, f"the job did not finish: {lines[-1:]}"
            time.sleep(0.1)
            samples.extend(probe.collect(time.time()))
            if not ranks and lines:
                ranks = {pid: rank for pid, (rank, _) in served_by_pid(str(hooks)).items()}
        reader.join(10)
        samples.extend(probe.collect(time.time()))
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.wait()
        probe.stop()

    assert job.returncode == 0
    main = next(line["pid"] for line in lines if line["event"] == "ready")
    epochs = [set(line["worker_pids"]) for line in lines if line["event"] == "epoch"]
    assert len(epochs) == 3 and all(len(pids) == 2 for pids in epochs)
    assert len(set.union(*epochs)) == 6, f"new worker pids every epoch: {epochs}"
    trainers: dict[int, set] = {}
    for _, labels, _ in samples:
        if int(labels["pid"]) in set.union(*epochs):
            trainers.setdefault(int(labels["pid"]), set()).add(labels.get("trainer"))
    for n, pids in enumerate(epochs, 1):
        for pid in pids:
            assert trainers.get(pid) == {str(main)}, f"epoch {n} worker {pid}: trainer {trainers.get(pid)}"
    assert ranks == {main: "0"}, "the trainer's hook socket names its rank"


def test_io_uring_reads_attributed_to_fio_pid(tmp_path):
    require_bpf()
    require(shutil.which("fio") is not None, "fio (Debian package fio)")
    data = tmp_path / "data"
    with open(data, "wb") as f:
        f.write(os.urandom(16 << 20))

    probe = DataloaderIo(Selection(pids=(0x7ffffffe,)))   # nothing selected yet
    assert probe.start().state == OK
    try:
        fio = subprocess.Popen(
            ["sh", "-c", 'read go; exec fio "$@"', "sh", "--name=probe", "--thread",
             "--ioengine=io_uring", "--rw=randread", "--bs=4k", "--direct=1", "--iodepth=8",
             "--size=16M", "--runtime=1", "--time_based", f"--filename={data}",
             "--output-format=json"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        probe.update_selection(Selection(pids=(fio.pid,)))
        probe.collect(time.time())
        out, _ = fio.communicate(b"go\n", timeout=60)
        samples = probe.collect(time.time())
    finally:
        probe.stop()

    assert fio.returncode == 0
    job = json.loads(out)["jobs"][0]["read"]
    total_ios = job["total_ios"]
    assert total_ios > 100
    reads = by_pid(samples, "dataloader_reads_total")
    latency = by_pid(samples, "dataloader_read_latency_us")
    assert set(reads) == {fio.pid}, f"reads attributed to {sorted(reads)}, expected only fio {fio.pid}"
    # Every io_uring completion lands on fio, plus a few plain reads of its own.
    assert total_ios <= reads[fio.pid][None] <= total_ios * 1.05 + 500
    p50 = latency[fio.pid]["0.5"]
    fio_p99_us = job["clat_ns"]["percentile"]["99.000000"] / 1000
    assert 5 <= p50 <= fio_p99_us, f"P50 {p50:.1f} us; fio clat P99 {fio_p99_us:.1f} us"


SYSCALLS = {f"sys_{side}_{s}": [] for s in ("read", "pread64") for side in ("enter", "exit")}


def test_fallback_order(tmp_path):
    block = {"block_bio_queue": []}
    cases = [
        ({"syscalls": SYSCALLS, "io_uring": {"io_uring_submit_req": ["req"], "io_uring_complete": ["req"]},
          "block": block}, OK, "-DURING_SUBMIT_REQ"),
        ({"syscalls": SYSCALLS, "io_uring": {"io_uring_submit_sqe": ["req"], "io_uring_complete": ["req"]},
          "block": block}, OK, "-DURING_SUBMIT_SQE"),
        ({"syscalls": SYSCALLS, "io_uring": {"io_uring_submit_req": ["req"], "io_uring_complete": ["req"]}},
         DEGRADED, "-DURING_SUBMIT_REQ"),
        ({"syscalls": SYSCALLS, "io_uring": {"io_uring_submit_sqe": ["ctx"], "io_uring_complete": ["ctx"]}},
         DEGRADED, "-DREAD_SYSCALLS"),
        ({"io_uring": {"io_uring_submit_req": ["req"], "io_uring_complete": ["req"]}},
         DEGRADED, "-DURING_SUBMIT_REQ"),
        ({"sched": {"sched_switch": []}}, UNSUPPORTED, None),
    ]
    for i, (events, state, flag) in enumerate(cases):
        probe = DataloaderIo(features=fake_tracefs(tmp_path / str(i), events))
        status = probe.choose_attach_points()
        assert status.state == state, (events, status)
        if flag:
            assert flag in probe.cflags()
        assert ("-DBLOCK_BIO_QUEUE" in probe.cflags()) == ("block" in events), events
    without = DataloaderIo(features=fake_tracefs(tmp_path / "b", {k: v for k, v in cases[0][0].items() if k != "block"}))
    assert without.choose_attach_points().reason.startswith("no block:block_bio_queue")
    probe = DataloaderIo(features=fake_tracefs(tmp_path / "s", {"syscalls": SYSCALLS}))
    status = probe.choose_attach_points()
    assert status.reason.startswith("syscalls only")
    assert "-DURING_SUBMIT_REQ" not in probe.cflags() and "-DURING_SUBMIT_SQE" not in probe.cflags()
    assert status.attach_points == ["tracepoint:syscalls:sys_enter_read", "tracepoint:syscalls:sys_exit_read",
                                    "tracepoint:syscalls:sys_enter_pread64", "tracepoint:syscalls:sys_exit_pread64"]


class Hiding(KernelFeatures):
    """The running kernel's features minus some tracepoints: compiles and runs
    the fallback variants of the C for real."""

    def __init__(self, hidden: set[str]) -> None:
        super().__init__()
        self.hidden = hidden

    def has_tracepoint(self, category: str, event: str) -> bool:
        return event not in self.hidden and super().has_tracepoint(category, event)


def test_degraded_variants_compile_and_count_reads():
    require_bpf()
    variants = [
        ({"io_uring_submit_req", "io_uring_submit_sqe"}, "syscalls only"),
        ({f"sys_enter_{s}" for s in READ_SYSCALLS}, "io_uring only"),
    ]
    for hidden, reason in variants:
        probe = DataloaderIo(Selection(pids=(os.getpid(),)), features=Hiding(hidden))
        status = probe.start()
        try:
            assert status.state == DEGRADED and status.reason.startswith(reason), status
            r, w = os.pipe()
            for _ in range(5):
                os.write(w, b"x")
                os.read(r, 1)
            os.close(r)
            os.close(w)
            reads = by_pid(probe.collect(time.time()), "dataloader_reads_total")
        finally:
            probe.stop()
        if reason == "syscalls only":
            assert reads[os.getpid()][None] >= 5
        else:
            assert os.getpid() not in reads     # plain reads are invisible without syscall tracepoints


RANDOM_READER = r"""
import os, random, sys
dev, advice, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
fd = os.open(dev, os.O_RDONLY)
size = os.lseek(fd, 0, os.SEEK_END)
if advice == "random":
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
print("ready", flush=True)
sys.stdin.readline()                                      # selected: go
rng = random.Random(7)
for mib in rng.sample(range(size >> 20), count // 4):    # a 16 KiB record at a MiB of its own, in 4 KiB reads
    base = mib << 20
    for j in range(4):
        assert len(os.pread(fd, 4096, base + j * 4096)) == 4096
print("done", flush=True)
"""


def amplification(dev: str, advice: str, count: int = 300) -> dict:
    """A worker's random 4 KiB buffered reads of a cold block device: its
    read bytes, device bytes and the interval's ratio, from the probe."""
    probe = DataloaderIo(Selection(pids=(0x7ffffffe,)))
    assert probe.start().state == OK
    try:
        reader = subprocess.Popen([sys.executable, "-c", RANDOM_READER, dev, advice, str(count)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert reader.stdout.readline().strip() == "ready"      # started: its imports are not counted
        probe.update_selection(Selection(pids=(reader.pid,)))
        probe.collect(time.time())
        out, _ = reader.communicate("go\n", timeout=60)
        assert out.strip() == "done"
        samples = probe.collect(time.time())
    finally:
        probe.stop()
    mine = {name: value for name, labels, value in samples if labels.get("pid") == str(reader.pid)}
    return mine


def test_read_amplification_of_short_records_with_and_without_readahead(tmp_path):
    """Records of 16 KiB at random places of a cold loop device, each read in
    four 4 KiB reads: with the default readahead the second read of a record
    looks sequential and starts a window well past the record (the disk reads
    several times what the worker used); with POSIX_FADV_RANDOM only the pages
    asked for (about 1). The bytes the reads returned are 4 KiB each."""
    require_bpf()
    results = {}
    for advice in ("normal", "random"):
        with loop_device(tmp_path / f"{advice}.img", 256 << 20) as dev:
            results[advice] = amplification(dev, advice)
    for advice, got in results.items():     # its reads, and "go\n" from its stdin
        assert 300 * 4096 <= got["dataloader_read_bytes_total"] <= 300 * 4096 + 64, (advice, got)
    normal, random_ = results["normal"], results["random"]
    assert normal["dataloader_read_amplification_ratio"] >= 3.0, results
    assert 0.9 <= random_["dataloader_read_amplification_ratio"] <= 1.5, results
    assert normal["dataloader_device_read_bytes_total"] >= 3 * random_["dataloader_device_read_bytes_total"]


def test_explain_says_the_amplification_signals_need_block_bio_queue(tmp_path):
    """A kernel without block:block_bio_queue runs the probe (degraded) without
    its byte counters: the node's facts name the missing tracepoint for those
    signals only, so explain does not say "can run here" for them."""
    from reflexarc.controller.signals.producers import PROBE, NodeFacts, Producer
    events = {"syscalls": SYSCALLS, "io_uring": {"io_uring_submit_req": ["req"], "io_uring_complete": ["req"]}}
    dataloader_io = Producer(PROBE, "dataloader_io")
    without = NodeFacts(features=fake_tracefs(tmp_path / "without", events))
    assert without.why_not(dataloader_io, "dataloader_read_amplification_ratio") == \
        "no block:block_bio_queue tracepoint"
    assert without.why_not(dataloader_io, "dataloader_read_latency_us") is None
    with_it = NodeFacts(features=fake_tracefs(tmp_path / "with", {**events, "block": {"block_bio_queue": []}}))
    assert with_it.why_not(dataloader_io, "dataloader_read_amplification_ratio") is None
