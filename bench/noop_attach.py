"""Attach points with a BPF program that does nothing: what switching them on
costs by themselves (the kernel's dispatch to BPF, the syscall slow path a
syscall tracepoint puts every task on, a tracepoint's record formatting),
apart from any probe's own work.

Usage::

    python bench/noop_attach.py tracepoint:sched:sched_switch
    python bench/noop_attach.py raw_tracepoint:sched_switch tracepoint:syscalls:sys_enter_read

Prints ``ready`` once everything is attached, detaches at SIGTERM or SIGINT.
Overhead: one bcc compile (~0.5 s) at start.
"""
import signal
import sys

from bcc import BPF

bpf = BPF(text="int noop(void *ctx) { return 0; }")
for spec in sys.argv[1:]:
    kind, _, point = spec.partition(":")
    if kind == "tracepoint":
        bpf.attach_tracepoint(tp=point.encode(), fn_name=b"noop")
    elif kind == "raw_tracepoint":
        bpf.attach_raw_tracepoint(tp=point.encode(), fn_name=b"noop")
    else:
        sys.exit(f"error: {spec}: unknown attach kind {kind!r} (tracepoint, raw_tracepoint)")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
print("ready", flush=True)
try:
    signal.pause()
except KeyboardInterrupt:
    pass
