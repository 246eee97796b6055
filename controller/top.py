"""``reflexarc top``: live signals per target (probes, and the step signals
training scripts report through the hooks), refreshed each interval, in the
manner of bcc's interval tools (``biolatency 1``, ``runqlat 1``), followed by
the most recent discrete probe events (cross-NUMA migrations), e.g.::

    12:00:01 cross-NUMA migration pid=123 tid=124 (pt_data_worker) cpu0/node0 -> cpu1/node1

Example::

    reflexarc top --interval 1 --count 5

Overhead: the light probe tier plus one table print per interval.
"""
from __future__ import annotations

import sys
import time
from collections import deque

from .signals import CATALOGUE

TARGET_LABELS = ("job", "rank", "trainer", "pid", "dev", "flow", "port", "qp", "iface")
RECENT_EVENTS = 5


def format_table(samples: list[tuple[str, dict, float]]) -> str:
    rows = []
    for name, labels, value in samples:
        target = ",".join(f"{k}={labels[k]}" for k in TARGET_LABELS if k in labels) or "-"
        q = labels.get("quantile")
        sig = f"{name}{{q={q}}}" if q else name
        unit = CATALOGUE[name].unit if name in CATALOGUE else ""
        rows.append((target, sig, f"{value:.6g}", unit))
    rows.sort()
    if not rows:
        return "(no samples yet: no selected task or flow was active)"
    w = [max(len(r[i]) for r in rows + [("target", "signal", "value", "unit")]) for i in range(4)]
    head = f"{'target':{w[0]}}  {'signal':{w[1]}}  {'value':>{w[2]}}  unit"
    return "\n".join([head] + [f"{t:{w[0]}}  {s:{w[1]}}  {v:>{w[2]}}  {u}" for t, s, v, u in rows])


def format_event(event: dict) -> str:
    """One line for a probe event (``ProbeManager.events()``): local time, what
    happened, and its fields."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event.get("time", 0)))
    if event.get("kind") == "cross_numa_migration":
        return (f"{stamp} cross-NUMA migration pid={event['tgid']} tid={event['tid']} ({event['comm']}) "
                f"cpu{event['orig_cpu']}/node{event['orig_node']} -> cpu{event['dest_cpu']}/node{event['dest_node']}")
    fields = " ".join(f"{k}={v}" for k, v in event.items() if k not in ("kind", "time"))
    return f"{stamp} {event.get('kind', 'event')} {fields}"


def run_top(selection, interval: float = 1.0, count: int | None = None, hook_dir: str | None = None,
            job: str = "", sys_root: str = "/sys") -> int:
    """Probe signals (with the rank of hooked training processes) and, with a
    hook directory, the step signals training scripts report."""
    from reflexarc.bpf.manager import ProbeManager

    from .sources import HookSource, ProbeSource
    manager = ProbeManager(selection, interval=interval, sys_root=sys_root)
    sources = [ProbeSource(manager, refresh_every=0.0, hook_dir=hook_dir)]
    if hook_dir:
        sources.append(HookSource(hook_dir, job))
    statuses = manager.start()
    down = [f"{n}: {s}" for n, s in statuses.items() if s.state != "ok"]
    tty = sys.stdout.isatty()
    recent: deque[dict] = deque(maxlen=RECENT_EVENTS)
    n = 0
    try:
        while count is None or n < count:
            time.sleep(interval)
            now = time.time()
            samples = [sample for src in sources for sample in src.poll(now)]
            recent.extend(manager.events())
            if tty:
                sys.stdout.write("\x1b[H\x1b[2J")
            print(time.strftime("%H:%M:%S"), f"({len(samples)} samples)")
            if down:
                print("not ok: " + "; ".join(down))
            print(format_table(samples))
            if recent:
                print("\nrecent events:")
                print("\n".join(format_event(e) for e in recent))
            sys.stdout.flush()
            n += 1
    except KeyboardInterrupt:
        pass
    finally:
        manager.stop()
    return 0
