"""The host rung on the node: the host-limit token, and the agent applying and undoing it."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from typing import Any, Callable, Dict, Iterable, List, Tuple

import pytest
import yaml

from slurmiso.agent.host_rung import HostRung
from slurmiso.agent.restraint_watch import RestraintCollector
from slurmiso.config.loader import parse_config
from slurmiso.config.model import HostLimitLevel
from slurmiso.errors import ConfigError
from slurmiso.host.cgroup_writer import FakeCgroupWriter, FileCgroupWriter, check_path
from slurmiso.host.limit_record import load_record
from slurmiso.host.rate_limit import CgroupWrite
from slurmiso.restraints import (
    M_HOST_LIMIT,
    NodeRestraint,
    Note,
    OnBound,
    RestraintStep,
    end_over_bound,
    parse_squeue,
    with_note,
    write_heartbeat,
)
from slurmiso.state import Journal
from slurmiso.state.record import JobRecord

ETC = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")
NOW = 1_733_460_000.0
HOST = Note(RestraintStep.HOST_LIMIT, NOW - 100, "n1", 0, "4711", 3600, OnBound.RESUME, 1)


# ------------------------------------------------------------------------------ the token
def test_host_limit_token_is_one_word_and_round_trips() -> None:
    text = HOST.text()
    assert text == ("slurmiso-restraint:step=host-limit,since=1733459900,gpu=n1/0,cause=4711,"
                    "max=3600,on=resume,lvl=1")
    assert len(text.split()) == 1
    assert Note.parse(f"site text {text} more") == HOST
    assert Note.parse(with_note("site", HOST)) == HOST


@pytest.mark.parametrize("tail", [
    "step=host-limit,since=1,gpu=n1/0,cause=1,max=60,on=resume",          # no level
    "step=host-limit,since=1,gpu=n1/0,cause=1,max=60,on=requeue,lvl=1",   # requeue
    "step=host-limit,since=1,gpu=n1/0,cause=1,max=60,on=resume,lvl=0",    # level 0
    "step=host-limit,since=1,gpu=n1/0,cause=1,max=60,on=resume,lvl=10",   # level 10
    "step=host-limit,since=1,gpu=n1/0,cause=1,max=60,on=resume,lvl=1x",   # trailing junk
    "step=throttle,since=1,gpu=n1/0,cause=1,max=60,on=resume,lvl=1",      # level elsewhere
    "step=host-limit,since=1,gpu=n1/0,cause=1,max=60,lvl=1,on=resume",    # out of order
])
def test_malformed_host_limit_tokens_are_none_of_ours(tail: str) -> None:
    assert Note.parse("slurmiso-restraint:" + tail) is None


def test_old_tokens_parse_as_before() -> None:
    old = "slurmiso-restraint:step=suspend,since=1733460000,gpu=n3/0,cause=4711,max=1800,on=resume"
    note = Note.parse(old)
    assert note is not None and note.level == 0 and note.text() == old
    assert "level" not in note.to_dict()
    bad = old.replace("step=suspend", "step=throttle") + ",lvl=1"
    # a malformed first token does not hide a whole one after it
    assert Note.parse(f"{bad} {old}") == note


def test_the_book_keeps_the_level() -> None:
    rows = parse_squeue(f"{'41':<40}{'RUNNING':<24}{HOST.text()}\n")
    assert [r.note for r in rows] == [HOST]
    assert rows[0].to_dict(NOW)["level"] == 1


# ------------------------------------------------------------------------------ the config
def _config(host_limit: Any) -> Any:
    with open(ETC, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data["monitor"].setdefault("ladder", {})["host_limit"] = host_limit
    return parse_config(data)


def test_no_host_limit_levels_by_default() -> None:
    with open(ETC, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    assert parse_config(data).monitor.ladder.host_limit.levels == ()


def test_host_limit_levels_load() -> None:
    cfg = _config({"levels": [{"cpu_cores": 8, "cpu_weight": 50},
                              {"cpu_cores": 2.5, "io_weight": 10, "memory_high": "64G",
                               "io_mbps": {"8:0": "200M"}}]})
    one, two = cfg.monitor.ladder.host_limit.levels
    assert (one.cpu_cores, one.cpu_weight, one.io_weight) == (8.0, 50, None)
    assert (two.memory_high_mb, two.io_mbps) == (64 * 1024, (("8:0", 200),))


@pytest.mark.parametrize("host_limit,key,words", [
    ({"levels": [{}]}, "monitor.ladder.host_limit.levels[0]", "limits nothing"),
    ({"levels": [{"cpu_cores": 0}]}, "monitor.ladder.host_limit.levels[0].cpu_cores",
     "0.01..4096"),
    ({"levels": [{"cpu_weight": 0}]}, "monitor.ladder.host_limit.levels[0].cpu_weight",
     "out of range"),
    ({"levels": [{"memory_max": "1G"}]}, "monitor.ladder.host_limit.levels[0].memory_max",
     "unknown key"),
    ({"levels": [{"io_mbps": {"sda": "1M"}}]},
     "monitor.ladder.host_limit.levels[0].io_mbps.sda", "MAJ:MIN"),
    ({"levels": [{"cpu_cores": 1}] * 10}, "monitor.ladder.host_limit.levels", "at most 9"),
    ({"level": []}, "monitor.ladder.host_limit.level", "unknown key"),
])
def test_host_limit_nonsense_names_the_key(host_limit: Any, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(host_limit)
    lines = [p for p in err.value.problems if f"{key}:" in p]
    assert lines and words in lines[0], err.value.problems


# ------------------------------------------------------------------- the node's executor
FIX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures",
                   "host")
V2_JOB = os.path.join("system.slice", "n1_slurmstepd.scope", "job_4242")
LEVEL = HostLimitLevel(cpu_cores=4.0, cpu_weight=10, io_weight=50, io_mbps=(("8:16", 1),),
                       memory_high_mb=1024)


class KernelDisk:
    """The real writer's path checks, then the kernel's rendering written to a plain file
    (cgroupfs shows ``max 100000`` with a newline and updates keyed lines in place)."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = tuple(roots)
        self.log: List[CgroupWrite] = []

    def write(self, change: CgroupWrite) -> None:
        check_path(self.roots, change.path)
        with open(change.path, encoding="ascii") as f:
            fake = FakeCgroupWriter(self.roots, {change.path: f.read()})
        fake.write(change)
        with open(change.path, "w", encoding="ascii") as f:
            f.write(fake.files[change.path])
        self.log.append(change)
        WRITES.append(change)


