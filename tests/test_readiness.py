"""Every signal a shipped policy reads has a live producer on this node, and
`validate`/`run` say so when one does not (no GPU, no RDMA device, no PromQL
source) or when alerts have no receiver."""
from __future__ import annotations

from types import SimpleNamespace

from conftest import ROOT

from reflexarc.controller.policy.loader import load_policies
from reflexarc.controller.signals.producers import NodeFacts, Producer
from reflexarc.controller.signals.catalogue import why_unproduced
from reflexarc.controller.policy.readiness import CatalogueFacts, findings, idle_reason
from reflexarc.controller.signals.catalogue import CATALOGUE, PRODUCERS
from reflexarc.controller.sources.readers import NvmlSource
from reflexarc.core.devices import Devices

GPU_POLICY = """\
policies:
  - name: gpu-idle
    mode: alert-only
    rules:
      - name: idle
        when: {signal: gpu_utilization_pct, agg: mean, window: 60s, op: "<", threshold: 20}
        actions:
          - {actuator: alert, params: {summary: GPUs idle}}
"""


def test_every_catalogued_signal_declares_its_producers():
    assert set(PRODUCERS) == set(CATALOGUE)
    assert all(PRODUCERS[name] for name in CATALOGUE)


def test_every_shipped_policy_signal_has_a_producer_here():
    """The shipped policies either read signals something on this node emits, or
    declare the device they need (and are idle here, with a note)."""
    policies = load_policies([str(ROOT / "policies")])
    facts = NodeFacts()
    found = findings(policies, facts, receiver=False)
    assert [f for f in found if f.severity != "note"] == [], "\n".join(map(str, found))
    idle = {p.name for p in policies if idle_reason(p, facts)}
    assert idle == {p.name for p in policies if p.requires}
    assert idle <= {"gpu-submit-gap", "rdma-deep-tracing", "rank-straggler", "pcie-aer-alert",
                    "gpu-downtrend-deep-tracing", "device-locality-alert"}


