"""What the ladder cost, in the audit (issue 24, item 6): hand-made journals whose answers are
worked out here, line by line; malformed and hostile lines; windows with no ladder activity.

The journals are the monitor's ``monitor-action`` lines as ``slurmiso.monitor.ladder`` writes
them (``details``: ``step``, ``node``, ``signal``, ``figure``, ``limit``, ``figure_before``,
``figure_after``, ``throttled_s``, ``suspended_s``, ``restraint``) beside the nodes' prolog
lines (a training job's GPUs) and the job's own checkpoint lines.
"""

from __future__ import annotations

import copy
import json
import math
import os
from typing import Any, Dict, List, Optional

import pytest

from slurmiso.audit.figures.aggregate import Aggregator
from slurmiso.audit.read.digest import JournalDigest
from slurmiso.audit.read.ladder import MAX_DURATION_S
from slurmiso.config import load_config
from tests.audit_helpers import CONFIG, ROOT, utc  # noqa: F401
from tests.unit.test_audit_figures import DAY, audit, codes, row

WINDOW = ["--since", f"{DAY}T00:00:00Z", "--until", "2024-05-02T00:00:00Z"]


def at(hms: str) -> str:
    return f"{DAY}T{hms}.000Z"


def prolog(job: str, node: str, gpus: List[int], hms: str = "00:00:00", mode: str = "mps",
           cls: str = "train", restart: int = 0) -> Dict[str, Any]:
    return {"ts": at(hms), "event": "prolog", "job": job, "node": node, "outcome": "ready",
            "class": cls, "pool": "serve", "mode": mode, "gpus": gpus, "uid": 1001,
            "restart_count": restart}


def act(action: str, job: str, hms: str, *, ok: Any = True, dry_run: Any = False,
        signal: Optional[str] = "p99_ms", node: str = "gpu001", **details: Any) -> Dict[str, Any]:
    """A ladder line as the monitor's applier journals it."""
    d: Dict[str, Any] = {"gpu": f"{node}/0", "node": node, "cause": "900", "signal": signal,
                         "limit": 250.0 if signal == "p99_ms" else 0.01,
                         "restraint": {"node": node, "gpu": 0, "cause": "900",
                                       "signal": signal}}
    if action != "ladder-end":
        d["step"] = action
    d.update(details)
    return {"ts": at(hms), "host": "mon", "event": "monitor-action", "source": "monitor",
            "action": action, "target": job, "reason": "training throttled: ...",
            "dry_run": dry_run, "ok": ok, "details": d}


def hold(job: str, hms: str, node: str = "gpu001", cls: str = "train") -> Dict[str, Any]:
    return {"ts": at(hms), "host": "mon", "event": "monitor-action", "source": "monitor",
            "action": "hold", "target": job, "reason": "training held: inference job 900 ...",
            "dry_run": False, "ok": True,
            "details": {"node": node, "ladder": "hold", "scopes": ["infer"], "job_class": cls,
                        "partition": "infer"}}


def checkpoint(job: str, hms: str) -> Dict[str, Any]:
    return {"ts": at(hms), "event": "checkpoint-end", "job": job, "ok": True,
            "requested": False, "source": "job"}


