"""The workloads whose CPU the light tier's cost is measured on, each measured
by its own CPU time per item (not only its throughput, which other load on the
machine moves more).

* ``LoaderWorkload``: the loaded training loader. A 2-worker DataLoader as an
  image pipeline feeds a training job: each item preads 4-64 KiB from a
  page-cached file, "decodes" it to 3x256x256 uint8 and augments it (random
  resized crop to 224, flip, normalise to float), ~0.7 ms of CPU; batches of
  32. It runs in its own process, kept alive across rounds (its workers are
  persistent, so a round measures steady state, not start-up), in its own
  cgroup v2: CPU per item is the cgroup's ``cpu.stat`` usage (main process and
  workers, user and kernel, µs resolution) over the items of the window.
* ``SyscallLoop``: a syscall-bound loop: one fio thread doing 4 KiB reads from
  the page cache, as ``pread`` syscalls (``psync``) or io_uring requests, the
  most events per second of work; CPU per read is fio's own accounting of its
  thread.
* ``TcpStream``: TCP over loopback, 16 KiB writes from one fio thread to
  another (NCCL's socket transport in miniature): the TCP tracepoints' load.

Example::

    with LoaderWorkload(path) as loader:
        loader.measure(3.0)    # {"throughput": 2650.0, "cpu_us_per_op": 741.2, "items": 7968}
    SyscallLoop(path, "io_uring").measure(2.0)

Overhead: the loader keeps two workers and ~600 MB of RSS alive between
measurements (idle: its prefetch queue fills, then it blocks).
"""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

from reflexarc.core.cgroups import cgroup2_root

FILE_BYTES = 256 << 20
BATCH = 32


def make_file(path: str) -> None:
    with open(path, "wb") as f:
        for _ in range(FILE_BYTES >> 20):
            f.write(os.urandom(1 << 20))


def warm(path: str) -> None:
    """Read the file into the page cache; this machine's DAMON reclaim (kdamond)
    evicts cold file pages within minutes, so every run re-warms."""
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


