"""What differs between the Slurm releases slurmiso runs on, in one table, read once.

Every row was measured in the sandbox (``slurmiso sandbox up --slurm 22.05|24.11|26.05``,
docs/compatibility.md), except where ``source`` says it comes from Slurm's NEWS. ``since`` is
the first release with the newer behaviour *among those measured or documented*: a release
between two measured ones is treated as the later measured behaviour only from ``since`` on,
so code asks :func:`has` instead of comparing numbers itself.

The version is read once: ``SLURM_VERSION`` when the environment has it (none of the measured
releases puts it in the Prolog environment), else ``scontrol --version``, which needs a
readable slurm.conf on every measured release (without one it tries a configless DNS SRV
lookup and fails), else ``slurmd -V``, which needs none.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Tuple

from slurmiso.slurm.client import parse_version

Version = Tuple[int, int, int]


@dataclass(frozen=True)
class Difference:
    """One behaviour that changed between releases, and what slurmiso does about it."""

    key: str
    since: Version
    before: str  # behaviour before ``since``
    after: str  # behaviour from ``since`` on
    workaround: str  # what slurmiso does for the older (or newer) releases
    source: str = "measured"


DIFFERENCES: Tuple[Difference, ...] = (
    Difference(
        "prolog_env_qos", (26, 5, 0),
        "the Prolog environment has no SLURM_JOB_QOS (22.05.8, 24.11.5)",
        "SLURM_JOB_QOS is in the Prolog environment (26.05.5)",
        "the prolog asks 'scontrol show job' for the QoS only when the env lacks it"),
    Difference(
        "disable_gpu_acct", (23, 2, 7),
        "JobAcctGatherParams has no DisableGPUAcct: slurmd may hold NVML open",
        "JobAcctGatherParams=DisableGPUAcct keeps NVML closed in slurmd",
        "'gen slurm-conf' adds it only where it exists; doctor says to stop slurmd "
        "around 'mig apply' before", source="Slurm NEWS (23.02.7)"),
    Difference(
        "mig_mixed_types", (24, 11, 0),
        "a node whose explicit gres.conf mixes MIG types (3x 3g.40gb + 1x 4g.40gb) records the "
        "second type under the first with count 0: a job asking for it gets no device (22.05.8)",
        "each MIG type of a mixed node is scheduled: --gres=gpu:4g.40gb:1 gets the 4g device "
        "(24.11.5, 26.05.5)",
        "doctor warns about mixed MIG types (mig-mixed-gpu) only before 24.11; the sandbox "
        "keeps one MIG type on n3"),
    Difference(
        "reconfigure_gres", (24, 11, 0),
        "'scontrol reconfigure' keeps a node's old GRES counts: a re-laid node needs "
        "slurmctld and its slurmd restarted (22.05.8)",
        "'scontrol reconfigure' takes a node's new Gres= count from slurm.conf/gres.conf "
        "(24.11.5: Gres=gpu:3g.40gb:3 -> 2, CfgTRES gres/gpu=2)",
        "'sandbox sync-gres' (the after-re-layout step) restarts the daemons on every release: "
        "that works everywhere"),
    Difference(
        "show_config_indexed_hooks", (24, 11, 0),
        "'scontrol show config' prints 'Prolog = /path' (22.05.8)",
        "'scontrol show config' prints 'Prolog[0] = /path', 'Epilog[0] = ...' (24.11.5, "
        "26.05.5): doctor read no Prolog at all and reported hook-unset",
        "SlurmCli.show_config keeps the indexed keys and gives the plain key index 0"),
    Difference(
        "show_job_alloc_tres", (24, 11, 0),
        "'scontrol show job' names the allocation TRES= (22.05.8)",
        "'scontrol show job' names it AllocTRES= beside ReqTRES= (24.11.5, 26.05.5)",
        "read AllocTRES, else TRES"),
    Difference(
        "cgroup_v1_needs_ignore_systemd", (24, 11, 0),
        "CgroupPlugin=cgroup/v1 runs without systemd (22.05.8)",
        "cgroup/v1 asks systemd for a scope unless cgroup.conf has IgnoreSystemd=yes "
        "(24.11.5); 26.05.5 also logs that cgroup/v1 is deprecated",
        "the sandbox writes IgnoreSystemd=yes; sites on v1 without systemd must too"),
    Difference(
        "grace_preempt_sticky", (24, 5, 0),
        "a job requeued by 'scontrol requeue' during its preemption GraceTime ends its next "
        "attempt as that attempt's program ends (22.05.8: 3 preemptions, restart count 3)",
        "slurmctld marks a job signalled for a preemption GraceTime (GRACE_PREEMPT, Slurm "
        "24.05, bug 16263) and clears the mark only when it requeues the job itself, not on "
        "'scontrol requeue': the next attempt's batch completion, exit 0 included, is taken "
        "for that preemption and requeued ('_job_complete: requeue ... per user/system "
        "request', sacct PREEMPTED; 24.11.5: a 4th restart redid the steps after the last "
        "checkpoint)",
        "'slurmiso run' turns the job's Requeue off ('scontrol update JobId= Requeue=0') "
        "when its program ends by itself after a requeue, from 24.05 on (and when the "
        "version is unknown)"),
)

_BY_KEY: Dict[str, Difference] = {d.key: d for d in DIFFERENCES}

#: ``--json`` data_parser plugin per release (``sacct``/``squeue``/``scontrol --json``
#: ``meta.plugin.data_parser``), measured; slurmiso.audit.read.sacct_json reads all of them.
DATA_PARSERS: Dict[Tuple[int, int], str] = {
    (22, 5): "v0.0.38",
    (24, 11): "v0.0.42",
    (26, 5): "v0.0.45",
}


def difference(key: str) -> Difference:
    return _BY_KEY[key]  # KeyError: a typo in slurmiso itself, not user input


def has(key: str, version: Optional[Version]) -> Optional[bool]:
    """Whether ``version`` has the newer behaviour ``key``; None when the version is unknown
    (callers then keep the workaround: unknown is never taken for new)."""
    diff = difference(key)
    if version is None:
        return None
    return tuple(version) >= diff.since


def needs_workaround(key: str, version: Optional[Version]) -> bool:
    """True where the older behaviour's workaround must stay (unknown version included)."""
    return has(key, version) is not True


def data_parser(version: Optional[Version]) -> Optional[str]:
    return DATA_PARSERS.get((version[0], version[1])) if version else None


def from_env(env: Optional[Mapping[str, str]] = None) -> Optional[Version]:
    """``SLURM_VERSION`` from the environment (slurmd exports it to some hook contexts)."""
    env = os.environ if env is None else env
    return parse_version(env.get("SLURM_VERSION", ""))


_CACHE: Dict[str, Optional[Version]] = {}


def current(env: Optional[Mapping[str, str]] = None) -> Optional[Version]:
    """The running Slurm's version, read once per process (env first, then the commands)."""
    found = from_env(env)
    if found is not None:
        return found
    if "v" not in _CACHE:
        from slurmiso.slurm.client import SlurmCli

        _CACHE["v"] = SlurmCli().version()
    return _CACHE["v"]


def describe(version: Optional[Version]) -> List[str]:
    """One line per difference: which side of it ``version`` is on (for doctor)."""
    if version is None:
        return ["Slurm version unknown: every workaround stays on"]
    out = []
    for d in DIFFERENCES:
        out.append(f"{d.key}: {d.after if has(d.key, version) else d.before}")
    parser = data_parser(version)
    out.append(f"--json data_parser: {parser or 'not measured for this release'}")
    return out
