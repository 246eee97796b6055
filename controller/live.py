"""The controller's loop on a node: wall clock, live sources, graceful stop.

Every ``interval`` seconds it polls each source onto the bus, ticks the
controller and sleeps until the next interval. SIGTERM/SIGINT stop it cleanly
(rules that roll back on shutdown are reverted); a SIGKILL leaves the journal,
which the next start reconciles. Optionally serves Prometheus metrics.

Example::

    run_live(controller, [ProbeSource(manager)], clock=WallClock(), interval=1.0)

Overhead: per interval, the sources' poll plus one controller tick; the kill
switch is checked every tick, so enforcement stops within one interval (1 s).
"""
from __future__ import annotations

import logging
import signal
import threading

log = logging.getLogger("reflexarc.live")


def run_live(controller, sources, clock, interval: float = 1.0, duration: float | None = None,
             metrics_port: int | None = None, stop: threading.Event | None = None) -> dict:
    stop = stop or threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    if metrics_port is not None:
        from prometheus_client import start_http_server
        start_http_server(metrics_port, addr="127.0.0.1", registry=controller.metrics.registry)
    start = clock.now()
    try:
        while not stop.is_set():
            now = clock.now()
            for src in sources:
                samples = src.poll(now)
                for name, labels, value in samples:
                    controller.bus.publish(name, labels, value, now)
                controller.metrics.signals.labels(src.name).inc(len(samples))
            controller.tick(now)
            if duration is not None and now - start >= duration:
                break
            stop.wait(max(0.0, interval - (clock.now() - now)))
    finally:
        for src in sources:
            src.close()
        controller.shutdown()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return controller.summary()
