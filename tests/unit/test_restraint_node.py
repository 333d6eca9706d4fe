"""Issue 33 on the node: a restraint the ladder put on a job is visible where an admin looks,
with its age and cause, without the monitor's memory; and it ends at its bound when no
monitor is alive. The monitor's note travels in the job's AdminComment (admin-only); its
heartbeat is its scrape of the agent."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Tuple

import pytest

from slurmiso import restraints as r
from slurmiso.restraints import Note, OnBound, RestraintStep
from slurmiso.state import Journal
from tests import waiting
from tests.audit_helpers import utc  # noqa: F401

NOW = 1_800_000_000.0
NOTE = Note(RestraintStep.SUSPEND, NOW - 2000, "n3", 0, "4711", 1800, OnBound.RESUME)


# ----------------------------------------------------------------------------- the note
def test_note_round_trips_and_keeps_the_sites_admin_comment() -> None:
    text = r.with_note("site:tag=7 billing", NOTE)
    assert text == f"site:tag=7 billing {NOTE.text()}"
    assert Note.parse(text) == NOTE
    later = Note(RestraintStep.THROTTLE, NOW, "n3", 0, "4711", 3600, OnBound.REQUEUE)
    again = r.with_note(text, later)
    assert again.count(r.PREFIX) == 1 and Note.parse(again) == later
    assert r.with_note(again, None) == "site:tag=7 billing"


@pytest.mark.parametrize("text", [
    "", "(null)", "slurmiso-restraint:", "slurmiso-restraint:step=stop,since=1,gpu=n/0,cause=1,"
    "max=5,on=resume", "slurmiso-restraint:step=suspend,since=-1,gpu=n/0,cause=1,max=5,on=resume",
    "slurmiso-restraint:step=suspend,since=1,gpu=n;rm/0,cause=1,max=5,on=resume",
    "slurmiso-restraint:step=suspend,since=1,gpu=n/0,cause=1,max=5,on=kill",
    "slurmiso-restraint:step=suspend,since=1,gpu=n/0,cause=1,max=5,on=resumeX",
])
def test_anything_but_a_whole_note_is_no_note(text: str) -> None:
    assert Note.parse(text) is None


def test_squeue_lines_without_a_note_or_with_odd_ids_are_not_restraints() -> None:
    out = (f"{'4711':<40}{'SUSPENDED':<24}{NOTE.text()}\n"
           f"{'4712':<40}{'RUNNING':<24}(null)\n"
           f"{'x; 1':<40}{'RUNNING':<24}{NOTE.text()}\n"
           f"{'4713_2':<40}{'RUNNING':<24}site text {NOTE.text()}\n")
    found = r.parse_squeue(out)
    assert [(x.job, x.state) for x in found] == [("4711", "SUSPENDED"), ("4713_2", "RUNNING")]


# ----------------------------------------------------------------------- the heartbeat
def test_heartbeat_age_and_liveness(tmp_path: Any) -> None:
    d = str(tmp_path)
    assert r.heartbeat_age(d, NOW) is None and not r.monitor_alive(d, 30, NOW)
    r.write_heartbeat(d, NOW - 50)
    assert r.heartbeat_age(d, NOW) == 50.0 and r.monitor_alive(d, 30, NOW)
    assert not r.monitor_alive(d, 30, NOW + 100), "older than max(3 x interval, 60 s)"
    with open(r.heartbeat_path(d), "w") as f:
        f.write("garbage")
    assert r.heartbeat_age(d, NOW) is None


def test_the_agent_stamps_the_heartbeat_only_for_a_vouched_header(
        tmp_path: Any, caplog: pytest.LogCaptureFixture) -> None:
    """The agent's own server hands each scrape's request head to the stamp; only a value
    munged vouches for stamps (any local user can send the header)."""
    from slurmiso.agent.serve import _Heartbeat, _stamp

    seen: List[Tuple[str, str]] = []

    def vouch(value: str, node: str) -> Optional[str]:
        seen.append((value, node))
        return None if value == "root's" else "bad-cred"

    beat = _Heartbeat(str(tmp_path), "n3", every_s=0.0, clock=lambda: NOW, vouch=vouch)
    _stamp(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", beat)
    assert r.heartbeat_age(str(tmp_path), NOW) is None and seen == [], "a plain scrape"
    with caplog.at_level("WARNING"):
        _stamp(b"GET /metrics HTTP/1.1\r\nX-Slurmiso-Monitor: 1\r\n\r\n", beat)
    assert r.heartbeat_age(str(tmp_path), NOW) is None, "a forged header stamped"
    assert "not the monitor's (bad-cred)" in caplog.text
    _stamp(b"GET /metrics HTTP/1.1\r\nx-slurmiso-monitor:  root's\r\n\r\n", beat)
    assert r.heartbeat_age(str(tmp_path), NOW) == 0.0
    assert seen == [("1", "n3"), ("root's", "n3")]


def _munged() -> str:
    from slurmiso.munge_token import MungeUnavailable, available, encode

    try:
        return available() or (encode(b"probe", 10) and "")
    except MungeUnavailable as exc:
        return str(exc)


NO_MUNGED = _munged()
needs_munged = pytest.mark.skipif(bool(NO_MUNGED), reason=f"no munged here ({NO_MUNGED}); "
                                  "make test starts the sandbox's")


@needs_munged
def test_only_the_monitors_own_credential_for_this_node_is_vouched_once() -> None:
    cred = r.heartbeat_credential("n3")
    assert cred is not None
    assert r.heartbeat_vouched(cred, "n4") == "made for another node"
    fresh = r.heartbeat_credential("n3")
    assert fresh is not None and r.heartbeat_vouched(fresh, "n3") is None
    assert r.heartbeat_vouched(fresh, "n3") == "cred-replayed"
    other = r.heartbeat_credential("n3")
    assert other is not None
    assert r.heartbeat_vouched(other, "n3", uid=os.geteuid() + 1).startswith("made by uid")
    assert r.heartbeat_vouched("1", "n3") == "bad-cred"


def test_the_monitor_sends_its_header_to_agents_only() -> None:
    from slurmiso.exposition import scrape

    _, _, req = scrape._target("http://n3:9400/metrics", {r.HEARTBEAT_HEADER: "1"})
    assert b"\r\nX-Slurmiso-Monitor: 1\r\n" in req
    _, _, plain = scrape._target("http://n3:9400/metrics")
    assert b"Slurmiso" not in plain
    _, _, bad = scrape._target("http://n3:9400/metrics", {"X-A": "1\r\nHost: evil"})
    assert b"evil" not in bad


# ------------------------------------------------------------- the bound on the node
class FakeSlurm:
    """Slurm as the node's tools call it: squeue's answer, and what was done."""

    def __init__(self, rows: List[Tuple[str, str, str]]) -> None:
        self.rows = rows
        self.calls: List[Tuple[str, ...]] = []

    def run(self, cmd: str, args: List[str], timeout: Optional[float] = None,
            env: Any = None) -> str:
        # squeue's -O name (22.05.8 refuses AdminComment: "Invalid job format specification")
        assert cmd == "squeue" and args[-1].endswith(f",admin_comment:{r.ADMIN_COMMENT_WIDTH}")
        return "".join(f"{j:<40}{s:<24}{c}\n" for j, s, c in self.rows)

    def resume_job(self, job: str) -> str:
        self.calls.append(("resume", job))
        return "done"

    def signal_job(self, job: str, sig: str) -> str:
        self.calls.append(("signal", job, sig))
        return "done"

    def requeue_job(self, job: str, resume_first: bool = False) -> str:
        self.calls.append(("requeue", job, str(resume_first)))
        return "done"

    def set_restraint_note(self, job: str, note: Optional[Note]) -> None:
        self.calls.append(("note", job, note.text() if note else ""))


def _bound(tmp_path: Any, slurm: FakeSlurm, dry_run: bool = False) -> Tuple[List[str], List]:
    d = str(tmp_path / "state")
    book = r.refresh(slurm, d, "n3", NOW)
    journal = Journal(str(tmp_path / "journal.jsonl"))
    lines = r.end_over_bound(slurm, d, book["restraints"], NOW, 30, "WINCH", dry_run, journal)
    recs = []
    if os.path.exists(journal.path):
        with open(journal.path) as f:
            recs = [json.loads(x) for x in f]
    return lines, recs


def test_monitor_gone_a_suspend_past_its_bound_is_resumed_and_journaled(tmp_path: Any) -> None:
    young = Note(RestraintStep.SUSPEND, NOW - 100, "n3", 1, "4711", 1800, OnBound.RESUME)
    slurm = FakeSlurm([("41", "SUSPENDED", NOTE.text()), ("42", "SUSPENDED", young.text())])
    lines, recs = _bound(tmp_path, slurm)
    assert slurm.calls == [("resume", "41"), ("signal", "41", "WINCH"), ("note", "41", "")], \
        "only the one past its bound: resumed, the throttle under it lifted, its note gone"
    assert len(lines) == 1 and "job 41" in lines[0] and "monitor last seen never" in lines[0]
    (rec,) = recs
    assert rec["action"] == "ladder-end" and rec["target"] == "41" and rec["ok"] is True
    assert rec["details"]["by"] == "node" and rec["details"]["suspended_s"] == 2000.0
    assert rec["details"]["cause"] == "4711"


def test_a_throttle_past_its_bound_gets_the_unthrottle_signal(tmp_path: Any) -> None:
    note = Note(RestraintStep.THROTTLE, NOW - 4000, "n3", 0, "4711", 3600, OnBound.RESUME)
    slurm = FakeSlurm([("41", "RUNNING", note.text())])
    _bound(tmp_path, slurm)
    assert slurm.calls[0] == ("signal", "41", "WINCH")


def test_on_bound_requeue_resumes_then_requeues(tmp_path: Any) -> None:
    note = Note(RestraintStep.SUSPEND, NOW - 4000, "n3", 0, "4711", 1800, OnBound.REQUEUE)
    slurm = FakeSlurm([("41", "SUSPENDED", note.text())])
    _bound(tmp_path, slurm)
    assert slurm.calls[0] == ("requeue", "41", "True")


def test_a_live_monitor_keeps_its_restraints(tmp_path: Any) -> None:
    slurm = FakeSlurm([("41", "SUSPENDED", NOTE.text())])
    r.write_heartbeat(str(tmp_path / "state"), NOW - 10)
    lines, recs = _bound(tmp_path, slurm)
    assert (lines, recs, slurm.calls) == ([], [], [])


def test_a_dry_run_says_what_it_would_end_and_ends_nothing(tmp_path: Any) -> None:
    slurm = FakeSlurm([("41", "SUSPENDED", NOTE.text())])
    lines, recs = _bound(tmp_path, slurm, dry_run=True)
    assert len(lines) == 1 and slurm.calls == [] and recs == []


def test_slurm_down_keeps_the_record_as_last_read(tmp_path: Any) -> None:
    from slurmiso.errors import SlurmError

    d = str(tmp_path)
    r.refresh(FakeSlurm([("41", "SUSPENDED", NOTE.text())]), d, "n3", NOW - 60)

    class Down(FakeSlurm):
        def run(self, *a: Any, **k: Any) -> str:
            raise SlurmError("squeue: slurm_load_jobs error: Unable to contact slurm controller")
    view = r.node_view(d, "n3", 30, NOW, Down([]))
    assert view["read_at"] == NOW - 60 and "Unable to contact" in view["error"]
    assert [x["job"] for x in view["restraints"]] == ["41"]


def test_slurm_cli_note_keeps_the_site_text(monkeypatch: Any) -> None:
    from slurmiso.slurm.client import SlurmCli

    calls: List[List[str]] = []

    def run(self: Any, cmd: str, args: List[str], *a: Any, **k: Any) -> str:
        calls.append([cmd, *args])
        if cmd == "squeue":
            assert "JobID:40,admin_comment:1024" in args, args
        return f"{'41':<40}site text\n" if cmd == "squeue" else ""
    monkeypatch.setattr(SlurmCli, "run", run)
    r.write_note(SlurmCli(), "41", NOTE)
    assert calls[-1] == ["scontrol", "update", "JobId=41",
                         f"AdminComment=site text {NOTE.text()}"]


# ------------------------------------------------------------------- where an admin looks
def _view(tmp_path: Any, alive: bool, note: Note = NOTE) -> Dict[str, Any]:
    d = str(tmp_path)
    if alive:
        r.write_heartbeat(d, NOW - 5)
    return r.node_view(d, "n3", 30, NOW, FakeSlurm([("41", "SUSPENDED", note.text())]))


def test_doctor_warns_on_a_restraint_past_its_bound_and_a_silent_monitor(tmp_path: Any) -> None:
    from slurmiso.doctor.restraints import check_restraints

    found = check_restraints({"restraints": _view(tmp_path, alive=False)}, None)  # type: ignore[arg-type]
    by = {f.code: f for f in found}
    assert by["ladder-restraint-over-bound"].severity == "warning"
    assert by["ladder-restraint-over-bound"].subjects == ("41",)
    assert "suspended by the ladder for 2000s" in by["ladder-restraint-over-bound"].message
    assert "inference job 4711" in by["ladder-restraint-over-bound"].message
    assert by["ladder-monitor-silent"].severity == "warning"
    assert by["ladder-monitor-silent"].subjects == ("41",)


def test_doctor_names_a_young_restraint_under_a_live_monitor_as_info(tmp_path: Any) -> None:
    from slurmiso.doctor.restraints import check_restraints

    young = Note(RestraintStep.THROTTLE, NOW - 60, "n3", 0, "4711", 3600, OnBound.RESUME)
    found = check_restraints({"restraints": _view(tmp_path, True, young)}, None)  # type: ignore[arg-type]
    assert [(f.severity, f.code, f.subjects) for f in found] == [
        ("info", "ladder-restraint", ("41",))]


def test_the_agent_exports_each_restraint_and_the_heartbeat_age(tmp_path: Any) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from slurmiso.agent.restraint_watch import RestraintCollector

    _view(tmp_path, alive=True)
    reg = CollectorRegistry()
    reg.register(RestraintCollector(str(tmp_path), clock=lambda: NOW))
    text = generate_latest(reg).decode()
    assert (f'{r.M_RESTRAINT}{{cause="4711",gpu="n3/0",job="41",on_bound="resume",'
            f'step="suspend"}} 2000.0') in text
    assert f"{r.M_HEARTBEAT} 5.0" in text


def test_status_shows_the_job_suspended_with_age_bound_and_cause(tmp_path: Any,
                                                                 capsys: Any) -> None:
    """The issue: a job the ladder suspended was listed as ``ready``."""
    import argparse

    from slurmiso.cli import status
    from slurmiso.config import load_config
    from slurmiso.state import NodeState
    from slurmiso.state.record import JobRecord, RecordStatus
    from tests.hookctx import write_config

    path = write_config(str(tmp_path), "mps")
    cfg = load_config(path)
    state_dir = cfg.paths.state_dir_for("node1")
    NodeState(state_dir).write_job("41", JobRecord("41", RecordStatus.READY, mode="mps",
                                                   gpus=[0]))
    import time

    now = time.time()  # status reads the clock: the note's age is from it
    note = Note(RestraintStep.SUSPEND, now - 2000, "node1", 0, "4711", 1800, OnBound.RESUME)
    r.save_book(state_dir, r.parse_squeue(f"{'41':<40}{'SUSPENDED':<24}{note.text()}\n"), now)
    args = argparse.Namespace(config=path, node="node1", no_gpus=True, no_slurm=True,
                              json=False)
    assert status.run(args) == 0
    out = capsys.readouterr().out
    assert "suspended" in out.split("\n")[2], out
    assert "job 41: suspended by the ladder for" in out and "bound 1800s" in out
    assert "inference job 4711 on node1 GPU 0  -- PAST ITS BOUND" in out
    assert "monitor: last scraped this node never (NOT ALIVE" in out
    args.json = True
    status.run(args)
    data = json.loads(capsys.readouterr().out)
    assert data["jobs"][0]["status"] == "suspended"
    assert data["jobs"][0]["restraint"]["cause"] == "4711"


# ------------------------------------------------------------------ monitor status
def test_monitor_status_has_a_ladder_section() -> None:
    from slurmiso.monitor.ladder_state import Restraint, Rung
    from slurmiso.monitor.policy import Memory, Policy
    from slurmiso.monitor.report import status, status_lines

    mem = Memory()
    mem.ladder["n3/0"] = Rung("suspend", NOW - 200, cause="4711", why="inference job 4711 "
                              "on n3 GPU 0: P99 400 ms (SLO 250 ms)", not_hot_since=NOW - 150)
    mem.restrained["41"] = Restraint("n3", 0, "4711", throttled_since=NOW - 400,
                                     suspended_since=NOW - 200)
    mem.restrained["42"] = Restraint("n3", 1, "4711", throttled_since=NOW - 30)
    mem.last_ts = NOW - 900
    st = status(Policy(), mem, NOW)
    assert st["ladder"]["restrained"][0]["job"] == "41"
    assert st["ladder"]["restrained"][0]["suspended_s"] == 200.0
    text = "\n".join(status_lines(st))
    assert "ladder: 1 GPU(s) at a step, 2 training job(s) restrained" in text
    assert "job 42 throttled on n3/1 for 30s (bound 3600s)" in text
    assert "job 41 suspended on n3/0 for 200s (bound 1800s), cause inference job 4711" in text
    assert "cause not hot for 150s of 1800s" in text
    assert "the monitor's last cycle: 900s ago" in text


# ------------------------------------------------------------------------- the audit
def test_the_audit_names_an_unreleased_restraint_by_job_id(tmp_path, utc, capsys,  # noqa: F811
                                                           monkeypatch) -> None:
    """Job 13's throttle in the worked scenario is never released: a finding names it, and
    the node's own end of a restraint (``by: node``) counts as its release."""
    from tests.unit.test_audit_ladder import SCENARIO, act, ladder

    rep = ladder(tmp_path, capsys, monkeypatch, SCENARIO)
    found = [f for f in rep["findings"] if f["code"] == "ladder-unreleased"]
    assert [(f["severity"], f["subjects"]) for f in found] == [("warning", ["13"])]
    assert "job 13 throttled since" in found[0]["message"]
    ended = act("ladder-end", "13", "04:30:00", node="gpu017", by="node", throttled_s=5400.0)
    assert "at least 75600s by 2024-05-02T00:00:00Z; bound 3600s" in found[0]["message"], \
        "aged by the window's end: a dead monitor writes no later line"
    (tmp_path / "early").mkdir()
    rep = ladder(tmp_path / "early", capsys, monkeypatch, SCENARIO, extra=[
        "--since", "2024-05-01T00:00:00Z", "--until", "2024-05-01T03:30:00Z"])
    found = [f for f in rep["findings"] if f["code"] == "ladder-unreleased"]
    assert [(f["severity"], f["subjects"]) for f in found] == [("info", ["13"])], \
        "30 min into a 1 h bound: still named, not yet a warning"
    (tmp_path / "2").mkdir()
    rep = ladder(tmp_path / "2", capsys, monkeypatch, SCENARIO + [ended])
    assert not [f for f in rep["findings"] if f["code"] == "ladder-unreleased"]


