"""cuda-checkpoint on the simulated node, the real tool's CLI wrapper, and the park rung's
all-or-none rule (issue 35 item 3).

The simulated states and verbs follow NVIDIA's cuda-checkpoint README (driver 570): running ->
lock -> locked -> checkpoint -> checkpointed (gone from the GPU's process list, its memory
released) -> restore -> locked -> unlock -> running; a failed checkpoint leaves ``failed``.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from slurmiso.errors import CheckpointRefused
from slurmiso.gpu.cuda_checkpoint import (
    Action,
    CliTool,
    CudaState,
    SimTool,
    parse_version,
)
from slurmiso.gpu.park import park, release
from slurmiso.gpu.sim import SimBackend, init_state


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Tuple[SimBackend, List[int]]]:
    """A simulated H100 with two live 'training' processes holding 30 GiB each."""
    path = str(tmp_path / "n.json")
    init_state(path, "H100-80GB", 1, mig=False, node="n")
    sim = SimBackend(path)
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
             for _ in range(2)]
    for p in procs:
        sim.add_process(0, p.pid, 30 * 1024, name="train")
    yield sim, [p.pid for p in procs]
    for p in procs:
        p.kill()
        p.wait()


def test_park_releases_gpu_memory_and_release_brings_it_back(node: Tuple[SimBackend, List[int]]
                                                            ) -> None:
    sim, pids = node
    before = sim.telemetry(0).memory_used_mb
    tool = SimTool(sim)
    out = park(tool, pids)
    assert out.ok and out.parked == tuple(pids)
    assert [tool.state(p) for p in pids] == [CudaState.CHECKPOINTED] * 2
    assert sim.telemetry(0).memory_used_mb == before - 2 * 30 * 1024
    assert sim.processes(0) == []  # gone from NVML's list, as the README shows nvidia-smi
    assert release(tool, pids) == []
    assert [tool.state(p) for p in pids] == [CudaState.RUNNING] * 2
    assert sim.telemetry(0).memory_used_mb == before


def test_a_refusal_part_way_parks_nothing_and_says_why(node: Tuple[SimBackend, List[int]]
                                                       ) -> None:
    sim, pids = node
    sim.refuse_checkpoint(pids[1], "UVM memory is not supported")
    out = park(SimTool(sim), pids)
    assert not out.ok and "UVM memory is not supported" in out.refused
    assert out.parked == ()
    # the first process, already checkpointed, was brought back; the refusing one is failed
    assert sim.cuda_state(pids[0]) is CudaState.RUNNING
    assert sim.cuda_state(pids[1]) is CudaState.FAILED
    assert out.damaged == (pids[1],)
    assert sim.telemetry(0).memory_used_mb >= 30 * 1024  # nothing stays released


def test_the_driver_state_machine_is_enforced(node: Tuple[SimBackend, List[int]]) -> None:
    sim, pids = node
    with pytest.raises(CheckpointRefused, match="is running: checkpoint needs locked"):
        sim.cuda_act(pids[0], Action.CHECKPOINT)
    with pytest.raises(CheckpointRefused, match="not a CUDA process"):
        sim.cuda_state(os.getpid())


def test_release_finishes_a_half_done_release(node: Tuple[SimBackend, List[int]]) -> None:
    """After a crash between restore and unlock, the next release takes each pid from its
    own state instead of failing on the first."""
    sim, pids = node
    tool = SimTool(sim)
    assert park(tool, pids).ok
    sim.cuda_act(pids[0], Action.RESTORE)  # the crash: restored, never unlocked
    assert release(tool, pids) == []
    assert [tool.state(p) for p in pids] == [CudaState.RUNNING] * 2


def test_no_process_is_a_refusal_not_a_park(node: Tuple[SimBackend, List[int]]) -> None:
    out = park(SimTool(node[0]), [])
    assert not out.ok and "no CUDA process" in out.refused


@pytest.mark.parametrize("text,want", [
    ("CUDA checkpoint and restore utility.\nVersion 570.86.10. Copyright", (570, 86)),
    ("Version 550.54.14. Copyright (C) 2024", (550, 54)),
    ("no version here", None),
])
def test_the_tools_version_is_read_from_its_help(text: str, want: object) -> None:
    assert parse_version(text) == want


def _fake_tool(tmp: Path, script: str) -> str:
    path = tmp / "cuda-checkpoint"
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def test_cli_tool_refuses_a_550_tool_without_a_lock_timeout(tmp_path: Path) -> None:
    tool = CliTool(_fake_tool(tmp_path, 'echo "Version 550.54.14. Copyright"\n'))
    why = tool.unusable()
    assert why is not None and "no lock timeout" in why and "570" in why


def test_cli_tool_passes_the_lock_timeout_and_reads_states(tmp_path: Path) -> None:
    log = tmp_path / "argv"
    tool = CliTool(_fake_tool(tmp_path, f'echo "$@" >> {log}\n'
                              'case "$1" in --help) echo "Version 570.86.10.";; '
                              '--get-state) echo checkpointed;; esac\n'))
    assert tool.unusable() is None
    tool.act(42, Action.LOCK, 5000)
    assert tool.state(42) is CudaState.CHECKPOINTED
    assert "--action lock --pid 42 --timeout 5000" in log.read_text()


def test_cli_tool_turns_a_failure_into_one_refusal(tmp_path: Path) -> None:
    tool = CliTool(_fake_tool(tmp_path, 'echo "error: CUDA_ERROR_ILLEGAL_STATE" >&2; exit 1\n'))
    with pytest.raises(CheckpointRefused, match="ILLEGAL_STATE.*exit 1"):
        tool.act(7, Action.CHECKPOINT)
    with pytest.raises(CheckpointRefused, match="unknown CUDA state"):
        CliTool(_fake_tool(tmp_path, "echo weird\n")).state(7)


def test_cli_tool_without_the_binary_says_so() -> None:
    why = CliTool("/nonexistent/cuda-checkpoint").unusable()
    assert why is not None and "not installed" in why
