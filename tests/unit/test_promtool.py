"""What the agent, the monitor and the probe export passes ``promtool check metrics`` (issue 32
item 6): counters are counters, no ``quantile`` label outside a summary, no ``le`` outside a
histogram. promtool is Debian's ``prometheus`` package (tests/tools/install-promtool.sh, run by
``make unit`` and ``make test``)."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slurmiso.agent.gpus import NodeCollector, gather_node
from slurmiso.monitor.loop import MonitorCollector, Stats
from slurmiso.probe import store
from slurmiso.state.record import JobRecord
from tests.fixtures import servers as fx
from tests.unit.test_monitor_agent import _node
from tests.unit.test_probe_audit_html import report
from tests.unit.test_real_servers import ok, read

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("CI"),
    reason="promtool not installed (sh tests/tools/install-promtool.sh; CI installs it)")


def promtool(text: str) -> str:
    assert PROMTOOL, "promtool is missing: CI must install it (tests/tools/install-promtool.sh)"
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    return (p.stdout + p.stderr).strip() if p.returncode else ""


def test_agent_exposition_is_clean(tmp_path: Any) -> None:
    backend = _node(str(tmp_path))
    inst = backend.instances(0)[0]
    records = {"41": JobRecord.from_dict({"class": "infer", "resources": [
        {"kind": "mig-static", "gpu": 0, "gi": inst.gi_id, "uuid": inst.uuid}]})}
    backend.add_process(0, os.getpid(), 100, inst.uuid, "pytest")  # per-job GPU memory
    registry = CollectorRegistry(auto_describe=False)
    registry.register(NodeCollector(
        lambda: gather_node(None, "n3", backend=backend, records=records, clock=lambda: 1.0),
        "n3", job_labels=True))
    text = generate_latest(registry).decode()
    assert "DCGM_FI_DEV_FB_USED" in text and "slurmiso_job_gpu_memory_used_bytes{" in text
    # The DCGM_FI_* copies keep DCGM exporter's own label names (modelName, UUID) so that its
    # dashboards read them: promtool's style lint on those alone is expected.
    dcgm_style = "label names should be written in 'snake_case' not 'camelCase'"
    left = [ln for ln in promtool(text).splitlines()
            if not (ln.startswith("DCGM_FI_") and ln.endswith(dcgm_style))]
    assert left == []


def test_agent_job_signals_are_clean() -> None:
    """Per-job latency with its percentiles, the window histograms, ages, unknowns."""
    from slurmiso.agent.job_signals import Budget, JobSignalsCollector, JobSignalsState
    from slurmiso.config.model import SignalSettings
    from slurmiso.state.record import RecordStatus

    server = fx.Vllm("B")
    texts = []
    for batch in (ok([0.05] * 3), ok(fx.spread(50, 0.02, 0.9))):
        for r in batch:
            server.serve(r)
        texts.append(server.text())
    clock = [0.0]
    state = JobSignalsState(SignalSettings(), slo_classes=("infer",), training_classes=("train",),
                            fetch=lambda urls, *a: {j: _Body(texts.pop(0)) for j in urls},
                            listeners=lambda: None, clock=lambda: clock[0],
                            # the exposition is under test, not the CPU budget: a loaded
                            # machine must not turn the job's latency unknown
                            budget=Budget(job_cpu_s=60.0, user_cpu_s=60.0))
    recs = {"7": JobRecord("7", RecordStatus.READY, uid=1, job_class="infer", metrics="8000"),
            "8": JobRecord("8", RecordStatus.READY, uid=1, job_class="train")}
    state.refresh(recs)
    clock[0] = 5.0
    state.refresh(recs)
    registry = CollectorRegistry()
    registry.register(JobSignalsCollector(state))
    text = generate_latest(registry).decode()
    assert 'slurmiso_job_window_latency_seconds_bucket{' in text and 'percentile="99"' in text
    assert promtool(text) == ""
    assert read(fx.Vllm("B"), ok([0.05] * 3), ok([0.1] * 20)).windows  # the reader's view


class _Body:
    def __init__(self, body: str) -> None:
        self.body, self.reason, self.detail = body, "", ""


def test_agent_host_figures_are_clean() -> None:
    """Per-job cgroup figures (v2 and v1, unknown markers) and the node's PSI and NICs."""
    from slurmiso.agent.host_figures import HostCollector, gather_host

    host = os.path.join(os.path.dirname(__file__), "..", "fixtures", "host")
    recs = {"4242": JobRecord.from_dict({"class": "train", "resources": []}),
            "50": JobRecord.from_dict({"class": "infer", "resources": []})}
    for root in ("slurm-v2", "v1"):
        registry = CollectorRegistry(auto_describe=False)
        report = gather_host(recs, "n1", os.path.join(host, root), os.path.join(host, "proc"),
                             os.path.join(host, "sys"))
        registry.register(HostCollector(lambda r=report: r, "n1"))
        text = generate_latest(registry).decode()
        assert "slurmiso_job_cpu_seconds_total{" in text
        assert "slurmiso_node_network_bytes_total{" in text
        assert promtool(text) == ""


def test_monitor_exposition_is_clean() -> None:
    st = Stats()
    st.actions = {"hold/applied": 3, "throttle/failed": 1}
    st.unknown = {"agents/unreachable": 1}
    st.held_by_reason = {"hot": 2}
    st.ladder_gpus = {"throttle": 1}
    registry = CollectorRegistry()
    registry.register(MonitorCollector(st))
    assert promtool(generate_latest(registry).decode()) == ""


def test_probe_textfile_is_clean() -> None:
    text = store.textfile(report())
    assert "slurmiso_probe_" in text and promtool(text) == ""


def test_promtool_catches_what_it_is_for() -> None:
    """The check bites: a quantile label on a gauge and a counter without _total."""
    bad = ("# HELP x_seconds x\n# TYPE x_seconds gauge\nx_seconds{quantile=\"0.99\"} 1\n"
           "# HELP y y\n# TYPE y counter\ny 1\n")
    out = promtool(bad)
    assert "quantile" in out and "_total" in out
