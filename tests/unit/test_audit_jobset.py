"""The audit's set of job ids: the same answers as a Python set, in bits."""

from __future__ import annotations

import random

from slurmiso.audit.figures.jobset import MAX_BIT_ID, JobSet


def test_jobset_agrees_with_a_set_on_every_id_form():
    rnd = random.Random(3)
    ids = [str(rnd.randrange(1, 5000)) for _ in range(3000)]
    ids += [f"{rnd.randrange(1, 50)}_{rnd.randrange(0, 40)}" for _ in range(1000)]
    ids += ["7_[1-3]", "7_[1-3]", str(MAX_BIT_ID + 5), str(MAX_BIT_ID + 5), "abc", "0"]
    rnd.shuffle(ids)
    js, ref = JobSet(), set()
    for job in ids:
        assert js.add(job) == (job not in ref), job
        ref.add(job)
        assert job in js
    assert len(js) == len(ref)
    assert "99999" not in js and "3_999" not in js and "zz" not in js


def test_a_million_ids_cost_bits_not_objects():
    js = JobSet()
    for n in range(1_000_000, 2_000_000):
        js.add(str(n))
    assert len(js) == 1_000_000
    assert len(js._bits) <= 2_000_000 // 8 * 3 // 2 + 1  # one bit per id (+ growth slack)
    assert not js._other and not js._tasks