def test_the_agents_watch_ends_a_restraint_past_its_bound_with_no_monitor(tmp_path: Any) -> None:
    import time

    from slurmiso.agent.restraint_watch import restraint_watch
    from slurmiso.config import load_config
    from slurmiso.state import NodeState
    from slurmiso.state.record import JobRecord, RecordStatus
    from tests.hookctx import write_config

    cfg = load_config(write_config(str(tmp_path), "mps"))
    asked: List[str] = []

    class Counting(FakeSlurm):
        def run(self, cmd: str, args: List[str], *a: Any, **k: Any) -> str:
            asked.append(cmd)
            return super().run(cmd, args)
    now = time.time()
    note = Note(RestraintStep.SUSPEND, now - 2000, "node1", 0, "4711", 1800, OnBound.RESUME)
    slurm = Counting([("41", "SUSPENDED", note.text())])
    assert restraint_watch(cfg, "node1", slurm, clock=lambda: now) == []
    assert asked == [], "no job on the node and none restrained: slurmctld is not asked"
    NodeState(cfg.paths.state_dir_for("node1")).write_job(
        "41", JobRecord("41", RecordStatus.READY, mode="mps", gpus=[0]))
    lines = restraint_watch(cfg, "node1", slurm, clock=lambda: now)
    assert len(lines) == 1 and slurm.calls[0] == ("resume", "41")
    with open(cfg.paths.journal_for("node1")) as f:
        assert any('"by":"node"' in line for line in f)


