"""The documentation stays true to the code.

- ``docs/architecture.md`` names functions by import path
  (`` `reflexarc.controller.engine.engine.Controller.tick` ``): every such name must
  import; in its data-path table, every "called from" function must really
  call (or register) the function beside it; and its layer table must hold for
  every import in the package, at the top of a module or inside a function.
- Every relative link in ``README.md`` and ``docs/*.md`` must reach a file,
  and an anchor into a Markdown page one of its headings; a repository path
  the README, the architecture, security and benchmarks pages name in code
  form must exist.
- The README's policy is the shipped one and loads; the README names ``make
  test``, which CI runs; it links every page of ``docs/``.
- The cost table in ``docs/benchmarks.md`` is what ``bench/cost_table.py``
  writes from ``bench/results/`` now.

No root, no kernel: imports, parsing and file reads, a second or two.
"""
from __future__ import annotations

import ast
import importlib
import inspect
import re
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from conftest import ROOT

ARCH = ROOT / "docs" / "architecture.md"
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
PACKAGE_DIRS = ("core", "controller", "bpf", "actuators", "simulations", "policies")   # reflexarc.<dir>

REF = re.compile(r"`(reflexarc(?:\.\w+)+)`")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)


# --- reading the pages ------------------------------------------------------------------------
def prose(text: str) -> str:
    """``text`` without its fenced code blocks."""
    return FENCE.sub("", text)


