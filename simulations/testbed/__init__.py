"""The real-world testbed: a multi-rank PyTorch job on one machine whose network
crosses a DSCP-aware switch bottleneck, reading its data from an object store,
with real faults to inject.

Modules: ``topology`` (namespaces, veths, the switch, ``Testbed``, ``sweep``),
``switch`` (the bottleneck's HTB classes), ``store`` (the HTTP object store),
``job`` (the training job), ``handle`` (a running job), ``faults``, ``procs``
(processes and cgroups), ``controller`` and ``closed_loop`` (reflexarc on it),
``conventional`` (the Prometheus, Alertmanager and script pipeline beside it)
and the CLI in ``__main__``.

Example::

    from reflexarc.simulations.testbed import BulkUpload, Testbed

    with Testbed(ranks=2, bottleneck="200mbit") as tb:
        job = tb.start_job()
        ...
        onset = BulkUpload(tb).start()

Overhead: importing runs no command and loads no torch (only ``job`` does).
"""
from .faults import BulkUpload, CpuHog, Fault, Misplaced, Nothing, StoreLatency, StoreSerial
from .handle import Job
from .procs import TestbedError
from .topology import Testbed, residue, sweep

__all__ = ["BulkUpload", "CpuHog", "Fault", "Job", "Misplaced", "Nothing", "StoreLatency", "StoreSerial", "Testbed",
           "TestbedError", "residue", "sweep"]