def test_validate_of_the_shipped_policies_prints_no_warning(cli):
    r = cli("validate", str(ROOT / "policies"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "warning:" not in r.stdout + r.stderr
    notes = [line for line in r.stdout.splitlines() if ": note: " in line]
    assert any("gpu-submit-gap requires gpu: idle on this node: no GPU" in n for n in notes), r.stdout


def test_a_gpu_signal_on_a_gpu_less_node_gets_a_located_warning(tmp_path, cli):
    policy = tmp_path / "gpu.yaml"
    policy.write_text(GPU_POLICY)
    r = cli("--webhook-url", "http://127.0.0.1:9/hook", "validate", str(policy))
    assert r.returncode == 0, r.stdout + r.stderr
    [warning] = [line for line in r.stdout.splitlines() if "warning:" in line]
    assert warning.startswith(f"{policy}:6:15: warning: signal 'gpu_utilization_pct' has no producer on this "
                              "node: NVML: no GPU"), warning
    assert "a PromQL source: no PromQL source configured" in warning
    strict = cli("--webhook-url", "http://127.0.0.1:9/hook", "validate", "--strict", str(policy))
    assert strict.returncode == 1 and f"{policy}:6:15: error: signal 'gpu_utilization_pct'" in strict.stdout
    assert "Traceback" not in strict.stderr


def test_an_alert_without_receiver_is_a_warning_at_validate(tmp_path, cli):
    policy = tmp_path / "gpu.yaml"
    policy.write_text(GPU_POLICY.replace("    rules:", "    requires: [gpu]\n    rules:"))
    r = cli("validate", str(policy))
    assert r.returncode == 0 and "warning:" not in r.stdout, r.stdout   # idle here: nothing would send
    policy.write_text(GPU_POLICY.replace("gpu_utilization_pct", "step_time_ms"))
    r = cli("validate", str(policy))
    [warning] = [line for line in r.stdout.splitlines() if "warning:" in line]
    assert warning == (f"{policy}:2:5: warning: policy gpu-idle (alert-only) sends alerts, but no alert receiver "
                       "is configured: give --alertmanager-url or --webhook-url")


def test_unknown_required_device_is_a_located_error(tmp_path, cli):
    policy = tmp_path / "x.yaml"
    policy.write_text(GPU_POLICY.replace("    rules:", "    requires: [tpu]\n    rules:"))
    r = cli("validate", str(policy))
    assert r.returncode == 1
    assert f"{policy}:4:16: error: unknown device 'tpu' in 'requires' (known: gpu, rdma, pcie_aer)" in r.stdout


def test_devices_are_read_from_the_given_roots(tmp_path):
    dev, sys_root = tmp_path / "dev", tmp_path / "sys"
    (dev).mkdir()
    (dev / "nvidiactl").touch()                      # a control node is not a GPU
    devices = Devices(dev_root=str(dev), sys_root=str(sys_root))
    assert devices.missing("gpu").startswith("no GPU") and devices.missing("rdma").startswith("no RDMA device")
    (dev / "nvidia0").touch()
    (sys_root / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    assert devices.missing("gpu") is None and devices.missing("rdma") is None
    facts = NodeFacts(devices)
    assert facts.why_not(Producer("probe", "gpu_submit", device="gpu")) is None
    assert why_unproduced("gpu_utilization_pct", NodeFacts(devices, promql=True)) is None


def test_catalogue_facts_judge_from_the_catalogue_and_the_given_promql_configuration(tmp_path):
    """Without this node (a user who is not root): no device, probe, interface or
    job finding; a PromQL requirement and an alert with no receiver still are."""
    policy = tmp_path / "x.yaml"
    policy.write_text(GPU_POLICY.replace("    rules:", "    requires: [gpu]\n    selector: {interfaces: [nosuch0], "
                                         "jobs: [nosuch]}\n    rules:"))
    policies = load_policies([str(policy)])
    facts = CatalogueFacts("not root")
    assert idle_reason(policies[0], facts) is None
    assert [(f.severity, f.message) for f in findings(policies, facts, receiver=False)] == [
        ("warning", "policy gpu-idle (alert-only) sends alerts, but no alert receiver is configured: give "
                    "--alertmanager-url or --webhook-url")]
    node = NodeFacts(Devices(dev_root=str(tmp_path), sys_root=str(tmp_path)), jobs=("llama",))
    seen = {f.message.split(":")[0] for f in findings(policies, node, receiver=False)}
    assert seen == {"policy gpu-idle requires gpu"}, seen            # the same file, this node: idle
    assert facts.why_not(Producer("probe", "gpu_submit", device="gpu")) is None
    assert why_unproduced("rank_pre_collective_ratio", facts) == "a PromQL source: no PromQL source configured"
    assert facts.missing("promql") == "no PromQL source configured" and facts.missing("gpu") is None
    assert facts.note().startswith("note: not root: this node's checks skipped (")


def test_validate_as_root_checks_this_node_and_says_no_note(tmp_path, cli):
    policy = tmp_path / "gpu.yaml"
    policy.write_text(GPU_POLICY.replace("    rules:", "    requires: [gpu]\n    rules:"))
    r = cli("--sys-root", str(tmp_path), "validate", str(policy))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "note: not root" not in r.stderr and "idle on this node: no GPU" in r.stdout, r.stdout + r.stderr


class StandInNvml(SimpleNamespace):
    """Answers the pynvml calls NvmlSource makes. A stand-in because no GPU and
    no NVIDIA driver exist on the test machines; the source's own logic (one
    sample per GPU, a failing GPU skipped) is what is tested."""

    class NVMLError(Exception):
        pass

    def __init__(self, utilisation):
        super().__init__(utilisation=utilisation, calls=[])

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self):
        return len(self.utilisation)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetUtilizationRates(self, handle):
        if self.utilisation[handle] is None:
            raise self.NVMLError("GPU is lost")
        return SimpleNamespace(gpu=self.utilisation[handle], memory=0)


def test_nvml_source_publishes_one_sample_per_working_gpu():
    nvml = StandInNvml([97, None, 12])
    source = NvmlSource(nvml, job="llama")
    assert source.poll(1.0) == [("gpu_utilization_pct", {"gpu": "0", "job": "llama"}, 97.0),
                                ("gpu_utilization_pct", {"gpu": "2", "job": "llama"}, 12.0)]
    source.close()
    assert nvml.calls == ["init", "shutdown"]
