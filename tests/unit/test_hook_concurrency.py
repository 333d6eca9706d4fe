"""Concurrent hooks on one node: the node lock guards state, not driver calls (issue 13).

32 prologs at once, each MIG creation taking 500 ms of simulated driver time (closer to real
MIG creation than the sim's default of nothing): with the lock held across driver calls and a
30 s timeout, the last ones timed out and drained the node. Each hook is its own process, as
slurmd runs it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Dict, List

import pytest
import yaml

from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.hooks.budget import DEFAULT_WAIT_S, lock_wait_s, prolog_epilog_timeout
from slurmiso.state import NodeState

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GPUS = 8
JOBS = 32


def _node(tmp: str) -> str:
    data = {
        "version": 1,
        "paths": {"state_dir": f"{tmp}/state", "journal": f"{tmp}/journal.jsonl"},
        "gpu": {"backend": "sim", "sim_state": f"{tmp}/sim.json"},
        "classes": [{"name": "train", "match": {"qos": ["train"]}, "isolation": "mig",
                     "mig_profile": "1g.10gb"}],
        "default_class": "",
        "pools": [{"name": "p", "nodes": "n1", "partition": "p", "gpu_model": "H100-80GB",
                   "gpus_per_node": GPUS, "mode": "mig-dynamic"}],
    }
    path = os.path.join(tmp, "slurmiso.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    init_state(f"{tmp}/sim.json", "H100-80GB", GPUS, mig=True, node="n1")
    return path


def _env(tmp: str, cfg: str, job: int, delay_ms: int) -> Dict[str, str]:
    return {"PYTHONPATH": ROOT, "SLURMISO_CONFIG": cfg, "SLURMISO_SIM_DELAY_MS": str(delay_ms),
            "SLURMISO_CACHE_DIR": os.environ.get("SLURMISO_CACHE_DIR", f"{tmp}/cache"),
            "SLURM_JOB_ID": str(job), "SLURM_JOB_UID": str(os.getuid()),
            "SLURMD_NODENAME": "n1", "SLURM_JOB_QOS": "train", "SLURM_JOB_GPUS": str(job % GPUS),
            "SLURM_JOB_PARTITION": "p", "SLURM_JOB_WORK_DIR": tmp}


def _storm(tmp: str, cfg: str, hook: str, delay_ms: int) -> List[int]:
    argv = [sys.executable, os.path.join(ROOT, hook)]
    procs = [subprocess.Popen(argv, env=_env(tmp, cfg, j, delay_ms), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) for j in range(1, JOBS + 1)]
    return [p.wait(timeout=300) for p in procs]


@pytest.mark.slow
def test_32_concurrent_prologs_with_500ms_driver_calls_never_drain(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = _node(tmp)
    codes = _storm(tmp, cfg, "prolog/slurmiso-prolog", 500)
    assert codes == [0] * JOBS, codes  # exit 1 = a drain
    insts = SimBackend(f"{tmp}/sim.json").instances()
    assert len(insts) == JOBS and len({i.uuid for i in insts}) == JOBS
    slices = [(i.gpu_index, s) for i in insts
              for s in range(i.placement_start, i.placement_start + i.placement_size)]
    assert len(slices) == len(set(slices)), "two jobs got overlapping placements"
    records = NodeState(f"{tmp}/state").jobs()
    assert sorted(r.status.value for r in records.values()) == ["ready"] * JOBS
    # (how much faster than the old serialised lock this is: bench/bench_hooks.py)
    assert _storm(tmp, cfg, "epilog/slurmiso-epilog", 500) == [0] * JOBS
    assert SimBackend(f"{tmp}/sim.json").instances() == []
    assert NodeState(f"{tmp}/state").jobs() == {}


@pytest.mark.slow
def test_a_turnover_storm_of_ending_and_starting_jobs_never_drains(tmp_path: Any) -> None:
    """Issue 22: N prologs, then N epilogs and N new prologs at once on the same GPUs. The
    driver hands an ending job's GI ids to the new jobs; no new prolog may drain the node.

    3 jobs of 1g.10gb per GPU: old and new together need 6 of the 7 slices (Slurm's shard
    count keeps an ending job's share until its epilog is done, so no more ever overlap)."""
    tmp = str(tmp_path)
    jobs = 3 * GPUS
    cfg = _node(tmp)
    first = [_start(tmp, cfg, "prolog/slurmiso-prolog", j, 50) for j in range(1, jobs + 1)]
    assert [p.wait(timeout=300) for p in first] == [0] * jobs
    turnover = [_start(tmp, cfg, "epilog/slurmiso-epilog", j, 50) for j in range(1, jobs + 1)]
    turnover += [_start(tmp, cfg, "prolog/slurmiso-prolog", j, 50)
                 for j in range(jobs + 1, 2 * jobs + 1)]
    codes = [p.wait(timeout=300) for p in turnover]
    assert codes == [0] * (2 * jobs), codes  # exit 1 = a drain
    insts = SimBackend(f"{tmp}/sim.json").instances()
    assert len(insts) == jobs and len({i.uuid for i in insts}) == jobs
    records = NodeState(f"{tmp}/state").jobs()
    assert sorted(records) == sorted(str(j) for j in range(jobs + 1, 2 * jobs + 1))
    assert all(r.status.value == "ready" for r in records.values())
    held = NodeState(f"{tmp}/state").allocations()
    assert sorted(held.values()) == sorted(records) and len(held) == jobs
    # Whether the driver reused an ending job's GI id here depends on the interleaving; the
    # reuse itself is forced, at the exact point, by test_mig_handlers'
    # test_dynamic_turnover_reusing_a_gi_id_never_drains.


def _start(tmp: str, cfg: str, hook: str, job: int, delay_ms: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, os.path.join(ROOT, hook)],
                            env=_env(tmp, cfg, job, delay_ms),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_lock_waits_are_bounded_by_prolog_epilog_timeout(tmp_path: Any) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=x\n# PrologEpilogTimeout=5\nprologepilogtimeout = 120 # s\n")
    env = {"SLURM_CONF": str(conf)}
    assert prolog_epilog_timeout(env) == 120
    assert lock_wait_s(env) == 108.0  # 10% kept back to write the drain reason
    conf.write_text("PrologEpilogTimeout=10\n")
    assert lock_wait_s(env) == 8.0
    conf.write_text("PrologEpilogTimeout=0\n")  # Slurm: wait forever; we still end it
    assert lock_wait_s(env) == DEFAULT_WAIT_S
    assert lock_wait_s({"SLURM_CONF": str(tmp_path / "missing")}) == DEFAULT_WAIT_S


def test_a_lock_wait_past_the_deadline_names_the_holder(tmp_path: Any) -> None:
    from slurmiso.errors import StateError
    from slurmiso.state.lock import FileLock

    st = NodeState(str(tmp_path / "state"))
    st.ensure()
    holder = FileLock(st.lock_path)
    holder.acquire()
    try:
        st.deadline = time.monotonic() + 0.2
        # the holder keeps the lock until the finally below: the raise itself shows the wait
        # ended at its deadline, on any machine
        with pytest.raises(StateError, match="node lock .* held by pid"), st.locked():
            pass
    finally:
        holder.release()


def test_unlocked_lets_another_process_in_and_takes_the_lock_back(tmp_path: Any) -> None:
    st = NodeState(str(tmp_path / "state"))
    other = NodeState(str(tmp_path / "state"), lock_timeout=0.2)
    with st.locked(), st.locked():
        with st.unlocked(), other.locked():  # would time out if st still held it
            pass
        from slurmiso.errors import StateError

        with pytest.raises(StateError), other.locked():
            pass
    with other.locked():  # released at the end of both levels
        pass
