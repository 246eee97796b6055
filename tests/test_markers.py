"""The suite's tiers stay honest: a test file that needs root (``require_root``,
``require_bpf``) carries the ``kernel`` marker and one that builds network
namespaces (``NetnsPair``) the ``netns`` marker, so ``make test-fast``
(``-m "not kernel and not netns and not testbed and not slow"``) never starts
one of them on a machine without root."""
from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_every_test_file_that_needs_root_or_netns_is_marked():
    missing = []
    for path in sorted(TESTS.glob("test_*.py")):
        text = path.read_text()
        if re.search(r"\brequire_(root|bpf)\(", text) and "pytest.mark.kernel" not in text:
            missing.append(f"{path.name}: needs root but has no pytest.mark.kernel")
        if "NetnsPair(" in text and "pytest.mark.netns" not in text:
            missing.append(f"{path.name}: builds network namespaces but has no pytest.mark.netns")
    assert missing == [], "\n".join(missing)


def test_make_test_fast_leaves_the_marked_tiers_out():
    makefile = (TESTS.parent / "Makefile").read_text()
    rule = makefile[makefile.index("\ntest-fast:"):].split("\n\n")[0]
    assert '-m "not kernel and not netns and not testbed and not slow"' in rule