@needs_munged
def test_the_real_agent_stamps_the_monitors_scrape(tmp_path: Any) -> None:
    """``slurmiso agent`` as a process: a plain scrape stamps nothing, the monitor's (its
    header) stamps the heartbeat in the node's state dir; its answer has the series."""
    import subprocess
    import sys
    import time

    from slurmiso.config import load_config
    from slurmiso.exposition import scrape
    from tests.hookctx import write_config

    path = write_config(str(tmp_path), "mps")
    state_dir = load_config(path).paths.state_dir_for("node1")
    with __import__("socket").socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "slurmiso", "--config", path, "agent",
                             "--node", "node1", "--port", str(port), "--addr", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = {"a": f"http://127.0.0.1:{port}/metrics"}
    try:
        deadline = time.monotonic() + 60  # guards a hang only: the agent starts in ~1 s
        while scrape.fetch_all(url, 5)["a"].body is None:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.2)
        assert r.heartbeat_age(state_dir, time.time()) is None, "a plain scrape is no heartbeat"
        body = scrape.fetch_all(url, 5, headers={r.HEARTBEAT_HEADER: "1"})["a"].body
        assert body is not None and f"{r.M_HEARTBEAT} " in body
        assert r.heartbeat_age(state_dir, time.time()) is None, "a forged header stamped"
        beat = {"a": {r.HEARTBEAT_HEADER: r.heartbeat_credential("node1") or ""}}
        assert scrape.fetch_all(url, 5, key_headers=beat)["a"].body is not None
        age = r.heartbeat_age(state_dir, time.time())
        assert age is not None and age < 60
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_nodes_end_line_is_a_good_ladder_line_for_the_audit(tmp_path: Any) -> None:
    """The line the node writes must count as the restraint's end, never as a bad line."""
    from slurmiso.audit.read.ladder import LadderLog

    slurm = FakeSlurm([("41", "SUSPENDED", NOTE.text())])
    _, recs = _bound(tmp_path, slurm)
    log = LadderLog()
    log.open_suspended.add("41")
    log.open_since["41"] = ("suspend", NOW - 2000)
    log.add(recs[0], NOW, None, {"41": "train"}, {})
    assert log.bad == 0, log.bad_samples
    assert log.taken[("ended", "train", "n3")] == 1
    assert not log.open_suspended and not log.open_since


