"""Run a command inside the sandbox a systemd service unit describes, without systemd.

``tests/test_deploy.py`` uses it to run the real controller under the
restrictions of ``deploy/systemd/reflexarc.service`` on a machine whose PID 1
is not systemd: what the unit forbids, the controller must not need. It
applies, in a child process, before exec, the directives below the way systemd
252 does; every other directive is left out (``EMULATED`` lists those applied):

- ``CapabilityBoundingSet``: the other capabilities leave the bounding set, so
  root's exec gets only these (systemd does the same for ``User=root``).
- ``NoNewPrivileges``, ``UMask``, ``LimitMEMLOCK``.
- ``SystemCallFilter`` (an allow-list; groups expanded by ``systemd-analyze
  syscall-filter``) with ``SystemCallErrorNumber``; ``SystemCallArchitectures=native``
  (the filter covers the native architecture only and kills on any other).
- ``MemoryDenyWriteExecute``: EPERM for mmap with PROT_WRITE|PROT_EXEC,
  mprotect/pkey_mprotect adding PROT_EXEC and shmat with SHM_EXEC.
- ``RestrictAddressFamilies`` (EAFNOSUPPORT for socket() of other families),
  ``RestrictNamespaces`` (EPERM for unshare/clone/setns of other kinds).
- ``ProtectSystem=strict``, ``ReadWritePaths`` (``-`` prefix: skipped when
  absent), ``ProtectKernelTunables``, ``ProtectControlGroups``, ``ProtectHome``
  (``yes``: an empty read-only tmpfs; ``read-only``) and ``PrivateTmp`` in a
  private mount namespace; ``--rw PATH`` stands for ``StateDirectory=`` and
  ``RuntimeDirectory=`` (paths a test picks instead of /var/lib and /run).

Seccomp filters are built with libseccomp (libseccomp2, which systemd itself
links) through ctypes.

Usage::

    python tests/unit_sandbox.py UNIT [--rw PATH]... [--ro PATH]... -- COMMAND [ARGS...]

Overhead: one ``systemd-analyze syscall-filter`` run and a few dozen mount
calls before exec; nothing afterwards.
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import errno
import os
import resource
import subprocess
import sys

EMULATED = ("CapabilityBoundingSet", "NoNewPrivileges", "UMask", "LimitMEMLOCK", "SystemCallFilter",
            "SystemCallErrorNumber", "SystemCallArchitectures", "MemoryDenyWriteExecute",
            "RestrictAddressFamilies", "RestrictNamespaces", "ProtectSystem", "ReadWritePaths",
            "ProtectKernelTunables", "ProtectControlGroups", "ProtectHome", "PrivateTmp")

CAPS = ("CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
        "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
        "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER",
        "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT",
        "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME",
        "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE", "CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL",
        "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM",
        "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE")

FAMILIES = {"AF_UNIX": 1, "AF_LOCAL": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16, "AF_PACKET": 17}
NAMESPACES = {"cgroup": 0x02000000, "ipc": 0x08000000, "net": 0x40000000, "mnt": 0x00020000,
              "pid": 0x20000000, "user": 0x10000000, "uts": 0x04000000}

PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
CLONE_NEWNS = 0x00020000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 0x1, 0x2, 0x4, 0x8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 0x20, 0x1000, 0x4000, 0x40000
O_PATH = getattr(os, "O_PATH", 0o10000000)

SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_NE, SCMP_CMP_EQ, SCMP_CMP_MASKED_EQ = 1, 4, 7
PROT_WRITE, PROT_EXEC, SHM_EXEC = 0x2, 0x4, 0o100000


def SCMP_ACT_ERRNO(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class SandboxError(Exception):
    pass


# --- the unit file ----------------------------------------------------------------
def parse_unit(text: str) -> dict[str, dict[str, list[str]]]:
    """Section -> key -> values in order, as systemd reads them: ``#``/``;``
    comments, ``\\`` continuations, repeated keys accumulate and an empty
    assignment resets the list."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in "#;"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        if current is None or "=" not in line:
            raise SandboxError(f"not a unit file line: {raw!r}")
        key, value = (part.strip() for part in line.split("=", 1))
        if value:
            current.setdefault(key, []).append(value)
        else:
            current[key] = []
    return sections


