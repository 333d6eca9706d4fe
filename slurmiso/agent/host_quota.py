"""Host quotas at job start: each training class's CPU and IO weight and memory high-water
mark (``classes[].host`` in the config), written into its jobs' cgroups by the node agent.

    >>> quota_round(cfg, "n1", NodeState(state_dir).jobs(), journal)    # doctest: +SKIP
    ['job 4242: host-quota: class train: cpu.weight 100 -> 50']

Neither hook can write it: Slurm runs the Prolog before it makes the job's cgroup (with
``PrologFlags=Alloc,Contain`` the extern step's cgroup comes after the prolog: measured on
the sandbox), and the TaskProlog runs as the job's user. So the agent's restraint watch does,
in its first round after the job starts, and again in any round that finds a value above the
quota (a host-rung limit, when undone, puts back what it found). The writes are the host
rung's, through the same planner and writers: only a job whose record on this node names the
class, only the cgroup Slurm's layout shows for it, only tightening, never ``memory.max``. A job
with a host-rung limit in force is left to the rung. Nothing needs undoing: the cgroup ends
with the job. Each round that writes says so in the node's journal (``host-quota``).

On cgroup v1 Slurm makes a job no ``cpu`` or ``blkio`` directory (measured: cpuset, memory,
devices and freezer only), so there is nothing to write: the quota is skipped with that reason,
and ``ConstrainCores`` (a cpuset) is the host's only CPU fence there (docs/host-contention.md).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterable, List, Mapping, Optional

from slurmiso.agent.node_journal import say
from slurmiso.errors import HostLimitError
from slurmiso.host.cgroup_figures import CgroupVersion
from slurmiso.host.cgroup_writer import CgroupWriter, FileCgroupWriter, apply_plan
from slurmiso.host.job_cgroups import JobCgroup, ready_jobs_cgroups
from slurmiso.host.kernel_text import parse_uint, read_text
from slurmiso.host.rate_limit import LimitRequest, Plan, plan_limit, read_settings

if TYPE_CHECKING:
    from slurmiso.config.model import Config, HostQuota

#: The node journal's event for a quota written.
EV_QUOTA = "host-quota"


def memory_max(cg: JobCgroup) -> Optional[int]:
    """The memory Slurm gave the job (v2 ``memory.max``); None if unlimited or unreadable."""
    if cg.version is not CgroupVersion.V2 or not cg.v2:
        return None
    return parse_uint(read_text(os.path.join(cg.v2, "memory.max")) or "")


def quota_request(quota: HostQuota, job_memory: Optional[int]) -> LimitRequest:
    """The class's quota as the planner's request; ``memory_high_pct`` needs the job's
    memory (``memory.max``), without which the knob is left alone."""
    high = None
    if quota.memory_high_pct is not None and job_memory:
        high = max(1, job_memory * quota.memory_high_pct // 100)
    return LimitRequest(cpu_weight=quota.cpu_weight, io_weight=quota.io_weight,
                        memory_high_bytes=high)


def plan_quota(quota: HostQuota, cg: JobCgroup) -> Plan:
    """What to write to bring one job's cgroup down to its class's quota (pure but for
    reading the cgroup's files); no steps when it is already there."""
    target: Any = cg.v2 if cg.version is CgroupVersion.V2 else cg.v1
    if target is None:
        return Plan((), ("the job's cgroup has no directory to write",))
    plan = plan_limit(read_settings(cg.version, target), quota_request(quota, memory_max(cg)))
    if quota.memory_high_pct is not None and cg.version is CgroupVersion.V2 \
            and memory_max(cg) is None:
        plan = Plan(plan.steps, plan.skipped + ("memory.high: the job has no memory.max "
                                                "(no --mem): its share cannot be taken",))
    return plan


def _dirs(cg: JobCgroup) -> List[str]:
    if cg.version is CgroupVersion.V2:
        return [cg.v2] if cg.v2 else []
    return [d for d in ((cg.v1.cpu, cg.v1.blkio) if cg.v1 else ()) if d]


def quota_round(cfg: Config, node: str, records: Mapping[str, Any], journal: Any = None,
                cgroup_root: str = "/sys/fs/cgroup", limited: Iterable[str] = (),
                writer_for: Callable[[Iterable[str]], CgroupWriter] = FileCgroupWriter,
                now: float = 0.0) -> List[str]:
    """One pass: bring every job of a class with a host quota down to it; one line per job
    written to (or whose write failed). ``limited``: jobs the host rung holds now."""
    quotas: Dict[str, HostQuota] = {c.name: c.host for c in cfg.classes
                                    if c.preemptible and c.host.any()}
    held = set(limited)
    lines: List[str] = []
    for job, rec, cg in ready_jobs_cgroups(records, quotas, cgroup_root, node):
        if job in held:
            continue  # the host rung holds it: the rung's to undo
        plan = plan_quota(quotas[rec.job_class], cg)
        if not plan.steps:
            continue  # at or under its quota already (or nothing writable): nothing to say
        _write(lines, journal, node, job, rec.job_class, cg, plan, writer_for, now)
    return lines


def _write(lines: List[str], journal: Any, node: str, job: str, job_class: str,
           cg: JobCgroup, plan: Plan, writer_for: Callable[[Iterable[str]], CgroupWriter],
           now: float) -> None:
    changes = "; ".join(f"{s.knob} {_values(s.restore)} -> {_values(s.apply)}"
                        for s in plan.steps)
    try:
        apply_plan(writer_for(_dirs(cg)), plan)
    except HostLimitError as exc:
        say(lines, journal, node, EV_QUOTA, job, now, False,
            f"class {job_class}: not written ({exc}); tried again next round",
            knobs=[s.knob for s in plan.steps])
        return
    say(lines, journal, node, EV_QUOTA, job, now, True, f"class {job_class}: {changes}",
        knobs=[s.knob for s in plan.steps], skipped=list(plan.skipped),
        writes=[[w.path, w.value] for s in plan.steps for w in s.apply])


def _values(writes: Any) -> str:
    """A knob's writes as one phrase (io.weight writes one line per device)."""
    return ", ".join(w.value for w in writes) or "?"
