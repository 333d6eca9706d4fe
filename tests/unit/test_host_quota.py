"""Host quotas at job start (issue 36 item 5): the config, and the agent writing a training
class's weights and memory high-water mark into its jobs' cgroups, on recorded cgroup trees
(tests/fixtures/host: Slurm's v2 layout, and v1's, where Slurm makes no cpu directory)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
from typing import Any, Dict, List

import pytest
import yaml

from slurmiso.agent.host_quota import plan_quota, quota_round
from slurmiso.config.loader import parse_config
from slurmiso.config.model import HostQuota
from slurmiso.errors import ConfigError
from slurmiso.host.job_cgroups import job_cgroups
from slurmiso.state import Journal
from slurmiso.state.record import JobRecord, RecordStatus
from tests.unit.test_host_rung import ETC, FIX, V2_JOB, WRITES, KernelDisk

NOW = 1_733_460_000.0


def config_with(key: str, **classes: Dict[str, Any]) -> Any:
    """The example config, with ``key:`` (``host``, ``gpu_memory``) given to the named
    classes."""
    with open(ETC, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    for c in data["classes"]:
        if c["name"] in classes:
            c[key] = classes[c["name"]]
    return parse_config(data)


def _config(**classes: Dict[str, Any]) -> Any:
    return config_with("host", **classes)


def test_the_example_gives_training_a_quota_and_nothing_else() -> None:
    quotas = {c.name: c.host for c in _config().classes if c.host.any()}
    assert quotas == {"train": HostQuota(cpu_weight=50, io_weight=50, memory_high_pct=95)}
    assert not HostQuota().any()  # a class without host: is never written


def test_a_training_quota_loads() -> None:
    cfg = _config(train={"cpu_weight": 50, "io_weight": 20, "memory_high": "90%"})
    (train,) = [c for c in cfg.classes if c.name == "train"]
    assert train.host == HostQuota(cpu_weight=50, io_weight=20, memory_high_pct=90)


@pytest.mark.parametrize("cls,host,key,words", [
    ("train", {"cpu_weight": 200}, "host.cpu_weight", "only lowers"),
    ("train", {"io_weight": 0}, "host.io_weight", "1..100"),
    ("train", {"cpu_weight": True}, "host.cpu_weight", "1..100"),
    ("train", {"memory_high": "32G"}, "host.memory_high", "90%"),
    ("train", {"memory_high": 90}, "host.memory_high", "share of the job's memory"),
    ("train", {"cpu_max": 4}, "host.cpu_max", "unknown key"),
    ("infer", {"cpu_weight": 50}, "host", "not preemptible"),
])
def test_quota_nonsense_is_one_clear_error(cls: str, host: Dict[str, Any], key: str,
                                           words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(**{cls: host})
    lines = [p for p in err.value.problems if key + ":" in p]
    assert lines and words in lines[0], err.value.problems


# ------------------------------------------------------------------------- the agent's round
@pytest.fixture()
def v2(tmp_path: pathlib.Path) -> pathlib.Path:
    WRITES.clear()
    shutil.copytree(os.path.join(FIX, "slurm-v2"), str(tmp_path / "cg"), symlinks=True)
    return tmp_path


def _records(cls: str = "train", status: RecordStatus = RecordStatus.READY,
             **more: str) -> Dict[str, JobRecord]:
    out = {"4242": JobRecord("4242", status, job_class=cls)}
    out.update({j: JobRecord(j, RecordStatus.READY, job_class=c) for j, c in more.items()})
    return out


def _round(tmp: pathlib.Path, cfg: Any, records: Any, **kw: Any) -> List[str]:
    return quota_round(cfg, "n1", records, Journal(str(tmp / "journal")), str(tmp / "cg"),
                       writer_for=KernelDisk, now=NOW, **kw)


def _journal(tmp: pathlib.Path) -> List[Dict[str, Any]]:
    path = tmp / "journal"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


QUOTA = {"cpu_weight": 50, "io_weight": 20, "memory_high": "90%"}


def test_a_training_job_gets_its_classes_quota_once(v2: pathlib.Path) -> None:
    job = v2 / "cg" / V2_JOB
    (job / "memory.max").write_text(f"{8 << 30}\n")  # sbatch --mem=8G
    cfg = _config(train=QUOTA)
    lines = _round(v2, cfg, _records())
    assert lines == ["job 4242: host-quota: class train: cpu.weight 100 -> 50; io.weight "
                     "default 100, 8:16 200 -> default 20, 8:16 20; memory.high max -> "
                     f"{(8 << 30) * 90 // 100}"]
    assert (job / "cpu.weight").read_text() == "50\n"
    assert "default 20" in (job / "io.weight").read_text()
    assert "8:16 20" in (job / "io.weight").read_text()  # the device override above it too
    assert (job / "memory.high").read_text() == f"{(8 << 30) * 90 // 100}\n"
    assert (job / "memory.max").read_text() == f"{8 << 30}\n"  # Slurm's, never written
    assert _round(v2, cfg, _records()) == []  # at its quota: nothing written, nothing said
    (event,) = _journal(v2)
    assert (event["event"], event["target"], event["ok"]) == ("host-quota", "4242", True)
    assert event["details"]["knobs"] == ["cpu.weight", "io.weight", "memory.high"]


def test_a_value_come_loose_is_brought_back(v2: pathlib.Path) -> None:
    """A host-rung limit, undone, puts back what it found: if that was above the quota
    (the agent was not running at the job's start), the next round takes it down again."""
    cfg = _config(train={"cpu_weight": 50})
    _round(v2, cfg, _records())
    (v2 / "cg" / V2_JOB / "cpu.weight").write_text("100\n")
    assert _round(v2, cfg, _records()) == ["job 4242: host-quota: class train: cpu.weight "
                                           "100 -> 50"]


def test_a_quota_never_loosens(v2: pathlib.Path) -> None:
    (v2 / "cg" / V2_JOB / "cpu.weight").write_text("10\n")
    assert _round(v2, _config(train={"cpu_weight": 50}), _records()) == []
    assert (v2 / "cg" / V2_JOB / "cpu.weight").read_text() == "10\n"


@pytest.mark.parametrize("records,limited", [
    (_records("infer"), ()),                              # not a class with a quota
    (_records("train", RecordStatus.REFUSED), ()),         # refused: not a training job here
    ({"999": JobRecord("999", RecordStatus.READY, job_class="train")}, ()),  # no such cgroup
    (_records(), ("4242",)),                               # the host rung holds it now
], ids=["other-class", "refused", "no-cgroup", "host-rung-holds-it"])
def test_what_the_quota_leaves_alone(v2: pathlib.Path, records: Any, limited: Any) -> None:
    before = (v2 / "cg" / V2_JOB / "cpu.weight").read_text()
    assert _round(v2, _config(train=QUOTA), records, limited=limited) == []
    assert (v2 / "cg" / V2_JOB / "cpu.weight").read_text() == before and not WRITES


def test_memory_high_needs_the_jobs_memory(v2: pathlib.Path) -> None:
    """No --mem (memory.max is "max"): the share cannot be taken, and only the weight goes."""
    found = job_cgroups(str(v2 / "cg"), "n1", {})
    plan = plan_quota(HostQuota(cpu_weight=50, memory_high_pct=90), found["4242"])
    assert [s.knob for s in plan.steps] == ["cpu.weight"]
    assert any("no memory.max" in why for why in plan.skipped), plan.skipped


def test_on_cgroup_v1_there_is_no_cpu_directory_to_write(tmp_path: pathlib.Path) -> None:
    """Slurm's cgroup/v1 files a job under cpuset, memory, devices and freezer only
    (measured on the sandbox): a tree like it gets nothing written, and says nothing."""
    root = tmp_path / "cg"
    for ctl in ("cpuset", "memory", "devices", "freezer"):
        job = root / ctl / "slurm_n1" / "uid_1000" / "job_77"
        job.mkdir(parents=True)
        (job / "cgroup.procs").write_text("")
    (root / "memory" / "slurm_n1" / "uid_1000" / "job_77" / "memory.limit_in_bytes").write_text(
        f"{8 << 30}\n")
    records = {"77": JobRecord("77", RecordStatus.READY, job_class="train", uid=1000)}
    found = job_cgroups(str(root), "n1", {})
    assert "77" in found and found["77"].v1 is not None and found["77"].v1.cpu is None
    assert quota_round(_config(train=QUOTA), "n1", records, None, str(root),
                       writer_for=KernelDisk) == []


def test_the_agents_restraint_watch_writes_the_quota_beside_the_rung(
        tmp_path: pathlib.Path) -> None:
    """The agent's round: a job of a class with a quota gets it with no restraint at all,
    then a host-limit note tightens further, and its end puts the quota back, not the
    pre-quota value."""
    from slurmiso.agent.restraint_watch import restraint_watch
    from slurmiso.restraints import Note, OnBound, RestraintStep
    from tests.unit.test_host_rung import node1_with_a_training_job

    def edit(data: Dict[str, Any]) -> None:
        data.setdefault("monitor", {}).setdefault("ladder", {})["host_limit"] = {
            "levels": [{"cpu_weight": 20}]}
        for c in data["classes"]:
            if c["name"] == "train":
                c["host"] = {"cpu_weight": 50}

    cfg, root, job = node1_with_a_training_job(
        tmp_path, edit, JobRecord("4242", RecordStatus.READY, job_class="train"))
    note = Note(RestraintStep.HOST_LIMIT, NOW - 60, "node1", 0, "4711", 3600, OnBound.RESUME, 1)

    class Squeue:
        rows: List[str] = []

        def run(self, cmd: str, args: List[str], *a: Any, **k: Any) -> str:
            return "".join(f"{'4242':<40}{'RUNNING':<24}{c}\n" for c in self.rows)

    slurm = Squeue()
    lines = restraint_watch(cfg, "node1", slurm, clock=lambda: NOW, cgroup_root=str(root))
    assert lines == ["job 4242: host-quota: class train: cpu.weight 100 -> 50"]
    slurm.rows = [note.text()]
    lines = restraint_watch(cfg, "node1", slurm, clock=lambda: NOW + 30, cgroup_root=str(root))
    assert lines == ["job 4242: host-limit: host limit level 1 applied"]
    assert (job / "cpu.weight").read_text() == "20"
    slurm.rows = []
    lines = restraint_watch(cfg, "node1", slurm, clock=lambda: NOW + 60, cgroup_root=str(root))
    assert len(lines) == 1 and "restored" in lines[0], lines
    assert (job / "cpu.weight").read_text() == "50"  # the quota, not the 100 before it
    assert restraint_watch(cfg, "node1", slurm, clock=lambda: NOW + 90,
                           cgroup_root=str(root)) == []