def _words(service: dict[str, list[str]], key: str) -> list[str]:
    return [w for value in service.get(key, []) for w in value.split()]


def _last(service: dict[str, list[str]], key: str, default: str = "") -> str:
    values = service.get(key) or [default]
    return values[-1]


def _bool(service: dict[str, list[str]], key: str) -> bool:
    return _last(service, key, "no").lower() in ("yes", "true", "on", "1")


# --- system call filters ---------------------------------------------------------------
def syscall_groups() -> dict[str, list[str]]:
    """``@group`` -> members, from ``systemd-analyze syscall-filter``."""
    out = subprocess.run(["systemd-analyze", "syscall-filter"], capture_output=True, text=True, check=True).stdout
    groups: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        word = line.strip()
        if not word or word.startswith("#"):
            continue
        if not line.startswith((" ", "\t")):
            current = groups.setdefault(word, [])
        elif current is not None:
            current.append(word)
    return groups


def expand(names: list[str], groups: dict[str, list[str]]) -> set[str]:
    out: set[str] = set()
    todo = list(names)
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name.startswith("@"):
            if name not in groups:
                raise SandboxError(f"unknown system call group {name}")
            todo.extend(groups[name])
        else:
            out.add(name)
    return out


class _Arg(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64),
                ("datum_b", ctypes.c_uint64)]


class Seccomp:
    """One libseccomp filter context (native architecture only)."""

    def __init__(self, default_action: int) -> None:
        path = ctypes.util.find_library("seccomp")
        if not path:
            raise SandboxError("libseccomp (Debian package libseccomp2) is not installed")
        self.lib = ctypes.CDLL(path, use_errno=True)
        self.lib.seccomp_init.restype = ctypes.c_void_p
        self.lib.seccomp_init.argtypes = [ctypes.c_uint32]
        self.lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
        self.lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int,
                                                    ctypes.c_uint, ctypes.POINTER(_Arg)]
        self.lib.seccomp_load.argtypes = [ctypes.c_void_p]
        self.ctx = self.lib.seccomp_init(default_action)
        if not self.ctx:
            raise SandboxError("seccomp_init failed")

    def nr(self, name: str) -> int | None:
        nr = self.lib.seccomp_syscall_resolve_name(name.encode())
        return None if nr < 0 else nr

    def rule(self, action: int, name: str, *args: tuple[int, int, int, int]) -> None:
        nr = self.nr(name)
        if nr is None:            # not a system call of this architecture
            return
        arr = (_Arg * max(1, len(args)))(*[_Arg(*a) for a in args])
        rc = self.lib.seccomp_rule_add_array(self.ctx, action, nr, len(args), arr)
        if rc < 0 and rc != -errno.EEXIST:
            raise SandboxError(f"seccomp rule for {name}: {os.strerror(-rc)}")

    def load(self) -> None:
        rc = self.lib.seccomp_load(self.ctx)
        if rc < 0:
            raise SandboxError(f"seccomp_load: {os.strerror(-rc)}")


def _errno_of(service) -> int:
    name = _last(service, "SystemCallErrorNumber", "")
    if not name:
        return 0
    return getattr(errno, name) if not name.isdigit() else int(name)


