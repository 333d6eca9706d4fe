"""The slurm.conf settings slurmiso relies on, derived from the config (pure, no I/O).

One table, :func:`required_settings`, serves both ``slurmiso gen slurm-conf`` (which prints it
with the reason for every line) and ``slurmiso doctor`` (which checks the live values against
it), so the generator and the checker cannot drift apart.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from slurmiso.config.model import Config, Pool
from slurmiso.slurm import versions

log = logging.getLogger(__name__)

MIG_RECONFIGURED = ("mig-static", "mig-dynamic")
DEFAULT_PREFIX = "/usr/bin"  # the packages' layout; 'gen slurm-conf' passes the live one
#: JobAcctGatherParams=DisableGPUAcct first appeared in Slurm 23.02.7 (Slurm's NEWS); 22.05's
#: slurm.conf(5) does not know it, so it is only generated for a Slurm known to have it. The
#: release table lives in slurmiso.slurm.versions.
DISABLE_GPU_ACCT_SINCE = versions.difference("disable_gpu_acct").since
Version = Optional[Tuple[int, int, int]]
HOOKS = (("Prolog", "slurmiso-prolog"), ("Epilog", "slurmiso-epilog"),
         ("TaskProlog", "slurmiso-task-prolog"))


@dataclass(frozen=True)
class Setting:
    """One slurm.conf line and why slurmiso needs it."""

    key: str
    value: str
    why: str


def gres_types(pools: Sequence[Pool]) -> List[str]:
    """GRES names the pools use, in Slurm's usual order (gpu first)."""
    used = {"gpu"} if pools else set()
    for p in pools:
        if p.mode == "mps":
            used.add("mps")
        elif p.mode in ("mig-dynamic", "timeslice"):
            used.add("shard")
    return [t for t in ("gpu", "mps", "shard") if t in used]


def reconfigures_mig(cfg: Config) -> bool:
    return any(p.mode in MIG_RECONFIGURED for p in cfg.pools)


def has_disable_gpu_acct(version: Version) -> bool:
    return versions.has("disable_gpu_acct", version) is True


def required_settings(cfg: Config, prefix: str = DEFAULT_PREFIX,
                      slurm_version: Version = None) -> List[Setting]:
    """Every cluster-wide setting slurmiso needs on ``slurm_version``, with its reason."""
    types = gres_types(cfg.pools)
    out = [
        Setting("PreemptType", "preempt/qos",
                "infer preempts train by QoS ('slurmiso qos apply' creates the QoS)"),
        Setting("PreemptMode", "REQUEUE",
                "preempted training is requeued; CANCEL silently voids --requeue"),
        Setting("JobRequeue", "1",
                "batch jobs are requeueable by default, so preemption can requeue them"),
    ]
    why = {
        "Prolog": "per-job GPU setup (MIG instance, MPS share, record); on every GPU node",
        "Epilog": "undoes the Prolog's setup exactly and removes leftovers",
        "TaskProlog": "exports the job's MIG UUID, MPS pipe and limits into the job",
    }
    out += [Setting(key, os.path.join(prefix, name), why[key]) for key, name in HOOKS]
    out += [
        Setting("ProctrackType", "proctrack/cgroup",
                "a job's processes live in its cgroup, where its device fence is"),
        Setting("TaskPlugin", "task/cgroup,task/affinity",
                "Slurm's device constraint (with ConstrainDevices=yes in cgroup.conf, "
                "'slurmiso gen cgroup-conf'): a job opens only the GPUs it was given"),
        Setting("PrologFlags", "Alloc",
                "the Prolog runs at allocation, before the job starts (salloc too), so the "
                "GPU is prepared before any step; never RunInJob (24.05+): the Prolog would "
                "run in the job's cgroup, and the MPS daemons it starts die with that job"),
        Setting("GresTypes", ",".join(types), "GRES the pools use"),
        Setting("AccountingStorageTRES", ",".join(f"gres/{t}" for t in types),
                "sacct/audit see GPUs per job (without gres/gpu the count is missing)"),
        Setting("AccountingStorageEnforce", "associations,limits,qos",
                "QoS grants and limits (MaxWall, MaxTRESPerJob) are enforced"),
    ]
    if reconfigures_mig(cfg) and has_disable_gpu_acct(slurm_version):
        out.append(Setting("JobAcctGatherParams", "DisableGPUAcct",
                           "slurmd holding NVML open blocks MIG changes (mig apply, dynamic "
                           "MIG); also keep AcctGatherEnergyType off acct_gather_energy/gpu"))
    out.append(Setting("JobSubmitPlugins", "lua",
                       "submit-time class checks (job_submit.lua from 'slurmiso gen "
                       "job-submit', in the slurm.conf directory)"))
    return out


def _type_counts(cfg: Config, pool: Pool) -> Optional[List[Tuple[str, int]]]:
    """The mig-static pool's ``Gres=gpu:T:N`` types in gres.conf order, from its layout."""
    from slurmiso.errors import SlurmisoError
    from slurmiso.gpu.profiles import lookup_model
    from slurmiso.mig.gres import gpu_type_name, layout_entries, type_counts

    layout = cfg.mig_layout(pool.mig_layout)
    model = lookup_model(pool.gpu_model)
    if layout is None or model is None:
        return None
    try:
        entries = layout_entries(model, layout, pool.gpus_per_node)
    except SlurmisoError as err:
        log.warning("pool %s: %s", pool.name, err)
        return None
    return type_counts(entries, gpu_type_name(pool.gpu_model))


