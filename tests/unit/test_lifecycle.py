"""Lifecycle operations in the library (``slurmiso.isolation.lifecycle``), without the CLI.

The monitor calls :func:`reconcile_node` periodically, so it must close the GPU session it
opens (an NVML session left open per call would pile up in a long-running daemon).
"""

from __future__ import annotations

from typing import Any, List

import pytest

import slurmiso.gpu
from slurmiso.gpu.sim import SimBackend
from slurmiso.isolation import lifecycle
from slurmiso.isolation.base import handler_for
from tests.hookctx import make_context


class CountingSim(SimBackend):
    closed: List[str] = []

    def close(self) -> None:
        CountingSim.closed.append("closed")
        super().close()


@pytest.fixture
def counting(monkeypatch: Any) -> List[str]:
    CountingSim.closed = []
    monkeypatch.setattr(
        slurmiso.gpu, "open_backend", lambda kind, sim_state, node: CountingSim(sim_state)
    )
    return CountingSim.closed


def _setup_job(tmp: str, job_id: str = "100") -> Any:
    ctx = make_context(tmp, "mig-dynamic", job_id=job_id, cls="train")
    handler_for("mig-dynamic").setup(ctx)
    ctx.save()
    return ctx


def test_reconcile_undoes_an_ended_job_and_closes_the_backend(tmp_path: Any, counting: Any) -> None:
    ctx = _setup_job(str(tmp_path))
    assert SimBackend(ctx.config.gpu.sim_state).instances(), "setup made no MIG instance"
    fixes = lifecycle.reconcile_node(ctx.config, "node1", False, live_jobs=[])
    assert any("job 100 ended" in f for f in fixes), fixes
    assert ctx.state.read_job("100") is None
    assert SimBackend(ctx.config.gpu.sim_state).instances() == []
    assert len(counting) == 1


def test_reconcile_dry_run_and_unknown_jobs_change_nothing(tmp_path: Any, counting: Any) -> None:
    ctx = _setup_job(str(tmp_path))
    assert lifecycle.reconcile_node(ctx.config, "node1", True, live_jobs=[])
    assert lifecycle.reconcile_node(ctx.config, "node1", False, live_jobs=None) == []
    assert ctx.state.read_job("100") is not None
    assert SimBackend(ctx.config.gpu.sim_state).instances()
    assert len(counting) == 2


def test_node_status_lists_the_job_and_closes_the_backend(tmp_path: Any, counting: Any) -> None:
    ctx = _setup_job(str(tmp_path))
    status = lifecycle.node_status(ctx.config, "node1", with_gpus=True)
    assert [j["job"] for j in status["jobs"]] == ["100"]
    assert status["mode"] == "mig-dynamic" and len(status["mig_instances"]) == 1
    assert len(counting) == 1


def test_reconcile_removes_fences_of_ended_jobs_and_unfinished_fence_writes(
    tmp_path: Any, counting: Any
) -> None:
    """Issue 22: reconcile left fence/<jobid> files and fence/*.tmp behind."""
    import os
    import subprocess
    import sys

    from slurmiso.isolation import fence

    live = _setup_job(str(tmp_path), "100")
    ended = _setup_job(str(tmp_path), "101")
    for ctx in (live, ended):
        fence.write(ctx.state.state_dir, ctx.job_id, "test", ["c 195:1 rwm"])
    folder = os.path.join(live.state.state_dir, fence.FENCE_DIR)
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead_tmp = f".101.{gone.pid}.0badc0de.tmp"
    live_tmp = f".100.{os.getpid()}.00c0ffee.tmp"  # a writer still at work is left alone
    for name in (dead_tmp, live_tmp, "999"):
        with open(os.path.join(folder, name), "w") as fh:
            fh.write("deny c 195:0 rwm\n")
    dry = lifecycle.reconcile_node(live.config, "node1", True, live_jobs=["100"])
    assert sorted(os.listdir(folder)) == sorted([dead_tmp, live_tmp, "100", "101", "999"])
    fixes = lifecycle.reconcile_node(live.config, "node1", False, live_jobs=["100"])
    assert sorted(os.listdir(folder)) == sorted([live_tmp, "100"])
    assert any("fence of job 101" in f for f in fixes) and any("job 999" in f for f in fixes)
    assert any(dead_tmp in f for f in fixes) and any(dead_tmp in f for f in dry)
    assert fence.read_rules(live.state.state_dir, "100") == ["c 195:1 rwm"]
