"""mig-static and mig-dynamic handlers on a simulated node (tests/hookctx.make_context)."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from slurmiso.errors import GpuInsufficientResources, GpuInUse, GpuLost, JobProblem, NodeFault
from slurmiso.gpu.backend import create_mig_device
from slurmiso.gpu.placement import best_placement
from slurmiso.gpu.profiles import MODELS
from slurmiso.gpu.sim import SimBackend
from slurmiso.isolation.base import Context, ReconcileContext
from slurmiso.isolation.mig_dynamic import HANDLER as DYN
from slurmiso.isolation.mig_static import HANDLER as STATIC
from slurmiso.mig import gres
from slurmiso.mig.apply import apply_plan, read_node
from slurmiso.mig.plan import plan_layout
from slurmiso.state.record import Resource
from tests.hookctx import make_context

H100 = MODELS["H100-80GB"]


def sim_of(ctx: Context) -> SimBackend:
    return SimBackend(ctx.config.gpu.sim_state)


def spans(sim: SimBackend) -> List[Tuple[int, str, int, int]]:
    return sorted((i.gpu_index, i.profile, i.placement_start, i.gi_id) for i in sim.instances())


@pytest.fixture
def job_proc() -> Iterator[Any]:
    """Start a process that looks like job ``job_id``'s (SLURM_JOB_ID in its environment)."""
    procs: List[subprocess.Popen] = []

    def start(job_id: str) -> subprocess.Popen:
        env = dict(os.environ, SLURM_JOB_ID=job_id) if job_id else {
            k: v for k, v in os.environ.items() if k != "SLURM_JOB_ID"}
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
        procs.append(p)
        # Reap it as slurmstepd would: a zombie still counts as a GPU user to the sim.
        threading.Thread(target=p.wait, daemon=True).start()
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


# ---------------------------------------------------------------------------- mig-static
def static_ctx(tmp: str, gpus: Tuple[int, ...], job: str = "100", record: bool = True) -> Context:
    ctx = make_context(tmp, "mig-static", job_id=job, gpus=gpus)
    sim = sim_of(ctx)
    if not sim.instances():
        lay = ctx.config.mig_layout("mixed")
        assert lay is not None
        snap = read_node(sim, {})
        apply_plan(sim, plan_layout(H100, lay, 2, snap.existing, snap.mig_enabled, snap.busy))
        if record:
            gres.save_record(ctx.state.state_dir, "mixed",
                             gres.live_entries(sim.devices(), sim.instances()))
    return ctx


@pytest.mark.parametrize("record", [True, False])
@pytest.mark.parametrize("gpus,expect", [
    ((0,), [(0, "3g.40gb", 0)]),
    ((1, 2), [(0, "3g.40gb", 4), (1, "3g.40gb", 4)]),  # type-grouped order (see mig/gres.py)
    ((3,), [(1, "4g.40gb", 0)]),
])
def test_static_maps_gres_indices(tmp_path: Any, gpus: Any, expect: Any, record: bool) -> None:
    ctx = static_ctx(str(tmp_path), gpus, record=record)
    STATIC.setup(ctx)
    res = ctx.record.resources
    assert [(r.gpu, r.profile, r.start) for r in res] == expect
    assert all(r.state == "ready" and r.kind == "mig-static" for r in res)
    by_place = {(i.gpu_index, i.placement_start): i for i in sim_of(ctx).instances()}
    uuids = [by_place[(g, s)].uuid for g, _, s in expect]
    assert ctx.record.env["CUDA_VISIBLE_DEVICES"] == ",".join(uuids)
    assert sorted(ctx.state.allocations()) == sorted(
        f"mig/{g}/gi{by_place[(g, s)].gi_id}" for g, _, s in expect)
    STATIC.setup(ctx)  # idempotent
    assert len(ctx.record.resources) == len(expect)


def test_static_missing_index_is_node_fault(tmp_path: Any) -> None:
    ctx = static_ctx(str(tmp_path), (4,))
    with pytest.raises(NodeFault, match="MIG state not as recorded"):
        STATIC.setup(ctx)


