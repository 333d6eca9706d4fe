"""The monitor names where a hot inference job's contention is (issue 36 item 3): the agents'
host series read into the snapshot, the diagnosis rule applied to a HOT breach, its cause in the
journal line of the ladder's actions, in the rung and in ``monitor status``; the ladder's
steps unchanged, and nothing new where no agent exports host figures."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, List, Optional, Tuple

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slurmiso.agent.host_figures import HostCollector, gather_host
from slurmiso.exposition.text import parse_prometheus_text
from slurmiso.monitor import host_view
from slurmiso.monitor.apply import Applier
from slurmiso.monitor.decide import decide
from slurmiso.monitor.host_view import JobHostFigures, NicFigures, NodeHostFigures
from slurmiso.monitor.policy import Memory
from slurmiso.monitor.report import ladder_lines, ladder_status
from slurmiso.monitor.snapshot import Snapshot, dumps, loads
from slurmiso.monitor.telemetry import FileSource, Reading, host_figures
from tests.unit.test_monitor_ladder import BREACH_MS, DT, POL, T0, Cluster, ladder_kinds

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "host")
GIB = 2**30
#: Every PSI line calm: the rules that read them are known and do not hold.
CALM_PSI = (("cpu", "full", 0.0), ("cpu", "some", 0.01), ("io", "full", 0.0),
            ("io", "some", 0.0), ("memory", "full", 0.0), ("memory", "some", 0.0))
CALM_NIC = (NicFigures("eth0", 1e9, 1e9, 1.25e9, 1e6, 1e6),)


def psi(base: Tuple[Tuple[str, str, float], ...], **set_: float) -> Tuple[Any, ...]:
    """``base`` with ``cpu_some=0.5`` style changes."""
    out = {(r, k): v for r, k, v in base}
    for key, value in set_.items():
        r, k = key.split("_")
        out[(r, k)] = value
    return tuple((r, k, v) for (r, k), v in sorted(out.items()))


class HostCluster(Cluster):
    """The ladder's test cluster, its snapshot carrying the agents' host figures."""

    def __init__(self) -> None:
        super().__init__(nodes=("n1",), gpus=2)
        self.host_node: Optional[NodeHostFigures] = None
        self.host_jobs: Dict[str, JobHostFigures] = {}
        self.gpu_used_mb: Dict[int, int] = {}

    def snapshot(self, ts: float) -> Snapshot:
        snap = super().snapshot(ts)
        nodes = tuple(dataclasses.replace(n, gpus=tuple(
            dataclasses.replace(g, memory_used_mb=self.gpu_used_mb.get(g.index,
                                                                       g.memory_used_mb))
            for g in n.gpus)) for n in snap.nodes)
        hosts = {} if self.host_node is None else {"n1": dataclasses.replace(self.host_node,
                                                                              ts=ts)}
        return dataclasses.replace(snap, nodes=nodes, host_nodes=hosts,
                                   host_jobs=dict(self.host_jobs))


def burning_cluster() -> HostCluster:
    """i1 (inference, GPU 0) breaching beside t1 (a quiet training job on GPU 0) while t2
    (training on GPU 1) burns the node's CPUs: the CPU PSI of i1 and of the node is high."""
    c = HostCluster()
    c.run_job("i1", "infer", gpu=0, p99=BREACH_MS)
    c.run_job("t1", "train", gpu=0)
    c.run_job("t2", "train", gpu=1)
    c.host_node = NodeHostFigures("n1", T0, psi(CALM_PSI, cpu_some=0.6), CALM_NIC)
    c.host_jobs = {
        "i1": JobHostFigures("i1", "n1", T0, pressure=psi(CALM_PSI, cpu_some=0.35),
                             memory_bytes=4 * GIB),
        "t1": JobHostFigures("t1", "n1", T0, pressure=CALM_PSI, cpu_cores=0.5,
                             memory_bytes=2 * GIB, io_bytes_per_s=0.0),
        "t2": JobHostFigures("t2", "n1", T0, pressure=CALM_PSI, cpu_cores=15.2,
                             memory_bytes=8 * GIB, io_bytes_per_s=0.0),
    }
    return c


