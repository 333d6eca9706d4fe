"""doctor checks, table-driven over a snapshot recorded from the real sandbox (22.05.8).

tests/fixtures/doctor/sandbox-n3.json came from ``slurmiso doctor --node n3 --save-snapshot``
after ``slurmiso qos apply`` on the sandbox (doctor is clean there); each case plants one
misconfiguration in a copy. sandbox-n3-mixed.json was recorded the same way when n3 mixed
3g.40gb and 4g.40gb (the layout slurmctld 22.05 mis-schedules): the mixed-type checks run on it.
"""

from __future__ import annotations

import copy
import json
import os
import re
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Dict, List, Set

import pytest
import yaml

from slurmiso.cli.main import main
from slurmiso.config import parse_config
from slurmiso.config.model import Config
from slurmiso.doctor import Finding, all_checks, run_checks
from slurmiso.doctor.nodes import gres_conf_types
from slurmiso.slurm import slurmconf
from slurmiso_sandbox import layout as L

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(os.path.dirname(HERE), "fixtures", "doctor")
SNAPSHOT = os.path.join(FIXTURES, "sandbox-n3.json")
MIXED_SNAPSHOT = os.path.join(FIXTURES, "sandbox-n3-mixed.json")
ROOT = "/var/lib/slurmiso-sandbox"
#: Findings the sandbox's correct configuration has: none.
KNOWN: Set[str] = set()
#: n3 as it was laid out when sandbox-n3-mixed.json was recorded: GPU 1 holds 4g + 3g.
MIXED_N3 = (L.MigSlot(0, "3g.40gb", 0), L.MigSlot(0, "3g.40gb", 4),
            L.MigSlot(1, "4g.40gb", 0), L.MigSlot(1, "3g.40gb", 4))


def _site(mixed: bool = False) -> L.Site:
    nodes = tuple(replace(n, mig_slots=MIXED_N3) if mixed and n.mig_slots else n
                  for n in L.NODES)
    return L.Site(root=ROOT, host="vm", python="/usr/bin/python3", nodes=nodes)


def sandbox_config(mixed: bool = False) -> Config:
    return parse_config(yaml.safe_load(L.render_slurmiso_yaml(_site(mixed))), "sandbox.yaml")


def recorded(mixed: bool = False) -> Dict[str, Any]:
    with open(MIXED_SNAPSHOT if mixed else SNAPSHOT, encoding="utf-8") as fh:
        return json.load(fh)


def problems(snap: Dict[str, Any], cfg: Config) -> Set[str]:
    return {f.code for f in run_checks(snap, cfg) if f.is_problem}


def qos_row(snap: Dict[str, Any], name: str) -> Dict[str, str]:
    return next(r for r in snap["qos"] if r["Name"] == name)


def conf(key: str, value: str) -> Callable[[Dict[str, Any]], None]:
    return lambda s: s["config"].__setitem__(key, value)


def qos_set(name: str, key: str, value: str) -> Callable[[Dict[str, Any]], None]:
    return lambda s: qos_row(s, name).__setitem__(key, value)


def node_gres(node: str, value: str) -> Callable[[Dict[str, Any]], None]:
    return lambda s: s["nodes"][node].__setitem__("Gres", value)


def _gres_conf_4g_first(s: Dict[str, Any]) -> None:
    lines = s["gres_conf"]["text"].splitlines()
    four = [ln for ln in lines if "Type=4g.40gb" in ln]
    s["gres_conf"]["text"] = "\n".join(four + [ln for ln in lines if ln not in four]) + "\n"


def _migd_gpu_off(s: Dict[str, Any]) -> None:
    gpu = s["gpu_node"]
    gpu.update(node="n4", pool="migd", instances=[])
    gpu["devices"][0]["mig_enabled"] = False
    gpu["devices"][0]["mig_pending"] = False  # off, no change pending (that is its own case)