def section(text: str, heading: str) -> str:
    """The body of the ``## heading`` section (up to the next ``## ``)."""
    match = re.search(rf"^## {re.escape(heading)}[ \t]*\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"no section '## {heading}'"
    return match.group(1)


def table_rows(text: str) -> list[list[str]]:
    """The cells of every row of the Markdown tables in ``text``, header and rule lines left out."""
    rows, previous = [], ""
    for line in text.splitlines():
        if line.startswith("|") and not re.fullmatch(r"\|[\s|:-]+\|", line):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if not previous.startswith("|"):
                previous = line
                continue                       # the header row
            rows.append(cells)
        previous = line
    return rows


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    out, seen = set(), {}
    for heading in HEADING.findall(prose(path.read_text())):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


# --- resolving names ----------------------------------------------------------------------------
def resolve(name: str):
    """The object an import path names: the longest importable module, then attributes."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                raise AttributeError(f"{name}: {'.'.join(parts[:parts.index(attr)])} has no '{attr}'")
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"{name}: no module of it imports")


def names_used(func) -> set[str]:
    """Every name, attribute and one-word string a function's body uses (its docstring left out)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    fn = tree.body[0]
    body = fn.body[1:] if (fn.body and isinstance(fn.body[0], ast.Expr)
                           and isinstance(fn.body[0].value, ast.Constant)
                           and isinstance(fn.body[0].value.value, str)) else fn.body
    used = set()
    for stmt in body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Name):
                used.add(node.id)
            elif isinstance(node, ast.Attribute):
                used.add(node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
                used.add(node.value)
    return used


def data_path() -> list[tuple[str, str]]:
    """(function, called from) of each row of the data-path table."""
    rows = table_rows(section(ARCH.read_text(), "The data path: from a BPF map to a journal line"))
    out = []
    for cells in rows:
        function, caller = REF.fullmatch(cells[1]), REF.fullmatch(cells[2])
        assert function and caller, f"a data-path row names its function and caller as `reflexarc....`: {cells[:3]}"
        out.append((function.group(1), caller.group(1)))
    return out


# --- the architecture page ---------------------------------------------------------------------
def test_every_named_function_exists():
    names = sorted(set(REF.findall(ARCH.read_text())))
    assert len(names) >= 40, f"the architecture page names only {len(names)} functions"
    missing = []
    for name in names:
        try:
            resolve(name)
        except (ImportError, AttributeError) as exc:
            missing.append(str(exc))
    assert not missing, "docs/architecture.md names what the code no longer has:\n" + "\n".join(missing)


def test_each_step_of_the_data_path_calls_the_next():
    rows = data_path()
    assert len(rows) >= 25
    functions = [f for f, _ in rows]
    for end in ("reflexarc.bpf.maps.drain_hists", "reflexarc.controller.engine.bus.SignalBus.publish",
                "reflexarc.controller.engine.lifecycle.RuleRun.step", "reflexarc.controller.engine.journal.Journal.intent",
                "reflexarc.controller.engine.journal.Journal.mark", "reflexarc.controller.engine.audit.AuditLog.write"):
        assert end in functions, f"the data path no longer passes through {end}"
    wrong = [f"{caller} does not call {function.rsplit('.', 1)[1]} ({function})"
             for function, caller in rows
             if function.rsplit(".", 1)[1] not in names_used(resolve(caller))]
    assert not wrong, "docs/architecture.md's data path:\n" + "\n".join(wrong)
    entries = {caller for _, caller in rows} - set(functions)
    assert len(entries) <= 2, f"the data path is not one story: it starts from {sorted(entries)}"


def test_the_check_of_calls_can_fail():
    assert "_act" in names_used(resolve("reflexarc.controller.engine.engine.Controller._carry_out"))
    assert "mark" not in names_used(resolve("reflexarc.controller.engine.journal.Journal.intent"))
    with pytest.raises(AttributeError):
        resolve("reflexarc.controller.engine.engine.Controller.no_such_method")


# --- layers -------------------------------------------------------------------------------------
def layer_table() -> dict[str, tuple[str, ...]]:
    """Layer folder -> the folders and files it may import, from the architecture page."""
    table = {}
    for cells in table_rows(section(ARCH.read_text(), "Layers")):
        if len(cells) != 4:
            continue                               # the table of other folders
        layer = re.findall(r"`([^`]+/)`", cells[0])
        assert len(layer) == 1, f"a layer row names one folder: {cells[0]}"
        table[layer[0]] = tuple(re.findall(r"`([^`]+)`", cells[3]))
    assert table, "no layer table in docs/architecture.md"
    return table


def layer_of(path: str, layers) -> str | None:
    return max((layer for layer in layers if path.startswith(layer)), key=len, default=None)


def module_path(module: str) -> str | None:
    """``reflexarc.controller.signals.catalogue`` -> ``controller/signals/catalogue.py``; a package -> its folder with a slash."""
    parts = module.split(".")
    if parts[0] != "reflexarc" or len(parts) < 2 or parts[1] not in PACKAGE_DIRS:
        return None
    rel = "/".join(parts[1:])
    if (ROOT / f"{rel}.py").is_file():
        return f"{rel}.py"
    return f"{rel}/"


def imports_of(path: Path, source: str | None = None) -> set[str]:
    """Repository paths of every reflexarc module ``path`` (or ``source``, as if it
    were that file) imports, wherever in the file."""
    rel = path.relative_to(ROOT)
    package = ["reflexarc", *rel.parent.parts]
    out = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            targets = []
            for alias in node.names:                  # ``from pkg import module`` names the module
                sub = module_path(f"{module}.{alias.name}")
                targets.append(f"{module}.{alias.name}" if sub and sub.endswith(".py") else module)
        else:
            continue
        out |= {p for p in map(module_path, targets) if p is not None}
    return out


def allowed(target: str, own: str, rules: tuple[str, ...], layers) -> bool:
    if layer_of(target, layers) == own:
        return True
    return any(target.startswith(rule) if rule.endswith("/") else target == rule for rule in rules)


def test_layers_never_import_upward():
    layers = layer_table()
    assert set(PACKAGE_DIRS) <= {layer.split("/")[0] for layer in layers}
    wrong = []
    for top in PACKAGE_DIRS:
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            own = layer_of(rel, layers)
            assert own is not None, f"{rel} is in no layer of docs/architecture.md"
            for target in sorted(imports_of(path)):
                if not allowed(target, own, layers[own], layers):
                    wrong.append(f"{rel} ({own}) imports {target}")
    assert not wrong, "imports the layer table of docs/architecture.md does not allow:\n" + "\n".join(wrong)


def test_modules_a_lower_layer_reads_do_not_read_it_back():
    layers = layer_table()
    wrong = []
    for layer, rules in layers.items():
        for rule in rules:
            if rule.endswith(".py"):
                wrong += [f"{rule} imports {t}, of {layer}" for t in imports_of(ROOT / rule) if t.startswith(layer)]
    assert not wrong, "\n".join(wrong)


def test_the_layer_check_can_fail():
    layers = layer_table()
    assert not allowed("controller/engine/engine.py", "bpf/", layers["bpf/"], layers)
    assert not allowed("controller/engine/engine.py", "controller/policy/", layers["controller/policy/"], layers)
    assert allowed("controller/signals/catalogue.py", "controller/policy/", layers["controller/policy/"], layers)
    source = "def f():\n    from ..controller.engine import engine\n    import reflexarc.bpf.maps\n"
    assert imports_of(ROOT / "core" / "units.py", source) == {"controller/engine/engine.py", "bpf/maps.py"}


# --- links --------------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue                                   # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading '#{anchor}' in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


OWN_PAGES = [README, ARCH, BENCHMARKS, ROOT / "docs" / "security.md"]
REPO_PATH = re.compile(r"`((?:core|controller|bpf|actuators|simulations|policies|tests|bench|deploy|docs|scripts)"
                       r"/[^`\s<>*]*)`")


@pytest.mark.parametrize("page", OWN_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_files_named_exist(page):
    """A file or folder named in code form (`controller/engine/journal.py`) exists; patterns
    (`bpf/<name>.py`, `policies/*.yaml`) are left out."""
    missing = sorted({p for p in REPO_PATH.findall(page.read_text()) if not (ROOT / p).exists()})
    assert not missing, f"{page.relative_to(ROOT)} names files that do not exist: {missing}"


def test_slugs_are_githubs():
    assert slug("Measured under faults: `make soak`") == "measured-under-faults-make-soak"
    assert slug("The whole cost, beside the peers' published figures") == \
        "the-whole-cost-beside-the-peers-published-figures"
    assert slug("`requires`: what a node must have") == "requires-what-a-node-must-have"


# --- the README ---------------------------------------------------------------------------------
def test_readme_policy_is_the_shipped_one_and_loads(tmp_path):
    from reflexarc.controller.policy.loader import validate_paths
    text = section(README.read_text(), "A policy")
    block = re.search(r"```yaml\n(.*?)```", text, re.DOTALL)
    assert block, "the README shows no policy"
    shipped = re.search(r"`(policies/[\w.-]+\.yaml)`", text)
    assert shipped, "the README names the file its policy comes from"
    file = tmp_path / "readme.yaml"
    file.write_text(block.group(1))
    policies, diagnostics = validate_paths([str(file)])
    assert not [d for d in diagnostics if d.is_error], [str(d) for d in diagnostics]
    assert len(policies) == 1
    shown = yaml.safe_load(block.group(1))["policies"][0]
    real = yaml.safe_load((ROOT / shipped.group(1)).read_text())["policies"][0]
    real.pop("description", None)
    assert shown == real, f"the README's policy differs from {shipped.group(1)}"


def test_readme_is_a_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    assert "make test" in text and re.search(r"^make test\b", (ROOT / ".ci" / "run").read_text(), re.MULTILINE)
    linked = {(README.parent / target.partition("#")[0]).resolve() for target in LINK.findall(prose(text))}
    unlinked = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not unlinked, f"README.md does not link {unlinked}"
    for verb in (r"status\b", r"pause\b", r"resume\b", r"top\b", r"journal \[?--check\b"):
        assert re.search(rf"^reflexarc {verb}", text, re.MULTILINE), f"the README's commands lack {verb}"


# --- benchmarks ---------------------------------------------------------------------------------
def test_benchmarks_page_holds_the_current_cost_table():
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import cost_table
    finally:
        sys.path.remove(str(ROOT / "bench"))
    rendered = cost_table.markdown(cost_table.build(cost_table.RESULTS)).strip()
    assert rendered in BENCHMARKS.read_text(), \
        "docs/benchmarks.md's cost table is not what bench/cost_table.py writes from bench/results/ now"
