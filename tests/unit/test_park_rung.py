"""The park rung on the node: the park token, and the agent parking and releasing a training
job's CUDA processes on the simulated node (issue 35 item 3).

Real child processes are registered with the simulated backend (its process list checks
their start times, as the record does); their cgroup is a fake ``/proc/PID/cgroup`` text.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

from slurmiso.agent.park_record import RECORD_FILE, load_record
from slurmiso.agent.park_rung import FALLBACK, ParkRung
from slurmiso.agent.restraint_watch import RestraintCollector
from slurmiso.gpu.cuda_checkpoint import CudaState, SimTool
from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.pids import start_ticks
from slurmiso.restraints import (
    M_PARK,
    NodeRestraint,
    Note,
    OnBound,
    RestraintStep,
    end_over_bound,
    with_note,
    write_heartbeat,
)
from slurmiso.state import Journal
from slurmiso.state.record import JobRecord

NOW = 1_733_460_000.0
PARK = Note(RestraintStep.PARK, NOW - 100, "n1", 0, "4711", 1800, OnBound.RESUME)
GIB = 1024


# ------------------------------------------------------------------------------ the token
def test_park_token_is_one_word_and_round_trips() -> None:
    text = PARK.text()
    assert text == ("slurmiso-restraint:step=park,since=1733459900,gpu=n1/0,cause=4711,"
                    "max=1800,on=resume")
    assert Note.parse(f"site {text} more") == PARK
    requeue = Note(RestraintStep.PARK, NOW, "n1", 0, "1", 60, OnBound.REQUEUE)
    assert Note.parse(with_note("", requeue)) == requeue


@pytest.mark.parametrize("tail", [
    "step=park,since=1,gpu=n1/0,cause=1,max=60,on=resume,lvl=1",   # a level: not ours
    "step=park,since=1,gpu=n1/0,cause=1,max=60,on=stop",
    "step=parked,since=1,gpu=n1/0,cause=1,max=60,on=resume",
    "step=park,since=1,gpu=n1/0,cause=1,max=60",
])
def test_malformed_park_tokens_are_none_of_ours(tail: str) -> None:
    assert Note.parse("slurmiso-restraint:" + tail) is None


def test_end_over_bound_leaves_a_park_to_the_node(tmp_path: Path) -> None:
    late = NodeRestraint("41", "RUNNING", PARK)
    assert end_over_bound(None, str(tmp_path), [late], NOW + 9999, 30, "SIGUSR2", True) == []


# ------------------------------------------------------------------------- the simulation
Node = Tuple[SimBackend, List[int], Path]


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    """An H100 with job 41's two training processes holding 30 GiB each."""
    path = str(tmp_path / "n.json")
    init_state(path, "H100-80GB", 1, mig=False, node="n1")
    sim = SimBackend(path)
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
             for _ in range(2)]
    for p in procs:
        sim.add_process(0, p.pid, 30 * GIB, name="train")
    yield sim, [p.pid for p in procs], tmp_path
    for p in procs:
        p.kill()
        p.wait()


def _cgroups(jobs: Dict[int, str]) -> Any:
    def read(pid: int) -> Optional[str]:
        job = jobs.get(pid)
        return None if job is None else \
            f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_0\n"
    return read


def _rung(sim: SimBackend, pids: List[int], tmp: Path, tool: Any = None,
          **kw: Any) -> ParkRung:
    kw.setdefault("cgroup", _cgroups({p: "41" for p in pids}))
    kw.setdefault("uid_of", lambda pid: os.getuid())
    return ParkRung(str(tmp / "state"), "n1", ("train",), 30, Journal(str(tmp / "journal")),
                    tool=tool or SimTool(sim), processes=sim.processes, **kw)


def _book(note: Note = PARK, job: str = "41") -> List[NodeRestraint]:
    return [NodeRestraint(job, "RUNNING", note)]


def _records(cls: str = "train") -> Dict[str, JobRecord]:
    return {"41": JobRecord("41", job_class=cls, uid=os.getuid())}


def _events(tmp: Path) -> List[Dict[str, Any]]:
    return list(Journal(str(tmp / "journal")).read())