CASES: List[Any] = [
    ("preempt-cancel", conf("PreemptMode", "CANCEL"), {"preempt-mode"}),
    ("preempt-type", conf("PreemptType", "preempt/partition_prio"), {"preempt-type"}),
    ("job-requeue-0", conf("JobRequeue", "0"), {"job-requeue"}),
    ("enforce-no-qos", conf("AccountingStorageEnforce", "associations,limits"), {"accounting-enforce"}),
    ("enforce-no-limits", conf("AccountingStorageEnforce", "associations,qos"), {"accounting-enforce"}),
    ("tres-no-gpu", conf("AccountingStorageTRES", "cpu,mem,energy,node"), {"accounting-tres"}),
    ("gres-types", conf("GresTypes", "gpu"), {"gres-types"}),
    ("prolog-flags", conf("PrologFlags", "Contain"), {"prolog-flags"}),
    ("prolog-run-in-job", conf("PrologFlags", "Alloc,Contain,RunInJob"), {"prolog-run-in-job"}),
    ("gpu-acct", lambda s: (conf("JobAcctGatherParams", "(null)")(s), s.__setitem__("slurm_version", "23.11.4")), {"gpu-acct"}),
    ("energy-gpu", conf("AcctGatherEnergyType", "acct_gather_energy/gpu"), {"gpu-acct"}),
    ("prolog-unset", conf("Prolog", "(null)"), {"hook-unset"}),
    ("grace-short", qos_set("train", "GraceTime", "00:00:05"), {"qos-grace"}),
    ("infer-no-preempt", qos_set("infer", "Preempt", ""), {"qos-preempt"}),
    ("train-mode-cancel", qos_set("train", "PreemptMode", "cancel"), {"qos-preempt-mode"}),
    ("limit-differs", qos_set("infer", "MaxWall", "02:00:00"), {"qos-differs"}),
    ("qos-missing", lambda s: s.__setitem__("qos", [r for r in s["qos"] if r["Name"] != "debug"]), {"qos-missing"}),
    ("partition-missing", lambda s: s["partitions"].pop("mig"), {"partition-missing"}),
    ("partition-nodes", lambda s: s["partitions"]["gpu"].__setitem__("Nodes", "n[1-2]"), {"partition-nodes"}),
    ("partition-cancel", lambda s: s["partitions"]["gpu"].__setitem__("PreemptMode", "CANCEL"), {"preempt-mode"}),
    ("mps-count", node_gres("n2", "gpu:h100:2,mps:100"), {"gres-layout", "gres-conf-count"}),
    ("mig-types-wrong", node_gres("n3", "gpu:4g.40gb:3"), {"gres-layout", "gres-mig-live", "gres-conf-order", "gres-conf-count"}),
    ("mig-count-wrong", node_gres("n3", "gpu:3g.40gb:4"), {"gres-layout", "gres-mig-live", "gres-conf-count"}),
    ("mig-instance-gone", lambda s: s["gpu_node"]["instances"].pop(), {"gres-mig-live"}),
    ("hook-missing", lambda s: s["hooks"]["Prolog"].update(exists=False, executable=False), {"hook-missing"}),
    ("no-proctrack-cgroup", conf("ProctrackType", "proctrack/linuxproc"), {"proctrack"}),
    ("no-task-cgroup", conf("TaskPlugin", "task/affinity"), {"task-cgroup"}),
    ("no-constrain-devices", conf("ConstrainDevices", "no"), {"constrain-devices"}),
    ("no-fence-plugin", lambda s: s["plugstack"].update(text="required /x/slurmiso.so classes=infer\n"), {"fence-plugin"}),
    ("cgroup-v2-no-bpf", lambda s: (conf("CgroupPlugin", "cgroup/v2")(s), s.__setitem__("fence_kernel", {"cgroup2": "/sys/fs/cgroup", "bpf_device": False, "detail": "no cgroup device programs"})), {"fence-cgroup-v2"}),
    ("hook-not-exec", lambda s: [f.update(executable=False) for f in [s["hooks"]["TaskProlog"], *s["hooks"]["TaskProlog"].get("files", [])]], {"hook-not-executable"}),
    ("migd-mig-off", _migd_gpu_off, {"mig-mode"}),
]


