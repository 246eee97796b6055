"""CPU lists in the kernel's notation (``0-3,8,10-11``), as sysfs, taskset and
policies write them.

``parse_cpulist`` reads the text of ``/sys/devices/system/node/node*/cpulist``
or ``cpu/online``, a policy or scenario value, or a command-line argument; a
list of CPU numbers passes through checked. ``format_cpulist`` writes the
shortest notation back, for summaries and messages.

Example::

    parse_cpulist("0-3,8,10-11\\n")      # [0, 1, 2, 3, 8, 10, 11]
    parse_cpulist([3, 1, 1])            # [1, 3]
    parse_cpulist("")                   # [] (a node without CPUs)
    format_cpulist([0, 1, 2, 5])        # "0-2,5"
    parse_cpulist("3-1")                # ValueError: bad CPU list '3-1': ...

Overhead: a split and a few integer conversions per call.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

_RANGE_RE = re.compile(r"^\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?$")
EXAMPLE = "use CPU numbers and ranges lo-hi, e.g. '0-15' or '0-3,8'"


def parse_cpulist(value: str | Iterable[int]) -> list[int]:
    """Sorted distinct CPU numbers of ``value``: kernel notation text, or CPU
    numbers; ValueError naming the bad part otherwise."""
    if not isinstance(value, str):
        if isinstance(value, (bytes, dict)) or not isinstance(value, Iterable):
            raise ValueError(f"bad CPU list {value!r}: {EXAMPLE}")
        cpus = set()
        for cpu in value:
            if isinstance(cpu, bool) or not isinstance(cpu, int) or cpu < 0:
                raise ValueError(f"bad CPU {cpu!r} in {list(value)!r}: CPU numbers are integers >= 0")
            cpus.add(cpu)
        return sorted(cpus)
    cpus = set()
    text = value.strip()
    for part in text.split(",") if text else ():
        match = _RANGE_RE.match(part)
        if not match:
            raise ValueError(f"bad CPU list {value!r}: {part.strip()!r} is not a CPU or a range; {EXAMPLE}")
        lo, hi = int(match.group(1)), int(match.group(2) or match.group(1))
        if hi < lo:
            raise ValueError(f"bad CPU list {value!r}: range {part.strip()!r} runs backwards; {EXAMPLE}")
        cpus.update(range(lo, hi + 1))
    return sorted(cpus)


def format_cpulist(cpus: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``; ``""`` for no CPUs."""
    out: list[str] = []
    run: list[int] = []
    for cpu in sorted(set(cpus)) + [None]:
        if run and cpu is not None and cpu == run[-1] + 1:
            run.append(cpu)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [cpu] if cpu is not None else []
    return ",".join(out)