class TrainingDataset:
    """Item i as in an image-classification input pipeline: an encoded image
    of 4-64 KiB pread from the page-cached file, "decoded" to a 3x256x256
    uint8 tensor (its bytes tiled: a stand-in for JPEG decoding), then
    augmented as torchvision v2 does on uint8 tensors: RandomResizedCrop to
    224x224 (bilinear, antialiased), a random horizontal flip, conversion to
    float normalised with the ImageNet mean/std; the label is i % 1000.
    Seeded by i, so A and B do the same work."""

    SOURCE, OUT = 256, 224
    MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
    STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)

    def __init__(self, path: str) -> None:
        self.path = path
        self.fd = None

    def __len__(self) -> int:
        return 1 << 30

    def __getitem__(self, i: int):
        import torch
        import torch.nn.functional as F
        if self.fd is None:
            self.fd = os.open(self.path, os.O_RDONLY)
        rng = random.Random(i)
        size = rng.randint(1, 16) * 4096
        offset = rng.randrange((FILE_BYTES - size) // 4096 + 1) * 4096
        encoded = torch.frombuffer(bytearray(os.pread(self.fd, size, offset)), dtype=torch.uint8)
        pixels = 3 * self.SOURCE * self.SOURCE
        image = encoded.repeat(pixels // size + 1)[:pixels].view(3, self.SOURCE, self.SOURCE)
        side = rng.randint(self.SOURCE * 5 // 8, self.SOURCE)
        top, left = rng.randint(0, self.SOURCE - side), rng.randint(0, self.SOURCE - side)
        crop = image[:, top:top + side, left:left + side].unsqueeze(0)
        out = F.interpolate(crop, size=(self.OUT, self.OUT), mode="bilinear", align_corners=False,
                            antialias=True)[0]
        if rng.random() < 0.5:
            out = out.flip(2)
        mean = torch.tensor(self.MEAN).view(3, 1, 1)
        std = torch.tensor(self.STD).view(3, 1, 1)
        return (out.float() - mean) / std, i % 1000


def training_item_ms(path: str, items: int = 200) -> float:
    """CPU time of one training item in one thread, as a worker runs it."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                   # as in DataLoader workers
    dataset = TrainingDataset(path)
    try:
        dataset[0]
        began = time.process_time()
        for i in range(items):
            dataset[i]
        return 1e3 * (time.process_time() - began) / items
    finally:
        torch.set_num_threads(threads)
        if dataset.fd is not None:
            os.close(dataset.fd)


def cgroup_usage_us(cgroup: Path) -> int:
    for line in (cgroup / "cpu.stat").read_text().splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value)
    raise RuntimeError(f"{cgroup}/cpu.stat has no usage_usec")


def serve_loader(path: str, cgroup: str) -> None:
    """The loader process: joins ``cgroup`` (its workers inherit it), then
    answers each stdin line ``SECONDS`` with one JSON line measured over that
    long; exits at end of input."""
    (Path(cgroup) / "cgroup.procs").write_text(str(os.getpid()))
    import torch
    import torch.utils.data as tud
    torch.set_num_threads(1)    # collate in one thread: idle OpenMP threads spinning would charge CPU by timing
    loader = tud.DataLoader(TrainingDataset(path), batch_size=BATCH, num_workers=2, persistent_workers=True)
    batches = iter(loader)
    for _ in range(4):
        next(batches)
    print(json.dumps({"ready": os.getpid()}), flush=True)
    for line in sys.stdin:
        seconds = float(line)
        next(batches)                          # the window starts at a batch boundary
        items, began, cpu0 = 0, time.monotonic(), cgroup_usage_us(Path(cgroup))
        while time.monotonic() - began < seconds:
            next(batches)
            items += BATCH
        wall, cpu = time.monotonic() - began, cgroup_usage_us(Path(cgroup)) - cpu0
        print(json.dumps({"throughput": items / wall, "cpu_us_per_op": cpu / items, "items": items}), flush=True)


class LoaderWorkload:
    name = "training loader"

    def __init__(self, path: str) -> None:
        self.path = path
        root = cgroup2_root()
        if root is None:
            raise RuntimeError("no cgroup2 hierarchy is mounted: the loader's CPU cannot be measured")
        self.cgroup = root / f"reflexarc-bench-loader-{os.getpid()}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "LoaderWorkload":
        self.cgroup.mkdir(exist_ok=True)
        self.proc = subprocess.Popen([sys.executable, __file__, "loader", self.path, str(self.cgroup)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        hello = self.proc.stdout.readline()
        if not hello:
            self.__exit__()
            raise RuntimeError("the loader process exited before its first batch")
        return self

    def measure(self, seconds: float) -> dict:
        warm(self.path)
        self.proc.stdin.write(f"{seconds}\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for _ in range(300):                    # the workers leave the cgroup as they exit
            try:
                self.cgroup.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(0.1)


class SyscallLoop:
    """One fio thread reading 4 KiB at random from the page cache: with ``psync``
    each read is a ``pread`` syscall, with ``io_uring`` a submit and a complete."""

    def __init__(self, path: str, engine: str = "psync") -> None:
        self.path, self.engine = path, engine
        self.name = f"syscall loop (fio {engine})"

    def __enter__(self) -> "SyscallLoop":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def measure(self, seconds: float) -> dict:
        warm(self.path)
        out = subprocess.run(
            ["fio", "--name=cost", "--thread", f"--ioengine={self.engine}", "--rw=randread", "--bs=4k",
             *(["--iodepth=16"] if self.engine == "io_uring" else []),
             f"--size={FILE_BYTES}", f"--filename={self.path}", f"--runtime={seconds}", "--time_based",
             "--invalidate=0", "--output-format=json"],
            check=True, capture_output=True, text=True).stdout
        job = json.loads(out)["jobs"][0]
        cpu_s = (job["usr_cpu"] + job["sys_cpu"]) / 100 * job["job_runtime"] / 1e3
        ios = max(job["read"]["total_ios"], 1)
        return {"throughput": float(job["read"]["iops"]), "cpu_us_per_op": 1e6 * cpu_s / ios, "items": ios}


class TcpStream:
    """One fio thread streaming 16 KiB writes over TCP on loopback to another
    that reads them: every segment and ACK passes the TCP tracepoints. CPU per
    write is both threads' CPU (fio's accounting) over the writes."""

    name = "TCP stream (fio net, loopback)"
    # the receiver outlasts the sender (it ends at the sender's close), so no write meets a closed peer
    JOB = ("[global]\nioengine=net\nprotocol=tcp\nport={port}\nbs=16k\nsize=100g\ntime_based\nthread\n"
           "[receiver]\nlisten\nrw=read\nruntime={receiver_ms}ms\n"
           "[sender]\nstartdelay=200ms\nrw=write\nhostname=127.0.0.1\nruntime={ms}ms\n")

    def __enter__(self) -> "TcpStream":
        return self

    def __exit__(self, *exc) -> None:
        pass

    def measure(self, seconds: float) -> dict:
        from reflexarc.simulations.testbed.local_server import free_port
        out = subprocess.run(["fio", "--output-format=json", "-"], input=self.JOB.format(
                             port=free_port(), ms=int(seconds * 1e3), receiver_ms=int(seconds * 1e3) + 2000), check=True, capture_output=True, text=True).stdout
        jobs = {job["jobname"]: job for job in json.loads(out[out.index("{"):])["jobs"]}
        cpu_s = sum((j["usr_cpu"] + j["sys_cpu"]) / 100 * j["job_runtime"] / 1e3 for j in jobs.values())
        writes = max(jobs["sender"]["write"]["total_ios"], 1)
        return {"throughput": float(jobs["sender"]["write"]["iops"]), "cpu_us_per_op": 1e6 * cpu_s / writes,
                "items": writes}


if __name__ == "__main__":
    if sys.argv[1:2] == ["loader"]:
        serve_loader(sys.argv[2], sys.argv[3])