@pytest.mark.parametrize("record", [True, False])
def test_static_drift_is_node_fault(tmp_path: Any, record: bool) -> None:
    ctx = static_ctx(str(tmp_path), (0,), record=record)
    sim = sim_of(ctx)
    inst = next(i for i in sim.instances(1) if i.profile == "3g.40gb")
    sim.destroy_compute_instance(1, inst.gi_id, 0)
    sim.destroy_gpu_instance(1, inst.gi_id)
    create_mig_device(sim, 1, "2g.20gb", 4)
    with pytest.raises(NodeFault, match="MIG state not as recorded"):
        STATIC.setup(ctx)
    assert ctx.state.allocations() == {}


def test_static_foreign_process_is_node_fault(tmp_path: Any, job_proc: Any) -> None:
    ctx = static_ctx(str(tmp_path), (0,))
    sim = sim_of(ctx)
    inst = next(i for i in sim.instances(0) if i.placement_start == 0)
    rogue = job_proc("")
    sim.add_process(0, rogue.pid, 10, inst.uuid)
    with pytest.raises(NodeFault, match=str(rogue.pid)):
        STATIC.setup(ctx)


def test_static_teardown_ends_job_processes_and_releases(tmp_path: Any, job_proc: Any) -> None:
    ctx = static_ctx(str(tmp_path), (1,))
    STATIC.setup(ctx)
    sim = sim_of(ctx)
    uuid = ctx.record.resources[0].uuid
    mine = job_proc("100")
    sim.add_process(0, mine.pid, 10, uuid)
    before = spans(sim)
    STATIC.teardown(ctx)
    assert mine.wait(timeout=10) is not None
    assert ctx.state.allocations() == {}
    assert spans(sim) == before  # static: nothing destroyed
    STATIC.teardown(ctx)  # twice is harmless


def test_static_reconcile_reports_drift(tmp_path: Any) -> None:
    ctx = static_ctx(str(tmp_path), (0,))
    sim = sim_of(ctx)
    rctx = ReconcileContext(ctx.config, ctx.pool, ctx.state, ctx.journal, sim)
    assert STATIC.reconcile(rctx) == []
    gi = next(i.gi_id for i in sim.instances(0) if i.placement_start == 4)
    sim.destroy_compute_instance(0, gi, 0)
    sim.destroy_gpu_instance(0, gi)
    lines = STATIC.reconcile(rctx)
    assert lines and "missing 3g.40gb at slice 4" in lines[0] and "mig apply" in lines[0]
    assert len(sim.instances(0)) == 1  # reported, not fixed


# --------------------------------------------------------------------------- mig-dynamic
def dyn_ctx(tmp: str, job: str = "100", gpus: Tuple[int, ...] = (0,), cls: str = "train",
            spank: Optional[Dict[str, str]] = None, ngpus: int = 2) -> Context:
    return make_context(tmp, "mig-dynamic", job_id=job, gpus=gpus, cls=cls, spank=spank,
                        ngpus=ngpus)


def test_dynamic_create_and_teardown_restore_state(tmp_path: Any) -> None:
    ctx = dyn_ctx(str(tmp_path))
    sim = sim_of(ctx)
    before = sim.state()["gpus"]
    DYN.setup(ctx)
    res = ctx.record.resources[0]
    assert (res.kind, res.profile, res.state) == ("mig-dynamic", "1g.10gb", "ready")
    assert ctx.record.env["CUDA_VISIBLE_DEVICES"] == res.uuid
    assert ctx.state.allocations() == {f"mig/0/gi{res.gi}": "100"}
    assert [i.uuid for i in sim.instances()] == [res.uuid]
    DYN.teardown(ctx)
    assert sim.state()["gpus"] == before
    assert ctx.state.allocations() == {}
    DYN.teardown(ctx)  # twice is harmless
    assert sim.state()["gpus"] == before