def seccomp_filters(service) -> list[Seccomp]:
    """The filters the directives make; the SystemCallFilter= allow-list, if any, first."""
    filters = []
    allowed = _words(service, "SystemCallFilter")
    if allowed:
        if allowed[0].startswith("~"):
            raise SandboxError("only allow-list SystemCallFilter= is emulated")
        code = _errno_of(service)
        f = Seccomp(SCMP_ACT_ERRNO(code) if code else 0x80000000)      # else SCMP_ACT_KILL_PROCESS
        names = expand(allowed, syscall_groups())
        # systemd always allows what it needs to exec the command
        names |= {"execve", "exit", "exit_group", "rt_sigreturn", "sigreturn", "getrlimit", "setrlimit"}
        for name in sorted(names):
            f.rule(SCMP_ACT_ALLOW, name)
        filters.append(f)
    if _bool(service, "MemoryDenyWriteExecute"):
        f = Seccomp(SCMP_ACT_ALLOW)
        deny = SCMP_ACT_ERRNO(errno.EPERM)
        for name in ("mmap", "mmap2"):
            f.rule(deny, name, (2, SCMP_CMP_MASKED_EQ, PROT_WRITE | PROT_EXEC, PROT_WRITE | PROT_EXEC))
        for name, arg in (("mprotect", 2), ("pkey_mprotect", 2)):
            f.rule(deny, name, (arg, SCMP_CMP_MASKED_EQ, PROT_EXEC, PROT_EXEC))
        f.rule(deny, "shmat", (2, SCMP_CMP_MASKED_EQ, SHM_EXEC, SHM_EXEC))
        filters.append(f)
    families = _words(service, "RestrictAddressFamilies")
    if families:
        keep = {FAMILIES[name] for name in families}
        f = Seccomp(SCMP_ACT_ALLOW)
        for family in range(1, 46):
            if family not in keep:
                f.rule(SCMP_ACT_ERRNO(errno.EAFNOSUPPORT), "socket", (0, SCMP_CMP_EQ, family, 0))
        filters.append(f)
    kinds = _words(service, "RestrictNamespaces")
    if kinds and kinds != ["no"]:
        allow = 0 if kinds == ["yes"] else sum(NAMESPACES[k] for k in kinds)
        f = Seccomp(SCMP_ACT_ALLOW)
        deny = SCMP_ACT_ERRNO(errno.EPERM)
        for kind, flag in NAMESPACES.items():
            if not flag & allow:
                f.rule(deny, "unshare", (0, SCMP_CMP_MASKED_EQ, flag, flag))
                f.rule(deny, "clone", (0, SCMP_CMP_MASKED_EQ, flag, flag))
                f.rule(deny, "setns", (1, SCMP_CMP_MASKED_EQ, flag, flag))
        if allow != sum(NAMESPACES.values()):
            f.rule(deny, "setns", (1, SCMP_CMP_EQ, 0, 0))      # nstype 0 could join any kind
        # clone3 keeps its flags in memory seccomp cannot read: systemd answers ENOSYS, glibc falls back to clone
        f.rule(SCMP_ACT_ERRNO(errno.ENOSYS), "clone3")
        filters.append(f)
    return filters


# --- the file system ------------------------------------------------------------------
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = (lambda s: s.encode() if s is not None else None)
    if _libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"mount {source} on {target} (flags {flags:#x}): {os.strerror(err)}")


def _mounts() -> list[tuple[str, int]]:
    """(mount point, per-mount flags to keep) of every mount, parents first."""
    out = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            point = fields[4].encode().decode("unicode_escape")
            opts = fields[5].split(",")
            keep = ((MS_NOSUID if "nosuid" in opts else 0) | (MS_NODEV if "nodev" in opts else 0)
                    | (MS_NOEXEC if "noexec" in opts else 0))
            out.append((point, keep))
    return sorted(set(out), key=lambda m: m[0].count("/") if m[0] != "/" else 0)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _remount_ro(point: str, keep: int) -> None:
    try:
        _mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | keep)
    except SandboxError:
        if not os.path.exists(point):       # a mount hidden under another one
            return
        raise


