"""Admission by strategy: the gates once per cycle (a GateState per scope, typed scopes),
then one strategy per ``monitor.admission`` mode."""

from __future__ import annotations

import dataclasses
import doctest
from typing import List, Tuple

import pytest

import slurmiso.monitor.gates as gates_module
from slurmiso.monitor.action import Action, ActionKind
from slurmiso.monitor.admission import (
    MODES,
    HoldAdmission,
    NodesAdmission,
    QosLimitAdmission,
    admission,
)
from slurmiso.monitor.admission_state import Gate, Hold
from slurmiso.monitor.gates import Gates, GateState, Scope, ScopeKind, gate
from slurmiso.monitor.policy import ADMISSIONS, Memory
from tests.unit.test_monitor_decide import POLICY, T0, job, node, snap

HOT_AND_CALM = [node("n1", mem_pct=80), node("n2", mem_pct=10)]


def _kinds(actions: List[Action]) -> List[Tuple[ActionKind, str]]:
    return [(a.kind, a.target) for a in actions]


def test_every_mode_has_one_strategy() -> None:
    assert set(MODES) == set(ADMISSIONS)
    assert isinstance(MODES["nodes"], NodesAdmission)
    assert isinstance(MODES["hold"], HoldAdmission)
    assert isinstance(MODES["qos-limit"], QosLimitAdmission)


@pytest.mark.parametrize("key,kind,name", [
    ("node:n1", ScopeKind.NODE, "n1"), ("slo", ScopeKind.SLO, ""),
    ("train", ScopeKind.PARTITION, "train"), ("gpu-a", ScopeKind.PARTITION, "gpu-a")])
def test_scopes_are_values_that_round_trip_their_memory_key(
        key: str, kind: ScopeKind, name: str) -> None:
    scope = Scope.of_key(key)
    assert (scope.kind, scope.name, scope.key) == (kind, name, key)


def test_gate_states() -> None:
    mem = Memory()
    assert gate(mem, Scope.node("n1"), "unknown", "?", T0, POLICY) is GateState.UNKNOWN
    assert gate(mem, Scope.node("n1"), "calm", "ok", T0, POLICY) is GateState.OPEN
    assert mem.gates == {}, "an open gate that never closed is not remembered"
    assert gate(mem, Scope.node("n1"), "hot", "hot", T0, POLICY) is GateState.CLOSED
    assert mem.gates["node:n1"].closed
    assert gate(mem, Scope.node("n1"), "unknown", "?", T0 + 1, POLICY) is GateState.UNKNOWN
    assert mem.gates["node:n1"].closed, "unknown neither opens nor closes"


def test_gates_keep_off_closed_and_unknown_unless_unknown_admits() -> None:
    g = Gates(scopes={"a": GateState.OPEN, "b": GateState.CLOSED, "c": GateState.UNKNOWN})
    assert [g.keeps_off(s, False) for s in "abcd"] == [False, True, True, False]
    assert [g.keeps_off(s, True) for s in "abcd"] == [False, True, False, False]
    assert g.state("d") is GateState.UNKNOWN


def test_hold_strategy_holds_a_hot_partitions_training() -> None:
    pol = dataclasses.replace(POLICY, admission="hold")
    mem = Memory()
    acts = admission(snap(HOT_AND_CALM, [job("1"), job("2", cls="infer")]), pol, mem)
    assert _kinds(acts) == [(ActionKind.HOLD, "1")]
    assert mem.gates["shared"].closed and not any(k.startswith("node:") for k in mem.gates)


def test_nodes_strategy_excludes_the_hot_node_only() -> None:
    pol = dataclasses.replace(POLICY, admission="nodes")
    mem = Memory()
    acts = admission(snap(HOT_AND_CALM, [job("1")]), pol, mem)
    assert _kinds(acts) == [(ActionKind.EXCLUDE, "1")] and acts[0].details["nodes"] == "n1"
    assert mem.gates["node:n1"].closed and "shared" not in mem.gates


def test_nodes_strategy_holds_a_job_every_node_of_which_is_hot() -> None:
    pol = dataclasses.replace(POLICY, admission="nodes")
    mem = Memory()
    acts = admission(snap([node("n1", mem_pct=80)], [job("1")]), pol, mem)
    assert _kinds(acts) == [(ActionKind.HOLD, "1")] and mem.holds["1"].scopes == ("nodes",)


def test_qos_limit_strategy_caps_and_never_holds() -> None:
    pol = dataclasses.replace(POLICY, admission="qos-limit", train_qos=("train",))
    mem = Memory(holds={"9": Hold(T0 - 10, ("shared",), "old hold")})
    acts = admission(snap(HOT_AND_CALM, [job("1"), job("9", held=True)]), pol, mem)
    assert _kinds(acts) == [(ActionKind.QOS_LIMIT, "train"), (ActionKind.RELEASE, "9")]
    assert mem.holds == {}


def test_qos_limit_takes_unknown_for_closed_unless_unknown_admits() -> None:
    for admits, want in ((False, [ActionKind.QOS_LIMIT]), (True, [])):
        pol = dataclasses.replace(POLICY, admission="qos-limit", unknown_admits=admits)
        acts = admission(snap([node("n1", age=None)], [job("1")]), pol, Memory())
        assert [a.kind for a in acts] == want, admits


def test_leaving_nodes_mode_forgets_the_node_gates() -> None:
    mem = Memory(gates={"node:n1": Gate(True, T0 - 10, None, "hot"),
                        "node:gone": Gate(True, T0 - 10, None, "hot")})
    admission(snap([node("n1", mem_pct=80)], []), dataclasses.replace(
        POLICY, admission="nodes"), mem)
    assert set(mem.gates) == {"node:n1"}, "a node no longer there loses its gate"
    admission(snap([node("n1", mem_pct=80)], []), POLICY, mem)
    assert not any(k.startswith("node:") for k in mem.gates)


def test_the_module_example_runs() -> None:
    assert doctest.testmod(gates_module).failed == 0
