"""The simulated backend fails where NVML fails, with the same error classes, across processes."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple, Type

import pytest

from slurmiso.errors import (
    ConfigError,
    GpuError,
    GpuInsufficientResources,
    GpuInUse,
    GpuLost,
    GpuNotFound,
    GpuNotSupported,
    GpuUnavailable,
    UsageError,
)
from slurmiso.gpu import open_backend, sim_state_path
from slurmiso.gpu.backend import GpuBackend, create_mig_device, destroy_mig_device
from slurmiso.gpu.sim import SimBackend, init_state

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def state_path(tmp_path: Path) -> str:
    path = str(tmp_path / "n1.json")
    init_state(path, "H100-80GB", 2, mig=True, node="n1")
    return path


@pytest.fixture
def sim(state_path: str) -> SimBackend:
    return SimBackend(state_path)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_is_a_gpu_backend(sim: SimBackend) -> None:
    assert isinstance(sim, GpuBackend)
    assert sim.name == "sim"


def test_constructor_does_no_io(tmp_path: Path) -> None:
    SimBackend(str(tmp_path / "missing" / "state.json"))
    assert list(tmp_path.iterdir()) == []


def test_devices_are_deterministic(tmp_path: Path) -> None:
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    init_state(a, "A100-40GB", 4, node="gpu7")
    init_state(b, "A100", 4, node="gpu7")
    devs_a, devs_b = SimBackend(a).devices(), SimBackend(b).devices()
    assert [d.uuid for d in devs_a] == [d.uuid for d in devs_b]
    assert len({d.uuid for d in devs_a}) == 4
    assert devs_a[3].index == 3 and devs_a[3].model == "A100-40GB"
    assert devs_a[0].name == "NVIDIA A100-SXM4-40GB" and devs_a[0].memory_total_mb == 40960
    assert not devs_a[0].mig_enabled


# --------------------------------------------------------------- failures, like NVML
def _fill_gpu0(b: SimBackend) -> None:
    create_mig_device(b, 0, "3g.40gb", 0)
    create_mig_device(b, 0, "3g.40gb", 4)


def _two_me(b: SimBackend) -> None:
    b.create_gpu_instance(0, "1g.10gb+me")
    b.create_gpu_instance(0, "1g.10gb+me")


def _create_on_non_mig(b: SimBackend) -> None:
    b.set_mig_mode(1, False)
    b.create_gpu_instance(1, "1g.10gb")


def _one_more_after_full(b: SimBackend) -> None:
    _fill_gpu0(b)
    b.create_gpu_instance(0, "1g.10gb")


def _mig_off_with_instance(b: SimBackend) -> None:
    b.create_gpu_instance(0, "1g.10gb")
    b.set_mig_mode(0, False)


def _mig_on_with_process(b: SimBackend) -> None:
    b.set_mig_mode(1, False)
    b.add_process(1, 1, 10)  # pid 1 is always alive
    b.set_mig_mode(1, True)


FAILURES: List[Tuple[str, Callable[[SimBackend], Any], Type[Exception], str]] = [
    (
        "mig-disabled",
        _create_on_non_mig,
        GpuNotSupported,
        "MIG mode is disabled on GPU 1",
    ),
    (
        "unknown-profile",
        lambda b: b.create_gpu_instance(0, "3g.20gb"),
        GpuNotSupported,
        "allowed profiles: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb",
    ),
    (
        "no-free-placement",
        _one_more_after_full,
        GpuInsufficientResources,
        "no free placement",
    ),
    (
        "overlap",
        lambda b: (create_mig_device(b, 0, "4g.40gb"), b.create_gpu_instance(0, "3g.40gb", 0)),
        GpuInsufficientResources,
        "free placements: 4",
    ),
    (
        "four-plus-four",
        lambda b: (create_mig_device(b, 0, "4g.40gb"), b.create_gpu_instance(0, "4g.40gb")),
        GpuInsufficientResources,
        "4g.40gb",
    ),
    ("media-engine-once", _two_me, GpuInsufficientResources, "at most 1"),
    (
        "illegal-start",
        lambda b: b.create_gpu_instance(0, "3g.40gb", 2),
        GpuError,
        "legal starts: 0, 4",
    ),
    (
        "destroy-gi-with-ci",
        lambda b: b.destroy_gpu_instance(0, create_mig_device(b, 0, "1g.10gb").gi_id),
        GpuInUse,
        "still has compute instance 0",
    ),
    ("unknown-gpu", lambda b: b.device(5), GpuNotFound, "no GPU 5"),
    ("unknown-gpu-create", lambda b: b.create_gpu_instance(2, "1g.10gb"), GpuNotFound, "no GPU 2"),
    ("unknown-gi", lambda b: b.destroy_gpu_instance(0, 3), GpuNotFound, "no GPU instance 3"),
    ("unknown-gi-ci", lambda b: b.create_compute_instance(0, 1), GpuNotFound, "no GPU instance 1"),
    (
        "unknown-ci",
        lambda b: b.destroy_compute_instance(0, b.create_gpu_instance(0, "7g.80gb").gi_id, 0),
        GpuNotFound,
        "no compute instance 0",
    ),
    (
        "second-ci",
        lambda b: b.create_compute_instance(0, create_mig_device(b, 0, "2g.20gb").gi_id),
        GpuInsufficientResources,
        "already has",
    ),
    (
        "mig-mode-with-instances",
        _mig_off_with_instance,
        GpuInUse,
        "1 MIG instance(s) exist",
    ),
    (
        "mig-mode-with-process",
        _mig_on_with_process,
        GpuInUse,
        "1 process(es) run on it",
    ),
]


@pytest.mark.parametrize("case", FAILURES, ids=[c[0] for c in FAILURES])
def test_failures_match_nvml(
    sim: SimBackend, case: Tuple[str, Callable[[SimBackend], Any], Type[Exception], str]
) -> None:
    _, action, exc_class, fragment = case
    with pytest.raises(exc_class) as info:
        action(sim)
    if exc_class is GpuError:  # "invalid argument" must not look like a resource problem
        assert type(info.value) is GpuError
    assert fragment in str(info.value)


def test_failed_change_writes_nothing(sim: SimBackend, state_path: str) -> None:
    before = Path(state_path).read_text()
    with pytest.raises(GpuError):
        sim.create_gpu_instance(0, "3g.40gb", 2)
    assert Path(state_path).read_text() == before


def test_compute_slice_budget(sim: SimBackend, state_path: str) -> None:
    """Memory slices 6-7 free but all 7 compute slices used: no 1g fits (hand-made state)."""
    state = json.loads(Path(state_path).read_text())
    state["gpus"][0]["instances"] = [
        {"gi_id": 1, "profile": "4g.40gb", "start": 0, "size": 4, "ci_id": None, "uuid": ""},
        {"gi_id": 2, "profile": "3g.40gb", "start": 4, "size": 2, "ci_id": None, "uuid": ""},
    ]
    Path(state_path).write_text(json.dumps(state))
    assert sim.free_placements(0, "1g.10gb") == []
    with pytest.raises(GpuInsufficientResources, match="compute slice"):
        sim.create_gpu_instance(0, "1g.10gb", 6)


def test_destroy_ci_with_live_process_is_in_use(sim: SimBackend) -> None:
    inst = create_mig_device(sim, 0, "3g.40gb")
    sim.add_process(0, 1, 1024, mig_uuid=inst.uuid)  # pid 1 is always alive
    assert inst.ci_id is not None
    with pytest.raises(GpuInUse, match="pid"):
        sim.destroy_compute_instance(0, inst.gi_id, inst.ci_id)


def test_destroy_ci_after_process_died(sim: SimBackend) -> None:
    inst = create_mig_device(sim, 0, "3g.40gb")
    sim.add_process(0, _dead_pid(), 1024, mig_uuid=inst.uuid)
    destroy_mig_device(sim, inst)
    assert sim.instances(0) == []


# ------------------------------------------------------------------ lost GPU
@pytest.mark.parametrize(
    "call",
    [
        lambda b: b.devices(),
        lambda b: b.device(1),
        lambda b: b.mig_mode(1),
        lambda b: b.profiles(1),
        lambda b: b.free_placements(1, "1g.10gb"),
        lambda b: b.create_gpu_instance(1, "1g.10gb"),
        lambda b: b.instances(),
        lambda b: b.processes(1),
        lambda b: b.telemetry(1),
        lambda b: b.set_mig_mode(1, False),
    ],
)
def test_lost_gpu_raises_on_every_call(sim: SimBackend, call: Callable[[SimBackend], Any]) -> None:
    sim.set_lost(1, True)
    with pytest.raises(GpuLost, match="GPU 1 has fallen off the bus"):
        call(sim)
    assert sim.device(0).index == 0  # the other GPU still answers


def test_lost_gpu_recovers(sim: SimBackend) -> None:
    sim.set_lost(1, True)
    sim.set_lost(1, False)
    assert len(sim.devices()) == 2


# --------------------------------------------------------------- placement and ids
def test_auto_placement_lowest_free_and_gi_ids(sim: SimBackend) -> None:
    made = [sim.create_gpu_instance(0, "1g.10gb") for _ in range(3)]
    assert [(i.gi_id, i.placement_start) for i in made] == [(1, 0), (2, 1), (3, 2)]
    sim.destroy_gpu_instance(0, 2)
    again = sim.create_gpu_instance(0, "1g.10gb")
    assert (again.gi_id, again.placement_start) == (2, 1)
    assert sim.free_placements(0, "1g.10gb") == [3, 4, 5, 6]
    assert sim.free_placements(0, "3g.40gb") == [4]


def test_create_destroy_round_trip_leaves_state_identical(sim: SimBackend, state_path: str) -> None:
    def observable() -> Dict[str, Any]:
        raw = json.loads(Path(state_path).read_text())
        raw.pop("mig_generation")  # only makes UUIDs of re-created instances new
        return raw

    sim.set_load(0, util=30)
    before, devices = observable(), sim.devices()
    inst = create_mig_device(sim, 0, "2g.20gb", 2)
    assert inst.uuid.startswith("MIG-") and inst.ci_id == 0 and inst.placement_size == 2
    assert sim.instances(0) == [inst]
    destroy_mig_device(sim, inst)
    assert observable() == before
    assert sim.devices() == devices
    again = create_mig_device(sim, 0, "2g.20gb", 2)
    assert again.gi_id == inst.gi_id and again.uuid != inst.uuid


def test_mig_instance_memory_follows_processes(sim: SimBackend) -> None:
    inst = create_mig_device(sim, 0, "3g.40gb")
    sim.add_process(0, 1, 5000, mig_uuid=inst.uuid, name="serve")
    (listed,) = sim.instances(0)
    assert listed.memory_used_mb == 5000 and listed.memory_total_mb == 4 * 9856
    with pytest.raises(GpuNotFound):
        sim.add_process(0, 1, 10, mig_uuid="MIG-not-there")


# ------------------------------------------------------------------ processes, load
def test_dead_pids_vanish_from_processes(sim: SimBackend) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sim.add_process(0, proc.pid, 2048, name="train")
        sim.add_process(0, proc.pid, 4096, name="train")  # replaces, does not add up
        assert [(p.pid, p.used_memory_mb) for p in sim.processes(0)] == [(proc.pid, 4096)]
        assert sim.device(0).memory_used_mb == 4096
    finally:
        proc.kill()
        proc.wait()
    assert sim.processes() == []
    assert sim.device(0).memory_used_mb == 0


def test_a_reused_pid_never_revives_a_dead_jobs_memory(sim: SimBackend) -> None:
    """A state file kept across runs (a machine image, a reboot) names pids that other
    processes now hold: only the same pid with the same start time still counts, and an entry
    written without a start time (an older state file) counts for nothing."""
    sim.add_process(0, 1, 2048, name="serve")  # pid 1 is always alive
    assert sim.device(0).memory_used_mb == 2048
    with open(sim.state_path) as fh:
        state = json.load(fh)
    assert state["processes"][0]["start"] is not None
    state["processes"][0]["start"] += 1  # as if pid 1 were another process than the one seen
    state["processes"].append({"pid": 1, "gpu_index": 1, "used_memory_mb": 4096,
                               "mig_uuid": "", "name": "old"})  # no start time at all
    with open(sim.state_path, "w") as fh:
        json.dump(state, fh)
    assert sim.processes() == []
    assert sim.device(0).memory_used_mb == 0


def test_load_and_telemetry(sim: SimBackend) -> None:
    sim.set_mig_mode(1, False)
    sim.set_load(1, util=50, sm_active=40, memory_used_mb=1000)
    tele = sim.telemetry(1)
    assert (tele.sm_active, tele.gr_engine_active, tele.memory_used_mb) == (0.4, 0.5, 1000)
    assert sim.device(1).utilization_pct == 50
    sim.set_load(0, util=70)
    assert sim.device(0).utilization_pct is None  # NVML reports none in MIG mode: not 0
    sim.clear_load(1)
    assert sim.telemetry(1).sm_active == 0.0 and sim.device(1).memory_used_mb == 0
    assert sim.telemetry(0).gr_engine_active == 0.7
    with pytest.raises(UsageError):
        sim.set_load(0, util=120)


# ------------------------------------------------------------------- state file
def test_init_refuses_to_overwrite(state_path: str) -> None:
    with pytest.raises(UsageError, match="already exists"):
        init_state(state_path, "H100-80GB", 1)
    init_state(state_path, "A30", 1, force=True)
    assert SimBackend(state_path).device(0).model == "A30-24GB"


def test_init_unknown_model_lists_known(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="known models: .*A30-24GB.*H100-80GB.*--memory"):
        init_state(str(tmp_path / "s.json"), "V100", 1)


@pytest.mark.parametrize("content", ["{not json", "[]", '{"version": 99}', ""])
def test_corrupt_state_is_unavailable(state_path: str, content: str) -> None:
    Path(state_path).write_text(content)
    with pytest.raises(GpuUnavailable) as info:
        SimBackend(state_path).devices()
    assert state_path in str(info.value) and "sim init --force" in str(info.value)


def test_missing_state_is_unavailable(tmp_path: Path) -> None:
    with pytest.raises(GpuUnavailable, match="sim init"):
        SimBackend(str(tmp_path / "nope.json")).devices()


def test_lock_timeout_names_lock_file(state_path: str) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys, time
            from slurmiso.state.lock import FileLock
            with FileLock({state_path + ".lock"!r}):
                print("locked", flush=True)
                time.sleep(30)
        """),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        with pytest.raises(GpuUnavailable, match=r"n1\.json\.lock"):
            SimBackend(state_path, lock_timeout=0.2).devices()
    finally:
        holder.kill()
        holder.wait()


