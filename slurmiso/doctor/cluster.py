"""Cluster-wide checks: slurm.conf settings and QoS (pure functions of a snapshot).

Each check reads ``snap["config"]`` (``scontrol show config``) or ``snap["qos"]`` and returns
findings whose ``fix`` is the line or command that repairs it.
"""

from __future__ import annotations

from typing import List

from slurmiso.config.model import Config
from slurmiso.doctor import Check, Finding, Snapshot
from slurmiso.slurm import qos as Q
from slurmiso.slurm import slurmconf

UNSET = ("", "(null)", "none", "n/a")


def conf(snap: Snapshot, key: str) -> str:
    """A ``scontrol show config`` value; "" when unset (``(null)``)."""
    value = str(snap.get("config", {}).get(key, "")).strip()
    return "" if value.lower() in UNSET else value


def _items(value: str) -> List[str]:
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
    modes = _items(conf(snap, "PreemptMode"))
    if "requeue" not in modes:
        why = ("CANCEL silently voids --requeue: preempted training is killed, not requeued"
               if "cancel" in modes else "preempted training is not requeued")
        out.append(Finding("error", "preempt-mode",
                           f"PreemptMode={conf(snap, 'PreemptMode') or '(none)'}: {why}",
                           "set PreemptMode=REQUEUE in slurm.conf"))
    pools = {p.partition for p in cfg.pools}
    for name, part in sorted(snap.get("partitions", {}).items()):
        pmode = _items(str(part.get("PreemptMode", "")))
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


def check_accounting_enforce(snap: Snapshot, cfg: Config) -> List[Finding]:
    have = _items(conf(snap, "AccountingStorageEnforce"))
    missing = [x for x in ("associations", "limits", "qos") if x not in have]
    if not missing:
        return []
    sev = "error" if "qos" in missing or "associations" in missing else "warning"
    return [Finding(sev, "accounting-enforce",
                    f"AccountingStorageEnforce lacks {','.join(missing)}: "
                    + ("any user may submit with any --qos (QoS grants are not enforced)"
                       if "qos" in missing else "QoS MaxWall/MaxTRESPerJob are not enforced"),
                    "set AccountingStorageEnforce=associations,limits,qos in slurm.conf")]


def check_accounting_tres(snap: Snapshot, cfg: Config) -> List[Finding]:
    have = _items(conf(snap, "AccountingStorageTRES"))
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
    have = _items(conf(snap, "GresTypes"))
    want = slurmconf.gres_types(cfg.pools)
    missing = [t for t in want if t not in have]
    if not missing:
        return []
    return [Finding("error", "gres-types",
                    f"GresTypes lacks {','.join(missing)}, which the pools use",
                    f"set GresTypes={','.join(want)} in slurm.conf and restart the daemons")]


def check_prolog_flags(snap: Snapshot, cfg: Config) -> List[Finding]:
    flags = _items(conf(snap, "PrologFlags"))
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
    if "alloc" in flags:
        return []
    return [Finding("error", "prolog-flags",
                    f"PrologFlags={conf(snap, 'PrologFlags') or '(none)'}: without Alloc the "
                    "Prolog runs only when the first step starts, so a job can start on a GPU "
                    "slurmiso has not prepared", "set PrologFlags=Alloc in slurm.conf")]


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
    elif "disablegpuacct" not in _items(conf(snap, "JobAcctGatherParams")):
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
        if not conf(snap, key):
            out.append(Finding("error", "hook-unset",
                               f"{key} is not set: slurmiso's per-job GPU isolation never runs",
                               f"set {key}={bindir}/{name} in slurm.conf "
                               "('slurmiso gen slurm-conf')"))
    return out


def _qos_finding(c: Q.Change, desired: List[Q.Qos]) -> Finding:
    want = next(q for q in desired if q.name == c.qos)
    fix = "slurmiso qos apply"
    if c.action == "add":
        return Finding("error", "qos-missing", f"QoS {c.qos} does not exist in slurmdbd", fix)
    if c.action == "grant":
        return Finding("error", "qos-grant",
                       f"account {c.account} may not use QoS {c.qos} (qos.accounts says it may)",
                       fix)
    text = f"QoS {c.qos}: {c.field}={c.live or '(unset)'}, the config says {c.want or '(none)'}"
    if c.field == "Preempt" and want.preempt:
        return Finding("error", "qos-preempt",
                       f"{text}: {c.qos} jobs do not preempt {','.join(want.preempt)}", fix)
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
    changes = Q.diff(desired, Q.qos_from_rows(snap["qos"]))
    account_qos = {a: tuple(q) for a, q in snap.get("account_qos", {}).items()}
    grants, unknown = Q.grant_changes(desired, account_qos)
    missing = {c.qos for c in changes if c.action == "add"}
    out = [_qos_finding(c, desired) for c in changes + grants
           if c.action != "set" or c.qos not in missing]  # one finding per missing QoS
    out += [Finding("error", "qos-account",
                    f"account {a} (qos.accounts in the config) does not exist in slurmdbd",
                    f"sacctmgr add account {a}, or remove it from the config") for a in unknown]
    return out


def check_submit_plugins(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Submit-time checks are optional layers: info only, never a failing exit."""
    out: List[Finding] = []
    if "lua" not in _items(conf(snap, "JobSubmitPlugins")):
        out.append(Finding("info", "job-submit",
                           "JobSubmitPlugins has no lua: class rules are not checked at submit",
                           "slurmiso gen job-submit; set JobSubmitPlugins=lua"))
    plug = snap.get("plugstack") or {}
    if not plug.get("exists") or "slurmiso" not in str(plug.get("text", "")):
        out.append(Finding("info", "plugstack",
                           f"{plug.get('path') or 'plugstack.conf'} does not load slurmiso's "
                           "SPANK plugin: --iso-* options are unavailable",
                           "slurmiso gen plugstack; install it on login and compute nodes"))
    return out


CHECKS: List[Check] = [
    check_preempt_type, check_preempt_mode, check_job_requeue, check_accounting_enforce,
    check_accounting_tres, check_gres_types, check_prolog_flags, check_gpu_acct,
    check_hooks_set, check_qos, check_submit_plugins, check_slurm_version,
]
