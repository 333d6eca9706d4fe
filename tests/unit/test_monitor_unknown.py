"""Unknown telemetry is loud (issue 33, item 4): an agent that stops answering is a WARNING
once per change (not INFO, not every cycle), ``monitor status`` (text and --json) and the
exported metrics count it from the same memory, and each change is journaled
(``monitor-telemetry``) for the audit."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import socket
from typing import Any, Callable, Dict, List

import pytest
from test_monitor_scenarios import BASE, T0, FakeCluster

from slurmiso.monitor import telemetry as t
from slurmiso.monitor.apply import Applier
from slurmiso.monitor.decide import decide
from slurmiso.monitor.loop import Monitor, MonitorCollector
from slurmiso.monitor.policy import Memory
from slurmiso.monitor.report import status, status_lines
from slurmiso.monitor.snapshot import Snapshot, dumps, loads
from slurmiso.state import Journal
from tests.audit_helpers import utc  # noqa: F401

POLICIES = {"default": BASE, "unknown admits": dataclasses.replace(BASE, unknown_admits=True),
            "hold admission": dataclasses.replace(BASE, admission="hold")}


def _silent_from(c: FakeCluster, node: str, start: int, stop: int) -> Callable[[int], Snapshot]:
    """Cycle i's snapshot: ``node``'s agent does not answer for cycles [start, stop)."""
    def snap(i: int) -> Snapshot:
        s = c.snapshot(T0 + 30 * i)
        if not start <= i < stop:
            return s
        nodes = tuple(dataclasses.replace(n, gpus=(), telemetry_age_s=None)
                      if n.name == node else n for n in s.nodes)
        return dataclasses.replace(
            s, nodes=nodes, unknown={"agents/unreachable": 1},
            errors=(f"agent http://{node}:9810/metrics: unreachable (connect: errno 111)",),
            telemetry_unknown={node: "agents/unreachable"})
    return snap


def _monitor(tmp: str, policy: Any, snaps: Callable[[int], Snapshot],
             c: FakeCluster) -> Monitor:
    clock = {"i": -1}

    def snap() -> Snapshot:
        clock["i"] += 1
        return snaps(clock["i"])

    return Monitor(policy, snap, Applier(None, c, Journal(os.path.join(tmp, "j.jsonl"))),
                   os.path.join(tmp, "s.json"), os.path.join(tmp, "l"), 30,
                   sleep=lambda s: None)


def _metrics(mon: Monitor) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    reg = CollectorRegistry(auto_describe=False)
    reg.register(MonitorCollector(mon.stats))
    return generate_latest(reg).decode()


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_an_agent_that_stops_answering_is_one_warning_and_one_line_back(
        name: str, tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    c = FakeCluster(["n1", "n2"], {"shared": ["n1", "n2"]})
    mon = _monitor(str(tmp_path), POLICIES[name], _silent_from(c, "n2", 2, 6), c)
    with caplog.at_level(logging.DEBUG, logger="slurmiso"):
        list(mon.run(cycles=8))
    mon.close()
    warned = [r for r in caplog.records if r.levelno == logging.WARNING
              and "telemetry unknown for" in r.getMessage()]
    assert len(warned) == 1, [r.getMessage() for r in caplog.records]
    assert "n2 (agents/unreachable)" in warned[0].getMessage()
    back = [r for r in caplog.records if "telemetry known again" in r.getMessage()]
    assert len(back) == 1 and "n2 (unknown 120s)" in back[0].getMessage()
    lines = [r for r in Journal(os.path.join(str(tmp_path), "j.jsonl")).read()
             if r["event"] == "monitor-telemetry"]
    assert [(r["node"], r["state"], r["reason"]) for r in lines] == [
        ("n2", "unknown", "agents/unreachable"), ("n2", "known", "agents/unreachable")]
    assert lines[0]["source"] == "monitor" and lines[1]["unknown_s"] == 120.0
    assert lines[1]["since"] == T0 + 60


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_status_and_metrics_count_the_same_unknown(name: str, tmp_path: Any) -> None:
    """Whatever admission makes of it (unknown_admits: nothing), status names the node and
    the signal the metric counts; 'unknown data: none' only when the metric has nothing."""
    c = FakeCluster(["n1", "n2"], {"shared": ["n1", "n2"]})
    mon = _monitor(str(tmp_path), POLICIES[name], _silent_from(c, "n2", 1, 99), c)
    list(mon.run(cycles=3))
    text = _metrics(mon)
    assert 'slurmiso_monitor_unknown_signals{reason="unreachable",source="agents"} 1.0' in text
    assert "slurmiso_monitor_unknown_telemetry_nodes 1.0" in text
    assert 'slurmiso_monitor_unknown_telemetry_seconds{node="n2",reason="agents/unreachable"}' \
        ' 30.0' in text
    # `monitor status` reads the state file the running monitor wrote
    mon.close()
    saved = Monitor(POLICIES[name], lambda: None, Applier(None, c),  # type: ignore[arg-type]
                    os.path.join(str(tmp_path), "s.json"), os.path.join(str(tmp_path), "l2"),
                    30).memory
    st = status(POLICIES[name], saved, T0 + 60)
    assert st["unknown_signals"] == {"agents/unreachable": 1}
    assert st["unknown_telemetry"]["n2"]["reason"] == "agents/unreachable"
    assert st["unknown_telemetry"]["n2"]["for_s"] == 30.0
    lines = "\n".join(status_lines(st))
    assert "unknown data: none" not in lines
    assert "unknown telemetry: 1 node(s): n2 (agents/unreachable, for 30s)" in lines
    assert "unknown signals last cycle: 1: agents/unreachable x1" in lines


def test_nothing_unknown_says_none_everywhere(tmp_path: Any) -> None:
    c = FakeCluster(["n1"], {"shared": ["n1"]})
    mon = _monitor(str(tmp_path), BASE, lambda i: c.snapshot(T0 + 30 * i), c)
    list(mon.run(cycles=2))
    mon.close()
    text = _metrics(mon)
    assert "slurmiso_monitor_unknown_telemetry_nodes 0.0" in text
    assert "slurmiso_monitor_unknown_signals{" not in text
    assert "unknown data: none" in status_lines(status(BASE, mon.memory, T0 + 30))


def test_stale_telemetry_and_a_node_with_no_answer_count_too() -> None:
    c = FakeCluster(["n1", "n2", "n3"], {"shared": ["n1", "n2", "n3"]})
    c.load["n1"] = (10.0, 10.0, 900.0)  # an age past max_data_age_s
    c.load["n2"] = (10.0, 10.0, None)  # no age at all, no reason given
    c.state["n3"] = "DOWN"
    c.load["n3"] = (10.0, 10.0, None)  # down: Slurm says so, not the monitor's to watch
    _, mem = decide(c.snapshot(T0), BASE, Memory())
    assert mem.telemetry_unknown == {"n1": {"since": T0, "reason": "telemetry/stale"},
                                     "n2": {"since": T0, "reason": "telemetry/no-data"}}
    _, mem = decide(c.snapshot(T0 + 30), BASE, mem)
    assert mem.telemetry_unknown["n1"]["since"] == T0, "since when it first was"


def test_a_state_file_without_the_new_fields_saves_without_them() -> None:
    data = Memory().to_dict()
    assert "telemetry_unknown" not in data and "unknown_signals" not in data
    mem = Memory(telemetry_unknown={"n1": {"since": T0, "reason": "agents/timeout"}},
                 unknown_signals={"agents/timeout": 2})
    assert Memory.from_dict(mem.to_dict()) == mem
    assert mem.copy() == mem


def test_the_agent_source_names_the_node_it_could_not_reach() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    src = t.AgentSource(port, {"n7": f"http://127.0.0.1:{port}/metrics"}, timeout=1,
                        deadline_s=3)
    reading = src.read({"n7": "127.0.0.1"}, T0)
    assert reading.node_unknown == {"n7": "agents/unreachable"}
    assert reading.unknown == {"agents/unreachable": 1}


def test_snapshot_keeps_which_nodes_were_unknown() -> None:
    c = FakeCluster(["n1"], {"shared": ["n1"]})
    s = dataclasses.replace(c.snapshot(T0), telemetry_unknown={"n1": "agents/timeout"})
    assert loads(dumps(s)).telemetry_unknown == {"n1": "agents/timeout"}
    assert "telemetry_unknown" not in dumps(c.snapshot(T0)), "absent when nothing is"


def test_gather_no_longer_logs_every_cycle_at_info(caplog: pytest.LogCaptureFixture) -> None:
    """The per-cycle error lines are DEBUG: the loop's WARNING per change is the loud one."""
    from slurmiso.monitor.gather import live_snapshot

    class Slurm:
        def show_all(self, kind: str, counts: Any = None) -> Dict[str, Dict[str, str]]:
            return {"n1": {"NodeAddr": "127.0.0.1", "State": "IDLE"}} if kind == "node" else {}

        def queue(self, states: str, counts: Any = None) -> List[Dict[str, str]]:
            return []

    class Broken:
        def read(self, nodes: Any, now: float) -> t.Reading:
            r = t.Reading()
            r.miss("agents", "unreachable", "agent http://n1:9810/metrics: unreachable", "n1")
            return r

    from slurmiso.config import load_config

    cfg = load_config(os.path.join(os.path.dirname(__file__), "..", "..", "etc",
                                   "slurmiso.yaml"))
    with caplog.at_level(logging.DEBUG, logger="slurmiso"):
        snap = live_snapshot(cfg, Slurm(), Broken())  # type: ignore[arg-type]
    assert snap.telemetry_unknown == {"n1": "agents/unreachable"}
    assert not [r for r in caplog.records if r.levelno == logging.INFO
                and "unreachable" in r.getMessage()]