#: The worked scenario (window: the 1st, UTC). Job 11: 1 GPU on gpu001 (pool serve);
#: job 12: GPUs on two nodes, 3 in all; job 13 on gpu017 (pool mixed, MIG).
SCENARIO = [
    prolog("11", "gpu001", [0]),
    prolog("12", "gpu001", [1]),
    prolog("12", "gpu002", [0, 1]),
    prolog("13", "gpu017", [0], mode="mig-static"),
    hold("20", "01:00:00"),
    act("throttle", "11", "01:05:00", figure=400.0, figure_before=400.0),
    act("suspend", "11", "01:10:00", figure=500.0, figure_before=400.0),
    act("resume-job", "11", "01:40:00", figure=200.0, figure_before=400.0, figure_after=200.0,
        suspended_s=1800.0),
    act("unthrottle", "11", "01:50:00", figure=180.0, figure_before=400.0, figure_after=180.0,
        throttled_s=2700.0, sends="WINCH"),
    act("throttle", "12", "02:00:00", signal="error_rate", figure=0.05, figure_before=0.05),
    checkpoint("12", "02:00:00"),
    act("requeue", "12", "02:30:00", signal="error_rate", figure=0.06, figure_before=0.05,
        throttled_s=1800.0, suspended_s=None, suspended=False),
    # the job's wrapper saw the requeue's SIGTERM as a preemption: the ladder's, not one
    {"ts": at("02:30:01"), "event": "preempt-signal", "job": "12", "cause": "preempted",
     "source": "job"},
    act("throttle", "13", "03:00:00", node="gpu017", figure=300.0, figure_before=300.0),
    act("suspend", "13", "03:10:00", node="gpu017", ok=False, figure=320.0),
    act("throttle", "11", "04:00:00", dry_run=True, figure=260.0),
]
ROWS = [
    row("11", qos="train", part="infer", tres="gres/mps=100", nodes="gpu001",
        start="00:00:00", end="06:00:00"),
    row("12", qos="train", part="infer", state="REQUEUED", tres="gres/gpu=3",
        nodes="gpu[001-002]", start="00:00:00", end="02:30:00"),
    row("12", qos="train", part="infer", tres="gres/gpu=3", nodes="gpu[001-002]",
        start="02:35:00", end="04:00:00"),
    row("13", qos="train", part="mixed", tres="gres/gpu=1", nodes="gpu017",
        start="00:00:00", end="05:00:00"),
]


def ladder(tmp_path: Any, capsys: Any, monkeypatch: Any, events: List[Dict[str, Any]],
           rows: Optional[List[str]] = None, extra: Optional[List[str]] = None) -> Any:
    _, r, err = audit(tmp_path, capsys, monkeypatch, rows if rows is not None else ROWS,
                      events, extra=WINDOW if extra is None else extra)
    assert "Traceback" not in err
    return r


