"""Executing MIG plans on the simulated backend: idempotent, dry-run, in-use never destroyed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any, Iterator, List, Tuple

import pytest

from slurmiso.config.model import MigGroup, MigLayout
from slurmiso.gpu.profiles import MODELS
from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.mig.apply import apply_plan, read_node
from slurmiso.mig.claims import claimed_instances
from slurmiso.mig.plan import MigPlanError, plan_layout
from slurmiso.state import Journal, NodeState
from slurmiso.state.record import JobRecord, RecordStatus

H100 = MODELS["H100-80GB"]
HALF = MigLayout("half", (
    MigGroup((0,), True, (("3g.40gb", 2),)),
    MigGroup((1,), True, (("4g.40gb", 1), ("1g.10gb", 3))),
))


@pytest.fixture
def sim(tmp_path: Any) -> SimBackend:
    path = str(tmp_path / "sim.json")
    init_state(path, "H100-80GB", 2, mig=True, node="n1")
    return SimBackend(path)


@pytest.fixture
def sleeper() -> Iterator[int]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def layout_of(backend: SimBackend) -> List[Tuple[int, str, int]]:
    return sorted((i.gpu_index, i.profile, i.placement_start) for i in backend.instances())


def plan(backend: SimBackend, state: Any = None, lay: MigLayout = HALF) -> Any:
    snap = read_node(backend, claimed_instances(state))
    return plan_layout(H100, lay, len(snap.devices), snap.existing, snap.mig_enabled, snap.busy)


def test_apply_twice_second_is_noop(sim: SimBackend, tmp_path: Any) -> None:
    journal = Journal(str(tmp_path / "j.jsonl"))
    done = apply_plan(sim, plan(sim), journal)
    assert len(done) == 6
    assert layout_of(sim) == [(0, "3g.40gb", 0), (0, "3g.40gb", 4), (1, "1g.10gb", 4),
                              (1, "1g.10gb", 5), (1, "1g.10gb", 6), (1, "4g.40gb", 0)]
    assert all(i.uuid.startswith("MIG-") for i in sim.instances())
    before = sim.state()
    second = plan(sim)
    assert second.noop
    assert apply_plan(sim, second, journal) == []
    assert sim.state()["gpus"] == before["gpus"]
    events = [json.loads(line)["event"] for line in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert events == ["mig.create"] * 6


def test_dry_run_changes_nothing(sim: SimBackend, tmp_path: Any) -> None:
    sim.create_gpu_instance(0, "1g.10gb", 6)
    before = sim.state()
    steps = apply_plan(sim, plan(sim), Journal(str(tmp_path / "j")), dry_run=True)
    assert [s.op for s in steps][:1] == ["destroy"] and len(steps) == 7
    assert sim.state()["gpus"] == before["gpus"]
    assert not os.path.exists(tmp_path / "j")


def test_in_use_instance_is_never_destroyed(sim: SimBackend, sleeper: int) -> None:
    inst = sim.create_compute_instance(0, sim.create_gpu_instance(0, "1g.10gb", 6).gi_id)
    sim.add_process(0, sleeper, 100, inst.uuid)
    p = plan(sim)
    assert any(str(sleeper) in prob for prob in p.problems)
    with pytest.raises(MigPlanError, match=str(sleeper)):
        apply_plan(sim, p)
    assert (0, "1g.10gb", 6) in layout_of(sim)
    assert not any(i.profile == "3g.40gb" for i in sim.instances())  # refused as a whole


def test_claimed_instance_is_never_destroyed(sim: SimBackend, tmp_path: Any) -> None:
    gi = sim.create_gpu_instance(0, "2g.20gb", 0).gi_id
    sim.create_compute_instance(0, gi)
    state = NodeState(str(tmp_path / "state"))
    state.ensure()
    state.write_job("77", JobRecord("77", RecordStatus.READY))
    state.set_allocations({f"mig/0/gi{gi}": "77"})
    p = plan(sim, state)
    assert any("job 77" in prob for prob in p.problems)
    with pytest.raises(MigPlanError, match="job 77"):
        apply_plan(sim, p)
    assert (0, "2g.20gb", 0) in layout_of(sim)
    # a claim of a job without a record is stale: no longer protects the instance
    state.delete_job("77")
    apply_plan(sim, plan(sim, state))
    assert (0, "2g.20gb", 0) not in layout_of(sim)


def test_mig_disabled_refused_without_enable_mig(tmp_path: Any) -> None:
    path = str(tmp_path / "sim.json")
    init_state(path, "H100-80GB", 2, mig=False, node="n1")
    backend = SimBackend(path)
    with pytest.raises(MigPlanError, match="MIG mode is disabled") as err:
        apply_plan(backend, plan(backend))
    assert "--enable-mig" in str(err.value)
    assert backend.instances() == []
    done = apply_plan(backend, plan(backend), enable_mig=True)
    assert [s.op for s in done].count("enable-mig") == 2
    assert plan(backend).noop


def test_enable_mig_needs_a_backend_that_can(sim: SimBackend) -> None:
    """Declared, not probed: a backend that has the method but does not declare it is refused."""
    from slurmiso.gpu.backend import Capabilities
    from slurmiso.mig.apply import check_applicable

    sim.set_mig_mode(1, False)
    check_applicable(plan(sim), sim, enable_mig=True)  # the sim declares it
    sim.capabilities = Capabilities(set_mig_mode=False, simulated=True)  # type: ignore[misc]
    with pytest.raises(MigPlanError, match="the sim backend cannot change MIG mode"):
        check_applicable(plan(sim), sim, enable_mig=True)