def pool_gres(cfg: Config, pool: Pool) -> str:
    """The ``Gres=`` value a node of ``pool`` must declare ("" when it cannot be derived)."""
    from slurmiso.mig.gres import gpu_type_name

    n = pool.gpus_per_node
    gtype = gpu_type_name(pool.gpu_model)
    if pool.mode == "mig-static":
        counts = _type_counts(cfg, pool)
        return ",".join(f"gpu:{t}:{c}" for t, c in counts) if counts else ""
    parts = [f"gpu:{gtype}:{n}" if gtype else f"gpu:{n}"]
    if pool.mode == "mps":
        parts.append(f"mps:{pool.mps_shares_per_gpu * n}")
    elif pool.mode in ("mig-dynamic", "timeslice"):
        parts.append(f"shard:{pool.shards_per_gpu * n}")
    return ",".join(parts)


def partition_line(pool: Pool) -> str:
    """The pool's ``PartitionName=`` line (feature pools name a ``NodeSet``)."""
    return f"PartitionName={pool.partition} Nodes={pool.nodes or 'ns_' + pool.name} State=UP"


def _pool_lines(cfg: Config, pool: Pool) -> List[str]:
    gres = pool_gres(cfg, pool)
    model = pool.gpu_model or "GPU (any model: the node reports it)"
    lines = [f"# pool {pool.name}: {pool.mode}, {pool.gpus_per_node}x {model}"]
    if pool.mode == "mig-static":
        lines.append("#   MIG types in gres.conf order ('slurmiso gen gres-conf'); another "
                     "order gives jobs the wrong instance")
    if gres:
        lines.append(f"#   add to the pool's NodeName lines: Gres={gres}")
    else:
        lines.append("#   Gres=: run 'slurmiso gen gres-conf' on a node of the pool")
    if not pool.nodes:
        lines.append(f"NodeSet=ns_{pool.name} Feature={pool.feature}")
    lines.append(partition_line(pool))
    return lines


def _gpu_acct_note(cfg: Config, version: Version) -> List[str]:
    """Why DisableGPUAcct is not among the lines, when MIG pools would want it."""
    if not reconfigures_mig(cfg) or has_disable_gpu_acct(version):
        return []
    have = ".".join(str(n) for n in version) if version else "unknown (no Slurm command answered)"
    return [
        f"# Slurm version: {have}. JobAcctGatherParams=DisableGPUAcct (slurmd stops holding",
        "# NVML open, which blocks MIG changes) exists from Slurm 23.02.7; older releases do not",
        "# have it, so it would do nothing there. Instead keep AcctGatherEnergyType off",
        "# acct_gather_energy/gpu, and if 'slurmiso mig apply' fails with IN_USE, stop slurmd on",
        "# that node while it runs. On 23.02.7 or newer (or pass --slurm-version), add:",
        "#JobAcctGatherParams=DisableGPUAcct",
    ]


def render(cfg: Config, prefix: str = DEFAULT_PREFIX, source: str = "",
           slurm_version: Version = None) -> str:
    """slurm.conf lines with a comment on each saying why (``gen slurm-conf``)."""
    lines = [
        "# slurm.conf settings slurmiso needs, generated by 'slurmiso gen slurm-conf'"
        + (f" from {source}" if source else "") + ".",
        "# Merge into slurm.conf on every node, then restart slurmctld and slurmd "
        "(PreemptType and GresTypes need a restart; 'scontrol reconfigure' is not enough).",
        "",
    ]
    for s in required_settings(cfg, prefix, slurm_version):
        lines.append(f"# {s.why}")
        lines.append(f"{s.key}={s.value}")
    lines += _gpu_acct_note(cfg, slurm_version)
    lines += [
        "# SPANK options (--iso-*): list slurmiso's plugin in plugstack.conf on login and "
        "compute nodes ('slurmiso gen plugstack'); the default path needs no line here",
        "#PlugStackConfig=/etc/slurm/plugstack.conf",
        "",
        "# One partition per pool. NodeName lines stay yours (CPUs, memory); add the Gres=.",
    ]
    for pool in cfg.pools:
        lines += _pool_lines(cfg, pool)
    return "\n".join(lines) + "\n"


def render_cgroup_conf(cgroup: str = "v1") -> str:
    """cgroup.conf for GPU nodes: the device constraint every GPU isolation rests on.

    ``v1`` where nodes mount the v1 devices controller, ``v2`` on a pure unified hierarchy;
    slurmiso_fence.so fences on both (v1 devices.deny, v2 a BPF device program attached
    beside Slurm's; docs/security.md).
    """
    if cgroup not in ("v1", "v2"):
        raise ValueError(f"cgroup version {cgroup!r}: use v1 or v2")
    lines = [
        "# cgroup.conf for slurmiso's GPU nodes, generated by 'slurmiso gen cgroup-conf'.",
        f"CgroupPlugin=cgroup/{cgroup}",
        "# jobs open only the GPUs / MIG instances / MPS GPU they were given",
        "ConstrainDevices=yes",
        "ConstrainCores=yes",
        "ConstrainRAMSpace=yes",
    ]
    return "\n".join(lines) + "\n"