def test_the_park_rung_is_counted_and_listed_where_it_acted(  # noqa: F811
        tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    """Issue 35: park and unpark lines are the ladder's steps (never bad lines); a park with
    no release is unreleased; the text report lists their rows only where they acted."""
    events = [prolog("11", "gpu001", [0]), prolog("12", "gpu001", [1]),
              act("throttle", "11", "01:00:00", figure=400.0, figure_before=400.0),
              act("park", "11", "01:02:00", figure=420.0, figure_before=400.0),
              act("unpark", "11", "01:20:00", figure=200.0, figure_before=400.0,
                  figure_after=200.0, parked_s=1080.0),
              act("park", "12", "02:00:00", figure=410.0, figure_before=410.0)]
    r = ladder(tmp_path, capsys, monkeypatch, events)
    lad = r["ladder"]
    assert lad["bad_lines"] == 0 and lad["lines"] == 4
    assert lad["steps"]["park"]["taken"] == 2 and lad["steps"]["unpark"]["taken"] == 1
    assert lad["steps"]["unpark"]["slo"]["p99_ms"]["pairs"] == 1
    assert lad["unreleased"] == {"throttled": 1, "suspended": 0, "parked": 1, "host_limited": 0}
    from slurmiso.audit.render.text import ladder_tables

    (title, _, rows), _ = ladder_tables(r)
    assert sorted(row[0] for row in rows) == sorted(["hold", "throttle", "unthrottle", "park",
                                                     "unpark", "suspend", "resume",
                                                     "requeue", "ended"])
    (tmp_path / "quiet").mkdir()
    quiet = ladder(tmp_path / "quiet", capsys, monkeypatch, SCENARIO)
    (_, _, rows), _ = ladder_tables(quiet)
    assert "park" not in [row[0] for row in rows]


def test_the_worked_scenario(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    r = ladder(tmp_path, capsys, monkeypatch, SCENARIO)
    lad = r["ladder"]
    assert lad["status"] == "active" and lad["bad_lines"] == 0
    # 10 lines counted: 8 taken, a dry run, a failure
    assert lad["lines"] == 10
    taken = {s: v["taken"] for s, v in lad["steps"].items()}
    assert taken == {"hold": 1, "throttle": 3, "unthrottle": 1, "park": 0, "unpark": 0,
                     "suspend": 1, "resume": 1, "requeue": 1, "ended": 0,
                     "host-limit": 0, "host-unlimit": 0}
    assert lad["steps"]["throttle"]["dry_run"] == 1
    assert lad["steps"]["suspend"]["failed"] == 1
    total = lad["total"]
    assert total["taken"] == taken
    # 11 throttled 2700 s, 12 1800 s until its requeue; 11 suspended 1800 s
    assert total["throttled_s"] == 4500.0 and total["suspended_s"] == 1800.0
    # GPU-hours: 11 on 1 GPU (0.75 + 0.5 h), 12 on 3 GPUs over two nodes (1.5 h)
    assert total["throttled_gpu_hours"] == pytest.approx(2.25)
    assert total["suspended_gpu_hours"] == pytest.approx(0.5)
    assert total["gpus_unknown"] == 0
    # 12's REQUEUED attempt ran 00:00-02:30 on 3 GPUs, checkpointed at 02:00: 1.5 GPU-h lost
    assert total["requeues_in_sacct"] == 1
    assert total["requeue_lost_gpu_hours"] == pytest.approx(1.5)
    assert total["requeue_lost_gpu_hours_estimated"] == 0.0
    # 13's throttle was never released in the window; its time is not counted
    assert lad["unreleased"] == {"throttled": 1, "suspended": 0, "parked": 0, "host_limited": 0}
    # per pool (from the line's node) and per class (the prolog's class)
    assert lad["by_pool"]["serve"]["taken"]["throttle"] == 2
    assert lad["by_pool"]["serve"]["taken"]["hold"] == 1
    assert lad["by_pool"]["mixed"]["taken"]["throttle"] == 1
    assert lad["by_pool"]["mixed"]["throttled_s"] is None  # nothing released there
    assert lad["by_pool"]["serve"]["throttled_gpu_hours"] == pytest.approx(2.25)
    assert list(lad["by_class"]) == ["train"]
    assert lad["by_class"]["train"]["requeue_lost_gpu_hours"] == pytest.approx(1.5)
    # the SLO at each step and before -> after each release
    thr = lad["steps"]["throttle"]["slo"]
    assert (thr["p99_ms"]["figures"], thr["p99_ms"]["figure_mean"],
            thr["p99_ms"]["figure_max"]) == (2, 350.0, 400.0)
    assert thr["error_rate"]["figure_mean"] == 0.05
    unt = lad["steps"]["unthrottle"]["slo"]["p99_ms"]
    assert (unt["pairs"], unt["before_mean"], unt["after_mean"]) == (1, 400.0, 180.0)
    res = lad["steps"]["resume"]["slo"]["p99_ms"]
    assert (res["before_mean"], res["after_mean"]) == (400.0, 200.0)
    assert lad["steps"]["requeue"]["slo"]["error_rate"]["figure_max"] == 0.06
    # the ladder's requeue is not a preemption, user-reported or not
    assert r["overall"]["preemptions_user_reported"] == 0
    assert r["overall"]["preemptions"] == 0
    assert "ladder-bad-lines" not in codes(r)


#: (what, extra lines, path in the report's ladder section, expected)
CASES = [
    ("a restraint begun before the window counts its part inside",
     [prolog("31", "gpu001", [0, 1], hms="00:00:00"),
      act("unthrottle", "31", "00:30:00", figure_after=100.0, figure_before=300.0,
          throttled_s=7200.0)],
     ("total", "throttled_s"), 1800.0),
    ("... and its GPU-hours with it (2 GPUs x 0.5 h)",
     [prolog("31", "gpu001", [0, 1], hms="00:00:00"),
      act("unthrottle", "31", "00:30:00", throttled_s=7200.0)],
     ("total", "throttled_gpu_hours"), 1.0),
    ("a job whose GPUs no prolog line gave: seconds known, GPU-hours unknown",
     [act("unthrottle", "32", "05:00:00", throttled_s=600.0)],
     ("total", "throttled_gpu_hours"), None),
    ("... counted as unknown",
     [act("unthrottle", "32", "05:00:00", throttled_s=600.0)],
     ("total", "gpus_unknown"), 1),
    ("... and its class unknown",
     [act("unthrottle", "32", "05:00:00", throttled_s=600.0)],
     ("by_class", "unknown", "throttled_s"), 600.0),
    ("the latest attempt's GPUs: a requeued job started again on 1 GPU",
     [prolog("33", "gpu001", [0, 1, 2, 3]), prolog("33", "gpu003", [0], restart=1),
      act("unthrottle", "33", "05:00:00", throttled_s=3600.0)],
     ("total", "throttled_gpu_hours"), 1.0),
    ("a requeue accounting does not show: its loss is unknown, not 0",
     [act("requeue", "34", "05:00:00", throttled_s=60.0)],
     ("total", "requeue_lost_gpu_hours"), None),
    ("a restraint that ended without the ladder still counts its time",
     [prolog("35", "gpu001", [0]),
      act("ladder-end", "35", "06:00:00", throttled_s=900.0, suspended_s=300.0)],
     ("total", "suspended_s"), 300.0),
    ("hold lines of admission's own (load, not the ladder) are not ladder steps; with "
     "admission 'nodes' no hold line is not 'no hold': unknown",
     [{**hold("36", "05:00:00"), "details": {"node": "gpu001", "scopes": ["infer"]}}],
     ("steps", "hold", "taken"), None),
    ("... in every scope",
     [], ("total", "taken", "hold"), None),
    ("a hold of a pending job array is a good line",
     [hold("40_[1-3]", "05:00:00")], ("steps", "hold", "taken"), 1),
    ("a monitor requeue without a restraint is not the ladder's",
     [{**act("requeue", "37", "05:00:00"), "details": {"reason": "begin-now"}}],
     ("steps", "requeue", "taken"), 0),
]


def _get(report: Dict[str, Any], path: Any) -> Any:
    node = report["ladder"]
    for key in path:
        node = node[key]
    return node


@pytest.mark.parametrize("what, lines, path, want", CASES, ids=[c[0] for c in CASES])
def test_known_answers(what, lines, path, want, tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    # beside one throttle, so that every case has ladder activity
    events = [prolog("1", "gpu001", [0]), act("throttle", "1", "00:10:00", figure=300.0),
              *lines]
    r = ladder(tmp_path, capsys, monkeypatch, events, rows=[row("1")])
    assert r["ladder"]["bad_lines"] == 0
    got = _get(r, path)
    assert got == (pytest.approx(want) if isinstance(want, float) else want), what


@pytest.mark.parametrize("admission, want", [("hold", 0), ("nodes", None), ("qos-limit", None)])
def test_no_hold_line_is_no_hold_only_where_admission_holds(admission, want):
    """With admission 'hold' the ladder's hold step is a line of its own (details.ladder);
    elsewhere it shows as exclusions or a QoS cap that do not name the ladder."""
    from slurmiso.audit.figures.ladder import ladder_section
    from slurmiso.state.journal import parse_ts
    from slurmiso.values import replace

    cfg = load_config(CONFIG)
    cfg = replace(cfg, monitor=replace(cfg.monitor, admission=admission))
    d = JournalDigest(since=parse_ts(at("00:00:00")).timestamp())
    for line in (prolog("1", "gpu001", [0]), act("throttle", "1", "00:10:00", figure=300.0)):
        d.add(line)
    out = ladder_section(Aggregator(cfg, d), d)
    assert out["steps"]["hold"]["taken"] == want
    assert out["total"]["taken"]["hold"] == want
    d.add(hold("2", "00:20:00"))
    assert ladder_section(Aggregator(cfg, d), d)["total"]["taken"]["hold"] == 1


def _bad(line: Dict[str, Any], **change: Any) -> Dict[str, Any]:
    out = copy.deepcopy(line)
    for key, value in change.items():
        if key.startswith("d_"):
            out["details"][key[2:]] = value
        else:
            out[key] = value
    return out


_UNTHROTTLE = act("unthrottle", "11", "01:50:00", figure=180.0, figure_before=400.0,
                  figure_after=180.0, throttled_s=2700.0)
MALFORMED = [
    ("a figure of the wrong type", _bad(_UNTHROTTLE, d_figure_after="fast")),
    ("a negative figure", _bad(_UNTHROTTLE, d_figure_after=-5.0)),
    ("a huge P99", _bad(_UNTHROTTLE, d_figure_after=1e300)),
    ("a NaN figure", _bad(_UNTHROTTLE, d_figure_after=math.nan)),
    ("an infinite figure", _bad(_UNTHROTTLE, d_figure_before=math.inf)),
    ("an error rate above 1", _bad(_UNTHROTTLE, d_signal="error_rate", d_figure_after=5.0,
                                   d_figure_before=0.5, d_figure=0.5, d_limit=0.01,
                                   d_restraint={"signal": "error_rate"})),
    ("a figure that is a bool", _bad(_UNTHROTTLE, d_figure=True)),
    ("a negative duration", _bad(_UNTHROTTLE, d_throttled_s=-10.0)),
    ("a huge duration", _bad(_UNTHROTTLE, d_throttled_s=MAX_DURATION_S * 10)),
    ("a duration as text", _bad(_UNTHROTTLE, d_throttled_s="2700")),
    ("a duration that is a list", _bad(_UNTHROTTLE, d_throttled_s=[2700])),
    ("a duration on a line that ends nothing",
     _bad(act("throttle", "11", "01:50:00", figure=300.0), d_throttled_s=600.0)),
    ("a suspended time on an unthrottle", _bad(_UNTHROTTLE, d_suspended_s=600.0)),
    ("an unknown step name", _bad(_UNTHROTTLE, action="explode", d_step="explode")),
    ("a step that is not the action", _bad(_UNTHROTTLE, d_step="suspend")),
    ("an unknown signal", _bad(_UNTHROTTLE, d_signal="latency")),
    ("a target that is no job id", _bad(_UNTHROTTLE, target="../../etc/passwd")),
    ("a target that is a number", _bad(_UNTHROTTLE, target=11)),
    ("details that are a list", _bad(_UNTHROTTLE, details=[1, 2])),
    ("ok that is text", _bad(_UNTHROTTLE, ok="yes")),
    ("dry_run that is a number", _bad(_UNTHROTTLE, dry_run=0)),
    ("a node that is a list", _bad(_UNTHROTTLE, d_node=["gpu001"])),
    ("a restraint that is text", _bad(_UNTHROTTLE, d_restraint="p99_ms")),
    ("a hold's class that is a dict", _bad(hold("20", "01:00:00"), d_job_class={"a": 1})),
]


@pytest.mark.parametrize("what, line", MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_line_is_counted_and_changes_nothing(what, line, tmp_path, utc, capsys,  # noqa: F811
                                                         monkeypatch):
    good = ladder(tmp_path, capsys, monkeypatch, SCENARIO)["ladder"]
    r = ladder(tmp_path, capsys, monkeypatch, [*SCENARIO, line])
    lad = r["ladder"]
    assert lad["bad_lines"] == 1, what
    assert lad["bad_samples"] and all(len(s) < 120 for s in lad["bad_samples"])
    for key in ("steps", "total", "by_class", "by_pool", "unreleased", "lines"):
        assert lad[key] == good[key], (what, key)
    finding = codes(r)["ladder-bad-lines"]
    assert finding["severity"] == "warning" and "1 ladder line" in finding["message"]
    # the hostile text itself is never echoed
    assert "passwd" not in json.dumps(lad) and "explode" not in json.dumps(lad)


def test_bad_lines_alone_are_reported_without_figures(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    r = ladder(tmp_path, capsys, monkeypatch, [prolog("1", "gpu001", [0]),
                                               _bad(_UNTHROTTLE, d_throttled_s=-1.0)],
               rows=[row("1")])
    lad = r["ladder"]
    assert lad["status"] == "none" and lad["bad_lines"] == 1 and lad["total"] is None


@pytest.mark.parametrize("events, status", [
    ([prolog("1", "gpu001", [0]), checkpoint("1", "00:30:00")], "none"),
    ([], "unknown"),
])
def test_no_ladder_activity_says_so_and_prints_no_zeros(events, status, tmp_path, utc,  # noqa: F811
                                                        capsys, monkeypatch):
    r = ladder(tmp_path, capsys, monkeypatch, events, rows=[row("1")])
    lad = r["ladder"]
    assert lad["status"] == status
    assert (lad["steps"], lad["total"], lad["by_class"], lad["by_pool"], lad["unreleased"]) == (
        {}, None, {}, {}, None)
    _, text, _ = audit(tmp_path, capsys, monkeypatch, [row("1")], events, fmt="text",
                       extra=WINDOW)
    section = text.split("WHAT THE LADDER COST TRAINING (MONITOR JOURNAL)\n", 1)[1]
    section = section.split("\n\n", 1)[0]
    want = "no ladder activity" if status == "none" else "unknown: no journal records"
    assert want in section and "THROTTLED" not in section and " 0 " not in section, section
    _, html, _ = audit(tmp_path, capsys, monkeypatch, [row("1")], events, fmt="html",
                       extra=WINDOW)
    assert want in html and "SUSPENDED GPU-H" not in html


def test_text_and_html_show_the_cost(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    _, text, _ = audit(tmp_path, capsys, monkeypatch, ROWS, SCENARIO, fmt="text", extra=WINDOW)
    section = text.split("WHAT THE LADDER COST TRAINING (MONITOR JOURNAL)\n", 1)[1]
    section = section.split("\n\nNOTES", 1)[0]
    assert "not released in the window: 1 throttled, 0 suspended" in section
    lines = {ln.split()[0]: ln for ln in section.splitlines() if ln.strip()}
    assert lines["all"].split()[:9] == ["all", "1", "3", "1", "1", "1h15m", "30m00s", "2.2",
                                        "0.5"]
    assert "P99 400 ms -> 180 ms (1)" in lines["unthrottle"]
    assert "errors 5.00% mean" in lines["throttle"]
    _, html, _ = audit(tmp_path, capsys, monkeypatch, ROWS, SCENARIO, fmt="html", extra=WINDOW)
    assert "What it cost training" in html and "<td>1h15m</td>" in html


def test_only_requeued_attempts_ask_about_the_ladder(monkeypatch, utc):  # noqa: F811
    """The record path's per-row work does not grow: the ladder is asked on REQUEUED
    attempts only, and not at all when it requeued nothing."""
    from slurmiso.audit.read.sacct import AcctRecord

    asked: List[str] = []
    d = JournalDigest()
    d.ladder.requeued_at["7"] = [1000.0]
    monkeypatch.setattr(JournalDigest, "ladder_requeued_within",
                        lambda self, job, s, e: asked.append(job) or False)
    agg = Aggregator(load_config(CONFIG), d)

    def rec(job: str, state: str) -> AcctRecord:
        return AcctRecord(job=job, name="n", user="u", account="a", partition="train",
                          qos="train", state=state, submit=0.0, eligible=0.0, start=900.0,
                          end=1900.0, elapsed=1000.0, timelimit_s=None, gpus=1.0, mps=0,
                          shards=0, nodes="gpu033")

    agg.add_all([rec("1", "COMPLETED"), rec("2", "FAILED"), rec("3", "PREEMPTED"),
                 rec("4", "REQUEUED")])
    assert asked == ["4"]
    asked.clear()
    d.ladder.requeued_at.clear()
    agg2 = Aggregator(load_config(CONFIG), d)
    agg2.add_all([rec("5", "REQUEUED")])
    assert asked == []


def test_ladder_losses_add_up_across_parts():
    cfg = load_config(CONFIG)
    a, b = Aggregator(cfg), Aggregator(cfg)
    a.ladder_lost[("train", "serve")] = [1.0, 0.5, 0.0]
    b.ladder_lost[("train", "serve")] = [2.0, 1.0, 0.25]
    b.ladder_lost[("train", "mixed")] = [1.0, 0.0, 2.0]
    a.merge(b)
    assert a.ladder_lost == {("train", "serve"): [3.0, 1.5, 0.25],
                             ("train", "mixed"): [1.0, 0.0, 2.0]}


def test_every_ladder_figure_has_a_definition_and_a_doc_section(tmp_path, utc, capsys,  # noqa: F811
                                                                monkeypatch):
    r = ladder(tmp_path, capsys, monkeypatch, SCENARIO)
    keys = [*r["ladder"]["total"], "status", "bad_lines", "unreleased", "slo"]
    with open(os.path.join(ROOT, "docs", "audit.md")) as fh:
        doc = fh.read()
    for key in keys:
        assert f"ladder_{key}" in r["definitions"], key
        assert f"### ladder_{key}\n" in doc, key


@pytest.mark.parametrize("calm_from, admission, want", [
    (5, "nodes", {"throttle": 1, "suspend": 1, "resume": 1, "unthrottle": 1, "requeue": 0}),
    (99, "nodes", {"throttle": 1, "suspend": 1, "resume": 0, "unthrottle": 0, "requeue": 1}),
    # pending 301 held, then 201 once requeued: the node is still the ladder's
    (99, "hold", {"hold": 2, "throttle": 1, "suspend": 1, "requeue": 1}),
])
def test_the_monitors_own_lines_read_back_whole(calm_from, admission, want, tmp_path):
    """The real ladder and applier write the journal: every line reads back as good, and the
    durations and figures are the ones the monitor's actions carried."""
    from slurmiso.audit.figures.ladder import ladder_section
    from slurmiso.monitor.apply import Applier
    from slurmiso.monitor.decide import decide
    from slurmiso.monitor.policy import Memory, override
    from slurmiso.state.journal import Journal, read_journals
    from tests.unit.test_monitor_ladder import BREACH_MS, CALM_MS, DT, POL, T0, Cluster

    c = Cluster(nodes=("gpu001", "gpu002"))
    c.run_job("101", "infer", node="gpu001", p99=BREACH_MS)
    c.run_job("201", "train", node="gpu001")
    c.submit("301")
    path = str(tmp_path / "monitor.jsonl")
    applier = Applier(None, c, journal=Journal(path))
    policy = override(POL, [f"admission={admission}"])
    mem = Memory()
    done = []
    for i in range(16):
        c.p99["101"] = BREACH_MS if i < calm_from else CALM_MS
        actions, mem = decide(c.snapshot(T0 + i * DT), policy, mem)
        done += [o.action for o in applier.apply(actions)]
    d = JournalDigest()
    d.add(prolog("201", "gpu001", [0]) | {"ts": "2000-01-01T00:00:00.000Z"})
    for rec in read_journals([path]):
        d.add(rec)
    out = ladder_section(Aggregator(load_config(CONFIG), d), d)
    assert out["bad_lines"] == 0, out["bad_samples"]
    assert {k: out["total"]["taken"][k] for k in want} == want
    holds = sorted(a.target for a in done if a.kind == "hold" and a.details.get("ladder"))
    assert len(holds) == want.get("hold", 0) and (holds == ["201", "301"] or not holds)
    ends = {a.kind: a.details for a in done if a.kind in ("unthrottle", "resume-job", "requeue")}
    throttled = sum(v.get("throttled_s") or 0.0 for v in ends.values())
    suspended = sum(v.get("suspended_s") or 0.0 for v in ends.values())
    assert throttled > 0 and suspended > 0
    assert out["total"]["throttled_s"] == pytest.approx(throttled)
    assert out["total"]["suspended_s"] == pytest.approx(suspended)
    assert out["total"]["throttled_gpu_hours"] == pytest.approx(throttled / 3600.0, abs=1e-3)
    assert out["by_pool"]["serve"]["taken"]["throttle"] == 1
    assert out["steps"]["throttle"]["slo"]["p99_ms"]["figure_max"] == BREACH_MS
    if want.get("unthrottle"):
        pair = out["steps"]["unthrottle"]["slo"]["p99_ms"]
        assert (pair["before_mean"], pair["after_mean"]) == (BREACH_MS, CALM_MS)
    assert out["unreleased"] == {"throttled": 0, "suspended": 0, "parked": 0, "host_limited": 0}


@pytest.mark.parametrize("fmt", ["text", "json", "html", "md", "csv"])
def test_the_worked_scenario_matches_golden(fmt, tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    from tests.goldens import check_golden

    _, out, _ = audit(tmp_path, capsys, monkeypatch, ROWS, SCENARIO, fmt=fmt, extra=WINDOW)
    text = out if isinstance(out, str) else json.dumps(out, indent=2, sort_keys=True) + "\n"
    check_golden(os.path.join(ROOT, "tests", "golden", "audit", f"ladder-scenario.{fmt}"),
                 text.replace(str(tmp_path), "TMP"))


def test_the_host_rungs_lines_are_counted_as_its_own_steps(tmp_path, utc, capsys,  # noqa: F811
                                                            monkeypatch):
    """host-limit / host-unlimit lines (issue 36) are the host rung's steps: counted beside
    the GPU rungs' (theirs unchanged), an easing (level > 0) releases nothing, only level 0
    does, and a limit never lifted is unreleased; a level that is not one is a bad line."""
    good = ladder(tmp_path, capsys, monkeypatch, SCENARIO)["ladder"]
    host = [act("host-limit", "12", "01:10:00", level=1, from_level=0,
                host_cause="host-cpu-pressure", signal=None, limit=None),
            act("host-limit", "12", "01:20:00", level=2, from_level=1, signal=None, limit=None),
            act("host-unlimit", "12", "01:30:00", level=1, from_level=2, limited_s=600.0,
                signal=None, limit=None),
            act("host-unlimit", "12", "01:40:00", level=0, from_level=1, limited_s=600.0,
                signal=None, limit=None),
            act("host-limit", "11", "05:00:00", level=1, from_level=0, signal=None, limit=None)]
    lad = ladder(tmp_path, capsys, monkeypatch, [*SCENARIO, *host])["ladder"]
    assert lad["bad_lines"] == 0 and lad["lines"] == good["lines"] + 5
    assert lad["steps"]["host-limit"]["taken"] == 3
    assert lad["steps"]["host-unlimit"]["taken"] == 2
    for step in ("throttle", "suspend", "resume", "requeue", "unthrottle"):
        assert lad["steps"][step] == good["steps"][step], step
    assert lad["unreleased"] == dict(good["unreleased"], host_limited=1)
    bad = ladder(tmp_path, capsys, monkeypatch,
                 [*SCENARIO, act("host-limit", "12", "01:10:00", level="high", signal=None, limit=None)])
    assert bad["ladder"]["bad_lines"] == 1
    assert "details.level is not a host rung's level" in bad["ladder"]["bad_samples"]