WRITES: List[CgroupWrite] = []


class NoteSlurm:
    def __init__(self) -> None:
        self.cleared: List[str] = []

    def set_restraint_note(self, job: str, note: Any) -> None:
        assert note is None
        self.cleared.append(job)


def _tree(root: pathlib.Path) -> Dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not p.is_symlink()}


def _journal(tmp: pathlib.Path) -> List[Dict[str, Any]]:
    path = tmp / "journal"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture()
def v2(tmp_path: pathlib.Path) -> pathlib.Path:
    WRITES.clear()
    shutil.copytree(os.path.join(FIX, "slurm-v2"), str(tmp_path / "cg"), symlinks=True)
    return tmp_path


def _rung(tmp: pathlib.Path, root: str = "cg", levels: Any = (LEVEL,), **kw: Any) -> HostRung:
    kw.setdefault("writer_for", KernelDisk)
    return HostRung(str(tmp / "state"), "n1", levels, ("train",), 30,
                    Journal(str(tmp / "journal")), str(tmp / root), **kw)


def _book(job: str = "4242", since: float = NOW - 100, level: int = 1,
          node: str = "n1") -> List[NodeRestraint]:
    note = Note(RestraintStep.HOST_LIMIT, since, node, 0, "4711", 3600, OnBound.RESUME, level)
    return [NodeRestraint(job, "RUNNING", note)]