# ---------------------------------------------------------------- the audit reads it back
def _tel(day_hms: str, node: str, state: str, reason: str = "agents/unreachable",
         **extra: Any) -> Dict[str, Any]:
    return {"ts": f"{day_hms}.000Z", "host": "mon", "event": "monitor-telemetry",
            "source": "monitor", "dry_run": False, "node": node, "state": state,
            "reason": reason, **extra}


def test_the_audit_reports_how_long_each_node_was_unknown(tmp_path, utc, capsys,  # noqa: F811
                                                          monkeypatch):
    from tests.unit.test_audit_figures import codes, row
    from tests.unit.test_audit_ladder import WINDOW, ladder

    d1, d0 = "2024-05-01T", "2024-04-30T"
    events = [
        _tel(d0 + "23:00:00", "n3", "unknown", "agents/timeout"),  # never back
        _tel(d0 + "23:50:00", "n2", "unknown"),  # back inside the window
        _tel(d1 + "00:20:00", "n2", "known", unknown_s=1800.0),
        _tel(d1 + "01:00:00", "n1", "unknown"),
        _tel(d1 + "01:10:00", "n1", "known", unknown_s=600.0),
        _tel(d1 + "02:00:00", "n4", "known", unknown_s=300.0),  # its start not journaled
        _tel(d1 + "03:00:00", "n5", "sideways"),  # not a state the monitor writes
        {**_tel(d1 + "04:00:00", "n6", "unknown"), "source": "job"},  # not the monitor's
    ]
    r = ladder(tmp_path, capsys, monkeypatch, events, rows=[row("1")], extra=WINDOW)
    sec = r["telemetry_unknown"]
    assert sec["status"] == "measured" and sec["bad_lines"] == 1
    got = {n: (v["unknown_s"], v["still_unknown"]) for n, v in sec["nodes"].items()}
    assert got == {"n1": (600.0, False), "n2": (1200.0, False), "n3": (86400.0, True),
                   "n4": (300.0, False)}
    assert sec["nodes"]["n3"]["reason"] == "agents/timeout"
    f = codes(r)["telemetry-unknown"]
    assert f["severity"] == "warning" and sorted(f["subjects"]) == ["n1", "n2", "n3", "n4"]
    assert f["message"].startswith("telemetry of 4 node(s) was unknown to the monitor for "
                                   "88500s in all: n3 86400s (agents/timeout, still unknown)")
    assert "telemetry-bad-lines" in codes(r)