#: Plants that need a node mixing MIG types: on sandbox-n3-mixed.json, whose own finding is
#: mig-mixed-gpu.
MIXED_CASES: List[Any] = [
    ("mig-type-order", node_gres("n3", "gpu:4g.40gb:1,gpu:3g.40gb:3"), {"gres-order", "gres-mig-order", "gres-conf-order"}),
    ("gres-conf-order", _gres_conf_4g_first, {"gres-conf-order"}),
]
MIXED_KNOWN = {"mig-mixed-gpu"}


def test_recorded_sandbox_is_clean() -> None:
    assert problems(recorded(), sandbox_config()) == KNOWN and not KNOWN


def test_recorded_mixed_node_has_only_the_mixed_type_finding() -> None:
    assert problems(recorded(True), sandbox_config(True)) == MIXED_KNOWN
    assert problems(recorded(True), sandbox_config()) >= {"gres-layout", "mig-mixed-gpu"}


@pytest.mark.parametrize("name,plant,codes", MIXED_CASES, ids=[c[0] for c in MIXED_CASES])
def test_planted_mixed_type_misconfiguration_is_found(name: str, plant: Any,
                                                      codes: Set[str]) -> None:
    snap = copy.deepcopy(recorded(True))
    plant(snap)
    assert problems(snap, sandbox_config(True)) - MIXED_KNOWN == codes


@pytest.mark.parametrize("name,plant,codes", CASES, ids=[c[0] for c in CASES])
def test_planted_misconfiguration_is_found(name: str, plant: Any, codes: Set[str]) -> None:
    snap = copy.deepcopy(recorded())
    plant(snap)
    found = run_checks(snap, sandbox_config())
    assert problems(snap, sandbox_config()) - KNOWN == codes, [f.message for f in found]
    for f in found:
        assert f.fix and f.message and f.severity in ("error", "warning", "info")


def test_every_problem_code_has_a_case() -> None:
    """Each error/warning code the checks can emit is planted here, in test_doctor_planted.py
    or in test_qos.py."""
    from slurmiso.doctor import cluster, nodes
    from tests.unit.test_doctor_planted import codes_planted

    source = Path(cluster.__file__).read_text() + Path(nodes.__file__).read_text()
    codes = set(re.findall(r'Finding\(\s*"(?:error|warning)", "([a-z-]+)"', source))
    codes |= set(re.findall(r'"error", "([a-z-]+)" if', source))
    codes |= {"gres-order", "gres-layout", "gres-mig-order", "gres-mig-live"}  # computed codes
    planted = set().union(*(c[2] for c in CASES + MIXED_CASES)) | MIXED_KNOWN | codes_planted()
    elsewhere = {"qos-grant", "qos-account", "qos-unread"}  # test_qos.py
    elsewhere |= {"hook-not-slurmiso"}  # test_install.py
    elsewhere |= {"slo-unresolvable"}  # test_slo_share.py
    assert len(all_checks()) >= 8
    assert codes - planted - elsewhere == set()


def test_autodetect_gres_conf_silences_the_mixed_type_warning() -> None:
    snap = recorded(True)
    snap["gres_conf"]["text"] = "AutoDetect=nvml\n"
    assert problems(snap, sandbox_config(True)) == set()


def test_off_a_gpu_node_the_layout_still_shows_mixing_and_hooks_are_not_checked() -> None:
    snap = recorded(True)
    snap["gpu_node"] = None
    snap["hooks"]["Prolog"]["exists"] = False  # not judged off a GPU node
    found = run_checks(snap, sandbox_config(True))
    assert {f.code for f in found if f.is_problem} == MIXED_KNOWN
    assert "hooks-unchecked" in {f.code for f in found if f.severity == "info"}
    assert "layout sandbox-migs" in next(f.message for f in found if f.code == "mig-mixed-gpu")


