"""Findings: what in the audit needs a human, with the jobs/nodes concerned and a fix.

Pure rules over the aggregates (:mod:`slurmiso.audit.figures.aggregate`), the journal digest and the
config, as :class:`slurmiso.doctor.Finding` (one type for doctor and audit). ``--live``
adds doctor's checks and the node's leftovers (:mod:`slurmiso.audit.read.live`). The exit code of
``slurmiso audit`` is 1 when any finding is at or above ``audit.severity``.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from slurmiso.audit.figures.aggregate import Aggregator
from slurmiso.audit.figures.jobledger import JobMark, Tally, natural
from slurmiso.audit.read.digest import JournalDigest
from slurmiso.audit.read.sacct import USER_FIELDS, ParseStats
from slurmiso.doctor import Finding

SEVERITY_RANK = {"info": 0, "warning": 1, "error": 2}
_SHOW = 50


def make(severity: str, code: str, message: str, fix: str = "",
         subjects: Sequence[str] = ()) -> Finding:
    """A finding whose subjects are sorted naturally and cut to the first 50."""
    subs = sorted(set(subjects), key=natural)
    return Finding(severity, code, message, fix, tuple(subs[:_SHOW]), len(subs))


def tallied(severity: str, code: str, message: str, fix: str, tally: Tally) -> Finding:
    """A finding about the jobs of a tally: its first ids (natural order) and its count."""
    return Finding(severity, code, message, fix, tuple(tally.ids[:_SHOW]), tally.count)


def at_or_above(findings: Sequence[Finding], level: str) -> List[Finding]:
    rank = SEVERITY_RANK.get(level, 1)
    return [f for f in findings if SEVERITY_RANK.get(f.severity, 0) >= rank]


def sort_findings(findings: Sequence[Finding]) -> List[Finding]:
    return sorted(findings, key=lambda f: (-SEVERITY_RANK.get(f.severity, 0), f.code, f.message))


def input_findings(stats: ParseStats, journals: Sequence[Dict[str, Any]],
                   agg: Optional[Aggregator] = None,
                   digest: Optional[JournalDigest] = None) -> List[Finding]:
    """What the input cannot show. Each says what to change; the report marks the figures
    that depend on it unknown (see :func:`slurmiso.audit.figures.report.unknowns`)."""
    out: List[Finding] = []
    src = stats.source or "sacct"
    if stats.truncated:
        out.append(make("warning", "sacct-truncated",
                        f"{src}: output ends mid-record; the report covers what came before",
                        "re-run sacct (was it killed, or the disk full?)"))
    if stats.bad:
        out.append(make("warning", "sacct-bad-records",
                        f"{src}: left {stats.bad} record(s) out of every figure (unreadable, "
                        "or negative/inconsistent times): " + "; ".join(stats.bad_samples[:3]),
                        "check the file is unmodified sacct -P or --json output; for live "
                        "sacct, check slurmdbd's clock and the job records named"))
    user = sorted(USER_FIELDS.intersection(stats.fields))
    if user and stats.bad:
        out.append(make("warning", "sacct-forgeable-rows",
                        f"{src}: {stats.bad} line(s) are no sacct row, in a file that holds "
                        f"{', '.join(user)}, text a job's user writes: a newline there ends a "
                        "line early, and the text after it may read as rows of other jobs",
                        "save sacct with the audit's own --format (slurmiso audit --help: no "
                        "field a user writes) or --json; live audits ask for no such field"))
    if stats.unknown_fields:
        out.append(make("info", "sacct-unknown-fields",
                        f"{src}: ignored unknown field(s) {', '.join(stats.unknown_fields)}"))
    if not stats.records and not stats.bad:
        out.append(make("warning", "sacct-no-records",
                        f"{src}: no job records at all (a header and nothing else); every "
                        "figure is unknown, not zero",
                        "check the window (--since/--until) and that sacct ran with -a as "
                        "root or an operator"))
    missing = [j["path"] for j in journals if j.get("missing")]
    if missing:
        out.append(make("warning", "journal-missing",
                        f"journal(s) not found: {', '.join(missing)}; checkpoint, requeue and "
                        "monitor figures leave those nodes out",
                        "point paths.journal at the shared journal directory with %n "
                        "(e.g. /var/log/slurmiso/%n.jsonl) or pass --journal", missing))
    elif not journals or (digest is not None and not digest.records):
        out.append(make("warning" if not journals else "info", "journal-empty",
                        "no journal records: time to checkpoint, measured lost work, wrapper "
                        "requeues and monitor actions are unknown",
                        "share the nodes' journals (paths.journal with %n on a shared "
                        "directory) with the host that runs the audit, or pass --journal"))
    if agg is not None:
        out.extend(_coverage_findings(stats, agg))
    if digest is not None and digest.rejected:
        out.append(make("warning", "journal-untrusted-lines",
                        f"{digest.rejected} journal line(s) ignored: their writer cannot have "
                        f"written them ({'; '.join(digest.rejected_samples)})",
                        "a job's events file may only report wrapper events; look at these "
                        "jobs' users", digest.rejected_jobs))
    if digest is not None and digest.ladder.bad:
        out.append(make("warning", "ladder-bad-lines",
                        f"{digest.ladder.bad} ladder line(s) of the monitor's journal left out "
                        "of what the ladder cost (" + "; ".join(digest.ladder.bad_samples)
                        + "): those figures cover the rest",
                        "look at the monitor's journal for damage; an SLO figure out of range "
                        "came from an inference job's metrics endpoint"))
    return out


def _coverage_findings(stats: ParseStats, agg: Aggregator) -> List[Finding]:
    out: List[Finding] = []
    missing = agg.missing_attempts()
    if missing is not None:
        out.append(tallied("warning", "sacct-without-duplicates",
                           f"{missing.count} job(s) have Restarts > 0 but none of their "
                           "earlier attempts is in the input: it was saved without sacct -D, "
                           "so preemptions, requeues and GPU-hours of earlier attempts are "
                           "unknown",
                           "run sacct with -D (--duplicates), as 'slurmiso audit' does",
                           missing))
    late = agg.job_tallies()[JobMark.LATE]
    if late.count:
        out.append(tallied("warning", "sacct-attempts-apart",
                           f"{late.count} attempt(s) came after thousands of other jobs since "
                           "their job's previous one (sacct lists a job's attempts together): "
                           "the input was joined or sorted by hand, so the findings about "
                           "preempted, requeued and restarted jobs may count those jobs' "
                           "attempts apart; every figure is exact",
                           "audit sacct's own output, one file per cluster, in its order",
                           late))
    gpu_rows = sum(p[0] for p in agg.pools.values())
    if gpu_rows and not any(c.gpu_hours for c in agg.classes.values()) and stats.records:
        out.append(make("warning", "gpu-tres-missing",
                        "no record carries gres/gpu, gres/mps or gres/shard in AllocTRES: GPU "
                        "accounting is off, so GPU-hours are unknown",
                        "add AccountingStorageTRES=gres/gpu,gres/mps,gres/shard to slurm.conf"))
    if agg.since is not None and agg.first_time is not None and agg.until is not None:
        slack = max(3600.0, 0.05 * (agg.until - agg.since))
        gap_lo = agg.first_time - agg.since
        gap_hi = agg.until - (agg.last_time or agg.until)
        if gap_lo > slack or gap_hi > slack:
            out.append(make("info", "window-not-covered",
                            "the data covers less than the window: first record at "
                            f"{_iso(agg.first_time)}, last at {_iso(agg.last_time)}; figures "
                            "for the rest of the window are unknown, not zero",
                            "save sacct for the whole window (-S/-E), or narrow --since/--until"))
    return out


def _iso(ts: Optional[float]) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def config_findings(cfg: Any) -> List[Finding]:
    return [
        make("warning", "class-without-checkpoint",
             f"class {c.name} is preemptible but declares no checkpoint: preemption loses "
             "all its work", f"add a checkpoint: section (signal, grace) to class {c.name}")
        for c in cfg.classes if c.preemptible and c.checkpoint is None
    ]


#: The findings about settled jobs (:mod:`~slurmiso.audit.figures.jobledger`): the tally,
#: the code, the message ({n} jobs, {threshold} preemptions) and the fix.
_JOB_RULES = (
    (JobMark.NOT_REQUEUED, "training-not-requeued",
     "{n} preemptible job(s) were preempted with no later attempt in accounting or the "
     "journals: not requeued (their run was thrown away), or the requeued attempt never "
     "became eligible in the window",
     "PreemptMode=REQUEUE on the train QoS (CANCEL voids --requeue), JobRequeue=1 or sbatch "
     "--requeue; check MaxBatchRequeue"),
    (JobMark.NO_CHECKPOINT, "training-without-checkpoint",
     "{n} preempted training job(s) never reported a checkpoint in the journals",
     "run the program as 'slurmiso run -- ...' and save on the class's checkpoint signal (or "
     "use slurmiso.checkpoint)"),
    (JobMark.REPEATED, "repeated-preemption",
     "{n} job(s) preempted {threshold}+ times without progress (no successful checkpoint, no "
     "advancing resume step)",
     "raise PreemptExemptTime on the train QoS so a job can reach a checkpoint; make sure it "
     "checkpoints within GraceTime"),
)


def job_findings(cfg: Any, agg: Aggregator, digest: JournalDigest) -> List[Finding]:
    """Rules over what the jobs did."""
    out: List[Finding] = []
    threshold = cfg.audit.repeated_preemptions
    jobs = agg.job_tallies()
    for mark, code, text, fix in _JOB_RULES:
        tally = jobs[mark]
        if tally.count:
            out.append(tallied("warning", code, text.format(n=tally.count, threshold=threshold),
                               fix, tally))
    for name, stats in sorted(agg.classes.items()):
        if stats.long_jobs:
            out.append(make("warning", "long-infer-jobs",
                            f"{stats.long_jobs} job(s) of class {name} ran longer than "
                            f"{cfg.audit.long_infer_job_s // 3600}h: batch work under a "
                            "never-preempted QoS blocks training",
                            f"submit batch work with --qos=train; lower qos.max_wall of {name}",
                            stats.long_job_ids))
        if stats.idle_gpu_hours > 0:
            idle = [job for _, job, _, util, _, c in agg.inefficient if util <= 0 and c == name]
            out.append(make("info", "idle-allocated-gpus",
                            f"class {name}: {stats.idle_gpu_hours:.1f} GPU-hours allocated to "
                            "jobs whose GPUs stayed at 0% utilisation (sacct gres/gpuutil)",
                            "ask the owners; consider MPS or MIG shares for such jobs", idle))
    out.extend(_slo_findings(cfg, agg, digest))
    out.extend(_journal_findings(digest))
    out.extend(_monitor_requeue_findings(agg, digest))
    out.extend(_telemetry_findings(agg, digest))
    out.extend(_ladder_findings(cfg, digest, agg.until))
    return out


def _telemetry_findings(agg: Aggregator, digest: JournalDigest) -> List[Finding]:
    """Nodes whose telemetry the monitor could not read: it kept training off them and its
    ladder neither stepped nor released there, blind, for that long."""
    from slurmiso.audit.figures.telemetry import telemetry_end

    nodes = {n: v for n, v in digest.telemetry.totals(telemetry_end(agg, digest)).items()
             if v["unknown_s"] > 0 or v["still_unknown"]}
    out: List[Finding] = []
    if nodes:
        worst = sorted(nodes.items(), key=lambda kv: (-kv[1]["unknown_s"], kv[0]))
        out.append(make("warning", "telemetry-unknown",
                        f"telemetry of {len(nodes)} node(s) was unknown to the monitor for "
                        f"{sum(v['unknown_s'] for v in nodes.values()):.0f}s in all: "
                        + ", ".join(f"{n} {v['unknown_s']:.0f}s"
                                    f" ({v['reason'] or '?'}"
                                    f"{', still unknown' if v['still_unknown'] else ''})"
                                    for n, v in worst[:5]),
                        "check each node's slurmiso agent (systemctl status slurmiso-agent) "
                        "and that the monitor reaches its port", list(nodes)))
    if digest.telemetry.bad:
        out.append(make("warning", "telemetry-bad-lines",
                        f"{digest.telemetry.bad} monitor-telemetry line(s) left out: not a "
                        "node, state or duration the monitor writes",
                        "check who else writes the monitor's journal"))
    return out


def _monitor_requeue_findings(agg: Aggregator, digest: JournalDigest) -> List[Finding]:
    """The monitor's own requeues of running training, named as such. The job's wrapper
    reads their SIGTERM as a preemption, finds Slurm showing the job requeued already and
    reports a declined requeue; the job goes on from its checkpoint. Those lines are the
    monitor's requeues (never ``requeue-declined``), and the work the ladder's cost is
    accounting's (REQUEUED attempts, since the last checkpoint, as the ladder section)."""
    out: List[Finding] = []
    said = {k: [j for j, kind in digest.monitor_requeue_declines if kind == k]
            for k in ("ladder", "monitor")}
    jobs = sorted(set(digest.ladder.requeued_at) | set(said["ladder"]))
    if jobs:
        n = sum(len(t) for t in digest.ladder.requeued_at.values()) or len(jobs)
        found = [0.0, 0.0, 0.0]
        for row in agg.ladder_lost.values():
            for i, v in enumerate(row):
                found[i] += v
        if found[0] >= n:
            lost = (f"{found[1] + found[2]:.2f} GPU-hours of work since the last checkpoint "
                    "lost" + (f" ({found[2]:.2f} of them estimated: no checkpoint seen)"
                              if found[2] else ""))
        else:
            lost = (f"the work lost is unknown: accounting shows {int(found[0])} of the "
                    f"{n} requeue(s)")
        wrapper = (f"; {len(said['ladder'])} job(s)' wrappers reported it as a declined "
                   "requeue, which it was not" if said["ladder"] else "")
        out.append(make("info", "ladder-requeue",
                        f"{n} ladder requeue(s) of training (the monitor's SLO ladder; "
                        f"the jobs start again from their checkpoint): {lost}{wrapper}",
                        "see 'What the ladder cost training'; budgets: monitor.ladder",
                        jobs))
    if said["monitor"]:
        out.append(make("info", "monitor-requeue",
                        f"{len(said['monitor'])} training job(s) requeued by the monitor's "
                        "MIG re-layout (preempt-training), not declined requeues",
                        "see monitor.relayout", said["monitor"]))
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
                            f"class {cls}: {ck.over_grace} requested checkpoint(s) took longer "
                            f"than the {ck.grace_s or 0:g}s grace time (as the jobs reported)",
                            "raise the class's checkpoint grace (QoS GraceTime) or checkpoint "
                            "less state", ck.over_grace_jobs))
        if ck.failed:
            out.append(make("warning", "checkpoint-failed",
                            f"class {cls}: {ck.failed} requested checkpoint(s) reported failure",
                            "see the checkpoint-end reasons in the journal", ck.failed_jobs))
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
    out.extend(_mps_sharing_findings(digest))
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


