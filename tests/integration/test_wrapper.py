"""``slurmiso run`` in the real sandbox: a training job preempted three times by inference
jobs finishes with every step counted exactly once and Slurm's restart count at 3.

The scenario itself is ``slurmiso.sandbox.demo.preemption_scenario`` (``make demo`` runs it
too); this test holds it to exact numbers.

Slurm facts this relies on (seen on 22.05): the preemption SIGTERM reaches job *steps* at
once but the batch shell only when the GraceTime ends, so the wrapper runs under ``srun``; a
requeued job gets a BeginTime 120 s ahead, which the test clears (as root) to stay short.
"""

from __future__ import annotations

from collections import Counter

STEPS = 240
STEP_TIME = 0.05


def test_train_job_preempted_three_times_loses_nothing(sandbox) -> None:
    from slurmiso.sandbox.demo import preemption_scenario

    r = preemption_scenario(sandbox, steps=STEPS, step_time=STEP_TIME)
    steps = r["steps"]
    assert sorted(steps) == list(range(1, STEPS + 1)), "a step was lost or counted twice"
    assert not [s for s, c in Counter(steps).items() if c > 1]
    assert r["restarts"] == "3" and r["finished"]
    recs = r["events"]
    ends = [e for e in recs if e["event"] == "checkpoint-end"]
    assert len(ends) == 3 and all(e["ok"] for e in ends), ends
    assert [e["restart_count"] for e in recs if e["event"] == "resume"] == [1, 2, 3]
    assert all(w < 15 for w in r["infer_waits_s"]), f"inference waited {r['infer_waits_s']} s"