def _records(cls: str = "train", uid: int = -1, **more: str) -> Dict[str, JobRecord]:
    out = {"4242": JobRecord("4242", job_class=cls, uid=uid)}
    out.update({j: JobRecord(j, job_class=c) for j, c in more.items()})
    return out


def test_apply_then_released_restores_every_file_byte_identical(v2: pathlib.Path) -> None:
    before = _tree(v2 / "cg")
    lines = _rung(v2).round(_book(), _records(), NOW)
    assert lines == ["job 4242: host-limit: host limit level 1 applied"]
    job = v2 / "cg" / V2_JOB
    assert (job / "cpu.max").read_text() == "400000 100000\n"
    assert (job / "cpu.weight").read_text() == "10\n"
    assert (job / "memory.high").read_text() == str(2**30) + "\n"
    assert "8:16 rbps=1048576 wbps=1048576" in (job / "io.max").read_text()
    assert (job / "memory.max").read_bytes() == before[os.path.join(V2_JOB, "memory.max")]
    assert not any(w.path.endswith("memory.max") for w in WRITES)
    rec = load_record(str(v2 / "state"))
    assert [(a.job, a.level, a.knobs()) for a in rec.applied] == [
        ("4242", 1, ("cpu.max", "cpu.weight", "io.weight", "io.max", "memory.high"))]
    lines = _rung(v2).round([], _records(), NOW + 60)  # the monitor removed the note
    assert _tree(v2 / "cg") == before
    assert load_record(str(v2 / "state")).applied == []
    events = [(e["event"], e["target"], e["ok"], e["details"]["by"]) for e in _journal(v2)]
    assert events == [("host-limit", "4242", True, "node"), ("host-limit-end", "4242", True,
                                                            "node")]


def test_v1_apply_then_restore_is_byte_identical(tmp_path: pathlib.Path) -> None:
    shutil.copytree(os.path.join(FIX, "v1"), str(tmp_path / "v1"))
    before = _tree(tmp_path / "v1")
    recs = {"77": JobRecord("77", job_class="train", uid=1000)}
    rung = _rung(tmp_path, "v1", (HostLimitLevel(cpu_cores=2.0, cpu_weight=10, io_weight=50),))
    rung.round(_book("77"), recs, NOW)
    cpu = tmp_path / "v1" / "cpu,cpuacct" / "slurm" / "uid_1000" / "job_77"
    assert (cpu / "cpu.cfs_quota_us").read_text() == "200000\n"
    assert (cpu / "cpu.shares").read_text() == "102\n"
    assert _tree(tmp_path / "v1") != before
    _rung(tmp_path, "v1").round([], recs, NOW + 1)
    assert _tree(tmp_path / "v1") == before


def test_a_job_filed_under_another_uid_is_refused(tmp_path: pathlib.Path) -> None:
    shutil.copytree(os.path.join(FIX, "v1"), str(tmp_path / "v1"))
    before = _tree(tmp_path / "v1")
    lines = _rung(tmp_path, "v1").round(_book("77"), {"77": JobRecord(
        "77", job_class="train", uid=1001)}, NOW)
    assert "uid 1000" in lines[0] and _tree(tmp_path / "v1") == before


def test_job_ended_drops_the_record(v2: pathlib.Path) -> None:
    _rung(v2).round(_book(), _records(), NOW)
    shutil.rmtree(v2 / "cg" / V2_JOB)
    WRITES.clear()
    lines = _rung(v2).round([], {}, NOW + 60)
    assert "cgroup is gone" in lines[0] and WRITES == []
    assert load_record(str(v2 / "state")).applied == []
    assert _journal(v2)[-1]["event"] == "host-limit-end"


