"""The policy-authoring guide (docs/policies.md) stays true: it names every key
of the policy language, every actuator and parameter, every lifecycle
transition; each complete policy file in it loads without a finding, its
policy tests pass, and its `reflexarc explain` sample is what explain prints."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import yaml

from reflexarc.actuators.specs import SPECS
from reflexarc.controller.policy.explain import explain
from reflexarc.controller.engine.lifecycle import STATES, TRANSITIONS
from reflexarc.controller.policy.loader import load_policies, validate_paths
from reflexarc.controller.policy.schema import SECTIONS
from reflexarc.controller.runtime.policy_tests import run_policy_tests
from reflexarc.controller.signals.producers import NodeFacts

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "policies.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(kind: str) -> list[str]:
    return [body for lang, body in FENCE.findall(GUIDE.read_text()) if lang == kind]


def first_key(body: str) -> str:
    """The first line of a block that is not blank or a comment."""
    return next((line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("#")), "")


def policy_files() -> list[str]:
    return [b for b in blocks("yaml") if first_key(b).startswith("policies:")]


def test_guide_names_every_key_of_every_section():
    text = GUIDE.read_text()
    missing = [f"{section}.{key}" for section, spec in SECTIONS.items() for key in spec.keys
               if f"`{key}`" not in text]
    assert not missing, missing


def test_guide_names_every_actuator_and_parameter():
    text = GUIDE.read_text()
    missing = [f"{name}.{param.name}" for name, spec in SPECS.items()
               for param in spec.params if f"`{param.name}`" not in text]
    missing += [name for name in SPECS if f"`{name}`" not in text]
    assert not missing, missing


def test_every_policy_file_in_the_guide_loads_cleanly(tmp_path):
    files = policy_files()
    assert len(files) >= 7, "the guide's complete policy files were not found"
    names = set()
    for i, body in enumerate(files):
        path = tmp_path / f"example-{i}.yaml"
        path.write_text(body)
        policies, diagnostics = validate_paths([str(path)])
        assert not diagnostics, f"block {i}:\n{body}\n" + "\n".join(map(str, diagnostics))
        assert policies, body
        names.update(p.name for p in policies)
    assert {"loader-wait-repin", "upload-scavenger", "nested-conditions", "keep-numa-balancing-off",
            "prefetch-while-running", "gpu-idle-alert", "loader-wait-alert"} <= names


def test_guide_lifecycle_diagram_is_the_state_machine():
    (diagram,) = blocks("mermaid")
    edges = set()
    for line in diagram.splitlines()[1:]:
        match = re.fullmatch(r"\s*(\[\*\]|\w+) --> (\w+)(?: : (\w+).*)?", line)
        assert match, line
        edges.add(match.groups())
    expected = {("[*]", "ok", None)}
    wildcards = set()
    for t in TRANSITIONS:
        if t["source"] == "*":
            wildcards.add(t["trigger"])
            continue
        sources = [t["source"]] if isinstance(t["source"], str) else t["source"]
        expected |= {(source, t["dest"], t["trigger"]) for source in sources}
    assert edges == expected, (edges - expected, expected - edges)
    assert {state for edge in edges for state in edge[:2]} - {"[*]"} == set(STATES)
    text = GUIDE.read_text()
    table = text[text.index("| trigger | from → to | when |"):]
    for trigger in {t["trigger"] for t in TRANSITIONS}:
        assert f"| `{trigger}` |" in table, trigger
    assert wildcards and all(f"| `{trigger}` | any → failed |" in table for trigger in wildcards)


def test_guide_policy_tests_pass(repo_root, tmp_path, capsys):
    """Each policy test file of the guide, run beside the shipped policies and the guide's own."""
    tests = [b for b in blocks("yaml") if first_key(b).startswith("policy:")]
    assert tests, "no policy test file in the guide"
    root = tmp_path / "policies"
    (root / "tests").mkdir(parents=True)
    for shipped in (repo_root / "policies").glob("*.yaml"):
        shutil.copy(shipped, root)
    for body in policy_files():
        for policy in yaml.safe_load(body)["policies"]:
            (root / f"{policy['name']}.yaml").write_text(body)
    for i, body in enumerate(tests):
        (root / "tests" / f"guide-{i}.yaml").write_text(body)
    assert run_policy_tests([str(root / "tests")]) == 0, capsys.readouterr().out
    out = capsys.readouterr().out
    assert "0 failed" in out and "FAIL" not in out and out.count("PASS") >= 2, out


def test_guide_explain_sample_is_what_explain_prints(repo_root, monkeypatch):
    text = GUIDE.read_text()
    sample = next(b for b in blocks("") if b.startswith("dataloader-starvation ("))
    shown = sample.split("  on this node it needs:")[0]       # what follows depends on the node
    monkeypatch.chdir(repo_root)      # the sample names the file as `reflexarc explain policies/` does
    policy = [p for p in load_policies(["policies/"]) if p.name == "dataloader-starvation"]
    actual = explain(policy, NodeFacts(), receiver=False)
    assert actual.startswith(shown), "the sample in docs/policies.md differs from reflexarc explain's output"
    assert "reflexarc explain" in text