_WORKER = """
import sys
sys.path.insert(0, {root!r})
from slurmiso.errors import GpuInsufficientResources
from slurmiso.gpu.backend import create_mig_device
from slurmiso.gpu.sim import SimBackend
backend, made, full = SimBackend({path!r}), 0, set()
while len(full) < 2:
    gpu = made % 2 if not full else ({{0, 1}} - full).pop()
    try:
        create_mig_device(backend, gpu, "1g.10gb")
        made += 1
    except GpuInsufficientResources:
        full.add(gpu)
print(made)
"""


def test_concurrent_processes_never_overlap(sim: SimBackend, state_path: str) -> None:
    code = _WORKER.format(root=str(ROOT), path=state_path)
    workers = [
        subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    counts = [int(w.communicate(timeout=120)[0]) for w in workers]
    assert all(w.returncode == 0 for w in workers)
    assert sum(counts) == 14  # 7 x 1g per GPU, each handed out exactly once
    for gpu in (0, 1):
        insts = sim.instances(gpu)
        assert sorted(i.placement_start for i in insts) == list(range(7))
        assert len({i.gi_id for i in insts}) == 7 and len({i.uuid for i in insts}) == 7


# -------------------------------------------------------------- deterministic kill points
_KILLED_WORKER = """
import sys
sys.path.insert(0, {root!r})
from slurmiso.gpu.backend import create_mig_device
from slurmiso.gpu.sim import SimBackend
from slurmiso.state import JobRecord, NodeState
st = NodeState({state_dir!r})
st.write_job("1", JobRecord.from_dict({{}}))  # before any SimBackend: not a step
backend = SimBackend({path!r})
st.write_job("2", JobRecord.from_dict({{}}))
create_mig_device(backend, 0, "1g.10gb")
st.set_allocations({{"mig/0/gi1": "2"}})
st.delete_job("1")
print("done", flush=True)
"""


def _killed_worker(tmp_path: Path, state_path: str, **env: str) -> subprocess.CompletedProcess:
    code = _KILLED_WORKER.format(root=str(ROOT), path=state_path,
                                 state_dir=str(tmp_path / "state"))
    full = {k: v for k, v in os.environ.items() if not k.startswith("SLURMISO_SIM_")}
    return subprocess.run([sys.executable, "-c", code], env=dict(full, **env),
                          capture_output=True, text=True, timeout=60)


def test_trace_lists_every_step_of_the_process(tmp_path: Path, state_path: str) -> None:
    trace = str(tmp_path / "trace")
    done = _killed_worker(tmp_path, state_path, SLURMISO_SIM_TRACE=trace)
    assert done.returncode == 0 and done.stdout == "done\n", done.stderr
    steps = [line.split(" ", 1)[1] for line in Path(trace).read_text().splitlines()]
    state_dir = tmp_path / "state"
    assert steps == [
        f"write 1 {state_dir}/jobs/2.json",
        "call 1 create_gpu_instance",
        "call 2 create_compute_instance",
        f"write 2 {state_dir}/allocations.json",
        f"write 3 {state_dir}/jobs/1.json",
    ]


@pytest.mark.parametrize("spec,instances,record_2,claimed,record_1", [
    ("before:1", 0, True, False, True),
    ("after:1", 1, True, False, True),  # a GPU instance without its compute instance
    ("before:2", 1, True, False, True),
    ("after:2", 1, True, False, True),
    ("before:write:1", 0, False, False, True),
    ("after:write:1", 0, True, False, True),
    ("before:write:2", 1, True, False, True),
    ("after:write:2", 1, True, True, True),
    ("before:write:3", 1, True, True, True),
    ("after:write:3", 1, True, True, False),
])
def test_kill_point_kills_exactly_there(
    tmp_path: Path, state_path: str, spec: str, instances: int, record_2: bool, claimed: bool,
    record_1: bool,
) -> None:
    from slurmiso.state import NodeState

    done = _killed_worker(tmp_path, state_path, SLURMISO_SIM_KILL_AT=spec)
    assert done.returncode == -signal.SIGKILL, done.stderr
    assert f"SLURMISO_SIM_KILL_AT={spec}" in done.stderr and done.stdout == ""
    st = NodeState(str(tmp_path / "state"))
    insts = SimBackend(state_path).instances()
    assert len(insts) == instances
    if spec in ("after:1", "before:2"):
        assert insts[0].ci_id is None
    assert (st.read_job("2") is not None) == record_2
    assert bool(st.allocations()) == claimed
    assert (st.read_job("1") is not None) == record_1


def test_kill_point_past_the_last_step_changes_nothing(tmp_path: Path, state_path: str) -> None:
    for spec in ("after:3", "before:write:4"):
        done = _killed_worker(tmp_path, state_path, SLURMISO_SIM_KILL_AT=spec)
        assert done.returncode == 0 and done.stdout == "done\n", done.stderr
        SimBackend(state_path).destroy_compute_instance(0, 1, 0)
        SimBackend(state_path).destroy_gpu_instance(0, 1)


def test_after_a_failed_call_is_a_kill_point_too(tmp_path: Path, state_path: str) -> None:
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from slurmiso.gpu.sim import SimBackend\n"
            f"SimBackend({state_path!r}).destroy_gpu_instance(0, 9)\n")
    env = dict(os.environ, SLURMISO_SIM_KILL_AT="after:1")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL and "GpuNotFound" not in done.stderr


