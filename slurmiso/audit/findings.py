"""Findings: what in the audit needs a human, with the jobs/nodes concerned and a fix.

Pure rules over the aggregates (:mod:`slurmiso.audit.analyze`), the journal digest and the
config. Live node checks add theirs in :mod:`slurmiso.audit.live`. The exit code of
``slurmiso audit`` is 1 when any finding is at or above ``audit.severity``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence

from slurmiso.audit.analyze import Aggregator
from slurmiso.audit.digest import JournalDigest
from slurmiso.audit.sacct import ParseStats

SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}
_SHOW = 50


@dataclass
class Finding:
    severity: str
    code: str
    message: str
    fix: str = ""
    subjects: List[str] = field(default_factory=list)  # job ids or node names
    count: int = 0  # how many subjects in all (subjects may be cut to _SHOW)

    def to_dict(self) -> Dict[str, Any]:
        return {"severity": self.severity, "code": self.code, "message": self.message,
                "fix": self.fix, "subjects": self.subjects, "count": self.count}


def make(severity: str, code: str, message: str, fix: str = "",
         subjects: Sequence[str] = ()) -> Finding:
    subs = sorted(set(subjects), key=_natural)
    return Finding(severity, code, message, fix, subs[:_SHOW], len(subs))


def at_or_above(findings: Sequence[Finding], level: str) -> List[Finding]:
    rank = SEVERITY_RANK.get(level, 1)
    return [f for f in findings if SEVERITY_RANK.get(f.severity, 0) >= rank]


def sort_findings(findings: Sequence[Finding]) -> List[Finding]:
    return sorted(findings, key=lambda f: (-SEVERITY_RANK.get(f.severity, 0), f.code, f.message))


def input_findings(stats: ParseStats, journals: Sequence[Dict[str, Any]]) -> List[Finding]:
    """Problems with what the audit read: the report is partial when these appear."""
    out: List[Finding] = []
    src = stats.source or "sacct"
    if stats.truncated:
        out.append(make("warning", "sacct-truncated",
                        f"{src}: output ends mid-record; the report covers what came before",
                        "re-run sacct (was it killed, or the disk full?)"))
    if stats.bad:
        out.append(make("warning", "sacct-bad-records",
                        f"{src}: skipped {stats.bad} unreadable record(s): "
                        + "; ".join(stats.bad_samples[:3]),
                        "check the file is unmodified sacct -P or --json output"))
    if stats.unknown_fields:
        out.append(make("info", "sacct-unknown-fields",
                        f"{src}: ignored unknown field(s) {', '.join(stats.unknown_fields)}"))
    missing = [j["path"] for j in journals if j.get("missing")]
    if missing:
        out.append(make("warning", "journal-missing",
                        f"journal(s) not found: {', '.join(missing)}; checkpoint, requeue and "
                        "monitor figures leave those nodes out",
                        "check paths.journal in the config or pass --journal", missing))
    return out


def config_findings(cfg: Any) -> List[Finding]:
    return [
        make("warning", "class-without-checkpoint",
             f"class {c.name} is preemptible but declares no checkpoint: preemption loses "
             "all its work", f"add a checkpoint: section (signal, grace) to class {c.name}")
        for c in cfg.classes if c.preemptible and c.checkpoint is None
    ]


def job_findings(cfg: Any, agg: Aggregator, digest: JournalDigest) -> List[Finding]:
    """Rules over what the jobs did."""
    out: List[Finding] = []
    preemptible = {c.name for c in cfg.classes if c.preemptible}
    threshold = cfg.audit.repeated_preemptions
    not_requeued, no_ckpt, repeated = [], [], []
    for job, p in agg.preempted.items():
        requeued = agg.multi_attempts(job) > p.preemptions or job in digest.requeued_jobs
        if p.cls in preemptible and not requeued:
            not_requeued.append(job)
        if digest.records and p.cls in preemptible and job not in digest.checkpointing_jobs:
            no_ckpt.append(job)
        if p.preemptions >= threshold and not digest.made_progress(job):
            repeated.append(job)
    if not_requeued:
        out.append(make("warning", "training-not-requeued",
                        f"{len(not_requeued)} preemptible job(s) were preempted with no later "
                        "attempt in accounting or the journals: not requeued (their run was "
                        "thrown away), or the requeued attempt never became eligible in the "
                        "window",
                        "PreemptMode=REQUEUE on the train QoS (CANCEL voids --requeue), "
                        "JobRequeue=1 or sbatch --requeue; check MaxBatchRequeue", not_requeued))
    if no_ckpt:
        out.append(make("warning", "training-without-checkpoint",
                        f"{len(no_ckpt)} preempted training job(s) never reported a checkpoint "
                        "in the journals",
                        "run the program as 'slurmiso run -- ...' and save on the class's "
                        "checkpoint signal (or use slurmiso.checkpoint)", no_ckpt))
    if repeated:
        out.append(make("warning", "repeated-preemption",
                        f"{len(repeated)} job(s) preempted {threshold}+ times without progress "
                        "(no successful checkpoint, no advancing resume step)",
                        "raise PreemptExemptTime on the train QoS so a job can reach a "
                        "checkpoint; make sure it checkpoints within GraceTime", repeated))
    for name, stats in sorted(agg.classes.items()):
        if stats.long_jobs:
            out.append(make("warning", "long-infer-jobs",
                            f"{stats.long_jobs} job(s) of class {name} ran longer than "
                            f"{cfg.audit.long_infer_job_s // 3600}h: batch work under a "
                            "never-preempted QoS blocks training",
                            f"submit batch work with --qos=train; lower qos.max_wall of {name}",
                            stats.long_job_ids))
        if stats.idle_gpu_hours > 0:
            out.append(make("info", "idle-allocated-gpus",
                            f"class {name}: {stats.idle_gpu_hours:.1f} GPU-hours allocated to "
                            "jobs whose GPUs stayed at 0% utilisation (sacct gres/gpuutil)",
                            "ask the owners; consider MPS or MIG shares for such jobs"))
    out.extend(_slo_findings(cfg, agg, digest))
    out.extend(_journal_findings(digest))
    return out


def _slo_findings(cfg: Any, agg: Aggregator, digest: JournalDigest) -> List[Finding]:
    out: List[Finding] = []
    for slo in cfg.monitor.slo:
        stats = agg.classes.get(slo.class_name)
        if slo.max_queue_wait_s is not None and stats and stats.wait.n:
            met = stats.wait_slo_met / stats.wait.n
            if met < 0.95:
                out.append(make("warning", "wait-slo-missed",
                                f"class {slo.class_name}: {met:.1%} of starts waited at most "
                                f"{slo.max_queue_wait_s}s (SLO; 95% expected)",
                                "check that the class preempts what blocks it, and its limits"))
        samples = [ms for c, ms in digest.latency if c in ("", slo.class_name)]
        if slo.p99_latency_ms is not None and samples:
            over = sum(1 for ms in samples if ms > slo.p99_latency_ms)
            if over / len(samples) > 0.05:
                out.append(make("warning", "latency-slo-missed",
                                f"class {slo.class_name}: P99 latency above "
                                f"{slo.p99_latency_ms:g} ms in {over} of {len(samples)} samples",
                                "lower the training share on serving GPUs (MPS/MIG profile)"))
    return out


def _journal_findings(digest: JournalDigest) -> List[Finding]:
    out: List[Finding] = []
    for cls, ck in sorted(digest.checkpoints.items()):
        if ck.over_grace:
            out.append(make("warning", "checkpoint-over-grace",
                            f"class {cls}: {ck.over_grace} checkpoint(s) took longer than the "
                            f"{ck.grace_s or 0:g}s grace time", "raise the class's checkpoint "
                            "grace (QoS GraceTime) or checkpoint less state"))
        if ck.failed:
            out.append(make("warning", "checkpoint-failed",
                            f"class {cls}: {ck.failed} checkpoint(s) reported failure",
                            "see the checkpoint-end reasons in the journal"))
    if digest.requeue_declined:
        out.append(make("info", "requeue-declined",
                        f"{len(digest.requeue_declined)} requeue(s) declined by the wrapper: "
                        + "; ".join(sorted({r for _, r in digest.requeue_declined})[:3]),
                        "raise checkpoint.max_requeues if these jobs should go on",
                        [j for j, _ in digest.requeue_declined]))
    if digest.mps_conflicts:
        out.append(make("warning", "mps-user-conflict",
                        f"{len(digest.mps_conflicts)} time(s) jobs of different users shared an "
                        "MPS daemon (time-sliced, no isolation between them)",
                        "keep MPS pools to one user per GPU (e.g. OverSubscribe=NO per GPU)",
                        sorted({n for n, _ in digest.mps_conflicts})))
    if digest.refused:
        reasons = "; ".join(f"{r} ({n}x)" for r, n in digest.refused.most_common(3))
        out.append(make("info", "prolog-refused",
                        f"{sum(digest.refused.values())} job(s) refused by the prolog: {reasons}",
                        "stop such requests at submit time (job_submit.lua / SPANK checks)"))
    if digest.idle_jobs:
        out.append(make("info", "monitor-idle-jobs",
                        f"the monitor flagged {len(digest.idle_jobs)} job(s) as idle on their "
                        "GPUs", "ask the owners to release idle allocations",
                        list(digest.idle_jobs)))
    return out


def _natural(s: str) -> Any:
    head = s.split("_")[0].split("+")[0]
    return (0, int(head), s) if head.isdigit() else (1, 0, s)