class Journal:
    """The journal's interface: each line kept as the JSON the real one writes."""

    def __init__(self) -> None:
        self.lines: List[Dict[str, Any]] = []

    def append(self, event: str, **fields: Any) -> None:
        self.lines.append(json.loads(json.dumps(dict(fields, event=event))))


def run(c: Cluster, cycles: int) -> Tuple[List[List[Any]], Memory, Journal]:
    journal = Journal()
    applier = Applier(None, c, journal=journal)
    mem = Memory()
    out = []
    for i in range(cycles):
        actions, mem = decide(c.snapshot(T0 + i * DT), POL, mem)
        for o in applier.apply(actions):
            assert o.ok, o.error
        out.append(actions)
    return out, mem, journal


def ladder_lines_of(journal: Journal) -> List[Dict[str, Any]]:
    return [ln for ln in journal.lines if ln.get("action") in ("throttle", "suspend",
                                                                "requeue")]


# --------------------------------------------------------------------- the causes named
def test_host_cpu_pressure_names_the_job_burning_cpus_on_another_gpu() -> None:
    c = burning_cluster()
    steps, mem, journal = run(c, 4)
    throttle = next(a for acts in steps for a in acts if a.kind == "throttle")
    assert throttle.target == "t1", "the ladder still acts on the GPU's training (for now)"
    d = throttle.details["diagnosis"]
    assert d["cause"] == "host-cpu-pressure"
    assert d["suspects"][0]["job"] == "t2" and d["suspects"][0]["contribution"] == 15.2
    assert "i1" not in [s["job"] for s in d["suspects"]], "never its own suspect"
    assert d["text"] == "host CPU pressure: job t2 (train) uses 15.2 cores"
    assert d["figures"]["job cpu PSI some avg10 %"] == 35.0
    lines = ladder_lines_of(journal)
    assert lines and all(ln["details"]["diagnosis"]["cause"] == "host-cpu-pressure"
                         for ln in lines)
    # the reason keeps its words: integration tests match them
    assert lines[0]["reason"] == ("training throttled: asked to slow down: inference job i1 "
                                  "on n1 GPU 0: P99 400 ms (SLO 250 ms)")
    rung = mem.ladder["n1/0"]
    assert (rung.diagnosis_cause, rung.diagnosis) == ("host-cpu-pressure", d["text"])
    st = ladder_status(POL, mem, T0 + 4 * DT)
    assert st["gpus"][0]["diagnosis"] == {"cause": "host-cpu-pressure", "text": d["text"]}
    assert f"    diagnosis: {d['text']}" in ladder_lines(st)


def test_gpu_memory_near_full_comes_first() -> None:
    c = burning_cluster()
    c.gpu_used_mb[0] = 79_000  # of 80,000 MiB
    c.host_jobs["t1"] = dataclasses.replace(
        c.host_jobs["t1"], gpu_memory=((0, "", 60_000 * 2**20),))
    steps, mem, _ = run(c, 4)
    throttle = next(a for acts in steps for a in acts if a.kind == "throttle")
    d = throttle.details["diagnosis"]
    assert d["cause"] == "gpu-memory-full"
    assert [s["job"] for s in d["suspects"]] == ["t1"], "only the jobs on that GPU"
    assert "host-cpu-pressure" in d["also"]
    assert mem.ladder["n1/0"].diagnosis_cause == "gpu-memory-full"


def test_an_sm_saturated_gpu_names_the_neighbour_taking_its_sms() -> None:
    """Issue 36: the agent's per-job SM share (NVML per-process samples) reaches the rule: a
    saturated GPU whose training neighbour took most of its SM time names that job, before
    the host CPU pressure (listed in ``also``)."""
    c = burning_cluster()
    c.sm[("n1", 0)] = 97.0
    c.host_jobs["t1"] = dataclasses.replace(c.host_jobs["t1"], gpu_sm=((0, "", 0.8),))
    c.host_jobs["i1"] = dataclasses.replace(c.host_jobs["i1"], gpu_sm=((0, "", 0.15),))
    steps, mem, _ = run(c, 4)
    throttle = next(a for acts in steps for a in acts if a.kind == "throttle")
    d = throttle.details["diagnosis"]
    assert d["cause"] == "sm-saturated-by-neighbour", d
    assert d["suspects"][0]["job"] == "t1" and d["suspects"][0]["contribution"] == 0.8
    assert d["text"] == "SMs saturated by a neighbour: job t1 (train) takes 80% of GPU 0"
    assert "host-cpu-pressure" in d["also"]
    # without the per-job figure the same GPU is "unknown" for this rule, never a guess
    c.host_jobs["t1"] = dataclasses.replace(c.host_jobs["t1"], gpu_sm=())
    steps, _, _ = run(c, 4)
    d = next(a for acts in steps for a in acts if a.kind == "throttle").details["diagnosis"]
    assert d["cause"] == "host-cpu-pressure" and "SM share of the jobs on GPU 0" in d["unknown"]