# ------------------------------------------- reconcile never takes a suspended job for ended
def test_the_monitors_reconcile_counts_a_suspended_job_as_live() -> None:
    """Found by the sandbox test: a suspended job was missing from ``live_jobs``, so the
    periodic reconcile undid its isolation record (its status then showed nothing)."""
    from slurmiso.monitor.decide import decide
    from slurmiso.monitor.policy import Memory, Policy
    from tests.unit.test_monitor_decide import POLICY, job, node, snap

    pol = Policy(**{**POLICY.__dict__, "reconcile_nodes": ("n1",), "reconcile_every_s": 600})
    jobs = [job("5", state="RUNNING", nodes=["n1"]), job("6", state="SUSPENDED", nodes=["n1"])]
    acts, _ = decide(snap([node("n1")], jobs), pol, Memory())
    rec = next(a for a in acts if a.kind == "reconcile")
    assert rec.details["live_jobs"] == ["5", "6"]


def test_slurmiso_reconcile_asks_slurm_for_suspended_jobs_too(monkeypatch: Any) -> None:
    from slurmiso.slurm.client import SlurmCli

    asked: List[List[str]] = []

    def run(self: Any, cmd: str, args: List[str], *a: Any, **k: Any) -> str:
        asked.append(args)
        return "41\n"
    monkeypatch.setattr(SlurmCli, "run", run)
    assert SlurmCli().jobs_on_node("n3") == ["41"]
    states = asked[0][asked[0].index("-t") + 1].split(",")
    assert "SUSPENDED" in states and "RUNNING" in states