def protect_filesystem(service, rw_extra: list[str], ro_extra: list[str] = ()) -> None:
    strict = _last(service, "ProtectSystem", "no") == "strict"
    tunables = _bool(service, "ProtectKernelTunables")
    cgroups = _bool(service, "ProtectControlGroups")
    home = _last(service, "ProtectHome", "no")
    private_tmp = _bool(service, "PrivateTmp")
    if not (strict or tunables or cgroups or home != "no" or private_tmp):
        return
    if _libc.unshare(CLONE_NEWNS) != 0:
        raise SandboxError(f"unshare(CLONE_NEWNS): {os.strerror(ctypes.get_errno())}")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    # held open before anything is hidden (a path under /tmp), in the new namespace (bind sources must be)
    rw = []
    for path in _words(service, "ReadWritePaths") + rw_extra:
        optional = path.startswith("-")
        path = path.lstrip("-")
        if not os.path.exists(path):
            if optional:
                continue
            raise SandboxError(f"ReadWritePaths={path}: no such file or directory")
        rw.append((path, os.open(path, O_PATH), os.path.isdir(path)))
    # the install (a checkout under /tmp, say) stays visible, read-only, as /opt would be
    shown = [(path, os.open(path, O_PATH)) for path in ro_extra]
    if tunables:
        _mount("/proc/sys", "/proc/sys", None, MS_BIND | MS_REC)      # a mount of its own, to make read-only
    fresh = []
    if private_tmp:
        for tmp in ("/tmp", "/var/tmp"):
            _mount("tmpfs", tmp, "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777")
            fresh.append(tmp)
    if home in ("yes", "true", "tmpfs"):
        for top in ("/home", "/root", "/run/user"):
            if os.path.isdir(top):
                _mount("tmpfs", top, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY, "mode=0755")
                fresh.append(top)
    for point, keep in _mounts():
        if any(_under(point, f) for f in fresh):
            continue
        api = _under(point, "/proc") or _under(point, "/sys") or _under(point, "/dev")
        ro = ((strict and not api) or (tunables and (_under(point, "/sys") or _under(point, "/proc/sys")))
              or (cgroups and _under(point, "/sys/fs/cgroup"))
              or (home == "read-only" and any(_under(point, t) for t in ("/home", "/root", "/run/user"))))
        if ro:
            _remount_ro(point, keep)
    for path, fd, is_dir in rw:
        if not os.path.exists(path):        # under a fresh tmpfs: make the mount point
            if is_dir:
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                open(path, "a").close()
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV)
        os.close(fd)
    for path, fd in shown:
        if any(_under(path, f) for f in fresh):       # hidden by a fresh tmpfs: bind it back
            os.makedirs(path, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
            _mount(None, path, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
        os.close(fd)


# --- the rest ----------------------------------------------------------------------------
def restrict_capabilities(service) -> None:
    keep = _words(service, "CapabilityBoundingSet")
    if not keep:
        return
    if keep[0].startswith("~"):
        raise SandboxError("only a positive CapabilityBoundingSet= is emulated")
    unknown = set(keep) - set(CAPS)
    if unknown:
        raise SandboxError(f"unknown capabilities: {', '.join(sorted(unknown))}")
    last = int(open("/proc/sys/kernel/cap_last_cap").read())
    for number in range(last + 1):
        name = CAPS[number] if number < len(CAPS) else f"cap_{number}"
        if name not in keep and _libc.prctl(PR_CAPBSET_DROP, number, 0, 0, 0) != 0:
            raise SandboxError(f"dropping {name}: {os.strerror(ctypes.get_errno())}")


def enter(service, rw_extra: list[str], ro_extra: list[str] = ()) -> None:
    """Apply the emulated directives to this process (it must exec next)."""
    limit = _last(service, "LimitMEMLOCK", "")
    if limit:
        value = resource.RLIM_INFINITY if limit == "infinity" else int(limit)
        try:
            resource.setrlimit(resource.RLIMIT_MEMLOCK, (value, value))
        except (ValueError, OSError) as exc:   # a machine that forbids it: BPF on >= 5.11 does not need it
            print(f"unit_sandbox: LimitMEMLOCK={limit} not applied ({exc}); keeping "
                  f"{resource.getrlimit(resource.RLIMIT_MEMLOCK)}", file=sys.stderr)
    umask = _last(service, "UMask", "")
    if umask:
        os.umask(int(umask, 8))
    protect_filesystem(service, rw_extra, ro_extra)
    restrict_capabilities(service)
    filters = seccomp_filters(service)
    if _bool(service, "NoNewPrivileges") or filters:
        if _libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise SandboxError("PR_SET_NO_NEW_PRIVS failed")
    for f in filters[1:] + filters[:1]:       # the allow-list last: it does not allow seccomp(2) itself
        f.load()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--" not in argv:
        print("usage: unit_sandbox.py UNIT [--rw PATH]... [--ro PATH]... -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    split = argv.index("--")
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("unit")
    p.add_argument("--rw", action="append", default=[], help="a path to keep writable (StateDirectory=, ...)")
    p.add_argument("--ro", action="append", default=[],
                   help="an install path to keep visible, read-only, even under PrivateTmp (a checkout in /tmp)")
    args, command = p.parse_args(argv[:split]), argv[split + 1:]
    if not command:
        p.error("give a command after --")
    with open(args.unit) as fh:
        service = parse_unit(fh.read()).get("Service", {})
    try:
        enter(service, args.rw, args.ro)
    except SandboxError as exc:
        print(f"unit_sandbox: {exc}", file=sys.stderr)
        return 125
    os.execvp(command[0], command)
    return 127


if __name__ == "__main__":
    sys.exit(main())
