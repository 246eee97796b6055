"""The controller's loop on a node: wall clock, live sources, graceful stop.

Every ``interval`` seconds it polls each source onto the bus through the
intake (bounded batches, impossible values rejected, everything refused
counted: ``intake.py``), ticks the controller and sleeps until the next
interval. SIGTERM/SIGINT stop it cleanly whatever the load: the intake looks
at the stop event between chunks of samples and the controller between
chunks of rule runs, so the loop leaves within a chunk's time and rules that
roll back on shutdown are reverted; a SIGKILL leaves the journal, which the
next start reconciles. How late each tick starts against its schedule is
``reflexarc_loop_lag_seconds``. With an ``exporter`` (``exporter.py``) the
metrics are served while the loop runs; the service manager hears
``READY=1`` as the loop begins (the probes armed, every source open) and
``STOPPING=1`` as it ends (``sd_notify.py``). With a ``reloader``
(``reload.py``) the policies are reloaded between two ticks, on SIGHUP or when
their files changed. With a ``control`` server (``control.py``) an operator's
requests are carried out between two ticks too: the loop wakes for one as it
arrives, so a ``pause`` or ``rollback`` waits for no tick.

With ``arrivals`` (seconds, ``run --arrivals``), the loop also polls, that
often between two ticks, the sources that give samples as they come
(``poll_arrived``: the probes' step signals, the hooks' reports) and steps at
once the rules that read what arrived (``Controller.arrived``), so a change
point is acted on a step after the evidence, not an interval after it. The
tick stays: it polls every source and steps every rule (time-based
transitions, silence). At most ``1 / arrivals`` such passes a second, each
over the rules that read what arrived.

Example::

    run_live(controller, [ProbeSource(manager)], clock=WallClock(), interval=1.0)

Overhead: per interval, the sources' poll plus one controller tick; the kill
switch is checked every tick, so enforcement stops within one interval (1 s).
SIGTERM to exit under a 1.05 M-sample replay storm: 0.8 s at worst here, in 10 trials
(``bench/signal_storm.py``).
"""
from __future__ import annotations

import gc
import logging
import math
import signal
import threading

from ..sources.intake import Intake
from .sd_notify import notify

log = logging.getLogger("reflexarc.live")


def run_live(controller, sources, clock, interval: float = 1.0, duration: float | None = None,
             exporter=None, stop: threading.Event | None = None, reloader=None, control=None,
             arrivals: float = 0.0) -> dict:
    stop = stop or threading.Event()
    previous = {}

    def stopping(*_):
        stop.set()
        if control is not None:
            control.wake.set()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, stopping)
    intake = Intake(controller.bus, controller.metrics)
    arriving = [src for src in sources if hasattr(src, "poll_arrived")] if arrivals > 0 else []

    def arrive(now: float) -> None:
        names: set[str] = set()
        for src in arriving:
            samples = src.poll_arrived(now)
            names.update(name for name, *_ in samples)
            if not intake.take(src.name, samples, now, stop).complete:
                break
        if names:
            controller.arrived(now, names, stop)
    start = due = clock.now()
    try:
        if exporter is not None:
            exporter.start()
        if control is not None:
            control.start()
        notify("READY=1")
        while not stop.is_set():
            now = clock.now()
            controller.metrics.loop_lag(now - due)
            due = now + interval
            for src in sources:
                if not intake.take(src.name, src.poll(now), now, stop).complete:
                    break
            controller.tick(now, stop)
            if reloader is not None and not stop.is_set():
                reloader.poll(now)
            if duration is not None and now - start >= duration:
                break
            _wait(stop, control, due, clock, arrive if arriving else None, arrivals)
    finally:
        notify("STOPPING=1")
        if control is not None:
            control.close()
        for src in sources:
            src.close()
        controller.shutdown()
        if exporter is not None:
            exporter.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        # The run's objects die with the process: frozen, the interpreter's exit
        # does not collect them one by one (seconds for thousands of rule-targets).
        gc.freeze()
    return controller.summary()


def _wait(stop: threading.Event, control, due: float, clock, arrive=None, every: float = 0.0) -> None:
    """Until the next tick is ``due``: with a control server, serve requests as
    they come; with ``arrive``, call it every ``every`` seconds (not within
    half of that of the tick, which polls everything); stop early when asked to."""
    now = clock.now()
    next_arrival = now + every if arrive is not None else math.inf
    while not stop.is_set():
        if control is not None:
            control.serve()
        now = clock.now()
        if now >= due:
            return
        if now >= next_arrival:
            if due - now > every / 2:
                arrive(now)
            next_arrival = now + every
            continue
        left = min(due, next_arrival) - now
        if control is None:
            stop.wait(left)
        else:
            control.wait(left)