def test_a_new_cgroup_at_the_same_path_is_not_restored_into(v2: pathlib.Path) -> None:
    """A requeued job's fresh cgroup has another inode: the old undo is not written there."""
    _rung(v2).round(_book(), _records(), NOW)
    job = v2 / "cg" / V2_JOB
    shutil.move(str(job), str(v2 / "old"))
    shutil.copytree(str(v2 / "old"), str(job))
    WRITES.clear()
    lines = _rung(v2).round([], _records(), NOW + 60)
    assert "cgroup is gone" in lines[0] and WRITES == []


def test_bound_passed_with_a_stale_heartbeat_restores_and_clears_the_note(
        v2: pathlib.Path) -> None:
    before = _tree(v2 / "cg")
    state = str(v2 / "state")
    write_heartbeat(state, NOW)
    _rung(v2).round(_book(), _records(), NOW)
    late = NOW + 3600
    write_heartbeat(state, late - 10)  # the monitor is alive: it owns the restraint
    assert _rung(v2).round(_book(), _records(), late) == []
    assert _tree(v2 / "cg") != before
    slurm = NoteSlurm()
    later = late + 600  # no scrape for 610 s: the monitor is not alive
    lines = _rung(v2, slurm=slurm).round(_book(), _records(), later)
    assert "past its bound" in lines[0]
    assert _tree(v2 / "cg") == before and slurm.cleared == ["4242"]
    end = _journal(v2)[-1]
    assert (end["event"], end["details"]["by"], end["details"]["bound"]["max_s"]) == (
        "host-limit-end", "node", 3600)
    # the note lingers in Slurm (not cleared yet): never applied again
    WRITES.clear()
    assert _rung(v2).round(_book(), _records(), later + 30) == []
    assert WRITES == []


def test_the_node_trusts_a_notes_bound_only_up_to_its_own(v2: pathlib.Path) -> None:
    """A note may say max=999999999; the node ends it at its own host_limit.max, and a note
    stamped far in the future is already past its bound."""
    before = _tree(v2 / "cg")
    state = str(v2 / "state")
    write_heartbeat(state, NOW)
    long = Note(RestraintStep.HOST_LIMIT, NOW - 100, "n1", 0, "4711", 999_999_999,
                OnBound.RESUME, 1)
    _rung(v2, max_s=3600).round([NodeRestraint("4242", "RUNNING", long)], _records(), NOW)
    assert _tree(v2 / "cg") != before
    later = NOW + 3600 + 700  # past the node's bound, no scrape for 700 s
    lines = _rung(v2, max_s=3600, slurm=NoteSlurm()).round(
        [NodeRestraint("4242", "RUNNING", long)], _records(), later)
    assert "past its bound (3600s" in lines[0] and _tree(v2 / "cg") == before
    future = Note(RestraintStep.HOST_LIMIT, later + 86400, "n1", 0, "4711", 3600,
                  OnBound.RESUME, 1)
    lines = _rung(v2, max_s=3600).round([NodeRestraint("4242", "RUNNING", future)],
                                        _records(), later + 30)
    assert "past its bound" in lines[0] and _tree(v2 / "cg") == before


def test_an_inference_job_is_refused_and_journaled_once(v2: pathlib.Path) -> None:
    before = _tree(v2 / "cg")
    lines = _rung(v2).round(_book(), _records(cls="infer"), NOW)
    assert lines == ["job 4242: host-limit-refused: class infer is not a training class: "
                     "never limited"]
    assert _rung(v2).round(_book(), _records(cls="infer"), NOW + 30) == []
    assert _tree(v2 / "cg") == before
    assert [e["event"] for e in _journal(v2)] == ["host-limit-refused"]