def _ladder_findings(cfg: Any, digest: JournalDigest,
                     until: Optional[float]) -> List[Finding]:
    """A restraint the ladder put on running training with no release in the journals
    (no unthrottle, resume, requeue or end line), with its job id (issue 33): a warning
    once it has lasted its step's bound (``monitor.ladder.<step>.max``) by the window's end
    (``until``; for a saved file without one, the last ladder line), when the monitor or the
    node should have ended it; info while it may still be in force for a reason. A monitor
    that died writes no more lines: the window's end, not its last line, ages it."""
    log = digest.ladder
    if not log.open_since:
        return []
    bounds = {st.name: st.max_s for st in cfg.monitor.ladder.steps}
    bounds["host-limit"] = cfg.monitor.ladder.host_limit.max_s
    end = until if until is not None else (log.last_ts or 0.0)
    past: List[Tuple[str, str]] = []
    within: List[Tuple[str, str]] = []
    for job, (step, when) in sorted(log.open_since.items(), key=lambda kv: kv[1][1]):
        lasted = max(0.0, end - when)
        bound = bounds.get(step, min(bounds.values(), default=0))
        (past if lasted >= bound else within).append(
            (job, f"job {job} {_DONE.get(step, step)} since {_iso(when)} (at least "
                  f"{lasted:.0f}s by {_iso(end)}; bound {bound:.0f}s)"))
    fix = ("check each job (scontrol show job: JobState, AdminComment); 'slurmiso monitor "
           "status' lists what the monitor holds, 'slurmiso status' on the node what is in "
           "force, and 'slurmiso reconcile' there ends one past its bound when no monitor "
           "is alive")
    out = []
    for severity, rows, what in (("warning", past, "past its bound"),
                                 ("info", within, "within its bound")):
        if rows:
            text = "; ".join(t for _, t in rows[:5]) + ("; ..." if len(rows) > 5 else "")
            out.append(make(severity, "ladder-unreleased",
                            f"{len(rows)} training job(s) restrained by the ladder with no "
                            f"release in the journals, {what}: {text}", fix,
                            [j for j, _ in rows]))
    return out