@pytest.mark.parametrize("existing,profile", [
    ([], "1g.10gb"),
    ([("3g.40gb", 0)], "1g.10gb"),
    ([("1g.10gb", 6)], "2g.20gb"),
    ([("4g.40gb", 0), ("1g.10gb", 6)], "2g.20gb"),
])
def test_dynamic_uses_best_placement(tmp_path: Any, existing: Any, profile: str) -> None:
    ctx = dyn_ctx(str(tmp_path), spank={"iso_mig_profile": profile}, cls="debug")
    sim = sim_of(ctx)
    for prof, start in existing:
        create_mig_device(sim, 0, prof, start)
    DYN.setup(ctx)
    assert ctx.record.resources[0].start == best_placement(H100, profile, existing)


def test_dynamic_does_not_fit_is_job_problem_and_leaves_nothing(tmp_path: Any) -> None:
    ctx = dyn_ctx(str(tmp_path), cls="infer")  # 3g.40gb
    sim = sim_of(ctx)
    create_mig_device(sim, 0, "4g.40gb", 0)
    create_mig_device(sim, 0, "1g.10gb", 4)
    before = sim.state()["gpus"]
    with pytest.raises(JobProblem, match=r"3g.40gb does not fit on GPU 0 now: occupied .*4g"):
        DYN.setup(ctx)
    assert sim.state()["gpus"] == before
    assert ctx.state.allocations() == {}
    assert all(r.state == "released" for r in ctx.record.resources)


def test_dynamic_second_gpu_not_fitting_rolls_back_the_first(tmp_path: Any) -> None:
    ctx = dyn_ctx(str(tmp_path), gpus=(0, 1), cls="infer")
    sim = sim_of(ctx)
    create_mig_device(sim, 1, "7g.80gb", 0)
    before = sim.state()["gpus"]
    with pytest.raises(JobProblem, match="GPU 1"):
        DYN.setup(ctx)
    assert sim.state()["gpus"] == before and ctx.state.allocations() == {}


@pytest.mark.parametrize("cls,spank,outcome", [
    ("train", {}, "1g.10gb"),
    ("infer", {"iso_mig_profile": "1g.10gb"}, "1g.10gb"),          # smaller than the class's
    ("infer", {"iso_mig_profile": "3g.40gb"}, "3g.40gb"),
    ("train", {"iso_mig_profile": "3g.40gb"}, "larger than class"),  # bigger than 1g.10gb
    ("train", {"iso_mig_profile": "3g.20gb"}, "not a MIG profile of H100-80GB"),
    ("debug", {"iso_mig_profile": "7g.80gb"}, "7g.80gb"),          # class without a profile
    ("debug", {}, "has no MIG profile"),
])
def test_dynamic_profile_choice(tmp_path: Any, cls: str, spank: Any, outcome: str) -> None:
    ctx = dyn_ctx(str(tmp_path), cls=cls, spank=spank)
    if "." in outcome and " " not in outcome:
        DYN.setup(ctx)
        assert ctx.record.resources[0].profile == outcome
    else:
        with pytest.raises(JobProblem, match=outcome):
            DYN.setup(ctx)
        assert sim_of(ctx).instances() == []


def test_dynamic_setup_twice_is_idempotent(tmp_path: Any) -> None:
    ctx = dyn_ctx(str(tmp_path))
    DYN.setup(ctx)
    first = Resource.from_dict(ctx.record.resources[0].to_dict())
    DYN.setup(ctx)
    assert ctx.record.resources == [first]
    assert len(sim_of(ctx).instances()) == 1


def test_dynamic_pending_after_kill_is_cleaned(tmp_path: Any) -> None:
    ctx = dyn_ctx(str(tmp_path), job="200")
    sim = sim_of(ctx)
    other = dyn_ctx(str(tmp_path), job="201", gpus=(0,))
    DYN.setup(other)  # another job's instance must survive
    theirs = other.record.resources[0]
    # the prolog recorded intent, created the device, and was killed before saving
    start = best_placement(H100, "1g.10gb", [("1g.10gb", theirs.start)])
    ctx.add_resource(Resource("mig-dynamic", gpu=0, profile="1g.10gb", start=start))
    create_mig_device(sim, 0, "1g.10gb", start)
    assert len(sim.instances()) == 2
    record = ctx.state.read_job("200")
    assert record is not None and record.resources[0].state == "pending"
    DYN.teardown(ctx)
    assert [i.uuid for i in sim.instances()] == [theirs.uuid]
    DYN.teardown(ctx)
    assert len(sim.instances()) == 1


