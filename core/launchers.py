"""A training process's job and rank from what its launcher put in its
environment, keeping only the keys recognised here.

Launchers announce the job to the processes they start (``/proc/PID/environ``
holds the environment at exec, readable by root):

==============  =============================================================
launcher        keys
==============  =============================================================
torchrun        ``TORCHELASTIC_RUN_ID``, ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``,
                ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``,
                ``TORCHELASTIC_RESTART_COUNT`` (Kubeflow adds ``PET_*``)
accelerate      torchrun's, plus ``ACCELERATE_*`` (only their presence is kept)
deepspeed       ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``MASTER_*``,
                ``CROSS_RANK``, ``CROSS_SIZE``, ``LOCAL_SIZE`` (no job id)
Slurm           ``SLURM_JOB_ID``, ``SLURM_STEP_ID``, ``SLURM_PROCID``,
                ``SLURM_LOCALID``, ``SLURM_NTASKS``, ``SLURM_NODEID``
Open MPI        ``OMPI_COMM_WORLD_RANK``, ``..._LOCAL_RANK``, ``..._SIZE``,
                ``OMPI_MCA_ess_base_jobid``
PMIx            ``PMIX_RANK``, ``PMIX_NAMESPACE``
==============  =============================================================

The job id, in this order: Slurm's job (``slurm-<SLURM_JOB_ID>``, the unit the
scheduler and its users name), torchrun's run id (unless it is ``none``,
torchrun's default), the PMIx namespace, Open MPI's job id, and last the
rendezvous ``MASTER_ADDR:MASTER_PORT`` (the same on every rank of a job, unique
to it on a node). The rank: ``RANK`` (torchrun, DeepSpeed, Accelerate), then
Open MPI's, PMIx's, Slurm's ``SLURM_PROCID``; likewise the local rank and world
size.

Environments also hold tokens and passwords: ``recognised()`` is the only way
in, and drops every other key before anything else sees the text. A value that
is too long, not text, or not a number where a number belongs makes the whole
environment ``Malformed`` (the caller counts and skips the process).

Example::

    env = recognised(open("/proc/4242/environ", "rb").read())
    launch = from_environ(env)      # Launch(job="llama-7b", rank=3, local_rank=1, world_size=16,
                                    #        launcher="torchrun", evidence=("TORCHELASTIC_RUN_ID", "RANK"))

Overhead: one split of the environment (a few KiB) per process, once per
process lifetime (``core.jobs`` caches by pid and start time).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

JOB_KEYS = ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")
RANK_KEYS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID")
LOCAL_RANK_KEYS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID")
WORLD_KEYS = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS")
OTHER_KEYS = ("MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "SLURM_STEP_ID", "SLURM_NODEID",
              "TORCHELASTIC_RESTART_COUNT", "CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE")
KEYS = frozenset(JOB_KEYS + RANK_KEYS + LOCAL_RANK_KEYS + WORLD_KEYS + OTHER_KEYS)
PRESENCE_PREFIXES = ("ACCELERATE_", "PET_")   # kept as "present", never with their values
NUMERIC = frozenset(RANK_KEYS + LOCAL_RANK_KEYS + WORLD_KEYS + (
    "MASTER_PORT", "GROUP_RANK", "SLURM_NODEID", "TORCHELASTIC_RESTART_COUNT", "CROSS_RANK", "CROSS_SIZE",
    "LOCAL_SIZE"))
MAX_VALUE = 256                                # bytes: no id or host name a launcher sets is longer
MAX_NUMBER = 1 << 24                           # ranks and sizes: no job has 16 M processes
ID_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/+=-]*")


class Malformed(ValueError):
    """A recognised key whose value no launcher would set: the reason, without the value."""


@dataclass(frozen=True)
class Launch:
    job: str
    rank: int | None
    local_rank: int | None
    world_size: int | None
    launcher: str
    evidence: tuple[str, ...]          # the keys the job and rank were read from


def recognised(raw: bytes) -> dict[str, str]:
    """The recognised keys of an environ blob (``KEY=value\\0`` ...), and
    ``{PREFIX: ""}`` for each presence prefix seen; nothing else survives."""
    env: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if not sep:
            continue
        name = key.decode("ascii", errors="replace")
        if name in KEYS:
            if len(value) > MAX_VALUE:
                raise Malformed(f"{name} is {len(value)} bytes long")
            try:
                text = value.decode("ascii")
            except UnicodeDecodeError:
                raise Malformed(f"{name} is not ASCII text") from None
            if name in NUMERIC:
                if not text.isdigit() or int(text) >= MAX_NUMBER:
                    raise Malformed(f"{name} is not a number below {MAX_NUMBER}")
            elif not ID_TEXT.fullmatch(text):
                raise Malformed(f"{name} holds characters no launcher uses")
            env[name] = text
        else:
            for prefix in PRESENCE_PREFIXES:
                if name.startswith(prefix):
                    env[prefix] = ""
    return env


def _first(env: dict[str, str], keys: tuple[str, ...]) -> tuple[str, str] | None:
    return next(((k, env[k]) for k in keys if k in env), None)


def _launcher(env: dict[str, str]) -> str:
    if "ACCELERATE_" in env:
        return "accelerate"
    if "TORCHELASTIC_RUN_ID" in env:
        return "torchrun"
    if "CROSS_RANK" in env or "LOCAL_SIZE" in env:
        return "deepspeed"
    if "OMPI_COMM_WORLD_RANK" in env or "OMPI_MCA_ess_base_jobid" in env:
        return "openmpi"
    if "PMIX_RANK" in env or "PMIX_NAMESPACE" in env:
        return "pmix"
    if "SLURM_JOB_ID" in env:
        return "slurm"
    return "torch.distributed"


def from_environ(env: dict[str, str]) -> Launch | None:
    """The job a recognised environment names, or None when it names none."""
    job_key = _first({k: v for k, v in env.items() if not (k == "TORCHELASTIC_RUN_ID" and v == "none")},
                     JOB_KEYS)
    if job_key is not None:
        key, value = job_key
        job = f"slurm-{value}" if key == "SLURM_JOB_ID" else value
        evidence = [key]
    elif "MASTER_ADDR" in env and "MASTER_PORT" in env and _first(env, RANK_KEYS):
        job, evidence = f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", ["MASTER_ADDR", "MASTER_PORT"]
    else:
        return None
    rank = _first(env, RANK_KEYS)
    if rank:
        evidence.append(rank[0])
    local = _first(env, LOCAL_RANK_KEYS)
    world = _first(env, WORLD_KEYS)
    return Launch(job, int(rank[1]) if rank else None, int(local[1]) if local else None,
                  int(world[1]) if world else None, _launcher(env), tuple(evidence))