_DONE = {"throttle": "throttled", "suspend": "suspended", "park": "parked",
         "host-limit": "host-limited"}


def _mps_sharing_findings(digest: JournalDigest) -> List[Finding]:
    """MPS sharing split into concurrent (one user) and serialised (several users, whose
    MPS servers the GPU time-slices), from the hooks' job-end lines."""
    from slurmiso.audit.figures.mps_sharing import sharing
    from slurmiso.config.mps_users import FIX

    if not digest.mps_intervals:
        return []
    got = sharing(digest.mps_intervals)
    if not got.shared_s:
        return []
    pct = 100.0 * got.serialised_s / got.shared_s
    worst = ", ".join(f"{n} GPU {g} ({s / 3600:.1f} h)" for n, g, s in got.worst)
    return [make(
        "warning" if got.serialised_s else "info", "mps-sharing",
        f"MPS GPUs were shared for {got.shared_s / 3600:.1f} GPU-hours on {got.gpus} GPU(s): "
        f"{got.concurrent_s / 3600:.1f} h concurrent (one user's jobs), "
        f"{got.serialised_s / 3600:.1f} h ({pct:.0f}%) serialised (different users' jobs, "
        "time-sliced between their MPS servers)" + (f"; most on {worst}" if worst else ""),
        FIX if got.serialised_s else "nothing to do: the sharing ran concurrently",
        sorted({n for n, _, _ in got.worst}))]