@pytest.mark.parametrize("records,level,node,words", [
    ({}, 1, "n1", "no slurmiso record"),
    (None, 2, "n1", "level 2 is not configured"),
    (None, 1, "n3", "contention is on node n3"),
])
def test_refusals_say_why(v2: pathlib.Path, records: Any, level: int, node: str,
                          words: str) -> None:
    before = _tree(v2 / "cg")
    lines = _rung(v2).round(_book(level=level, node=node),
                            _records() if records is None else records, NOW)
    assert len(lines) == 1 and words in lines[0], lines
    assert _tree(v2 / "cg") == before


def test_no_levels_configured_refuses(v2: pathlib.Path) -> None:
    lines = _rung(v2, levels=()).round(_book(), _records(), NOW)
    assert "levels has 0" in lines[0]


def test_a_symlinked_job_dir_is_not_slurms(v2: pathlib.Path) -> None:
    job = v2 / "cg" / V2_JOB
    shutil.move(str(job), str(v2 / "elsewhere"))
    os.symlink(str(v2 / "elsewhere"), str(job))
    before = _tree(v2 / "elsewhere")
    lines = _rung(v2).round(_book(), _records(), NOW)
    assert "no cgroup of the job" in lines[0]
    assert _tree(v2 / "elsewhere") == before


def test_a_symlinked_knob_is_never_planned(v2: pathlib.Path) -> None:
    job = v2 / "cg" / V2_JOB
    outside = v2 / "outside"
    outside.write_text("100\n")
    (job / "cpu.weight").unlink()
    os.symlink(str(outside), str(job / "cpu.weight"))
    _rung(v2).round(_book(), _records(), NOW)
    assert outside.read_text() == "100\n"
    assert "cpu.weight" not in load_record(str(v2 / "state")).applied[0].knobs()
    assert not any(w.path.endswith("cpu.weight") for w in WRITES)


def test_a_knob_swapped_for_a_symlink_is_refused_by_the_real_writer(v2: pathlib.Path) -> None:
    """Linked outside between the plan and the write: the real writer refuses before
    writing, apply_plan puts back what it changed, the outside file is untouched."""
    job = v2 / "cg" / V2_JOB
    outside = v2 / "outside"
    outside.write_text("100\n")

    def swap_then_write(roots: Iterable[str]) -> FileCgroupWriter:
        if not (job / "cpu.weight").is_symlink():
            (job / "cpu.weight").unlink()
            os.symlink(str(outside), str(job / "cpu.weight"))
        return FileCgroupWriter(roots)

    rung = _rung(v2, writer_for=swap_then_write)
    lines = rung.round(_book(), _records(), NOW)
    assert "not limited" in lines[0] and "symlink" in lines[0], lines
    assert outside.read_text() == "100\n"
    assert (job / "cpu.max").read_text().split() == ["max", "100000"]
    # its undo of the swapped knob was refused too: the entry stays, marked done, so later
    # rounds keep putting the originals back and the note is never applied again
    rec = load_record(str(v2 / "state"))
    assert [a.job for a in rec.applied] == ["4242"] and rec.applied[0].key() in rec.done
    assert _journal(v2)[-1]["event"] == "host-limit-refused"


def test_a_tampered_record_never_writes_outside_the_job(v2: pathlib.Path) -> None:
    (v2 / "state").mkdir()
    victim = v2 / "victim"
    victim.write_text("keep\n")
    job = str(v2 / "cg" / V2_JOB)
    entry = {"job": "4242", "since": NOW - 100, "level": 1, "dirs": [job],
             "inodes": [os.lstat(job).st_ino], "at": NOW,
             "steps": [{"knob": "cpu.max", "apply": [[job + "/cpu.max", "1000 100000"]],
                        "restore": [[str(victim), "x"]]}]}
    (v2 / "state" / "host-limits.json").write_text(json.dumps(
        {"version": 1, "applied": [entry], "done": []}))
    lines = _rung(v2).round([], _records(), NOW)
    assert "not whole" in lines[-1] and victim.read_text() == "keep\n"


