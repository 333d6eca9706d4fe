"""The definition of every figure the audit reports, by the key the JSON uses.

``docs/audit.md`` explains each at length under a heading of the same key; the JSON report
carries this table as ``definitions`` so a figure read out of it can be looked up, and a unit
test checks that every figure key has an entry here and a section in the docs.
"""

from __future__ import annotations

from typing import Dict

DOC = "docs/audit.md"

DEFINITIONS: Dict[str, str] = {
    "jobs": "distinct job ids with an attempt in the window (array tasks count apart)",
    "attempts": "allocation records in the window (sacct -D: one per requeued attempt)",
    "requeues": "attempts - jobs; unknown when the input lacks sacct -D",
    "preemptions": "attempts in state PREEMPTED (accounting); unknown without sacct -D",
    "preemptions_user_reported": "REQUEUED attempts the job's wrapper reported as preempted "
                                 "(user-reported, not counted in preemptions)",
    "started": "attempts that started inside the window",
    "wait_p50_s": "median of start - eligible (submit if eligible unknown), seconds",
    "wait_p95_s": "95th percentile (nearest rank) of the wait, seconds",
    "wait_p99_s": "99th percentile (nearest rank) of the wait, seconds",
    "wait_max_s": "longest wait, seconds",
    "gpu_hours": "GPU equivalents x hours of the run inside [since, until) (sreport's clipping)",
    "lost_gpu_hours": "GPU-hours of preempted attempts after their last user-reported "
                      "checkpoint, clipped to the window",
    "lost_gpu_hours_estimated": "GPU-hours of preempted attempts of jobs that never reported "
                                "a checkpoint: the whole attempt (an estimate)",
    "idle_gpu_hours": "GPU-hours of attempts whose gres/gpuutil stayed 0; unknown without "
                      "GPU utilisation accounting",
    "util_accounted_gpu_hours": "GPU-hours of attempts whose gres/gpuutil Slurm accounted",
    "wait_slo": "share of started attempts that waited at most the class's max_queue_wait",
    "checkpoints": "requested checkpoints (checkpoint-end after a preemption asked), per class",
    "ok": "requested checkpoints the job reported as saved",
    "failed": "requested checkpoints the job reported as failed",
    "over_grace": "requested checkpoints that took longer than the grace time",
    "periodic": "checkpoints the program took on its own schedule (requested: false)",
    "grace_s": "the grace time the wrapper was given (QoS GraceTime), seconds",
    "p50_s": "median time to a requested checkpoint, seconds (user-reported)",
    "p95_s": "95th percentile time to a requested checkpoint, seconds (user-reported)",
    "max_s": "longest time to a requested checkpoint, seconds (user-reported)",
    "pool_gpu_hours": "GPU-hours per pool (by partition, else by node name)",
    "capacity_gpus": "GPUs in the pool: nodes x gpus_per_node (config) or from scontrol "
                     "show nodes",
    "use_share": "pool GPU-hours in a bucket / (capacity_gpus x bucket hours)",
    "user_rank": "per user: GPU-hours, idle allocated GPU-hours, lost GPU-hours (measured + "
                 "estimated), preemptions suffered, jobs",
    "account_rank": "the same per Slurm account",
    "gpu_efficiency": "per job: Slurm's gres/gpuutil as a share of its GPUs (a value above "
                      "100 is read as a sum over the job's GPUs); wasted = GPU-hours x (1 - "
                      "efficiency)",
    "series_gpu_hours": "GPU-hours per time bucket, each attempt's hours spread over the "
                        "buckets it ran in",
    "series_wait": "mean and max wait of attempts that started in the bucket",
    "data_span": "earliest start and latest end of the attempts read (the data's real span)",
    "latency_attainment": "share of monitor latency samples at or under the class's P99 target",
    "journal_user_reported": "journal lines written by jobs' own users (source: job)",
    "journal_rejected": "journal lines whose writer cannot have written that event: ignored",
    "ladder_status": "active: the monitor's ladder took a step (or a dry run of one) in the "
                     "window; none: journals read, no ladder line; unknown: no journal record",
    "ladder_taken": "steps the ladder took (ok, not a dry run), per step, in all, per class "
                    "of the training job (prolog) and per pool (the line's node)",
    "ladder_throttled_s": "seconds training was throttled, from the lines that ended a "
                          "throttle (unthrottle, requeue, ladder-end), clipped to the window",
    "ladder_suspended_s": "seconds training was suspended, from resume-job, requeue and "
                          "ladder-end lines, clipped to the window",
    "ladder_throttled_gpu_hours": "throttled seconds x the job's GPUs (its prolog lines' "
                                  "gpus, whole GPUs) / 3600; unknown if any job's GPUs are",
    "ladder_suspended_gpu_hours": "suspended seconds x the job's GPUs / 3600; unknown if any "
                                  "job's GPUs are",
    "ladder_gpus_unknown": "restraints whose job's GPUs no prolog line gave",
    "ladder_requeues_in_sacct": "REQUEUED attempts in accounting during which the ladder "
                                "requeued the job",
    "ladder_requeue_lost_gpu_hours": "GPU-hours of those attempts after their last "
                                     "user-reported checkpoint (as lost_gpu_hours); unknown "
                                     "unless every requeue's attempt is in accounting",
    "ladder_requeue_lost_gpu_hours_estimated": "the same for jobs that never reported a "
                                               "checkpoint: the whole attempt",
    "ladder_unreleased": "jobs throttled or suspended in the window with no release read: "
                         "their time is in no figure",
    "ladder_slo": "per step and signal: the inference figure (P99 ms, error rate) at "
                  "escalations, mean and max; at releases, the mean before (when the job "
                  "was first restrained) and after",
    "ladder_bad_lines": "ladder lines left out of every figure: a wrong type, a negative, "
                        "non-finite or out-of-range figure or duration, an unknown step",
    "telemetry_unknown_s": "per node, seconds its telemetry was unknown to the monitor in the "
                           "window (its monitor-telemetry lines); an outage still open counts "
                           "to the window's end",
}