def test_submit_layers_are_info_only() -> None:
    snap = recorded()
    snap["config"]["JobSubmitPlugins"] = "(null)"
    snap["plugstack"] = {"path": "/etc/slurm/plugstack.conf", "exists": False, "text": ""}
    found = run_checks(snap, sandbox_config())
    infos = {f.code for f in found if f.severity == "info"}
    assert {"job-submit", "plugstack"} <= infos
    # ... but without plugstack.conf the device fence is gone too, and that is an error
    assert problems(snap, sandbox_config()) == KNOWN | {"fence-plugin"}


def test_generated_settings_are_what_the_sandbox_runs() -> None:
    """gen slurm-conf and doctor share one table; the sandbox satisfies it."""
    live = recorded()["config"]
    for s in slurmconf.required_settings(sandbox_config(), prefix=ROOT + "/bin"):
        if s.key == "JobSubmitPlugins":
            continue  # wired by the job_submit work; recorded before it was
        have = {v.strip().lower() for v in live[s.key].split(",")}
        assert {v.lower() for v in s.value.split(",")} <= have, s.key


def test_gres_conf_types_by_node() -> None:
    text = ("NodeName=n[3-4] Name=gpu Type=3g.40gb MultipleFiles=/dev/nvidia0,a,b\n"
            "# NodeName=n3 Name=gpu Type=1g.10gb\n"
            "Name=gpu Type=4g.40gb MultipleFiles=/dev/nvidia1,c,d\n"
            "NodeName=n5 Name=gpu Type=a100 File=/dev/nvidia0\n")
    assert gres_conf_types(text, "n3") == ["3g.40gb", "4g.40gb"]
    assert gres_conf_types(text, "n5") == ["4g.40gb", "a100"]


# ------------------------------------------------------------------------------- CLI
def _write(tmp: Any, snap: Dict[str, Any]) -> str:
    path = os.path.join(str(tmp), "snap.json")
    with open(path, "w") as fh:
        json.dump(snap, fh)
    return path


@pytest.fixture
def sandbox_yaml(tmp_path: Any) -> str:
    path = tmp_path / "slurmiso.yaml"
    path.write_text(L.render_slurmiso_yaml(_site()))
    return str(path)