def test_a_restarted_agent_applies_nothing_twice(v2: pathlib.Path) -> None:
    _rung(v2).round(_book(), _records(), NOW)
    WRITES.clear()
    assert _rung(v2).round(_book(), _records(), NOW + 30) == []  # a new agent, same record
    assert WRITES == []
    assert len(load_record(str(v2 / "state")).applied) == 1


def test_a_new_level_restores_then_applies_the_new_one(v2: pathlib.Path) -> None:
    soft = HostLimitLevel(cpu_weight=50)
    _rung(v2, levels=(soft, LEVEL)).round(_book(level=1), _records(), NOW)
    lines = _rung(v2, levels=(soft, LEVEL)).round(_book(level=2), _records(), NOW + 30)
    assert [x.split(":")[1].strip() for x in lines] == ["host-limit-end", "host-limit"]
    job = v2 / "cg" / V2_JOB
    assert (job / "cpu.weight").read_text() == "10\n"
    assert [a.level for a in load_record(str(v2 / "state")).applied] == [2]


def test_a_record_that_is_not_whole_fails_closed(v2: pathlib.Path) -> None:
    before = _tree(v2 / "cg")
    _rung(v2).round(_book(), _records(), NOW)
    path = v2 / "state" / "host-limits.json"
    data = json.loads(path.read_text())
    evil = json.loads(json.dumps(data["applied"][0]))
    evil["job"] = "4243"
    evil["steps"][0]["restore"] = [["/etc/shadow", "x"]]
    data["applied"].append(evil)
    path.write_text(json.dumps(data))
    lines = _rung(v2).round(_book(), _records(), NOW + 30)
    assert "restored (fail closed)" in lines[0] and "not whole" in lines[-1]
    assert _tree(v2 / "cg") == before  # what was whole was restored
    assert list((v2 / "state").glob("host-limits.json.bad-*"))
    fresh = load_record(str(v2 / "state"))  # a fresh record: nothing left, the note barred
    assert fresh.applied == [] and list(fresh.done) == [("4242", NOW - 100, 1)]
    # the note in force is never applied again from a baseline a lost entry may limit ...
    assert _rung(v2).round(_book(), _records(), NOW + 60) == []
    assert _tree(v2 / "cg") == before
    # ... a new note (the monitor's next step) is, from the restored baseline
    assert _rung(v2).round(_book(since=NOW + 70), _records(), NOW + 90) == [
        "job 4242: host-limit: host limit level 1 applied"]


@pytest.mark.parametrize("text", ["{not json", "[]", '{"version": 1, "applied": {}}',
                                  "\u00ff\u00fe"])
def test_garbage_record_never_crashes(v2: pathlib.Path, text: str) -> None:
    (v2 / "state").mkdir()
    (v2 / "state" / "host-limits.json").write_text(text, encoding="latin-1")
    before = _tree(v2 / "cg")
    lines = _rung(v2).round(_book(), _records(), NOW)
    assert "not whole" in lines[-1] and _tree(v2 / "cg") == before


def test_the_collector_exports_applied_limits(v2: pathlib.Path) -> None:
    _rung(v2).round(_book(), _records(), NOW)
    col = RestraintCollector(str(v2 / "state"), clock=lambda: NOW + 90)
    fams = {f.name: f for f in col.collect()}
    rows = {(s.labels["job"], s.labels["step"], s.labels["level"], s.labels["knob"]): s.value
            for s in fams[M_HOST_LIMIT].samples}
    assert rows[("4242", "host-limit", "1", "cpu.max")] == 90.0
    assert {k[3] for k in rows} == {"cpu.max", "cpu.weight", "io.weight", "io.max",
                                    "memory.high"}


def test_end_over_bound_leaves_host_limits_to_the_node_executor(tmp_path: pathlib.Path) -> None:
    old = _book(since=NOW - 7200)
    assert end_over_bound(None, str(tmp_path), old, NOW, 30, "WINCH", False) == []


