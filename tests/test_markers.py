"""The suite's tiers stay honest: a test file that needs root (``require_root``,
``require_bpf``) carries the ``kernel`` marker and one that builds network
namespaces (``NetnsPair``) the ``netns`` marker, so ``make test-fast``
(``-m "not kernel and not netns and not testbed and not slow"``) never starts
one of them on a machine without root. And the controller's command line is
spelled once, in ``conftest.py`` (the ``cli`` fixture, ``run_cli``, ``spawn_cli``)."""
from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
OWN_COMMAND_LINE = re.compile(r"""["']-m["']\s*,\s*["']reflexarc\.controller\.cli["']""")


def _helpers_that_need_root() -> list[str]:
    """The helper modules beside the tests (``file_attrs``...) that fail without root."""
    return [path.stem for path in sorted(TESTS.glob("*.py"))
            if not path.name.startswith("test_") and path.name != "conftest.py"
            and re.search(r"\brequire_(root|bpf)\(", path.read_text())]


def test_every_test_file_that_needs_root_or_netns_is_marked():
    missing = []
    rooted = _helpers_that_need_root()
    assert "file_attrs" in rooted
    for path in sorted(TESTS.glob("test_*.py")):
        text = path.read_text()
        uses = [m for m in rooted if re.search(rf"^(from {m} import|import {m}\b)", text, re.M)]
        if re.search(r"\brequire_(root|bpf)\(", text) and "pytest.mark.kernel" not in text:
            missing.append(f"{path.name}: needs root but has no pytest.mark.kernel")
        elif uses and "pytest.mark.kernel" not in text:
            missing.append(f"{path.name}: uses {', '.join(uses)} (root) but has no pytest.mark.kernel")
        if "NetnsPair(" in text and "pytest.mark.netns" not in text:
            missing.append(f"{path.name}: builds network namespaces but has no pytest.mark.netns")
    assert missing == [], "\n".join(missing)


def test_make_test_fast_leaves_the_marked_tiers_out():
    makefile = (TESTS.parent / "Makefile").read_text()
    rule = makefile[makefile.index("\ntest-fast:"):].split("\n\n")[0]
    assert '-m "not kernel and not netns and not testbed and not slow"' in rule


def test_only_conftest_spells_the_controller_s_command_line():
    copies = [f"{path.relative_to(TESTS)}:{text[:m.start()].count(chr(10)) + 1}"
              for path in sorted(TESTS.rglob("*.py")) if path.name != "conftest.py"
              for text in [path.read_text()] for m in OWN_COMMAND_LINE.finditer(text)]
    assert copies == [], "use the cli fixture (or conftest.run_cli / spawn_cli) instead: " + ", ".join(copies)