def test_cli_snapshot_exit_codes_and_json(tmp_path: Any, sandbox_yaml: str, capsys: Any) -> None:
    assert main(["-c", sandbox_yaml, "doctor", "--snapshot", _write(tmp_path, recorded())]) == 0
    assert "no problems found" in capsys.readouterr().out
    mixed_yaml = tmp_path / "mixed.yaml"
    mixed_yaml.write_text(L.render_slurmiso_yaml(_site(mixed=True)))
    path = _write(tmp_path, recorded(mixed=True))
    assert main(["-c", str(mixed_yaml), "doctor", "--snapshot", path]) == 1
    assert "mig-mixed-gpu" in capsys.readouterr().out
    assert main(["-c", str(mixed_yaml), "doctor", "--snapshot", path,
                 "--ignore", "mig-mixed-gpu"]) == 0
    assert "no problems found" in capsys.readouterr().out
    snap = recorded()
    snap["config"]["PreemptMode"] = "CANCEL"
    path = _write(tmp_path, snap)
    assert main(["-c", sandbox_yaml, "doctor", "--snapshot", path, "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is False and data["node"] == "n3"
    f = next(f for f in data["findings"] if f["code"] == "preempt-mode")
    assert set(f) == {"severity", "code", "message", "fix", "subjects", "count"}  # audit's shape
    assert "CANCEL" in f["message"]


def test_cli_bad_snapshot_is_a_usage_error(tmp_path: Any, sandbox_yaml: str, capsys: Any) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main(["-c", sandbox_yaml, "doctor", "--snapshot", str(bad)]) == 2
    assert "not valid JSON" in capsys.readouterr().err


def test_cli_slurm_unreachable_exits_5(tmp_path: Any, sandbox_yaml: str, capsys: Any,
                                      monkeypatch: Any) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "scontrol"
    fake.write_text("#!/bin/sh\necho 'slurm_load_ctl_conf error: Unable to contact slurm controller (connect failure)' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SLURMISO_SLURM_BIN", str(bindir))
    assert main(["-c", sandbox_yaml, "doctor"]) == 5
    err = capsys.readouterr().err
    assert "Unable to contact slurm controller" in err and "scontrol ping" in err


def test_finding_problem_flag() -> None:
    assert Finding("warning", "x", "m", "f").is_problem
    assert not Finding("info", "x", "m", "f").is_problem


def test_mixed_types_across_gpus_of_one_node_are_flagged_too() -> None:
    """Measured: 3g.40gb on GPU 0 and 4g.40gb on GPU 1 fail like a mixed GPU does."""
    from slurmiso.config import parse_config
    from slurmiso.doctor.nodes import check_mig_mixed

    data = {
        "version": 1,
        "classes": [{"name": "c", "match": {"qos": ["c"]}, "isolation": "mig",
                     "mig_profile": "3g.40gb"}],
        "pools": [{"name": "m", "nodes": "g1", "partition": "m", "gpu_model": "H100-80GB",
                   "gpus_per_node": 2, "mode": "mig-static", "mig_layout": "split"}],
        "mig_layouts": {"version": "v1", "mig-configs": {"split": [
            {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
            {"devices": [1], "mig-enabled": True, "mig-devices": {"4g.40gb": 1}},
        ]}},
    }
    cfg = parse_config(data)
    found = check_mig_mixed({}, cfg)
    assert [f.code for f in found] == ["mig-mixed-gpu"] and "3g.40gb, 4g.40gb" in found[0].message
    data["mig_layouts"]["mig-configs"]["split"][1]["mig-devices"] = {"3g.40gb": 2}
    assert check_mig_mixed({}, parse_config(data)) == []


def test_mixed_mig_types_warn_only_where_the_release_mis_schedules_them() -> None:
    """22.05.8 gives the second MIG type no device; 24.11.5 and 26.05.5 schedule it
    (tests/integration/test_isolation.py::test_mig_static_second_type_is_scheduled)."""
    for version, warned in (("22.05.8", True), ("23.11.4", True), ("24.11.5", False),
                            ("26.05.5", False)):
        snap = copy.deepcopy(recorded(True))
        snap["slurm_version"] = version
        assert ("mig-mixed-gpu" in problems(snap, sandbox_config(True))) is warned, version


def test_cgroup_v2_fence_is_fine_where_the_kernel_loads_bpf_device_programs() -> None:
    """The v2 fence exists now (spank/slurmiso_bpf.h): cgroup/v2 alone is no finding; a kernel
    that refuses BPF device programs is (planted above), and an unmeasured one is info."""
    snap = recorded()
    snap["config"]["CgroupPlugin"] = "cgroup/v2"
    snap["fence_kernel"] = {"cgroup2": "/sys/fs/cgroup", "bpf_device": True, "detail": "ok"}
    assert "fence-cgroup-v2" not in {f.code for f in run_checks(snap, sandbox_config())}
    snap["fence_kernel"] = {"cgroup2": None, "bpf_device": None, "detail": "not root"}
    found = [f for f in run_checks(snap, sandbox_config()) if f.code == "fence-cgroup-v2"]
    assert [f.severity for f in found] == ["info"] and "not root" in found[0].message
    snap.pop("fence_kernel")  # a snapshot taken before the fact was collected
    assert problems(snap, sandbox_config()) == KNOWN
    snap["fence_kernel"] = {"cgroup2": "/sys/fs/cgroup", "bpf_device": False, "detail": "x"}
    err = next(f for f in run_checks(snap, sandbox_config()) if f.code == "fence-cgroup-v2")
    assert err.severity == "error" and "migd" in err.message and "CONFIG_CGROUP_BPF" in err.fix


def _v2(jobs: List[Dict[str, Any]], **top: Any) -> Dict[str, Any]:
    snap = recorded()
    snap["config"]["CgroupPlugin"] = "cgroup/v2"
    snap["fence_kernel"] = {"cgroup2": "/sys/fs/cgroup", "bpf_device": True, "detail": "ok"}
    snap["cgroup_v2"] = {"mount": "/sys/fs/cgroup", "unified": True, "hybrid_proc": False,
                         "scopes": ["/sys/fs/cgroup/system.slice/n4_slurmstepd.scope"],
                         "jobs": jobs, "error": "", **top}
    return snap


SLURM, FENCE = "Slurm_Cgroup_v2", "slurmiso_fence"
MIGD_JOB = {"dir": "s42DM918PDCP00", "job": "2605001", "own": [SLURM], "flags": 1, "deny": 1080,
            "narrow": 0, "tasks": [{"path": "step_batch/user/task_0",
                                     "effective": [SLURM, FENCE], "procs": 2},
                                    # measured: Slurm makes task_special, empty, unfenced
                                    {"path": "step_batch/user/task_special",
                                     "effective": [SLURM], "procs": 0}]}
EXCL_JOB = {"dir": "job_2411003", "job": "2411003", "own": [SLURM], "flags": 1, "deny": 0,
            "narrow": 0, "tasks": [{"path": "step_0/user/task_0", "effective": [SLURM]}]}


def _codes(snap: Dict[str, Any]) -> Dict[str, str]:
    return {f.code: f.severity for f in run_checks(snap, sandbox_config())
            if f.code.startswith("cgroup-v2")}


def test_cgroup_v2_fences_in_place_is_one_info_line() -> None:
    """What the 26.05 sandbox on cgroup v2 measured: Slurm's program on each job cgroup
    (ALLOW_OVERRIDE), slurmiso's in effect beside it on a mig-dynamic job's task."""
    snap = _v2([copy.deepcopy(MIGD_JOB), copy.deepcopy(EXCL_JOB)])
    info = [f for f in run_checks(snap, sandbox_config()) if f.code == "cgroup-v2-fences"]
    assert _codes(snap) == {"cgroup-v2-fences": "info"}
    assert "2 running job(s), 2 task(s)" in info[0].message and "1 task(s)" in info[0].message


@pytest.mark.parametrize("plant, code", [
    (lambda s: s["cgroup_v2"].update(unified=False), "cgroup-v2-hierarchy"),
    (lambda s: s["cgroup_v2"].update(hybrid_proc=True), "cgroup-v2-hierarchy"),
    (lambda s: s["cgroup_v2"]["jobs"][1].update(own=[]), "cgroup-v2-device-constraint"),
    (lambda s: s["cgroup_v2"]["jobs"][0]["tasks"][0].update(effective=[SLURM]),
     "cgroup-v2-fence-missing"),
    (lambda s: s["cgroup_v2"]["jobs"][0]["tasks"][0].update(effective=[FENCE]),
     "cgroup-v2-slurm-fence-replaced"),
    (lambda s: s["cgroup_v2"]["jobs"][0]["tasks"][1].update(procs=1),
     "cgroup-v2-fence-missing"),
], ids=["not-unified", "hybrid-proc", "no-constrain", "no-fence", "slurm-replaced",
        "task-special-runs-unfenced"])
def test_cgroup_v2_fence_problems(plant: Callable[[Dict[str, Any]], Any], code: str) -> None:
    snap = _v2([copy.deepcopy(MIGD_JOB), copy.deepcopy(EXCL_JOB)])
    plant(snap)
    assert _codes(snap) == {code: "error"}


def test_cgroup_v2_fences_not_checked_off_root_or_on_v1() -> None:
    snap = _v2([])
    snap["cgroup_v2"] = {"error": "not root: the device programs of job cgroups are root's"}
    assert _codes(snap) == {"cgroup-v2-fences": "info"}
    snap = _v2([copy.deepcopy(MIGD_JOB)])
    snap["config"]["CgroupPlugin"] = "cgroup/v1"
    assert _codes(snap) == {}
    snap = _v2([])
    assert "no job runs here" in next(f.message for f in run_checks(snap, sandbox_config())
                                      if f.code == "cgroup-v2-fences")
