"""Device-fence checks: is a job kept off the GPUs it was not given? (pure, on a snapshot)

slurmiso's isolation holds against the job's own user only with Slurm's device constraint
(proctrack/cgroup, task/cgroup, ``ConstrainDevices=yes``) and, where slurmiso must close what
Slurm cannot know (mig-dynamic instances, refused jobs), ``slurmiso_fence.so`` loaded from
plugstack.conf: device rules on cgroup v1, a BPF device program on cgroup v2 (the kernel must
load those: ``fence_kernel`` in a snapshot taken on a GPU node). See docs/security.md.
"""

from __future__ import annotations

import os
from typing import List

from slurmiso.config.model import Config
from slurmiso.doctor import Check, Finding, Snapshot
from slurmiso.doctor.cluster import conf, conf_items
from slurmiso.isolation.bpf_probe import FENCE_PROG_NAME, SLURM_PROG_NAME

FENCE_PLUGIN = "slurmiso_fence.so"


def check_device_constraint(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Without Slurm's device cgroup every job can open every GPU of its node."""
    if not cfg.pools:
        return []
    out: List[Finding] = []
    if conf(snap, "ProctrackType") != "proctrack/cgroup":
        out.append(Finding("error", "proctrack",
                           f"ProctrackType={conf(snap, 'ProctrackType') or '(unset)'}: a job's "
                           "processes are not tracked by cgroup, so none can be fenced",
                           "set ProctrackType=proctrack/cgroup in slurm.conf "
                           "('slurmiso gen slurm-conf')"))
    if "task/cgroup" not in conf_items(conf(snap, "TaskPlugin")):
        out.append(Finding("error", "task-cgroup",
                           f"TaskPlugin={conf(snap, 'TaskPlugin') or '(unset)'} lacks task/cgroup:"
                           " jobs can open every GPU of their node whatever CUDA_VISIBLE_DEVICES "
                           "says", "set TaskPlugin=task/cgroup,task/affinity in slurm.conf"))
    if conf(snap, "ConstrainDevices").lower() != "yes":
        out.append(Finding("error", "constrain-devices",
                           "ConstrainDevices is not yes in cgroup.conf: jobs can open every GPU "
                           "and MIG instance of their node",
                           "slurmiso gen cgroup-conf -o /etc/slurm/cgroup.conf; restart slurmd"))
    return out


def _fence_needed(cfg: Config) -> bool:
    return bool(cfg.pools)  # every pool may refuse a job; mig-dynamic needs it for its caps


def check_fence_plugin(snap: Snapshot, cfg: Config) -> List[Finding]:
    """slurmiso_fence.so closes a refused job's GPUs and other jobs' MIG instances. It must be
    on a ``required`` line Slurm reads (doctor/plugstack.py: comments, ``optional``, keywords,
    includes), and read fences where the prolog writes them."""
    if not _fence_needed(cfg):
        return []
    from slurmiso.doctor import plugstack as P

    plug = snap.get("plugstack") or {}
    path = str(plug.get("path") or "plugstack.conf")
    dynamic = any(p.mode == "mig-dynamic" for p in cfg.pools)
    harm = ("a job slurmiso refuses keeps its GPU"
            + (", and mig-dynamic jobs can open each other's MIG instances" if dynamic else ""))
    build = "make -C spank install builds the plugin"
    if not plug.get("exists"):  # Slurm: a missing plugstack.conf is an empty one
        return [Finding("error", "fence-plugin", f"{path} does not exist, so Slurm loads no "
                        f"SPANK plugin: {harm}", f"slurmiso gen plugstack -o {path} ({build})")]
    out = P.check_read_path(snap, path)
    lines, unread = P.stack(plug)
    fence = [ln for ln in lines if ln.kind in ("required", "optional")
             and os.path.basename(ln.path) == FENCE_PLUGIN]
    if not fence:
        why = P.near_miss(lines, FENCE_PLUGIN) or (
            " (nor does a file its include lines match)"
            if any(ln.kind == "include" for ln in lines) else "")
        want = f"required {P.sibling(lines, FENCE_PLUGIN)} state_dir={cfg.paths.state_dir}"
        what = f"{path} does not load {FENCE_PLUGIN}{why}: {harm}"
        fix = f"add '{want}' to {path} ('slurmiso gen plugstack'; {build})"
        if unread:  # the line may be in an included file this snapshot did not read
            return out + [Finding("warning", "fence-plugin", what + " (unless a file "
                                  f"included from {unread[0]} does)", fix)]
        return out + [Finding("error", "fence-plugin", what, fix)]
    line = fence[0]  # Slurm refuses to load a plugin twice: the first line is the one
    where = f"{line.file}:{line.lineno}"
    if line.kind == "optional":
        out.append(Finding("error", "fence-plugin",
                           f"{where} loads {FENCE_PLUGIN} as optional: if it fails to load, "
                           f"Slurm skips it in silence and {harm} (fail open)",
                           f"change 'optional' to 'required' on {where}"))
    found = (plug.get("plugins") or {}).get(line.path) or {}
    if line.kind == "required" and found.get("exists") is False:
        node = (snap.get("gpu_node") or {}).get("node")
        out.append(Finding("error" if node else "info", "fence-plugin",
                           f"{found.get('resolved') or line.path} ({where}) is not on "
                           f"{node or 'this host'}: Slurm fails every job step there "
                           "(a required plugin that does not load)",
                           f"install slurmiso-spank on {node or 'this host'} "
                           "(make -C spank install), or fix the path on " + where))
    dirs = [a.split("=", 1)[1] for a in line.args if a.startswith("state_dir=")]
    have = dirs[-1] if dirs else "/run/slurmiso"  # the plugin's default
    if os.path.normpath(have) != os.path.normpath(cfg.paths.state_dir):
        out.append(Finding("error", "fence-state-dir",
                           f"{FENCE_PLUGIN} reads fences from state_dir={have}"
                           + ("" if dirs else " (its default)") + f", the prolog writes them "
                           f"to {cfg.paths.state_dir}: every job finds no fence and is denied "
                           "all its GPUs", f"set state_dir={cfg.paths.state_dir} on {where} "
                           "('slurmiso gen plugstack')"))
    return out


def check_fence_cgroup_version(snap: Snapshot, cfg: Config) -> List[Finding]:
    """On cgroup v2 the fence is a BPF device program: the node's kernel must load one, or the
    jobs it must fence (mig-dynamic, refused) do not start."""
    if conf(snap, "CgroupPlugin").lower() != "cgroup/v2" or not _fence_needed(cfg):
        return []
    kernel = snap.get("fence_kernel") or {}
    ok = kernel.get("bpf_device")
    if ok is None:  # not measured: doctor ran off a GPU node, or not as root
        return [Finding("info", "fence-cgroup-v2",
                        "CgroupPlugin=cgroup/v2: slurmiso_fence.so fences with a BPF device "
                        "program; whether this node's kernel loads one was not checked"
                        + (f" ({kernel['detail']})" if kernel.get("detail") else ""),
                        "run 'slurmiso doctor' as root on a GPU node of each pool")]
    if ok:
        return []
    dynamic = [p.name for p in cfg.pools if p.mode == "mig-dynamic"]
    return [Finding("error", "fence-cgroup-v2",
                    f"CgroupPlugin=cgroup/v2 and this node's kernel cannot fence: "
                    f"{kernel.get('detail') or 'BPF device programs refused'}; jobs slurmiso "
                    "refuses do not start"
                    + (f", nor any job of mig-dynamic pool(s) {', '.join(dynamic)}"
                       if dynamic else ""),
                    "boot a kernel with CONFIG_BPF_SYSCALL=y and CONFIG_CGROUP_BPF=y (Slurm's "
                    "own ConstrainDevices on cgroup/v2 needs them too); see docs/security.md")]


def check_cgroup_v2_fences(snap: Snapshot, cfg: Config) -> List[Finding]:
    """On a cgroup v2 GPU node, as the kernel has it now: /sys/fs/cgroup is the unified
    hierarchy alone; every running job's cgroup carries Slurm's device program (its
    ConstrainDevices); every task of a job slurmiso fences has slurmiso_fence's program in
    effect *beside* Slurm's (the kernel runs both: docs/security.md, "Composing")."""
    facts = snap.get("cgroup_v2")
    if not facts or conf(snap, "CgroupPlugin").lower() != "cgroup/v2":
        return []
    if facts.get("error") and "jobs" not in facts:
        return [Finding("info", "cgroup-v2-fences", f"cgroup/v2 fences not checked: "
                        f"{facts['error']}", "run 'slurmiso doctor' as root on a GPU node")]
    if not facts.get("unified") or facts.get("hybrid_proc"):
        return [Finding("error", "cgroup-v2-hierarchy",
                        f"CgroupPlugin=cgroup/v2 but {facts.get('mount', '/sys/fs/cgroup')} "
                        "on this node is not the unified hierarchy alone"
                        + (" (/proc/<pid>/cgroup lists cgroup v1 hierarchies)"
                           if facts.get("hybrid_proc") else "")
                        + ": Slurm's cgroup/v2 plugin refuses such a host ('Hybrid mode is "
                        "not supported'), so slurmd does not start",
                        "boot the node with the unified hierarchy only "
                        "(systemd.unified_cgroup_hierarchy=1, or cgroup_no_v1=all), or use "
                        "CgroupPlugin=cgroup/v1 where Slurm still ships it")]
    out: List[Finding] = []
    tasks = fenced = 0
    for job in facts.get("jobs", []):
        name = job.get("job") or job.get("dir", "?")
        if SLURM_PROG_NAME not in job.get("own", []):
            out.append(Finding("error", "cgroup-v2-device-constraint",
                               f"job {name}'s cgroup ({job.get('dir')}) has no device program "
                               f"of Slurm's: its processes can open every device of the node",
                               "set ConstrainDevices=yes in cgroup.conf and restart slurmd"))
        needs = int(job.get("deny", 0)) + int(job.get("narrow", 0))
        for task in job.get("tasks", []):
            if not task.get("procs", 1):
                continue  # an empty cgroup (Slurm makes task_special for every step) runs nothing
            tasks += 1
            eff = task.get("effective", [])
            if SLURM_PROG_NAME not in eff:
                out.append(Finding("error", "cgroup-v2-slurm-fence-replaced",
                                   f"job {name} {task.get('path')}: Slurm's device program is "
                                   f"not in effect (programs in effect: {eff or 'none'}): its "
                                   "GPU constraint is gone", "see docs/security.md, "
                                   "'Composing with Slurm's device programs'"))
            if needs and FENCE_PROG_NAME not in eff:
                out.append(Finding("error", "cgroup-v2-fence-missing",
                                   f"job {name} {task.get('path')}: its fence has {needs} "
                                   f"rule(s) but no {FENCE_PROG_NAME} program is in effect",
                                   "check plugstack.conf loads slurmiso_fence.so (required) and "
                                   "slurmd's log for 'slurmiso_fence'"))
            elif needs:
                fenced += 1
    if not out:
        jobs = len(facts.get("jobs", []))
        out.append(Finding("info", "cgroup-v2-fences",
                           f"cgroup/v2: {jobs} running job(s), {tasks} task(s) checked: Slurm's "
                           f"device program on each job, {fenced} task(s) with slurmiso's fence "
                           "in effect beside Slurm's" if jobs else
                           "cgroup/v2: unified hierarchy; no job runs here to check its fences",
                           ""))
    return out


CHECKS: List[Check] = [check_device_constraint, check_fence_plugin, check_fence_cgroup_version,
                       check_cgroup_v2_fences]
