"""What is switched on in the B side of a cost round, each in its own process
and started (compiled, attached) before the round's window opens:
reflexarc's light tier or one of its probes, one attach point with a no-op
program (``noop_attach.py``), a bcc tool, or a bpftrace one-liner.

Example::

    with Observer.light_tier(probes=["sched_numa"]) as tier:
        workload.measure(3.0)
    OBSERVERS["bcc runqlat"]          # a factory: Observer(...)

Overhead: the observer's own; starting waits for its first line of output
that says it is attached.
"""
from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BPFTRACE = "/usr/bin/bpftrace"
BCC_TOOLS = "/usr/sbin"


class ObserverFailed(RuntimeError):
    pass


class Observer:
    def __init__(self, argv: list[str], ready: str, timeout: float = 60.0) -> None:
        self.argv, self.ready, self.timeout = argv, re.compile(ready), timeout
        self.proc: subprocess.Popen | None = None
        self.output: list[str] = []
        self.start_s = 0.0

    @classmethod
    def light_tier(cls, probes: list[str] | None = None,
                   comms: tuple[str, ...] = ("pt_data_worker", "fio")) -> "Observer":
        """The tier as ``reflexarc run`` starts it, selecting threads by name
        (``fio``: the syscall loops are watched as a worker would be)."""
        argv = [sys.executable, "-m", "reflexarc.bpf.manager", "--watch", "0", "--interval", "1"]
        for comm in comms:
            argv += ["--comm", comm]
        for name in probes or ():
            argv += ["--probe", name]
        return cls(argv, r'^\{"armed_s"')

    @classmethod
    def noop(cls, *points: str) -> "Observer":
        """``points``: "tracepoint:sched:sched_switch", "raw_tracepoint:sched_switch", ..."""
        return cls([sys.executable, str(HERE / "noop_attach.py"), *points], r"^ready$")

    @classmethod
    def control(cls) -> "Observer":
        """A process that starts like an observer and attaches nothing: B against
        A with nothing different but a process started and stopped, the bias of
        the method itself (expected 1.000 within the interval)."""
        return cls([sys.executable, "-c", "import signal; print('ready', flush=True); signal.pause()"],
                   r"^ready$")

    @classmethod
    def bcc(cls, tool: str, *args: str) -> "Observer":
        return cls([f"{BCC_TOOLS}/{tool}-bpfcc", *args], r"^Tracing ")

    @classmethod
    def bpftrace(cls, script: str) -> "Observer":
        return cls([BPFTRACE, "-e", script], r"^Attaching \d+ probe")

    def __enter__(self) -> "Observer":
        began = time.monotonic()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        found = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                if len(self.output) < 200:
                    self.output.append(line.rstrip())
                if not found.is_set() and self.ready.search(line):
                    found.set()
        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + self.timeout
        while not found.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.__exit__()
                raise ObserverFailed(f"{' '.join(self.argv[:3])}: not attached (exit {self.proc.returncode}):\n"
                                     + "\n".join(self.output[-15:]))
        self.start_s = time.monotonic() - began
        time.sleep(0.3)                      # attach calls after the line (bcc tools print it first)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGINT)   # bcc tools and bpftrace print their summary and detach
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
