"""etc/grafana/slurmiso.json names only metrics that exist, and shows each live figure beside
its probe baseline.

KNOWN: the agent's GPU series (slurmiso/exposition/gpu_series.py), its per-job series (the
contract the agent writes and the monitor reads, slurmiso/exposition/job_series.py: the agent's own
tests check it writes them) and the probe's textfile series (slurmiso.probe.store).
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, Iterator, List, Set

from slurmiso.exposition import gpu_series as t
from slurmiso.exposition import host_series as host
from slurmiso.exposition import job_series as signals
from slurmiso.probe.store import metric_names

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARD = os.path.join(ROOT, "etc", "grafana", "slurmiso.json")
AGENT = [t.M_MEM_USED, t.M_MEM_TOTAL, t.M_SM, t.M_GR, t.M_PROCS, t.M_COLLECTED, t.M_UP,
         t.DCGM_USED, t.DCGM_FREE, t.DCGM_SM, t.DCGM_GR, t.DCGM_UTIL]
#: The per-job series the dashboard must show, from the signals contract itself.
JOB_CONTRACT = {
    signals.M_LATENCY: {signals.L_JOB, signals.L_CLASS, signals.L_QUANTILE},
    signals.M_ERROR_RATIO: {signals.L_JOB, signals.L_CLASS},
    signals.M_STEP_SECONDS: {signals.L_JOB, signals.L_CLASS},
    signals.M_THROUGHPUT_VS_SOLO: {signals.L_JOB, signals.L_CLASS},
    signals.M_JOB_GPU: {signals.L_JOB, signals.L_CLASS, signals.L_GPU, signals.L_GI},
}
KNOWN: Set[str] = (set(AGENT) | set(signals.SERIES) | set(metric_names())
                   | set(host.JOB_SERIES) | set(host.NODE_SERIES))
#: PromQL words that look like metric names but are not.
_NOT_METRICS = {"by", "without", "sum", "max", "min", "avg", "count", "time", "label_values",
                "on", "ignoring", "group_left", "group_right", "rate", "and", "or", "unless"}
_NAME = re.compile(r"\b([A-Za-z_:][A-Za-z0-9_:]*)\s*(?=\{|\(|\)|\[|,|$|\s)")


def dashboard() -> Dict[str, Any]:
    with open(DASHBOARD) as fh:
        return json.load(fh)


def queries(d: Dict[str, Any]) -> Iterator[str]:
    for p in d["panels"]:
        for target in p.get("targets", []):
            yield target["expr"]
    for v in d["templating"]["list"]:
        q = v.get("query")
        if isinstance(q, dict):
            yield q["query"]


def metrics_in(expr: str) -> Set[str]:
    no_strings = re.sub(r'"[^"]*"', '""', expr)
    no_labels = re.sub(r"\{[^}]*\}", "{}", no_strings)
    no_groups = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", no_labels)
    return {m for m in _NAME.findall(no_groups) if m not in _NOT_METRICS
            and (m.startswith(("slurmiso_", "DCGM_")) or "_" in m)}


def test_every_metric_the_dashboard_names_exists() -> None:
    named: Set[str] = set()
    for expr in queries(dashboard()):
        named |= metrics_in(expr)
    assert named, "no metric found: the parser is broken"
    assert named <= KNOWN, f"unknown metrics: {sorted(named - KNOWN)}"
    assert set(JOB_CONTRACT) - {"slurmiso_job_gpu"} <= named


def test_the_parser_sees_through_promql() -> None:
    expr = ('max by (class, instance) (slurmiso_job_latency_seconds{quantile="0.99", '
            'class=~"a_b"}) / sum(rate(foo_total[5m]))')
    assert metrics_in(expr) == {"slurmiso_job_latency_seconds", "foo_total"}


def test_live_figures_sit_beside_their_probe_baselines() -> None:
    panels = {p["title"]: p for p in dashboard()["panels"]}
    pairs = {"Inference P99 latency": ("slurmiso_job_latency_seconds",
                                       "slurmiso_probe_p99_seconds"),
             "Inference error rate": ("slurmiso_job_error_ratio", "slurmiso_probe_error_ratio"),
             "Training step time": ("slurmiso_job_step_seconds", "slurmiso_probe_step_seconds"),
             "Training throughput vs alone": ("slurmiso_job_throughput_vs_solo",
                                              "slurmiso_probe_throughput_vs_solo")}
    for title, (live, probe) in pairs.items():
        exprs = " ".join(x["expr"] for x in panels[title]["targets"])
        assert live in exprs and probe in exprs, title
        # per class and node
        assert "by (class, instance)" in exprs


def test_the_dashboard_is_importable() -> None:
    d = dashboard()
    ids: List[int] = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and d["uid"] and d["schemaVersion"] >= 30
    for p in d["panels"]:
        assert {"x", "y", "w", "h"} <= set(p["gridPos"])
        for target in p.get("targets", []):
            assert target["refId"] and target["datasource"]["uid"] == "${datasource}"


def test_the_dashboard_judges_what_the_ladder_judges() -> None:
    """Issue 32: the share of requests over the SLO bound from the window's buckets, and the
    percentiles under their percentile label (no quantile label outside a summary)."""
    exprs = " ".join(queries(dashboard()))
    assert "slurmiso_job_window_latency_seconds_bucket" in exprs and 'le="$slo_bound"' in exprs
    assert 'percentile="99"' in exprs and "quantile=" not in exprs


def test_the_host_figures_sit_beside_the_latency_curves() -> None:
    """Issue 36: where contention is, per job and per node, right below inference's
    latency and training's step time, and every host series the diagnosis reads is shown."""
    panels = dashboard()["panels"]
    titles = [p["title"] for p in panels]
    row = next(i for i, p in enumerate(panels) if p["type"] == "row"
               and p["title"].startswith("Where contention is: the host"))
    assert titles.index("Training throughput vs alone") < row < titles.index(
        "Jobs per GPU / MIG instance")
    exprs = " ".join(queries(dashboard()))
    for series in (host.M_JOB_PSI, host.M_NODE_PSI, host.M_JOB_CPU, host.M_JOB_MEM_CURRENT,
                   host.M_JOB_IO_BYTES, host.M_NODE_NET_BYTES):
        assert series in exprs, series
    for res in host.RESOURCES:
        assert f'resource="{res}"' in exprs, res


def test_no_two_panels_overlap() -> None:
    cells: Set[tuple] = set()
    for p in dashboard()["panels"]:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, p["title"]
        cells |= mine