def test_missing_figures_give_unknown_never_none_found() -> None:
    c = burning_cluster()
    c.host_node = NodeHostFigures("n1", T0)  # an agent that could read no PSI, no NIC
    c.host_jobs = {}
    steps, mem, _ = run(c, 4)
    throttle = next(a for acts in steps for a in acts if a.kind == "throttle")
    d = throttle.details["diagnosis"]
    assert d["cause"] == "unknown" and d["text"].startswith("cause unknown: no figure for")
    assert "CPU pressure (some)" in d["unknown"] and "NIC load" in d["unknown"]
    assert mem.ladder["n1/0"].diagnosis_cause == "unknown"


def test_all_figures_calm_is_none_found() -> None:
    c = burning_cluster()
    c.host_node = NodeHostFigures("n1", T0, CALM_PSI, CALM_NIC)
    c.host_jobs["i1"] = dataclasses.replace(c.host_jobs["i1"], pressure=CALM_PSI)
    c.sm[("n1", 0)] = 30.0
    steps, _, _ = run(c, 4)
    throttle = next(a for acts in steps for a in acts if a.kind == "throttle")
    assert throttle.details["diagnosis"]["cause"] == "none-found"


def test_without_host_figures_nothing_changes() -> None:
    """An agent that exports no host figures: no diagnosis field, no rung words, and the
    ladder takes the very same steps as with figures (it names a cause, no more)."""
    plain = burning_cluster()
    plain.host_node, plain.host_jobs = None, {}
    steps, mem, journal = run(plain, 8)
    assert all("diagnosis" not in a.details for acts in steps for a in acts)
    assert all("diagnosis" not in r.to_dict() for r in mem.ladder.values())
    assert all("diagnosis" not in g for g in ladder_status(POL, mem, T0)["gpus"])
    with_figures, _, _ = run(burning_cluster(), 8)
    assert ladder_kinds(steps) == ladder_kinds(with_figures)
    assert [ln["reason"] for ln in ladder_lines_of(journal)] == [
        a.reason for acts in with_figures for a in acts
        if a.kind in ("throttle", "suspend", "requeue")]


# ------------------------------------------------------------- the agent's own exposition
GPU_LINES = """\
slurmiso_agent_up 1
slurmiso_gpu_memory_used_bytes{gpu="0",node="n1"} 2.097152e+10
slurmiso_gpu_memory_total_bytes{gpu="0",node="n1"} 8.388608e+10
"""


def agent_text() -> str:
    """What ``slurmiso agent`` answers about node n1 of the recorded v2 tree, rendered by its
    own collector."""
    report = gather_host({}, "n1", cgroup_root=os.path.join(FIX, "slurm-v2"),
                         proc_root=os.path.join(FIX, "proc"),
                         sys_root=os.path.join(FIX, "sys"))
    registry = CollectorRegistry(auto_describe=False)
    registry.register(HostCollector(lambda: report, "n1"))
    return GPU_LINES + generate_latest(registry).decode()


