"""Cluster-wide checks: slurm.conf settings and QoS (pure functions of a snapshot).

Each check reads ``snap["config"]`` (``scontrol show config``) or ``snap["qos"]`` and returns
findings whose ``fix`` is the line or command that repairs it.
"""

from __future__ import annotations

import glob
import os
from typing import List, Optional, Sequence

from slurmiso.config.model import Config, JobClass
from slurmiso.doctor import Check, Finding, Snapshot
from slurmiso.slurm import qos as Q
from slurmiso.slurm import slurmconf

UNSET = ("", "(null)", "none", "n/a")


def conf(snap: Snapshot, key: str) -> str:
    """A ``scontrol show config`` value; "" when unset (``(null)``)."""
    value = str(snap.get("config", {}).get(key, "")).strip()
    return "" if value.lower() in UNSET else value


def conf_items(value: str) -> List[str]:
    return [v.strip().lower() for v in value.split(",") if v.strip()]


def check_preempt_type(snap: Snapshot, cfg: Config) -> List[Finding]:
    value = conf(snap, "PreemptType")
    if value == "preempt/qos":
        return []
    return [Finding("error", "preempt-type",
                    f"PreemptType={value or '(none)'}: infer jobs cannot preempt train jobs "
                    "by QoS", "set PreemptType=preempt/qos in slurm.conf and restart "
                    "slurmctld")]


def check_preempt_mode(snap: Snapshot, cfg: Config) -> List[Finding]:
    out: List[Finding] = []
    modes = conf_items(conf(snap, "PreemptMode"))
    if "requeue" not in modes:
        why = ("CANCEL silently voids --requeue: preempted training is killed, not requeued"
               if "cancel" in modes else "preempted training is not requeued")
        out.append(Finding("error", "preempt-mode",
                           f"PreemptMode={conf(snap, 'PreemptMode') or '(none)'}: {why}",
                           "set PreemptMode=REQUEUE in slurm.conf"))
    pools = {p.partition for p in cfg.pools}
    for name, part in sorted(snap.get("partitions", {}).items()):
        pmode = conf_items(str(part.get("PreemptMode", "")))
        if name in pools and pmode and "requeue" not in pmode and "off" not in pmode:
            out.append(Finding("error", "preempt-mode",
                               f"partition {name} has PreemptMode={part.get('PreemptMode')}: "
                               "its preempted training jobs are not requeued",
                               f"drop PreemptMode= from PartitionName={name} (or set REQUEUE)"))
    return out


def check_job_requeue(snap: Snapshot, cfg: Config) -> List[Finding]:
    if conf(snap, "JobRequeue") != "0":
        return []
    return [Finding("error", "job-requeue",
                    "JobRequeue=0: batch jobs without --requeue are cancelled when preempted "
                    "(PreemptMode=REQUEUE needs a requeueable job)",
                    "set JobRequeue=1 in slurm.conf")]


#: What each AccountingStorageEnforce word turns on besides itself (slurm.conf(5)).
_ENFORCE_IMPLIES = {"all": ("associations", "limits", "qos", "safe", "wckeys"),
                    "safe": ("associations", "limits"), "limits": ("associations",),
                    "qos": ("associations",)}


def check_accounting_enforce(snap: Snapshot, cfg: Config) -> List[Finding]:
    have = conf_items(conf(snap, "AccountingStorageEnforce"))
    have += [x for word in have for x in _ENFORCE_IMPLIES.get(word, ())]
    missing = [x for x in ("associations", "limits", "qos") if x not in have]
    if not missing:
        return []
    sev = "error" if "qos" in missing or "associations" in missing else "warning"
    return [Finding(sev, "accounting-enforce",
                    f"AccountingStorageEnforce lacks {','.join(missing)}: "
                    + ("any user may submit with any --qos (QoS grants are not enforced)"
                       if "qos" in missing else "QoS MaxWall/MaxTRESPerJob are not enforced"),
                    "set AccountingStorageEnforce=associations,limits,qos in slurm.conf")]


def check_accounting_storage(snap: Snapshot, cfg: Config) -> List[Finding]:
    """QoS live in slurmdbd: without it there is nothing to preempt by, grant or enforce."""
    if "AccountingStorageType" not in snap.get("config", {}):
        return []
    value = conf(snap, "AccountingStorageType")
    if value == "accounting_storage/slurmdbd":
        return []
    return [Finding("error", "accounting-storage",
                    f"AccountingStorageType={value or '(none)'}: QoS live in slurmdbd, so "
                    "infer cannot preempt train by QoS and no QoS grant or limit holds",
                    "set AccountingStorageType=accounting_storage/slurmdbd in slurm.conf (with "
                    "slurmdbd running), restart slurmctld, then 'slurmiso qos apply'")]


