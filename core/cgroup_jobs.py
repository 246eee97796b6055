"""A process's pod, container or Slurm job from the cgroup it sits in.

Kubelet lays pods out one of two ways, on cgroup v1 (each controller's
hierarchy) and v2 (the unified one) alike, sometimes below a prefix (a node
that itself runs in a container):

- systemd driver: ``kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<UID>.slice/<runtime>-<ID>.scope``,
  the UID's ``-`` written ``_``; Guaranteed pods have no ``<qos>`` level; runtime
  ``cri-containerd``, ``crio`` or ``docker`` (``crio-conmon-<ID>`` is CRI-O's
  monitor, not the container);
- cgroupfs driver: ``kubepods/<qos>/pod<UID>/<ID>`` (no ``<qos>`` for Guaranteed).

Slurm puts each job step in its own cgroup: v2
``system.slice/slurmstepd.scope/job_<id>/step_<step>/...``, v1
``<controller>/slurm/uid_<uid>/job_<id>/step_<step>/...`` (or ``slurm_<node>``
with several slurmd on a node).

Example::

    place = from_cgroups(["/kubepods.slice/kubepods-burstable.slice/"
                          "kubepods-burstable-pod1b2c..._..slice/cri-containerd-ab12....scope"])
    place.pod, place.container          # "1b2c...-...", "ab12..."
    from_cgroups(["/system.slice/slurmstepd.scope/job_42/step_0/user/task_0"]).slurm_job   # "42"

Overhead: a few regular-expression searches per cgroup line, once per process.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
SYSTEMD_POD = re.compile(rf"kubepods(?:-(?P<qos>besteffort|burstable))?-pod(?P<uid>{_UID})\.slice")
SYSTEMD_CONTAINER = re.compile(r"/(?:cri-containerd|crio|docker)-(?P<id>[0-9a-f]{64})\.scope(?:/|$)")
CGROUPFS_POD = re.compile(rf"/kubepods(?:/(?P<qos>besteffort|burstable))?/pod(?P<uid>{_UID})"
                          r"(?:/(?P<id>[0-9a-f]{64}))?(?:/|$)")
SLURM = re.compile(r"/slurm[^/]*/(?:.*/)?job_(?P<job>\d+)(?:/step_(?P<step>[A-Za-z0-9_.]+))?(?:/|$)")


@dataclass(frozen=True)
class Placement:
    cgroup: str                     # the cgroup path the placement was read from
    pod: str = ""                   # Kubernetes pod UID, with dashes
    container: str = ""             # container ID (64 hex digits)
    qos: str = ""                   # "besteffort", "burstable" or "" (Guaranteed)
    slurm_job: str = ""
    slurm_step: str = ""
    evidence: str = ""              # "kubelet systemd cgroup", "kubelet cgroupfs cgroup", "slurm cgroup"


def _slurm_path(path: str) -> bool:
    return "/slurm" in path


def placement(path: str) -> Placement | None:
    """The pod or Slurm job one cgroup path names, or None."""
    m = SYSTEMD_POD.search(path)
    if m:
        c = SYSTEMD_CONTAINER.search(path)
        return Placement(path, pod=m.group("uid").replace("_", "-"), container=c.group("id") if c else "",
                         qos=m.group("qos") or "", evidence="kubelet systemd cgroup")
    m = CGROUPFS_POD.search(path)
    if m:
        return Placement(path, pod=m.group("uid").replace("_", "-"), container=m.group("id") or "",
                         qos=m.group("qos") or "", evidence="kubelet cgroupfs cgroup")
    m = SLURM.search(path) if _slurm_path(path) else None
    if m:
        return Placement(path, slurm_job=m.group("job"), slurm_step=m.group("step") or "", evidence="slurm cgroup")
    return None


def from_cgroups(paths: Iterable[str]) -> Placement | None:
    """The first placement any of a process's cgroup paths names (the v2 line and
    the v1 controllers agree on a real node; the most specific one is kept:
    one with a container or a step beats one without)."""
    best = None
    for path in paths:
        place = placement(path)
        if place is not None and (best is None or (place.container or place.slurm_step)
                                  and not (best.container or best.slurm_step)):
            best = place
    return best
