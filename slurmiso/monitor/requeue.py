"""The requeue delay (pure): on Slurm 22.05 a preempted training job comes back pending with
a ``BeginTime`` about 120 s ahead and sits idle even once its GPUs are free. The monitor notices
a training job that ran last cycle and now waits for its BeginTime and, once the job that
preempted it runs (no eligible inference waits on a node this job could use), sets
``StartTime=now``, within the start budget shared with arrivals and releases.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List

from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.policy import Memory, Policy
from slurmiso.monitor.snapshot import JobInfo, Snapshot


def begin_now(snap: Snapshot, policy: Policy, mem: Memory, pending: Dict[str, JobInfo],
              allowance: int, open_for: Any, order: Callable[[JobInfo], Any]) -> List[Action]:
    """A requeued training job waits out a BeginTime (about 120 s on 22.05) even once its
    GPUs are free: start it now once the job that preempted it runs (no eligible inference
    waits on any node this job could use), within the start budget."""
    train = set(policy.train_classes)
    was_running = set(mem.running_train)
    for job in pending.values():
        if job.id in was_running and job.job_class in train and job.reason == "BeginTime":
            mem.requeued.setdefault(job.id, snap.ts)
    mem.running_train = sorted(j.id for j in snap.jobs
                               if j.state == "RUNNING" and j.job_class in train)
    for jid in list(mem.requeued):
        back = pending.get(jid)
        if back is None or back.reason != "BeginTime" or back.held:
            del mem.requeued[jid]
    if not policy.release_requeue_delay or not mem.requeued:
        return []
    waiting_parts = {p for j in pending.values() if j.eligible and j.job_class not in train
                     for p in j.partitions}
    waiting_nodes = {n for p in waiting_parts for n in snap.partitions.get(p, ())}
    actions = []
    for jid in sorted(mem.requeued, key=lambda i: order(pending[i])):
        job = pending[jid]
        if allowance <= 0:
            break
        if waiting_parts.intersection(job.partitions) or not open_for(job) or any(
                n in waiting_nodes for p in job.partitions for n in snap.partitions.get(p, ())):
            continue  # inference still waits where this job could run: its preemptor
        since = mem.requeued.pop(jid)
        allowance -= 1
        mem.release_times.append(snap.ts)
        actions.append(Action(
            ActionKind.BEGIN_NOW, jid,
            "requeued after preemption: the preempting job runs, start it without waiting "
            "out its BeginTime",
            {"begin_ts": job.begin_ts, "waited_s": round(snap.ts - since, 1),
             "partition": ",".join(job.partitions)}))
    return actions