def check_accounting_tres(snap: Snapshot, cfg: Config) -> List[Finding]:
    have = conf_items(conf(snap, "AccountingStorageTRES"))
    want = [f"gres/{t}" for t in slurmconf.gres_types(cfg.pools)]
    missing = [t for t in want if t not in have]
    if not missing:
        return []
    sev = "warning" if "gres/gpu" in missing else "info"
    return [Finding(sev, "accounting-tres",
                    f"AccountingStorageTRES lacks {','.join(missing)}: sacct and "
                    "'slurmiso audit' cannot count those GPUs/shares per job",
                    f"set AccountingStorageTRES={','.join(want)} in slurm.conf")]


def check_gres_types(snap: Snapshot, cfg: Config) -> List[Finding]:
    have = conf_items(conf(snap, "GresTypes"))
    want = slurmconf.gres_types(cfg.pools)
    missing = [t for t in want if t not in have]
    if not missing:
        return []
    return [Finding("error", "gres-types",
                    f"GresTypes lacks {','.join(missing)}, which the pools use",
                    f"set GresTypes={','.join(want)} in slurm.conf and restart the daemons")]


def check_prolog_flags(snap: Snapshot, cfg: Config) -> List[Finding]:
    flags = conf_items(conf(snap, "PrologFlags"))
    if "runinjob" in flags:  # 24.05+: implies Alloc and Contain
        mps = [p.name for p in cfg.pools if p.mode == "mps"]
        return [Finding("error", "prolog-run-in-job",
                        f"PrologFlags={conf(snap, 'PrologFlags')}: RunInJob runs slurmiso's "
                        "Prolog and Epilog in the job's extern step (its cgroup, its device "
                        "constraint): an MPS control daemon the Prolog starts for a GPU would be "
                        "killed with the first job that started it and fenced like it, under the "
                        "later jobs sharing it"
                        + (f" (mps pool(s) {', '.join(mps)}: the prolog refuses to start one "
                           "there and drains the node)" if mps else ""),
                        "set PrologFlags=Alloc,Contain (without RunInJob) in slurm.conf")]
    if "alloc" not in flags:
        return [Finding("error", "prolog-flags",
                        f"PrologFlags={conf(snap, 'PrologFlags') or '(none)'}: without Alloc "
                        "the Prolog runs only when the first step starts, so a job can start on "
                        "a GPU slurmiso has not prepared", "set PrologFlags=Alloc in slurm.conf")]
    return []