def node1_with_a_training_job(tmp_path: pathlib.Path, edit: Callable[[Dict[str, Any]], None],
                              record: JobRecord) -> Tuple[Any, pathlib.Path, pathlib.Path]:
    """An MPS test config edited by ``edit``, node1's recorded v2 tree with job 4242 in it,
    and ``record`` as its record: (config, cgroup root, the job's directory)."""
    from slurmiso.config import load_config
    from slurmiso.state import NodeState
    from tests.hookctx import write_config

    path = write_config(str(tmp_path), "mps")
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    edit(data)
    with open(path, "w", encoding="utf-8") as f:
        yaml.safe_dump(data, f)
    cfg = load_config(path)
    root = tmp_path / "cg"
    shutil.copytree(os.path.join(FIX, "slurm-v2"), str(root))
    job = root / "system.slice" / "node1_slurmstepd.scope" / "job_4242"
    shutil.copytree(os.path.join(FIX, "v2", "job_4242"), str(job))
    NodeState(cfg.paths.state_dir_for("node1")).write_job("4242", record)
    return cfg, root, job


def _levels(*levels: Dict[str, Any]) -> Callable[[Dict[str, Any]], None]:
    def edit(data: Dict[str, Any]) -> None:
        data.setdefault("monitor", {}).setdefault("ladder", {})["host_limit"] = {
            "levels": list(levels)}
    return edit


def test_the_agents_watch_runs_the_host_rung(tmp_path: pathlib.Path) -> None:
    """One restraint-watch round with a host-limit note applies it through the real
    writer; the next, without the note, restores it."""
    from slurmiso.agent.restraint_watch import restraint_watch

    cfg, root, job = node1_with_a_training_job(
        tmp_path, _levels({"cpu_cores": 2, "cpu_weight": 20}),
        JobRecord("4242", job_class="train"))
    before = _tree(root)
    note = Note(RestraintStep.HOST_LIMIT, NOW - 60, "node1", 0, "4711", 3600, OnBound.RESUME, 1)

    class Squeue:
        rows = [note.text()]

        def run(self, cmd: str, args: List[str], *a: Any, **k: Any) -> str:
            return "".join(f"{'4242':<40}{'RUNNING':<24}{c}\n" for c in self.rows)

    slurm = Squeue()
    lines = restraint_watch(cfg, "node1", slurm, clock=lambda: NOW, cgroup_root=str(root))
    assert lines == ["job 4242: host-limit: host limit level 1 applied"]
    assert (job / "cpu.weight").read_text() == "20"  # the real writer: no newline added
    slurm.rows = []
    # one unreadable job record on the node must not stop the undo
    jobs = pathlib.Path(cfg.paths.state_dir_for("node1")) / "jobs"
    (jobs / "9999.json").write_text("{torn")
    lines = restraint_watch(cfg, "node1", slurm, clock=lambda: NOW + 30, cgroup_root=str(root))
    assert "restored" in lines[0]
    assert {k: v.split() for k, v in _tree(root).items()} == {
        k: v.split() for k, v in before.items()}


def test_an_emptied_record_does_not_make_the_watch_ask_slurm(tmp_path: pathlib.Path) -> None:
    from slurmiso.agent.restraint_watch import restraint_watch
    from slurmiso.config import load_config
    from slurmiso.host.limit_record import HostRecord, save_record
    from tests.hookctx import write_config

    cfg = load_config(write_config(str(tmp_path), "mps"))
    save_record(cfg.paths.state_dir_for("node1"), HostRecord())

    class Refusing:
        def run(self, *a: Any, **k: Any) -> str:
            raise AssertionError("no job, no restraint, no limit: slurmctld is not asked")

    assert restraint_watch(cfg, "node1", Refusing(), clock=lambda: NOW) == []


