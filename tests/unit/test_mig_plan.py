"""The pure MIG layout planner: keep what matches, destroy extras, never touch what is in use."""

from __future__ import annotations

from typing import Any, Dict, List, Sequence, Tuple

import pytest

from slurmiso.config.model import MigGroup, MigLayout
from slurmiso.gpu.profiles import MODELS
from slurmiso.mig.plan import CREATE, DESTROY, ENABLE_MIG, Existing, plan_layout

H100 = MODELS["H100-80GB"]


def layout(*groups: Tuple[Any, bool, Dict[str, int]]) -> MigLayout:
    return MigLayout("t", tuple(
        MigGroup(None if dev is None else tuple(dev), on, tuple(counts.items()))
        for dev, on, counts in groups
    ))


HALF = layout(([0], True, {"3g.40gb": 2}), ([1], True, {"4g.40gb": 1, "1g.10gb": 3}))
SEVENS = layout((None, True, {"1g.10gb": 7}))


def ops(plan: Any, gpu: int = 0) -> List[Tuple[str, str, int]]:
    return [(s.op, s.profile, s.start) for s in plan.gpus[gpu].steps]


@pytest.mark.parametrize(
    "lay,current,expected",
    [
        # empty GPU: create everything, in placement order
        (HALF, {}, [(CREATE, "3g.40gb", 0), (CREATE, "3g.40gb", 4)]),
        # half there: keep it, create the other beside it
        (HALF, {0: [("3g.40gb", 4, 2, False)]}, [(CREATE, "3g.40gb", 0)]),
        # an extra: destroy it, keep the match
        (HALF, {0: [("3g.40gb", 0, 1, False), ("3g.40gb", 4, 2, False), ("1g.10gb", 7, 3, False)]},
         [(DESTROY, "1g.10gb", 7)]),
        # wrong profile: destroyed first, then created
        (HALF, {0: [("4g.40gb", 0, 1, False)]},
         [(DESTROY, "4g.40gb", 0), (CREATE, "3g.40gb", 0), (CREATE, "3g.40gb", 4)]),
        # kept 1g at slice 0 blocks 3g+3g: unused, so the GPU is laid out again
        (HALF, {0: [("1g.10gb", 0, 9, False)]},
         [(DESTROY, "1g.10gb", 0), (CREATE, "3g.40gb", 0), (CREATE, "3g.40gb", 4)]),
        # a GI without its compute instance is not a match: recreated
        (HALF, {0: [Existing("3g.40gb", 0, 1, False, "", False), ("3g.40gb", 4, 2, False)]},
         [(DESTROY, "3g.40gb", 0), (CREATE, "3g.40gb", 0)]),
        # sevens: 5 present, 2 missing
        (SEVENS, {0: [("1g.10gb", s, s + 1, False) for s in (0, 1, 2, 4, 6)]},
         [(CREATE, "1g.10gb", 3), (CREATE, "1g.10gb", 5)]),
    ],
)
def test_plan_steps(lay: MigLayout, current: Dict[int, Sequence[Any]], expected: List[Any]) -> None:
    plan = plan_layout(H100, lay, 1, current)
    assert ops(plan) == expected
    assert plan.problems == []


def test_matching_node_plans_nothing() -> None:
    current = {0: [("3g.40gb", 0, 1, True, "job 7"), ("3g.40gb", 4, 2, False)],
               1: [("4g.40gb", 0, 1, False)] + [("1g.10gb", s, s, False) for s in (4, 5, 6)]}
    plan = plan_layout(H100, HALF, 2, current)
    assert plan.noop
    assert plan.steps == [] and plan.differences() == []
    assert [e.start for e in plan.gpus[1].keep] == [0, 4, 5, 6]


def test_in_use_extra_is_a_problem_not_a_step_change() -> None:
    current = {0: [("3g.40gb", 0, 1, False), ("1g.10gb", 4, 5, True, "job 42")]}
    plan = plan_layout(H100, HALF, 1, current)
    assert any("job 42" in p and "GI 5" in p for p in plan.problems)
    assert not plan.noop


def test_in_use_instance_in_the_way_is_a_problem() -> None:
    # 1g at slice 0 in use blocks the 3g at 0; layout wants 3g x2 -> cannot: problem names job
    current = {0: [("3g.40gb", 4, 2, False), ("1g.10gb", 0, 9, True, "job 13")]}
    plan = plan_layout(H100, HALF, 1, current)
    assert any("job 13" in p for p in plan.problems)
    # and the in-use instance is never planned for destruction without being a problem
    for step in plan.steps:
        if step.op == DESTROY and step.gi_id == 9:
            assert any("GI 9" in p for p in plan.problems)


def test_repack_keeps_in_use_and_reuses_loose() -> None:
    lay = layout(([0], True, {"4g.40gb": 1, "1g.10gb": 3}))
    # 1g at 4 in use (fits the layout), 1g at 0 unused blocks the 4g
    current = {0: [("1g.10gb", 4, 3, True, "job 1"), ("1g.10gb", 0, 1, False), ("1g.10gb", 5, 4, False)]}
    plan = plan_layout(H100, lay, 1, current)
    assert plan.problems == []
    destroyed = [s.gi_id for s in plan.steps if s.op == DESTROY]
    assert destroyed == [1]
    assert 3 not in destroyed and 4 not in destroyed  # in-use kept, loose match reused
    assert sorted((s.profile, s.start) for s in plan.steps if s.op == CREATE) == [
        ("1g.10gb", 6), ("4g.40gb", 0)]


def test_mig_disabled_plans_enable_and_creates() -> None:
    plan = plan_layout(H100, HALF, 1, {}, mig_enabled={0: False})
    assert ops(plan)[0] == (ENABLE_MIG, "", -1)
    assert plan.gpus[0].needs_mig_enable
    assert "MIG mode is disabled" in plan.differences()[0]
    assert plan.problems == []


def test_mig_disabled_on_busy_gpu_is_a_problem() -> None:
    plan = plan_layout(H100, HALF, 1, {}, mig_enabled={0: False}, busy={0: "pid(s) 5 run on it"})
    assert any("pid(s) 5" in p for p in plan.problems)


def test_layout_disabling_mig_is_refused() -> None:
    lay = layout((None, False, {}))
    plan = plan_layout(H100, lay, 1, {0: [("3g.40gb", 0, 1, False)]})
    assert any("never disables MIG" in p for p in plan.problems)
    assert plan_layout(H100, lay, 1, {}, mig_enabled={0: False}).noop


def test_uncovered_gpu_is_left_alone() -> None:
    lay = layout(([0], True, {"7g.80gb": 1}))
    plan = plan_layout(H100, lay, 2, {1: [("1g.10gb", 3, 4, False)]})
    assert plan.gpus[1].steps == () and not plan.gpus[1].covered
    assert ops(plan) == [(CREATE, "7g.80gb", 0)]


def test_plan_is_json_ready() -> None:
    import json

    data = plan_layout(H100, HALF, 2, {}).to_dict()
    assert json.loads(json.dumps(data))["steps"][0]["op"] == CREATE
    assert data["noop"] is False