def test_the_monitor_reads_a_real_agent_exposition(tmp_path: Any) -> None:
    (tmp_path / "n1.prom").write_text(agent_text())
    reading = FileSource(str(tmp_path)).read({"n1": ""}, T0)
    assert reading.gpus["n1"] and not reading.errors
    node = reading.host_nodes["n1"]
    assert node.pressure_ratio("cpu", "some") == pytest.approx(0.412)  # proc/pressure/cpu avg10=41.20
    assert {n.device for n in node.nics} >= {"eth0"}
    assert all(n.rx_bytes_per_s is None for n in node.nics), "one scrape: no rate yet"
    job = reading.host_jobs["4242"]
    assert job.pressure_ratio("cpu", "some") == pytest.approx(0.2351)
    assert job.cpu_seconds == pytest.approx(8420.000123) and job.memory_bytes == 34359738368
    assert job.cpu_cores is None, "a counter needs the scrape before"
    partial = reading.host_jobs["4243"]  # only cpu.stat and memory.current there
    assert partial.pressure == () and partial.io_bytes is None
    assert partial.pressure_ratio("cpu", "some") is None, "unknown, never 0"


def test_rates_need_the_scrape_before_and_a_counter_that_went_up() -> None:
    samples = parse_prometheus_text(agent_text())
    node, jobs = host_view.from_samples(samples, "n1", T0)
    assert node is not None
    later = dataclasses.replace(jobs["4242"], ts=T0 + 10,
                                cpu_seconds=(jobs["4242"].cpu_seconds or 0) + 150.0)
    assert host_view.with_rates(later, jobs["4242"]).cpu_cores == pytest.approx(15.0)
    fresh = dataclasses.replace(later, cpu_seconds=1.0)  # a requeued job's new cgroup
    assert host_view.with_rates(fresh, jobs["4242"]).cpu_cores is None
    nic = node.nics[0]
    moved = dataclasses.replace(node, ts=T0 + 2, nics=(dataclasses.replace(
        nic, rx_bytes=(nic.rx_bytes or 0) + 2e6),) + node.nics[1:])
    assert host_view.node_with_rates(moved, node).nics[0].rx_bytes_per_s == pytest.approx(1e6)


def test_an_agent_without_host_figures_gives_none() -> None:
    assert host_view.from_samples(parse_prometheus_text(GPU_LINES), "n1", T0) == (None, {})
    down = GPU_LINES + 'slurmiso_agent_host_up{node="n1"} 0\n'
    assert host_view.from_samples(parse_prometheus_text(down), "n1", T0) == (None, {})


def test_a_snapshot_with_host_figures_round_trips() -> None:
    c = burning_cluster()
    c.host_jobs["t1"] = dataclasses.replace(c.host_jobs["t1"], gpu_sm=((0, "", 0.8),))
    snap = c.snapshot(T0)
    back = loads(dumps(snap))
    assert back.host_nodes == snap.host_nodes and back.host_jobs == snap.host_jobs
    plain = dataclasses.replace(snap, host_nodes={}, host_jobs={})
    assert "host_nodes" not in dumps(plain) and "host_jobs" not in dumps(plain)


def test_the_agent_source_keeps_the_scrape_before_for_rates() -> None:
    """What :class:`AgentSource` does with each answer: the second scrape's job figures carry
    CPU cores used since the first."""
    first, second = Reading(), Reading()
    samples = parse_prometheus_text(agent_text())
    host_figures(first, samples, "n1", T0, ({}, {}))
    assert first.host_jobs["4242"].cpu_cores is None
    later = [s._replace(value=s.value + 30.0)
             if s.name == "slurmiso_job_cpu_seconds_total" else s for s in samples]
    host_figures(second, later, "n1", T0 + 10, (first.host_nodes, first.host_jobs))
    assert second.host_jobs["4242"].cpu_cores == pytest.approx(3.0)
    assert second.host_jobs["4242"].io_bytes_per_s == 0.0, "IO counters did not move"


def test_the_monitor_reads_the_agents_per_job_sm_share() -> None:
    text = (GPU_LINES + 'slurmiso_agent_host_up{node="n1"} 1\n'
            'slurmiso_job_gpu_sm_util_ratio{job="7",class="train",gpu="0",gi=""} 0.5\n'
            'slurmiso_job_gpu_sm_util_ratio{job="7",class="train",gpu="1",gi=""} 1.5\n'
            'slurmiso_job_gpu_sm_util_ratio{job="8",class="infer",gpu="x",gi=""} 0.2\n')
    _, jobs = host_view.from_samples(parse_prometheus_text(text), "n1", T0)
    assert jobs["7"].gpu_sm == ((0, "", 0.5),), "a share over 1 is no figure"
    assert "8" not in jobs or jobs["8"].gpu_sm == ()