def test_a_failed_restore_is_kept_retried_and_journaled_once(v2: pathlib.Path) -> None:
    from slurmiso.errors import HostLimitError

    broken = {"on": False}

    class Flaky(KernelDisk):
        def write(self, change: CgroupWrite) -> None:
            if broken["on"] and change.path.endswith("cpu.max"):
                raise HostLimitError(f"error writing to {change.path}: device busy")
            super().write(change)

    before = _tree(v2 / "cg")
    soft = HostLimitLevel(cpu_cores=1.0)
    _rung(v2, levels=(soft, LEVEL), writer_for=Flaky).round(_book(), _records(), NOW)
    broken["on"] = True
    for t in (30, 60):  # the monitor moved the job to level 2; the old undo fails twice
        _rung(v2, levels=(soft, LEVEL), writer_for=Flaky).round(_book(level=2), _records(),
                                                               NOW + t)
    rec = load_record(str(v2 / "state"))
    assert [(a.level, a.failed) for a in rec.applied] == [(1, 2)]  # level 2 waits for it
    assert [e["ok"] for e in _journal(v2) if e["event"] == "host-limit-end"] == [False]
    broken["on"] = False
    _rung(v2, levels=(soft, LEVEL), writer_for=Flaky).round([], _records(), NOW + 90)
    assert _tree(v2 / "cg") == before and load_record(str(v2 / "state")).applied == []


def test_a_duplicate_job_dir_in_the_scan_does_not_drop_a_limit_unrestored(
        tmp_path: pathlib.Path) -> None:
    """The scan of Slurm's layout may lose the job (a second job_77 under another uid, an
    unreadable directory): whether the limit's cgroup is gone is decided on the record's own
    directories, so the limit is still undone when its note goes."""
    shutil.copytree(os.path.join(FIX, "v1"), str(tmp_path / "v1"))
    before = _tree(tmp_path / "v1")
    recs = {"77": JobRecord("77", job_class="train", uid=1000)}
    level = (HostLimitLevel(cpu_cores=2.0, cpu_weight=10, io_weight=50),)
    _rung(tmp_path, "v1", level).round(_book("77"), recs, NOW)
    cpu = tmp_path / "v1" / "cpu,cpuacct" / "slurm"
    (cpu / "uid_2000" / "job_77").mkdir(parents=True)
    _rung(tmp_path, "v1", level).round(_book("77"), recs, NOW + 30)  # still in force
    assert (cpu / "uid_1000" / "job_77" / "cpu.cfs_quota_us").read_text() == "200000\n"
    shutil.rmtree(cpu / "uid_2000")
    _rung(tmp_path, "v1", level).round([], recs, NOW + 60)  # the note went: restored
    assert _tree(tmp_path / "v1") == before


def test_an_apply_that_fails_both_ways_is_kept_and_restored(v2: pathlib.Path) -> None:
    """apply_plan's own rollback can fail too: the entry stays, marked done, and later
    rounds put the originals back until that is sure; the note is not applied again."""
    from slurmiso.errors import HostLimitError

    broken = {"writes": 0, "on": True}

    class Failing(KernelDisk):
        def write(self, change: CgroupWrite) -> None:
            broken["writes"] += 1
            if broken["on"] and broken["writes"] > 1:  # the first write lands, no other
                raise HostLimitError(f"error writing to {change.path}: device busy")
            super().write(change)

    before = _tree(v2 / "cg")
    lines = _rung(v2, writer_for=Failing).round(_book(), _records(), NOW)
    assert "not limited" in lines[0]
    assert _tree(v2 / "cg") != before  # the first write is stuck: a partial limit
    assert [a.job for a in load_record(str(v2 / "state")).applied] == ["4242"]
    broken["on"] = False
    lines = _rung(v2, writer_for=Failing).round(_book(), _records(), NOW + 30)
    assert _tree(v2 / "cg") == before and load_record(str(v2 / "state")).applied == []
    assert _rung(v2, writer_for=Failing).round(_book(), _records(), NOW + 60) == []
