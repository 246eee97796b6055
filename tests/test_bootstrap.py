"""The bootstrap provides everything the suite needs (tests/capabilities.py).

A fresh machine that ran only ``scripts/bootstrap`` must pass ``make test``: so
every capability a test uses is listed once, is present here, and is brought by
a package that the bootstrap really installs (its apt list, or the project's
``test`` extra). A program started by name anywhere in the tests, simulations or
benchmarks that the list does not name fails here, on the developer's machine.
"""
from __future__ import annotations

import re
import tomllib

from capabilities import CAPABILITIES, missing
from conftest import ROOT

BOOTSTRAP = ROOT / "scripts" / "bootstrap"
# How a program is started by name: shutil.which("NAME"), _tool("NAME", ...), subprocess.run(["NAME", ...]),
# and the tests' sh("NAME", ...) helper
STARTED = re.compile(r'(?:\bwhich\(|\b_tool\(|\bsh\(|subprocess\.(?:run|Popen|check_output|check_call|call)\(\s*\[)'
                     r'\s*"([a-z][a-z0-9_.-]*)"')
# programs every machine that can clone the project has (coreutils, a shell, git itself), the
# project's own, and a fallback name that is looked for but not needed
NOT_PROGRAMS = {"sh", "bash", "env", "sleep", "true", "git", "reflexarc", "python", "python3", "chromium-browser"}


def apt_packages() -> set[str]:
    text = BOOTSTRAP.read_text()
    body = re.search(r"APT_PACKAGES=\(([^)]*)\)", text, re.S)
    assert body, "scripts/bootstrap declares no APT_PACKAGES=(...)"
    return set(body.group(1).split())


def pip_test_extra() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = project["dependencies"] + project["optional-dependencies"]["test"]
    return {re.split(r"[<>=!~\[ ]", n, 1)[0].lower() for n in names}


def test_every_capability_is_brought_by_the_bootstrap():
    apt, pip = apt_packages(), pip_test_extra()
    for cap in CAPABILITIES:
        kind, _, package = cap.provider.partition(":")
        assert kind in ("apt", "pip"), f"{cap.name}: provider {cap.provider!r} is neither apt: nor pip:"
        assert package in (apt if kind == "apt" else pip), (
            f"{cap.name} ({cap.used_for}) comes from {cap.provider}, which the bootstrap does not install")


def test_every_capability_is_present_after_the_bootstrap():
    gone = missing()
    assert not gone, "missing after scripts/bootstrap: " + "; ".join(
        f"{c.name} ({c.provider}, for {c.used_for})" for c in gone)


def test_every_program_the_suite_starts_is_listed():
    listed = {c.name for c in CAPABILITIES if c.kind == "program"}
    started: dict[str, str] = {}
    for folder in ("tests", "simulations", "bench"):
        for path in (ROOT / folder).rglob("*.py"):
            for name in STARTED.findall(path.read_text()):
                started.setdefault(name, str(path.relative_to(ROOT)))
    unlisted = {n: where for n, where in started.items() if n not in listed | NOT_PROGRAMS}
    assert not unlisted, "programs started by name but not in tests/capabilities.py: " + ", ".join(
        f"{n} ({where})" for n, where in sorted(unlisted.items()))


def test_the_scan_finds_programs():
    """The scan above would pass vacuously if it matched nothing: it sees the suite's own."""
    found = STARTED.findall('shutil.which("chromium") subprocess.run(["ip", "link"]) x["pid"] sh("bpftool", "-j")')
    assert found == ["chromium", "ip", "bpftool"]