def check_prep_plugins(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Since 20.11 slurmd runs Prolog=/Epilog= through the prep/script plugin: a PrEpPlugins
    without it runs neither, so no job is ever isolated (and none is refused)."""
    if "PrEpPlugins" not in snap.get("config", {}) or not cfg.pools:
        return []  # a Slurm before PrEp plugins (or a snapshot without the key)
    if "prep/script" in conf_items(conf(snap, "PrEpPlugins")):
        return []
    return [Finding("error", "prep-plugins",
                    f"PrEpPlugins={conf(snap, 'PrEpPlugins') or '(none)'} lacks prep/script: "
                    "slurmd never runs Prolog= or Epilog=, so slurmiso's per-job GPU isolation "
                    "never runs", "add prep/script to PrEpPlugins in slurm.conf (or remove the "
                    "line: prep/script is the default); restart slurmctld and slurmd")]


def check_slurmd_user(snap: Snapshot, cfg: Config) -> List[Finding]:
    """slurmd runs Prolog=/Epilog= as SlurmdUser; slurmiso's hooks need root (MIG instances,
    MPS daemons, device fences)."""
    user = conf(snap, "SlurmdUser")
    if not cfg.pools or not user or user.startswith("root") or user.endswith("(0)"):
        return []
    return [Finding("error", "slurmd-user",
                    f"SlurmdUser={user}: slurmd runs Prolog= and Epilog= as that user, and "
                    "slurmiso's hooks need root, so every job drains its node",
                    "remove SlurmdUser= from slurm.conf (root is the default); restart slurmd")]


def _seconds(value: str) -> Optional[int]:
    """``60``, ``60 sec`` (scontrol's forms) -> 60; None when unset or not a number."""
    head = value.split()[0] if value.split() else ""
    return int(head) if head.isdigit() else None


#: The hooks' own bounded waits on an MPS pool (hooks/runner.py, isolation/mps*.py): a daemon
#: start and a command (10 s each), the QoS lookup and a drain call (5 s each). A shorter
#: PrologEpilogTimeout turns a clear drain reason into slurmd's kill.
HOOK_WAITS_S = 30
FOREVER = 65534  # scontrol's PrologEpilogTimeout when unset (NO_VAL16): Slurm waits forever


def check_timeouts(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Slurm's kill timers against what slurmiso's hooks and GPU jobs need."""
    out: List[Finding] = []
    heavy = sorted({p.mode for p in cfg.pools if p.mode in ("mps", "mig-dynamic")})
    pet = _seconds(conf(snap, "PrologEpilogTimeout"))
    if heavy and pet and pet < min(HOOK_WAITS_S, FOREVER):
        out.append(Finding("warning", "prolog-timeout",
                           f"PrologEpilogTimeout={pet}: under the {HOOK_WAITS_S} s the hooks "
                           f"may wait on {'/'.join(heavy)} pools (MPS daemon start, MIG "
                           "changes, locks): slurmd kills the hook and drains the node",
                           f"set PrologEpilogTimeout={2 * HOOK_WAITS_S} (or more) in slurm.conf"))
    unkillable = _seconds(conf(snap, "UnkillableStepTimeout"))
    floor = max(60, 5 * (_seconds(conf(snap, "MessageTimeout")) or 10))
    if cfg.pools and unkillable is not None and unkillable < floor:
        out.append(Finding("warning", "unkillable-timeout",
                           f"UnkillableStepTimeout={unkillable} s, under {floor} s (Slurm's "
                           "default and 5x MessageTimeout): a GPU process still freeing device "
                           "memory after SIGKILL drains the node 'Kill task failed'",
                           f"set UnkillableStepTimeout={max(floor, 120)} in slurm.conf"))
    grace = [(c.checkpoint.grace_s, c.name) for c in cfg.classes
             if c.preemptible and c.checkpoint]
    kill_wait = _seconds(conf(snap, "KillWait"))
    if cfg.monitor.relayout.drain == "preempt-training" and grace and kill_wait is not None \
            and kill_wait < max(grace)[0]:
        need, name = max(grace)
        out.append(Finding("warning", "kill-wait",
                           f"KillWait={kill_wait} s: a MIG re-layout requeues training with "
                           f"'scontrol requeue' (SIGTERM, KillWait, SIGKILL), shorter than "
                           f"class {name}'s {need} s checkpoint grace",
                           f"set KillWait={need} in slurm.conf (or monitor.relayout.drain: "
                           "wait)"))
    return out


def check_gpu_acct(snap: Snapshot, cfg: Config) -> List[Finding]:
    if not slurmconf.reconfigures_mig(cfg):
        return []
    from slurmiso.slurm.client import parse_version

    out: List[Finding] = []
    version = parse_version(str(snap.get("slurm_version") or ""))
    if version is not None and not slurmconf.has_disable_gpu_acct(version):
        out.append(Finding("info", "gpu-acct",
                           f"Slurm {snap.get('slurm_version')} has no "
                           "JobAcctGatherParams=DisableGPUAcct (23.02.7 added it): slurmd may "
                           "hold NVML open while pools reconfigure MIG",
                           "if 'slurmiso mig apply' fails with IN_USE, stop slurmd on that "
                           "node while it runs"))
    elif "disablegpuacct" not in conf_items(conf(snap, "JobAcctGatherParams")):
        out.append(Finding("error", "gpu-acct",
                           "JobAcctGatherParams lacks DisableGPUAcct while pools reconfigure "
                           "MIG: slurmd holds NVML open and MIG changes fail (IN_USE)",
                           "add DisableGPUAcct to JobAcctGatherParams in slurm.conf"))
    if conf(snap, "AcctGatherEnergyType") == "acct_gather_energy/gpu":
        out.append(Finding("error", "gpu-acct",
                           "AcctGatherEnergyType=acct_gather_energy/gpu keeps NVML open in "
                           "slurmd while pools reconfigure MIG",
                           "set AcctGatherEnergyType=acct_gather_energy/none (or ipmi/rapl)"))
    return out


def check_slurm_version(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Which Slurm this is, and which side of each measured release difference it is on."""
    from slurmiso.slurm import versions
    from slurmiso.slurm.client import parse_version

    raw = str(snap.get("slurm_version") or "")
    version = parse_version(raw)
    if version is None:
        why = raw or "scontrol show config has no SLURM_VERSION"
        return [Finding("info", "slurm-version",
                        f"cannot tell the Slurm version ({why}): every release workaround "
                        "stays on",
                        "check that 'scontrol show config' answers")]
    known = versions.data_parser(version)
    return [Finding("info", "slurm-version",
                    f"Slurm {raw}: " + "; ".join(versions.describe(version)),
                    "nothing to change (docs/compatibility.md: what each release needs)"
                    if known else "this release was not measured in slurmiso's sandbox: run "
                    "'make test SLURM=<nearest release>' (docs/compatibility.md)")]


def check_hooks_set(snap: Snapshot, cfg: Config) -> List[Finding]:
    from slurmiso.install import scripts_dir

    out = []
    bindir = scripts_dir()
    for key, name in slurmconf.HOOKS:
        value = conf(snap, key)
        if not value:
            out.append(Finding("error", "hook-unset",
                               f"{key} is not set: slurmiso's per-job GPU isolation never runs",
                               f"set {key}={bindir}/{name} in slurm.conf "
                               "('slurmiso gen slurm-conf')"))
            continue
        if glob.has_magic(value):
            continue  # a prolog.d glob: check_hook_files reads what it matches on a GPU node
        names = _hook_names(snap, key, value)
        names += [os.path.basename(str(v)) for k, v in snap.get("config", {}).items()
                  if k.startswith(key + "[")]  # 24.11+: Prolog[1] = ... (several scripts)
        if any(n == name or n.endswith("-" + name) for n in names):
            continue
        other = [k for k, n in slurmconf.HOOKS if n in names]
        if other:
            out.append(Finding("error", "hook-not-slurmiso",
                               f"{key}={value} is slurmiso's {other[0]} hook, not its {key}: "
                               "jobs are set up or torn down at the wrong time",
                               f"set {key}={os.path.join(os.path.dirname(value), name)} in "
                               "slurm.conf ('slurmiso gen slurm-conf')"))
        else:
            out.append(Finding("warning", "hook-not-slurmiso",
                               f"{key}={value} is not slurmiso's {name}: unless that script "
                               "runs it, per-job GPU isolation never runs",
                               f"set {key}={bindir}/{name} in slurm.conf (a script that runs "
                               f"it: --ignore hook-not-slurmiso)"))
    return out


def _hook_names(snap: Snapshot, key: str, value: str) -> List[str]:
    """The file name ``value`` has, and its target's where the snapshot recorded one."""
    hook = (snap.get("hooks") or {}).get(key) or {}
    files = (hook.get("files") or []) if hook.get("path") == value else []
    return [os.path.basename(value)] + [os.path.basename(str(f["realpath"]))
                                        for f in files if f.get("realpath")]


def _qos_finding(c: Q.Change, desired: List[Q.Qos], cfg_classes: Sequence[JobClass]
                 ) -> Finding:
    want = next(q for q in desired if q.name == c.qos)
    fix = "slurmiso qos apply"
    if c.action == "add":
        return Finding("error", "qos-missing", f"QoS {c.qos} does not exist in slurmdbd", fix)
    if c.action == "grant":
        return Finding("error", "qos-grant",
                       f"account {c.account} may not use QoS {c.qos} (qos.accounts says it may)",
                       fix)
    text = f"QoS {c.qos}: {c.field}={c.live or '(unset)'}, the config says {c.want or '(none)'}"
    if c.field == "Preempt":
        live, wanted = set(c.live.split(",")) - {""}, set(want.preempt or ())
        never = {x.qos.name for x in cfg_classes if not x.preemptible}
        why = ([f"{c.qos} jobs do not preempt {','.join(sorted(wanted - live))}"]
               if wanted - live else [])
        why += [f"{c.qos} jobs preempt {','.join(sorted(live - wanted))}"
                + (", which the config never preempts" if (live - wanted) & never else "")
                ] if live - wanted else []
        if why:
            return Finding("error", "qos-preempt", f"{text}: {'; '.join(why)}", fix)
    if c.field == "GraceTime" and int(c.live or 0) < int(c.want):
        return Finding("error", "qos-grace",
                       f"{text}: shorter than the class's checkpoint grace, so preempted jobs "
                       "are killed before their checkpoint is written", fix)
    if c.field == "PreemptMode":
        return Finding("error", "qos-preempt-mode", f"{text}: preempted jobs are not requeued"
                       if c.want == "requeue" else text, fix)
    return Finding("warning", "qos-differs", text, fix)


def check_qos(snap: Snapshot, cfg: Config) -> List[Finding]:
    if "qos" not in snap:
        return [Finding("warning", "qos-unread", "QoS were not read (slurmdbd unreachable?)",
                        "check slurmdbd, then run 'slurmiso doctor' again")]
    desired = Q.desired_qos(cfg)
    try:
        changes = Q.diff(desired, Q.qos_from_rows(snap["qos"]))
    except ValueError as exc:  # a time sacctmgr would not print: say so, do not crash doctor
        return [Finding("error", "qos-unread", f"QoS could not be read: {exc}",
                        "check 'sacctmgr -P show qos' and the snapshot's qos rows")]
    account_qos = {a: tuple(q) for a, q in snap.get("account_qos", {}).items()}
    grants, unknown = Q.grant_changes(desired, account_qos)
    missing = {c.qos for c in changes if c.action == "add"}
    out = [_qos_finding(c, desired, cfg.classes) for c in changes + grants
           if c.action != "set" or c.qos not in missing]  # one finding per missing QoS
    out += [Finding("error", "qos-account",
                    f"account {a} (qos.accounts in the config) does not exist in slurmdbd",
                    f"sacctmgr add account {a}, or remove it from the config") for a in unknown]
    return out


def check_submit_plugins(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Submit-time checks are optional layers: info only, never a failing exit."""
    out: List[Finding] = []
    if "lua" not in conf_items(conf(snap, "JobSubmitPlugins")):
        out.append(Finding("info", "job-submit",
                           "JobSubmitPlugins has no lua: class rules are not checked at submit",
                           "slurmiso gen job-submit; set JobSubmitPlugins=lua"))
    from slurmiso.doctor.plugstack import stack

    plug = snap.get("plugstack") or {}
    lines, unread = stack(plug)
    loaded = any(ln.kind in ("required", "optional")
                 and ln.path.rsplit("/", 1)[-1] == "slurmiso.so" for ln in lines)
    if not plug.get("exists") or not (loaded or unread):
        out.append(Finding("info", "plugstack",
                           f"{plug.get('path') or 'plugstack.conf'} does not load slurmiso's "
                           "SPANK plugin: --iso-* options are unavailable",
                           "slurmiso gen plugstack; install it on login and compute nodes"))
    return out


def check_plugstack_files(snap: Snapshot, cfg: Config) -> List[Finding]:
    """A ``required`` SPANK plugin that does not load aborts the whole stack: every job step on
    that node fails (slurmiso_fence.so is check_fence_plugin's)."""
    from slurmiso.doctor.plugstack import stack

    plug = snap.get("plugstack") or {}
    node = (snap.get("gpu_node") or {}).get("node")
    files = plug.get("plugins") or {}
    out: List[Finding] = []
    for ln in stack(plug)[0]:
        found = files.get(ln.path) or {}
        if ln.kind != "required" or found.get("exists") is not False \
                or ln.path.rsplit("/", 1)[-1] == "slurmiso_fence.so":
            continue
        out.append(Finding("error" if node else "info", "plugin-missing",
                           f"{found.get('resolved') or ln.path} ({ln.file}:{ln.lineno}, "
                           f"required) is not on {node or 'this host'}: every job step there "
                           "fails", f"install it on {node or 'this host'} (slurmiso.so: the "
                           "slurmiso-spank package), or fix the path"))
    return out


def check_slo_resolvable(snap: Snapshot, cfg: Config) -> List[Finding]:
    """A class's latency bound that a built-in server's buckets cannot place: its jobs read
    unknown whenever over 1 % of their requests fall in that bucket (issue 32)."""
    from slurmiso.config.slo_check import slo_problems

    return [Finding("warning", "slo-unresolvable", f"{key}: {words}",
                    fix="set monitor.slo[].p99_ms to a bucket edge or signal: ttft; check a "
                    "live server with: slurmiso signals check URL")
            for key, words in slo_problems(cfg)]


CHECKS: List[Check] = [
    check_preempt_type, check_preempt_mode, check_job_requeue, check_accounting_storage,
    check_accounting_enforce, check_accounting_tres, check_gres_types, check_prolog_flags,
    check_prep_plugins, check_slurmd_user, check_timeouts, check_gpu_acct, check_hooks_set,
    check_qos, check_submit_plugins, check_plugstack_files, check_slurm_version,
    check_slo_resolvable,
]