def test_dynamic_pending_never_takes_another_jobs_instance(tmp_path: Any) -> None:
    other = dyn_ctx(str(tmp_path), job="301")
    DYN.setup(other)
    spot = other.record.resources[0]
    ctx = dyn_ctx(str(tmp_path), job="300")
    ctx.add_resource(Resource("mig-dynamic", gpu=0, profile=spot.profile,
                              start=spot.start))  # killed before creating anything
    DYN.teardown(ctx)
    assert [i.uuid for i in sim_of(ctx).instances()] == [spot.uuid]


class _Wrap:
    """A backend that fails one call the way NVML would."""

    def __init__(self, inner: SimBackend, method: str, exc: Exception) -> None:
        self._inner, self._method, self._exc = inner, method, exc

    def __getattr__(self, name: str) -> Any:
        if name == self._method:
            def fail(*a: Any, **k: Any) -> Any:
                raise self._exc
            return fail
        return getattr(self._inner, name)


def test_dynamic_race_lost_is_job_problem(tmp_path: Any) -> None:
    ctx = dyn_ctx(str(tmp_path))
    ctx._backend = _Wrap(sim_of(ctx), "create_gpu_instance",  # type: ignore[assignment]
                         GpuInsufficientResources("taken"))
    with pytest.raises(JobProblem, match="could not be created"):
        DYN.setup(ctx)
    assert ctx.record.resources == [] and sim_of(ctx).instances() == []


def test_dynamic_gpu_error_propagates(tmp_path: Any) -> None:
    ctx = dyn_ctx(str(tmp_path))
    sim_of(ctx).set_lost(0, True)
    with pytest.raises(GpuLost):
        DYN.setup(ctx)


def test_dynamic_surviving_process_is_node_fault(tmp_path: Any) -> None:
    ctx = dyn_ctx(str(tmp_path))
    DYN.setup(ctx)
    ctx._backend = _Wrap(sim_of(ctx), "destroy_compute_instance",  # type: ignore[assignment]
                         GpuInUse("in use by pid(s) 4242"))
    with pytest.raises(NodeFault, match="4242"):
        DYN.teardown(ctx)


def test_dynamic_teardown_ends_job_processes(tmp_path: Any, job_proc: Any) -> None:
    ctx = dyn_ctx(str(tmp_path))
    DYN.setup(ctx)
    mine = job_proc("100")
    sim_of(ctx).add_process(0, mine.pid, 100, ctx.record.resources[0].uuid)
    DYN.teardown(ctx)
    assert mine.wait(timeout=10) is not None
    assert sim_of(ctx).instances() == []


def test_dynamic_reconcile_removes_orphans(tmp_path: Any, job_proc: Any) -> None:
    ctx = dyn_ctx(str(tmp_path))
    DYN.setup(ctx)
    sim = sim_of(ctx)
    orphan = create_mig_device(sim, 0, "2g.20gb", 0)
    busy = create_mig_device(sim, 1, "1g.10gb", 0)
    rogue = job_proc("")
    sim.add_process(1, rogue.pid, 10, busy.uuid)
    rctx = ReconcileContext(ctx.config, ctx.pool, ctx.state, ctx.journal, sim, dry_run=True)
    lines = DYN.reconcile(rctx)
    assert any("would be destroyed" in x and "2g.20gb" in x for x in lines)
    assert any(str(rogue.pid) in x for x in lines)
    assert len(sim.instances()) == 3
    rctx.dry_run = False
    DYN.reconcile(rctx)
    left = {i.uuid for i in sim.instances()}
    assert orphan.uuid not in left and busy.uuid in left
    assert ctx.record.resources[0].uuid in left  # the live job's device stays