@pytest.mark.parametrize("spec", ["before", "during:1", "before:0", "before:x", "after:disk:1",
                                  "before:write:1:2"])
def test_a_bad_kill_point_is_refused(
    state_path: str, spec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slurmiso.gpu import sim as sim_mod

    monkeypatch.setattr(sim_mod, "_kill_points_read", False)
    monkeypatch.setenv("SLURMISO_SIM_KILL_AT", spec)
    with pytest.raises(UsageError, match="not a kill point"):
        SimBackend(state_path)


def test_the_state_store_alone_never_reads_the_kill_point(tmp_path: Path) -> None:
    """A node on NVML never builds a SimBackend: its state writes are no kill points."""
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from slurmiso.state import JobRecord, NodeState, store\n"
            f"NodeState({str(tmp_path / 'state')!r}).write_job('1', JobRecord.from_dict({{}}))\n"
            "assert store.write_hook is None and 'slurmiso.gpu.sim' not in sys.modules\n")
    env = dict(os.environ, SLURMISO_SIM_KILL_AT="before:write:1",
               SLURMISO_SIM_TRACE=str(tmp_path / "trace"))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "trace").exists()


# ------------------------------------------------------------------- open_backend
def test_open_backend_sim_with_node_pattern(
    state_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURMISO_SIM_STATE", raising=False)
    monkeypatch.delenv("SLURMISO_GPU_BACKEND", raising=False)
    pattern = state_path.replace("n1.json", "%n.json")
    backend = open_backend("sim", sim_state=pattern, node="n1")
    assert isinstance(backend, SimBackend) and backend.state_path == state_path
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    assert sim_state_path(pattern) == state_path


def test_open_backend_env_overrides(state_path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURMISO_GPU_BACKEND", "sim")
    monkeypatch.setenv("SLURMISO_SIM_STATE", state_path)
    backend = open_backend("nvml", sim_state="/elsewhere.json")
    assert isinstance(backend, SimBackend) and backend.state_path == state_path


def test_open_backend_unknown_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURMISO_GPU_BACKEND", raising=False)
    with pytest.raises(ConfigError, match="auto, nvml, sim"):
        open_backend("cuda")


def _no_nvml() -> Any:
    raise GpuUnavailable("NVML initialisation: NVML Shared Library Not Found")


def test_open_backend_auto_falls_back_loudly(
    state_path: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("SLURMISO_GPU_BACKEND", raising=False)
    monkeypatch.delenv("SLURMISO_SIM_STATE", raising=False)
    monkeypatch.setattr("slurmiso.gpu._open_nvml", _no_nvml)
    with caplog.at_level(logging.WARNING, logger="slurmiso.gpu"):
        backend = open_backend("auto", sim_state=state_path)
    assert isinstance(backend, SimBackend)
    assert "NVML is unavailable" in caplog.text and "Shared Library Not Found" in caplog.text
    assert state_path in caplog.text


def test_open_backend_auto_without_sim_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SLURMISO_GPU_BACKEND", raising=False)
    monkeypatch.delenv("SLURMISO_SIM_STATE", raising=False)
    monkeypatch.setattr("slurmiso.gpu._open_nvml", _no_nvml)
    with pytest.raises(GpuUnavailable, match="sim init"):
        open_backend("auto", sim_state=str(tmp_path / "none.json"))


def test_a_processes_sm_share_is_modelled_on_whole_gpus_only(tmp_path: Path) -> None:
    """As NVML samples processes (nvmlDeviceGetProcessUtilization): a whole GPU's process
    may carry its SM share; a MIG device's never; one added without a share is unknown."""
    path = str(tmp_path / "n2.json")
    init_state(path, "H100-80GB", 1, mig=False, node="n2")
    sim = SimBackend(path)
    me = os.getpid()
    assert sim.add_process(0, me, 100, sm_util=35.0).sm_util == 0.35
    assert [p.sm_util for p in sim.processes(0)] == [0.35]
    sim.add_process(0, me, 100)  # replaced, without a share
    assert [p.sm_util for p in sim.processes(0)] == [None]
    for bad in (-1.0, 100.5):
        with pytest.raises(UsageError, match="percentage 0-100"):
            sim.add_process(0, me, 100, sm_util=bad)


def test_a_mig_devices_process_takes_no_sm_share(sim: SimBackend) -> None:
    inst = create_mig_device(sim, 0, "1g.10gb")
    with pytest.raises(UsageError, match="whole GPU"):
        sim.add_process(0, os.getpid(), 100, inst.uuid, sm_util=10.0)