def test_status_names_a_host_limited_job_so(tmp_path: Any, capsys: Any) -> None:
    """A host-limit note is neither a throttle nor a suspend: status says host-limited."""
    import argparse
    import time

    from slurmiso.cli import status
    from slurmiso.config import load_config
    from slurmiso.state import NodeState
    from slurmiso.state.record import JobRecord, RecordStatus
    from tests.hookctx import write_config

    path = write_config(str(tmp_path), "mps")
    cfg = load_config(path)
    state_dir = cfg.paths.state_dir_for("node1")
    NodeState(state_dir).write_job("41", JobRecord("41", RecordStatus.READY, mode="mps",
                                                   gpus=[0]))
    now = time.time()
    note = Note(RestraintStep.HOST_LIMIT, now - 20, "node1", 0, "4711", 600, OnBound.RESUME,
                level=1)
    r.save_book(state_dir, r.parse_squeue(f"{'41':<40}{'RUNNING':<24}{note.text()}\n"), now)
    args = argparse.Namespace(config=path, node="node1", no_gpus=True, no_slurm=True,
                              json=True)
    assert status.run(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["jobs"][0]["status"] == "host-limited"


def test_a_vouched_nudge_wakes_the_restraint_watch_at_most_once_a_second(
        tmp_path: Any) -> None:
    """The monitor's nudge (X-Slurmiso-Wake: restraints beside its credential) wakes the
    watch at once; a forged credential, a nudge without one, or a second within the second,
    does not (each wake is one read of Slurm)."""
    from slurmiso.agent.serve import _Heartbeat, _stamp

    now = [NOW]
    wakes: List[float] = []
    beat = _Heartbeat(str(tmp_path), "n3", every_s=5.0, clock=lambda: now[0],
                      vouch=lambda v, n: None if v.startswith("root") else "bad-cred",
                      wake=lambda: wakes.append(now[0]))

    def nudge(cred: str) -> None:
        _stamp(f"GET /metrics HTTP/1.1\r\nX-Slurmiso-Monitor: {cred}\r\n"
               "X-Slurmiso-Wake: restraints\r\n\r\n".encode(), beat)

    _stamp(b"GET /metrics HTTP/1.1\r\nX-Slurmiso-Wake: restraints\r\n\r\n", beat)
    nudge("forged")
    assert wakes == []
    nudge("root-1")
    _stamp(b"GET /metrics HTTP/1.1\r\nX-Slurmiso-Monitor: root-2\r\n\r\n", beat)  # no nudge
    now[0] += 0.5
    nudge("root-3")
    assert wakes == [NOW], "once, and not again within the second"
    now[0] += 0.6
    nudge("root-4")
    assert wakes == [NOW, NOW + 1.1]


def test_the_watch_runs_a_round_when_woken_not_only_at_its_interval(
        monkeypatch: Any) -> None:
    import threading

    from slurmiso.agent import restraint_watch as rw

    rounds: List[float] = []
    done = threading.Event()

    def one_round(cfg: Any, node: str) -> List[str]:
        rounds.append(1.0)
        if len(rounds) == 2:
            done.set()
        return []

    monkeypatch.setattr(rw, "restraint_watch", one_round)
    woken = threading.Event()
    threading.Thread(target=rw.watch_forever, args=(None, "n3", 3600.0, woken),
                     daemon=True).start()
    waiting.wait_for(lambda: len(rounds) >= 1, "the first round")
    woken.set()
    assert done.wait(30), "a woken watch runs its next round at once, not in an hour"