def _concurrent_setup(args: Tuple[str, str, int]) -> Tuple[str, str, Any]:
    tmp, job, gpu = args
    ctx = dyn_ctx(tmp, job=job, gpus=(gpu,), ngpus=8)
    try:
        with ctx.state.locked():
            DYN.setup(ctx)
    except JobProblem as err:
        return job, "refused", str(err)
    res = ctx.record.resources[0]
    return job, "ok", (res.gpu, res.start, res.gi, res.uuid)


@pytest.mark.slow
def test_dynamic_concurrent_setups_never_overlap(tmp_path: Any) -> None:
    dyn_ctx(str(tmp_path), job="1", ngpus=8)  # creates the 8-GPU sim node once
    # 32 jobs of 1g.10gb on GPUs 0-3: 8 per GPU where 7 fit, so 4 must be refused.
    jobs = [(str(tmp_path), str(1000 + n), n % 4) for n in range(32)]
    with multiprocessing.get_context("fork").Pool(32) as pool:
        results = pool.map(_concurrent_setup, jobs)
    ok = [r[2] for r in results if r[1] == "ok"]
    refused = [r for r in results if r[1] == "refused"]
    assert len(ok) == 28 and len(refused) == 4
    assert all("does not fit" in r[2] for r in refused)
    assert len({u for *_, u in ok}) == 28
    assert len({(g, s) for g, s, _, _ in ok}) == 28  # no two jobs on one slice
    sim = SimBackend(str(tmp_path / "sim.json"))
    per_gpu = [len(sim.instances(g)) for g in range(8)]
    assert per_gpu == [7, 7, 7, 7, 0, 0, 0, 0]
    allocs = dyn_ctx(str(tmp_path), job="2", ngpus=8).state.allocations()
    assert len(allocs) == 28 and len(set(allocs.values())) == 28


class _StartsAJobMidDestroy:
    """A backend whose GPU-instance destroy lets a new job's whole prolog run right after the
    driver call: the ending job's epilog is between destroy and its next save (unlocked)."""

    def __init__(self, backend: Any, then: Any) -> None:
        self._backend, self._then, self.fired = backend, then, False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        self._backend.destroy_gpu_instance(index, gi_id)
        if not self.fired:
            self.fired = True
            self._then()


def test_dynamic_turnover_reusing_a_gi_id_never_drains(tmp_path: Any) -> None:
    """Issue 22: in a storm of ending and starting jobs, the driver gave an ending job's GI id
    to a new job before the old claim was let go, and the new prolog drained the node with
    'already allocated'. Here the new job's prolog runs at exactly that point."""
    tmp = str(tmp_path)
    old = dyn_ctx(tmp, job="8004")
    with old.state.locked():
        DYN.setup(old)
    gi = old.record.resources[0].gi
    new = dyn_ctx(tmp, job="8040")

    def start_new_job() -> None:
        with new.state.locked():
            DYN.setup(new)

    real = old.backend
    old._backend = _StartsAJobMidDestroy(real, start_new_job)  # type: ignore[attr-defined]
    with old.state.locked():
        DYN.teardown(old)
    assert old.backend.fired  # type: ignore[attr-defined]
    assert new.record.resources[0].gi == gi, "the premise: the driver reused the GI id"
    assert new.state.allocations() == {f"mig/0/gi{gi}": "8040"}
    assert [i.uuid for i in sim_of(new).instances()] == [new.record.resources[0].uuid]
    with new.state.locked():
        DYN.teardown(new)
    assert sim_of(new).instances() == [] and new.state.allocations() == {}


def test_dynamic_instance_vanished_under_a_running_job_names_it(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    running = dyn_ctx(tmp, job="500")
    DYN.setup(running)
    res = running.record.resources[0]
    sim = sim_of(running)
    (inst,) = sim.instances()
    sim.destroy_compute_instance(0, inst.gi_id, inst.ci_id)  # as nvidia-smi mig -dci/-dgi would
    sim.destroy_gpu_instance(0, inst.gi_id)
    with pytest.raises(NodeFault) as err:
        DYN.setup(dyn_ctx(tmp, job="501"))
    text = str(err.value)
    assert f"job 500's MIG device 1g.10gb (GI {res.gi}) at slice {res.start}" in text
    assert "gone from the driver" in text and "already allocated" not in text
