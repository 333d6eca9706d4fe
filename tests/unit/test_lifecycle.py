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