def test_park_frees_the_jobs_gpu_memory_and_the_note_gone_restores_it(node: Node) -> None:
    sim, pids, tmp = node
    before = sim.telemetry(0).memory_used_mb
    lines = _rung(sim, pids, tmp).round(_book(), _records(), NOW)
    assert lines == ["job 41: park: 2 CUDA processes parked"]
    assert sim.telemetry(0).memory_used_mb == before - 60 * GIB
    assert [sim.cuda_state(p) for p in pids] == [CudaState.CHECKPOINTED] * 2
    rec = load_record(str(tmp / "state"))
    assert [(p.job, p.pids(), p.whole) for p in rec.parked] == [("41", tuple(pids), True)]
    # the next round changes nothing; a restarted agent (a new rung) parks nothing twice
    assert _rung(sim, pids, tmp).round(_book(), _records(), NOW + 30) == []
    # the series shows the park
    fams = {f.name: f for f in RestraintCollector(str(tmp / "state"), lambda: NOW + 60)
            .collect()}
    sample = fams[M_PARK].samples[0]
    assert sample.labels["job"] == "41" and sample.value == 60
    # the monitor removes the note: released, memory back
    lines = _rung(sim, pids, tmp).round([], _records(), NOW + 60)
    assert "released" in lines[0]
    assert [sim.cuda_state(p) for p in pids] == [CudaState.RUNNING] * 2
    assert sim.telemetry(0).memory_used_mb == before
    assert load_record(str(tmp / "state")).parked == []
    events = [(e["event"], e["ok"], e["details"]["by"]) for e in _events(tmp)]
    assert events == [("park", True, "node"), ("park-end", True, "node")]


def test_one_process_refusing_parks_nothing_and_is_journaled_once(node: Node) -> None:
    sim, pids, tmp = node
    before = sim.telemetry(0).memory_used_mb
    sim.refuse_checkpoint(pids[1], "UVM memory is not supported")
    _rung(sim, pids, tmp).round(_book(), _records(), NOW)
    _rung(sim, pids, tmp).round(_book(), _records(), NOW + 30)  # never retried
    assert sim.cuda_state(pids[0]) is CudaState.RUNNING
    assert sim.telemetry(0).memory_used_mb >= before - 30 * GIB  # nothing stays parked
    assert load_record(str(tmp / "state")).parked == []
    events = _events(tmp)
    assert [e["event"] for e in events] == ["park-refused"]
    assert "UVM memory is not supported" in events[0]["reason"]
    assert FALLBACK in events[0]["reason"] and events[0]["details"]["by"] == "node"


def test_an_inference_jobs_note_is_refused(node: Node) -> None:
    sim, pids, tmp = node
    _rung(sim, pids, tmp).round(_book(), _records("infer"), NOW)
    assert [sim.cuda_state(p) for p in pids] == [CudaState.RUNNING] * 2
    (e,) = _events(tmp)
    assert e["event"] == "park-refused" and "not a training class" in e["reason"]


class Unusable(SimTool):
    def unusable(self) -> Optional[str]:
        return "cuda-checkpoint is not installed (it ships with the driver from 570)"


def test_an_unusable_tool_refuses_with_its_reason(node: Node) -> None:
    sim, pids, tmp = node
    _rung(sim, pids, tmp, tool=Unusable(sim)).round(_book(), _records(), NOW)
    (e,) = _events(tmp)
    assert e["event"] == "park-refused" and "not installed" in e["reason"]
    assert FALLBACK in e["reason"]
    assert [sim.cuda_state(p) for p in pids] == [CudaState.RUNNING] * 2


def test_only_the_jobs_own_processes_are_parked(node: Node) -> None:
    sim, pids, tmp = node
    rung = _rung(sim, pids, tmp, cgroup=_cgroups({pids[0]: "41", pids[1]: "99"}))
    rung.round(_book(), _records(), NOW)
    assert sim.cuda_state(pids[0]) is CudaState.CHECKPOINTED
    assert sim.cuda_state(pids[1]) is CudaState.RUNNING


def test_a_job_ended_drops_the_record(node: Node) -> None:
    sim, pids, tmp = node
    _rung(sim, pids, tmp).round(_book(), _records(), NOW)
    # its processes are gone: every recorded start time differs now
    lines = _rung(sim, pids, tmp, start_of=lambda pid: None).round(_book(), _records(), NOW + 30)
    assert "nothing to release, record dropped" in lines[0]
    assert load_record(str(tmp / "state")).parked == []


