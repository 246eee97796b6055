"""The catalogue of signal names: the only names a policy may use.

A signal is a named, labelled, timestamped value. Sources (simulations, bcc probes,
framework hooks, PromQL queries) publish samples of catalogued signals onto the bus.

Example::

    CATALOGUE["dataloader_read_latency_us"].unit     # "us"
    suggest("dataloader_read_latency", CATALOGUE)    # "dataloader_read_latency_us"

Overhead: dictionary look-ups only.
"""
from __future__ import annotations

import difflib
from dataclasses import dataclass


@dataclass(frozen=True)
class SignalSpec:
    name: str
    unit: str
    labels: tuple[str, ...]
    kind: str  # "gauge" (a level) or "counter" (monotonic total)
    help: str


def _s(name, unit, labels, kind, help_):
    return SignalSpec(name, unit, tuple(labels.split()), kind, help_)


CATALOGUE: dict[str, SignalSpec] = {s.name: s for s in (
    # DataLoader workers (dataloader_io, sched_numa probes)
    _s("dataloader_read_latency_us", "us", "node job pid quantile", "gauge",
       "I/O latency of DataLoader worker reads (io_uring and read syscalls), per interval quantile"),
    _s("dataloader_reads_total", "1", "node job pid", "counter", "Reads completed by a DataLoader worker"),
    _s("dataloader_runq_latency_us", "us", "node job pid quantile", "gauge",
       "Run-queue latency (wakeup to switch-in) of DataLoader worker threads, per interval quantile"),
    _s("dataloader_batch_wait_ms", "ms", "node job rank", "gauge",
       "Time the training loop waited for the next batch (framework hook)"),
    _s("numa_migrations_total", "1", "node job pid", "counter", "Task migrations between CPUs of a selected task"),
    _s("numa_cross_migrations_total", "1", "node job pid", "counter",
       "Task migrations that crossed a NUMA node boundary"),
    _s("numa_remote_ratio", "ratio", "node job pid", "gauge",
       "Share of a task's CPU time spent on a CPU outside its memory's NUMA node"),
    # Block I/O (block_io probe)
    _s("block_rq_latency_us", "us", "node dev quantile", "gauge", "Block request latency issue to complete, per interval quantile"),
    _s("block_small_io_ratio", "ratio", "node dev", "gauge", "Share of block requests smaller than 128 KiB"),
    _s("block_requests_total", "1", "node dev", "counter", "Block requests completed"),
    # GPU submission (gpu_submit probe)
    _s("gpu_submit_rate_hz", "1/s", "node job pid", "gauge", "NVIDIA driver ioctl submissions per second"),
    _s("gpu_submit_gap_us", "us", "node job pid quantile", "gauge", "Gap between consecutive submissions, per interval quantile"),
    _s("gpu_utilization_pct", "%", "node gpu job", "gauge", "GPU utilisation"),
    # Network (net_tcp probe, NIC counters)
    _s("tcp_retransmits_total", "1", "node job flow port", "counter", "TCP retransmissions on selected flows"),
    _s("tcp_srtt_us", "us", "node job flow port quantile", "gauge", "Smoothed TCP round-trip time on selected flows"),
    _s("nccl_link_latency_us", "us", "node link quantile", "gauge", "Collective link latency"),
    _s("link_utilization_pct", "%", "node iface", "gauge", "Port utilisation"),
    # RDMA (rdma_qp deep probe, hardware counters)
    _s("rdma_qp_completion_latency_us", "us", "node qp dev quantile", "gauge", "RDMA queue-pair post to completion latency"),
    _s("rdma_hw_counter_rate", "1/s", "node dev port counter", "gauge", "Rate of an RDMA hardware counter (cnp, retries, out-of-sequence)"),
    # Training job (framework hooks)
    _s("step_time_ms", "ms", "node job rank", "gauge", "Training step time"),
    _s("mfu_pct", "%", "node job rank", "gauge", "Model FLOPs utilisation"),
    # Controller itself
    _s("deep_probe_events_per_s", "1/s", "node probe", "gauge", "Events handled by the deep probe tier"),
    _s("probe_events_lost_total", "1", "node probe", "counter",
       "Discrete probe events dropped because the ring buffer was full"),
)}


class UnknownSignal(KeyError):
    def __init__(self, name: str) -> None:
        self.name = name
        self.suggestion = suggest(name, CATALOGUE)
        super().__init__(name)

    def __str__(self) -> str:
        hint = f"; did you mean '{self.suggestion}'?" if self.suggestion else ""
        return f"unknown signal '{self.name}'{hint}"


def suggest(word: str, choices) -> str | None:
    """Closest choice to ``word``, or None."""
    match = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return match[0] if match else None