def test_no_telemetry_line_is_none_not_zero(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    from tests.unit.test_audit_figures import codes, row
    from tests.unit.test_audit_ladder import WINDOW, ladder, prolog

    r = ladder(tmp_path, capsys, monkeypatch, [prolog("1", "gpu001", [0])], rows=[row("1")],
               extra=WINDOW)
    assert r["telemetry_unknown"] == {"status": "none", "nodes": {}, "bad_lines": 0}
    assert "telemetry-unknown" not in codes(r)


def _unmapped_from(c: FakeCluster, start: int, stop: int) -> Callable[[int], Snapshot]:
    """Cycle i's snapshot: Prometheus holds DCGM series naming no node in [start, stop)."""
    line = ("DCGM series DCGM_FI_DEV_FB_USED maps to no node of the cluster by its Hostname, "
            "hostname or instance labels (gpu='0'): counted as prometheus/unmapped")

    def snap(i: int) -> Snapshot:
        s = c.snapshot(T0 + 30 * i)
        if not start <= i < stop:
            return s
        return dataclasses.replace(s, unknown={"prometheus/unmapped": 4}, errors=(line,))
    return snap


def test_unmapped_dcgm_series_are_journaled_once_and_shown_by_doctor(tmp_path: Any) -> None:
    """Issue 32 item 5: a series that maps to no node is counted, journaled (one
    ``monitor-signals`` line when it appears, one when it goes) and shown by doctor."""
    from slurmiso.doctor import telemetry as doctor_telemetry

    c = FakeCluster(["n1", "n2"], {"shared": ["n1", "n2"]})
    mon = _monitor(str(tmp_path), BASE, _unmapped_from(c, 1, 4), c)
    list(mon.run(cycles=3))
    state = json.loads((tmp_path / "s.json").read_text())
    view = {"path": "s.json", "unknown_signals": state["memory"]["unknown_signals"]}
    found = doctor_telemetry.check_unknown_signals({"monitor": view}, None)  # type: ignore
    assert [(f.severity, f.code, f.count) for f in found] == [
        ("warning", "telemetry-unmapped", 4)]
    list(mon.run(cycles=3))
    mon.close()
    lines = [r for r in Journal(os.path.join(str(tmp_path), "j.jsonl")).read()
             if r["event"] == "monitor-signals"]
    assert [(r["unknown"], r["new"]) for r in lines] == [
        ({"prometheus/unmapped": 4}, ["prometheus/unmapped"]), ({}, [])]
    assert "maps to no node" in lines[0]["detail"][0] and lines[0]["source"] == "monitor"
    assert doctor_telemetry.check_unknown_signals({"monitor": {"unknown_signals": {}}},
                                                  None) == []  # type: ignore


def test_doctor_reads_the_monitor_state_of_its_host(tmp_path: Any) -> None:
    from types import SimpleNamespace

    from slurmiso.config.model import Paths
    from slurmiso.doctor.collect import monitor_view

    cfg: Any = SimpleNamespace(paths=Paths(state_dir=str(tmp_path)))
    assert monitor_view(cfg, "ctl") is None  # no monitor runs here
    os.makedirs(tmp_path / "monitor")
    (tmp_path / "monitor" / "state.json").write_text(json.dumps({"version": 1, "memory": {
        "unknown_signals": {"prometheus/unmapped": 3, "x": "bad", "y": True}}}))
    assert monitor_view(cfg, "ctl")["unknown_signals"] == {"prometheus/unmapped": 3}
    (tmp_path / "monitor" / "state.json").write_text("{")
    assert "error" in monitor_view(cfg, "ctl")