def test_a_reused_pid_is_never_touched(node: Node) -> None:
    sim, pids, tmp = node
    _rung(sim, pids, tmp).round(_book(), _records(), NOW)
    real = {p: start_ticks(p) for p in pids}
    moved = {pids[0]: real[pids[0]], pids[1]: (real[pids[1]] or 0) + 1}  # pid 2 is another
    lines = _rung(sim, pids, tmp, start_of=moved.get).round([], _records(), NOW + 30)
    assert "released" in lines[0]
    assert sim.cuda_state(pids[0]) is CudaState.RUNNING
    assert sim.cuda_state(pids[1]) is CudaState.CHECKPOINTED  # not ours to touch any more
    assert _events(tmp)[-1]["details"]["skipped"] == [pids[1]]


class FakeSlurm:
    def __init__(self) -> None:
        self.notes: Dict[str, Optional[Note]] = {}
        self.requeued: List[str] = []

    def set_restraint_note(self, job: str, note: Optional[Note]) -> None:
        self.notes[job] = note

    def requeue_job(self, job: str, resume_first: bool = False) -> str:
        self.requeued.append(job)
        return "done"


@pytest.mark.parametrize("on", [OnBound.RESUME, OnBound.REQUEUE])
def test_past_its_bound_with_a_stale_monitor_released_and_note_cleared(
        node: Node, on: OnBound) -> None:
    sim, pids, tmp = node
    note = Note(RestraintStep.PARK, NOW - 100, "n1", 0, "4711", 1800, on)
    slurm = FakeSlurm()
    _rung(sim, pids, tmp, slurm=slurm).round(_book(note), _records(), NOW)
    late = NOW + 2000
    write_heartbeat(str(tmp / "state"), late - 10)  # alive: the monitor owns it
    assert _rung(sim, pids, tmp, slurm=slurm).round(_book(note), _records(), late) == []
    write_heartbeat(str(tmp / "state"), late - 1000)  # silent
    lines = _rung(sim, pids, tmp, slurm=slurm).round(_book(note), _records(), late)
    assert "past its bound" in lines[0]
    assert [sim.cuda_state(p) for p in pids] == [CudaState.RUNNING] * 2
    assert slurm.notes == {"41": None}
    assert slurm.requeued == (["41"] if on is OnBound.REQUEUE else [])
    # the note still read from Slurm before the clear reached it: not parked again
    assert _rung(sim, pids, tmp, slurm=slurm).round(_book(note), _records(), late + 30) == []


def test_a_park_cut_short_is_released_and_never_redone(node: Node) -> None:
    sim, pids, tmp = node
    _rung(sim, pids, tmp).round(_book(), _records(), NOW)
    path = tmp / "state" / RECORD_FILE
    data = json.loads(path.read_text())
    data["parked"][0]["whole"] = False  # the agent died between park and its last write
    path.write_text(json.dumps(data))
    lines = _rung(sim, pids, tmp).round(_book(), _records(), NOW + 30)
    assert "cut short" in lines[0]
    assert [sim.cuda_state(p) for p in pids] == [CudaState.RUNNING] * 2
    assert _rung(sim, pids, tmp).round(_book(), _records(), NOW + 60) == []
    assert [sim.cuda_state(p) for p in pids] == [CudaState.RUNNING] * 2


class BreaksOnRelease(SimTool):
    def __init__(self, sim: SimBackend) -> None:
        super().__init__(sim)
        self.broken = False

    def act(self, pid: int, action: Any, timeout_ms: int = 0) -> None:
        if self.broken:
            from slurmiso.errors import CheckpointRefused

            raise CheckpointRefused(f"pid {pid}: busy")
        super().act(pid, action, timeout_ms)


