"""SIGKILL prolog and epilog at every step (mig-dynamic, and an MPS node), then the epilog
and ``reconcile``: no instance, record, claim, events file or daemon may be left (issue 13).

The kills land at chosen steps (SLURMISO_SIM_KILL_AT: before and after each driver call and
node-state write), not at chosen times, so a faster or a busier machine kills at the same
steps (issue 22). bench/bench_hooks.py still soaks with 200 SIGKILLs at random moments."""

from __future__ import annotations

import os
from typing import Any

import pytest

from slurmiso.gpu.sim import SimBackend
from slurmiso.hooks.runner import run_hook
from slurmiso.state.record import RecordStatus
from tests.hookctx import Drains
from tests.killrounds import NODE, hook_env, leftovers, run_kill_points, setup_node


@pytest.mark.slow
def test_kills_at_every_step_leave_nothing_behind(tmp_path: Any) -> None:
    out = run_kill_points(str(tmp_path))
    assert out.not_killed == []
    assert out.drains == 0
    assert out.leftovers == [] and out.left_by_epilog == []
    assert out.reconcile_fixes == []  # the epilog alone cleaned everything
    # every driver call of both hooks was a kill point, and the kills hit both before and
    # after an instance existed, or this proved little
    for call in ("create_gpu_instance", "create_compute_instance",
                 "destroy_compute_instance", "destroy_gpu_instance"):
        assert any(call in p for p in out.points), out.points
    assert 0 < out.made_before_kill < out.prolog_kills


@pytest.mark.slow
def test_kills_on_a_shared_mps_server_leave_no_daemon_or_namespace(tmp_path: Any) -> None:
    """The shared MPS v3 server (issue 35): a namespace per job, the daemon with the last."""
    out = run_kill_points(str(tmp_path), mode="mps-shared")
    assert out.not_killed == []
    assert out.drains == 0 and out.leftovers == [] and out.left_by_epilog == []
    assert not os.path.exists(f"{tmp_path}/state/n1/mps/gpu0/shared")
    assert any("allocations.json" in p for p in out.points), out.points
    assert out.kills >= len(out.points)


@pytest.mark.slow
def test_kills_on_an_mps_node_leave_no_daemon(tmp_path: Any) -> None:
    out = run_kill_points(str(tmp_path), mode="mps")
    assert out.not_killed == []
    assert out.drains == 0 and out.leftovers == [] and out.left_by_epilog == []
    # reconcile only tidies the kept MPS log dirs of GPUs nobody uses any more
    assert all("remove stale MPS directory" in f for f in out.reconcile_fixes)
    assert any("allocations.json" in p for p in out.points), out.points
    assert out.kills >= len(out.points)  # one kill per point, two per prolog+epilog pair


def test_epilog_finds_a_gi_whose_ci_is_gone(tmp_path: Any) -> None:
    """An epilog killed between destroying the CI and the GI used to leave the GI for good:
    the rerun matched by gi *and* UUID, and a GI without CI has no UUID."""
    tmp = str(tmp_path)
    cfg = setup_node(tmp)
    env = hook_env(tmp, cfg, "7", 0, 0)
    assert run_hook("prolog", env, cfg, Drains()) == 0
    sim = SimBackend(f"{tmp}/sim/{NODE}.json")
    [inst] = sim.instances()
    assert inst.ci_id is not None
    sim.destroy_compute_instance(0, inst.gi_id, inst.ci_id)  # what the killed epilog did
    drains = Drains()
    assert run_hook("epilog", env, cfg, drains) == 0 and drains.calls == []
    assert sim.instances() == [] and leftovers(tmp) == []


def test_epilog_never_destroys_another_jobs_instance_that_reuses_the_gi(tmp_path: Any) -> None:
    """GI ids are reused: job 7's stale record names gi 1, now job 8's. Finding by gi alone
    must still leave job 8's instance alone."""
    tmp = str(tmp_path)
    cfg = setup_node(tmp)
    env7, env8 = hook_env(tmp, cfg, "7", 0, 0), hook_env(tmp, cfg, "8", 0, 0)
    assert run_hook("prolog", env7, cfg, Drains()) == 0
    from slurmiso.state import NodeState

    st = NodeState(f"{tmp}/state/{NODE}")
    stale = st.read_job("7")
    assert stale is not None
    assert run_hook("epilog", env7, cfg, Drains()) == 0
    assert run_hook("prolog", env8, cfg, Drains()) == 0
    [mine] = SimBackend(f"{tmp}/sim/{NODE}.json").instances()
    assert mine.gi_id == stale.resources[0].gi  # same gi, another job
    stale.status = RecordStatus.RELEASING
    st.write_job("7", stale)  # as if job 7's epilog had been killed before it deleted this
    assert run_hook("epilog", env7, cfg, Drains()) == 0
    assert [i.uuid for i in SimBackend(f"{tmp}/sim/{NODE}.json").instances()] == [mine.uuid]
    assert os.path.exists(st.job_path("8"))


def test_a_claim_the_record_does_not_name_is_still_released(tmp_path: Any) -> None:
    """Found by the 200-round bench: a prolog killed after the allocation table named its
    instance but before its record did left the claim behind, and the next epilog of that
    job (no record) drained the node over it."""
    tmp = str(tmp_path)
    cfg = setup_node(tmp)
    env = hook_env(tmp, cfg, "7", 0, 0)
    assert run_hook("prolog", env, cfg, Drains()) == 0
    from slurmiso.state import NodeState

    st = NodeState(f"{tmp}/state/{NODE}")
    rec = st.read_job("7")
    assert rec is not None and rec.claims == ["mig/0/gi1"]
    rec.claims = []  # the record never learned of its claim
    st.write_job("7", rec)
    drains = Drains()
    assert run_hook("epilog", env, cfg, drains) == 0
    assert run_hook("epilog", env, cfg, drains) == 0  # slurmd may run it twice
    assert drains.calls == [] and leftovers(tmp) == []
