"""The host side of a GPU node (issue 36): what keeps training from filling its host.

Slurm owns the hard part: ``ConstrainCores`` (a job's processes only on its allocated CPUs)
and ``ConstrainRAMSpace`` (its memory at what it asked for); ``slurmiso gen cgroup-conf``
writes both. slurmiso's class quotas (``classes[].host``, written by the node agent) lower a
training job's CPU and IO weight and set its ``memory.high``, which needs cgroup v2: Slurm's
cgroup/v1 makes a job no ``cpu`` or ``blkio`` directory (measured on the sandbox).
"""

from __future__ import annotations

from typing import List

from slurmiso.config.model import Config
from slurmiso.doctor import Check, Finding, Snapshot
from slurmiso.doctor.cluster import conf

GEN = "slurmiso gen cgroup-conf -o /etc/slurm/cgroup.conf; restart slurmd"


def check_host_constraints(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Without Slurm's CPU and memory constraint a training job can take its whole host."""
    if not cfg.pools or not snap.get("config"):
        return []
    out: List[Finding] = []
    for key, what in (("ConstrainCores", "every CPU of its node"),
                      ("ConstrainRAMSpace", "all of its node's memory")):
        if conf(snap, key).lower() != "yes":
            out.append(Finding("warning", "host-constrain",
                               f"{key} is not yes in cgroup.conf: a training job can take "
                               f"{what}, and the inference beside it waits for the host "
                               "(docs/host-contention.md)", GEN))
    return out


def check_host_quotas(snap: Snapshot, cfg: Config) -> List[Finding]:
    """A class quota on a node whose Slurm cannot carry it."""
    classes = [c.name for c in cfg.classes if c.host.any()]
    if not classes or not snap.get("config"):
        return []
    plugin = conf(snap, "CgroupPlugin").lower()
    if plugin == "cgroup/v2":
        return [Finding("info", "host-quota",
                        f"class(es) {', '.join(classes)}: host quotas are written by the node "
                        "agent into each job's cgroup within one of its rounds after the job "
                        "starts (the node's journal says host-quota)", "")]
    return [Finding("info", "host-quota",
                    f"class(es) {', '.join(classes)} have host quotas, but CgroupPlugin="
                    f"{plugin or '(unset)'}: Slurm's cgroup/v1 makes a job no cpu or blkio "
                    "cgroup, so the node agent has nothing to write them to; ConstrainCores "
                    "is the host's CPU fence here",
                    "run GPU nodes on cgroup v2 (CgroupPlugin=cgroup/v2) for the quotas")]


CHECKS: List[Check] = [check_host_constraints, check_host_quotas]