def test_a_release_failure_is_kept_retried_and_journaled_once(node: Node) -> None:
    sim, pids, tmp = node
    tool = BreaksOnRelease(sim)
    _rung(sim, pids, tmp, tool=tool).round(_book(), _records(), NOW)
    tool.broken = True
    for t in (30, 60, 90):
        _rung(sim, pids, tmp, tool=tool).round([], _records(), NOW + t)
    rec = load_record(str(tmp / "state"))
    assert rec.parked[0].failed == 3
    tool.broken = False
    _rung(sim, pids, tmp, tool=tool).round([], _records(), NOW + 120)
    assert [sim.cuda_state(p) for p in pids] == [CudaState.RUNNING] * 2
    assert load_record(str(tmp / "state")).parked == []
    assert [(e["event"], e["ok"]) for e in _events(tmp)] == [
        ("park", True), ("park-end", False), ("park-end", True)]


def test_a_broken_record_fails_closed(node: Node) -> None:
    sim, pids, tmp = node
    _rung(sim, pids, tmp).round(_book(), _records(), NOW)
    path = tmp / "state" / RECORD_FILE
    data = json.loads(path.read_text())
    data["parked"].append({"job": "../etc", "procs": [[1, 1]]})
    path.write_text(json.dumps(data))
    lines = _rung(sim, pids, tmp).round(_book(), _records(), NOW + 30)
    assert any("not whole" in x for x in lines)
    assert [sim.cuda_state(p) for p in pids] == [CudaState.RUNNING] * 2
    assert any(n.startswith(RECORD_FILE + ".bad-") for n in os.listdir(tmp / "state"))
    # the note in force is not parked again from that record
    assert _rung(sim, pids, tmp).round(_book(), _records(), NOW + 60) == []
    assert [sim.cuda_state(p) for p in pids] == [CudaState.RUNNING] * 2


def test_a_note_for_another_node_is_not_parked(node: Node) -> None:
    sim, pids, tmp = node
    other = Note(RestraintStep.PARK, NOW - 100, "n2", 0, "4711", 1800, OnBound.RESUME)
    _rung(sim, pids, tmp).round(_book(other), _records(), NOW)
    assert [sim.cuda_state(p) for p in pids] == [CudaState.RUNNING] * 2
    (e,) = _events(tmp)
    assert "not here" in e["reason"] and FALLBACK not in e["reason"]


def test_the_watch_runs_the_park_rung_over_the_sim_backend(tmp_path: Path) -> None:
    """The agent's round hands a park note to the rung with SimTool over the configured sim
    backend: a job with no CUDA process here is refused, journaled once, never retried."""
    from slurmiso.agent.restraint_watch import restraint_watch
    from slurmiso.config import load_config
    from slurmiso.state import NodeState
    from tests.hookctx import write_config

    cfg = load_config(write_config(str(tmp_path), "mps"))
    NodeState(cfg.paths.state_dir_for("node1")).write_job("41", JobRecord(
        "41", job_class="train"))
    note = Note(RestraintStep.PARK, NOW - 60, "node1", 0, "4711", 1800, OnBound.RESUME)

    class Squeue:
        def run(self, cmd: str, args: List[str], *a: Any, **k: Any) -> str:
            return f"{'41':<40}{'RUNNING':<24}{note.text()}\n"

    lines = restraint_watch(cfg, "node1", Squeue(), clock=lambda: NOW)
    assert lines == ["job 41: park-refused: the job has no CUDA process on this node to park; "
                     f"the monitor {FALLBACK}"]
    assert restraint_watch(cfg, "node1", Squeue(), clock=lambda: NOW + 30) == []


def test_a_release_at_the_bound_that_failed_clears_the_note_once_it_succeeds(
        node: Node) -> None:
    sim, pids, tmp = node
    tool, slurm = BreaksOnRelease(sim), FakeSlurm()
    _rung(sim, pids, tmp, tool=tool, slurm=slurm).round(_book(), _records(), NOW)
    tool.broken = True
    late = NOW + 2000  # no heartbeat at all: the monitor is not alive
    _rung(sim, pids, tmp, tool=tool, slurm=slurm).round(_book(), _records(), late)
    assert slurm.notes == {}  # not released yet: the note stays
    tool.broken = False
    write_heartbeat(str(tmp / "state"), late + 20)  # the monitor is back meanwhile
    _rung(sim, pids, tmp, tool=tool, slurm=slurm).round(_book(), _records(), late + 30)
    assert [sim.cuda_state(p) for p in pids] == [CudaState.RUNNING] * 2
    assert slurm.notes == {"41": None}
