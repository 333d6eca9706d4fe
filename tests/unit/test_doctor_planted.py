"""Misconfigurations planted in the recorded sandbox snapshot, one small mutation each, of the
kinds a real site gets wrong and doctor must still catch (issue 22: held-out testers planted
14, doctor missed one). Each must be reported with its check's code and a fix naming what to
change; the unmutated snapshot, and spellings Slurm reads the same, must stay clean.

The table is about config an admin can get wrong yet looks right at a glance: a plugstack line
commented out or ``optional``, a hook pointing at another script, gres.conf MIG lines without
their capability files, timeouts too short for the hooks' own bounded waits, and so on.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Dict, List, Set, Tuple

import pytest

from slurmiso.doctor import Finding, run_checks
from tests.unit.test_doctor import recorded, sandbox_config

Snap = Dict[str, Any]
Plant = Callable[[Snap], None]
ROOT = "/var/lib/slurmiso-sandbox"
FENCE = f"{ROOT}/lib/slurmiso_fence.so"
FENCE_LINE = f"required {FENCE} state_dir={ROOT}/state/%n gpu_majors=195,237,238"


def conf(key: str, value: str) -> Plant:
    return lambda s: s["config"].__setitem__(key, value)


def both(*plants: Plant) -> Plant:
    def run(s: Snap) -> None:
        for p in plants:
            p(s)
    return run


def plugstack_sub(old: str, new: str) -> Plant:
    def run(s: Snap) -> None:
        text = s["plugstack"]["text"]
        assert old in text, old
        s["plugstack"]["text"] = text.replace(old, new)
    return run


def plugstack_set(**kw: Any) -> Plant:
    return lambda s: s["plugstack"].update(kw)


def gres_sub(old: str, new: str, count: int = 0) -> Plant:
    def run(s: Snap) -> None:
        text = s["gres_conf"]["text"]
        assert old in text, old
        s["gres_conf"]["text"] = text.replace(old, new, count or -1)
    return run


def gres_lines(keep: Callable[[str], bool]) -> Plant:
    def run(s: Snap) -> None:
        lines = s["gres_conf"]["text"].splitlines()
        s["gres_conf"]["text"] = "\n".join(ln for ln in lines if keep(ln)) + "\n"
    return run


def qos_set(name: str, key: str, value: str) -> Plant:
    return lambda s: next(r for r in s["qos"] if r["Name"] == name).__setitem__(key, value)


def _n3_caps_dropped(s: Snap) -> None:
    """n3's MIG lines name only /dev/nvidiaN: the GI/CI caps are left out."""
    out = []
    for ln in s["gres_conf"]["text"].splitlines():
        if "NodeName=n3" in ln and "MultipleFiles=" in ln:
            head, files = ln.split("MultipleFiles=")
            ln = head + "MultipleFiles=" + files.split(",")[0]
        out.append(ln)
    s["gres_conf"]["text"] = "\n".join(out) + "\n"


def _n3_file_not_multiple(s: Snap) -> None:
    """The admin wrote File= (the whole-GPU form) for the MIG lines."""
    out = []
    for ln in s["gres_conf"]["text"].splitlines():
        if "NodeName=n3" in ln and "MultipleFiles=" in ln:
            head, files = ln.split("MultipleFiles=")
            ln = head + "File=" + files.split(",")[0]
        out.append(ln)
    s["gres_conf"]["text"] = "\n".join(out) + "\n"


def _fence_in_unread_include(s: Snap) -> None:
    """The fence line moved to plugstack.conf.d/, but the include's glob matches only *.conf
    and the file is slurmiso.conf.rpmnew: nothing included holds the fence."""
    pattern = f"{ROOT}/etc/plugstack.conf.d/*.conf"
    s["plugstack"]["text"] = (s["plugstack"]["text"].replace(FENCE_LINE, "")
                              + f"include {pattern}\n")
    s["plugstack"]["includes"] = {pattern: {f"{ROOT}/etc/plugstack.conf.d/site.conf":
                                            "required /usr/lib/slurm/site_x11.so\n"}}


def _fence_file_missing(s: Snap) -> None:
    s["plugstack"]["plugins"] = {FENCE: {"resolved": FENCE, "exists": False},
                                 f"{ROOT}/lib/slurmiso.so": {"resolved": f"{ROOT}/lib/slurmiso.so",
                                                             "exists": True}}


def _prolog_elsewhere(s: Snap) -> None:
    """Prolog= names the site's own script (slurmiso's is installed but not what runs)."""
    s["config"]["Prolog"] = "/etc/slurm/prolog.sh"
    s["hooks"]["Prolog"] = {"path": "/etc/slurm/prolog.sh", "glob": False, "exists": True,
                            "executable": True,
                            "files": [{"path": "/etc/slurm/prolog.sh", "exists": True,
                                       "executable": True, "realpath": "/etc/slurm/prolog.sh"}]}


def _hooks_swapped(s: Snap) -> None:
    s["config"]["Prolog"], s["config"]["Epilog"] = s["config"]["Epilog"], s["config"]["Prolog"]


#: (name, plant, code that must be reported, a word the fix must contain, missed before)
CASES: List[Tuple[str, Plant, str, str, bool]] = [
    # (a) plugstack.conf: the fence must be loaded, and loaded fail-closed
    ("fence-commented-out", plugstack_sub(FENCE_LINE, "# " + FENCE_LINE), "fence-plugin",
     "required", True),
    ("fence-optional", plugstack_sub(FENCE_LINE, FENCE_LINE.replace("required", "optional")),
     "fence-plugin", "required", True),
    ("fence-keyword-capitalised", plugstack_sub(FENCE_LINE, "Required" + FENCE_LINE[8:]),
     "fence-plugin", "required", True),
    ("fence-only-in-a-comment",
     both(plugstack_sub(FENCE_LINE, ""),
          plugstack_sub("classes=infer,train,debug", "classes=infer,train,debug  # + "
                        "slurmiso_fence.so")), "fence-plugin", "slurmiso gen plugstack", True),
    ("fence-path-renamed", plugstack_sub(FENCE, FENCE + ".disabled"), "fence-plugin",
     "slurmiso_fence.so", True),
    ("fence-file-missing", _fence_file_missing, "fence-plugin", "install", True),
    ("fence-in-unmatched-include", _fence_in_unread_include, "fence-plugin",
     "slurmiso gen plugstack", False),  # was a warning ("or an included file does")
    ("plugstack-missing", plugstack_set(exists=False), "fence-plugin", "slurmiso gen plugstack",
     True),
    ("plugstack-other-file", conf("PlugStackConfig", "/etc/slurm/plugstack-new.conf"),
     "fence-plugin", "doctor", True),
    ("fence-state-dir-default",
     plugstack_sub(f"state_dir={ROOT}/state/%n", "state_dir=/run/slurmiso"), "fence-state-dir",
     f"state_dir={ROOT}/state/%n", True),
    ("fence-no-state-dir", plugstack_sub(f" state_dir={ROOT}/state/%n", ""), "fence-state-dir",
     "state_dir=", True),
    # (b) the hooks slurm.conf runs, and when
    ("prolog-site-script", _prolog_elsewhere, "hook-not-slurmiso", "slurmiso-prolog", True),
    ("prolog-epilog-swapped", _hooks_swapped, "hook-not-slurmiso", "slurmiso gen slurm-conf",
     True),
    ("taskprolog-is-prolog", conf("TaskProlog", f"{ROOT}/bin/slurmiso-prolog"),
     "hook-not-slurmiso", "slurmiso-task-prolog", True),
    ("prolog-path-moved", conf("Prolog", "/opt/slurmiso/bin/slurmiso-prolog"), "hook-unchecked",
     "doctor", True),
    ("slurmd-user-not-root", conf("SlurmdUser", "slurm(64030)"), "slurmd-user", "SlurmdUser=",
     True),
    ("prep-plugins-no-script", conf("PrEpPlugins", "prep/site_audit"), "prep-plugins",
     "prep/script", True),
    ("prolog-flags-contain-only", conf("PrologFlags", "Contain"), "prolog-flags", "Alloc", False),
    ("prolog-flags-none", conf("PrologFlags", "(null)"), "prolog-flags", "Alloc", False),
    ("prolog-flags-run-in-job", conf("PrologFlags", "Alloc,Contain,RunInJob"), "prolog-run-in-job",
     "RunInJob", True),
    # (c) spellings: a raw config file read with another case, spacing or comments
    ("gres-conf-lowercase-spaced-file-only",
     both(_n3_file_not_multiple, lambda s: s["gres_conf"].__setitem__(
         "text", s["gres_conf"]["text"].replace("NodeName=n3 Name=gpu Type=",
                                                "nodename = n3  name=gpu type = "))),
     "gres-conf-mig-caps", "MultipleFiles", True),
    ("gres-conf-autodetect-commented",
     both(gres_sub("# Generated", "#AutoDetect=nvml\n# Generated", 1), _n3_caps_dropped),
     "gres-conf-mig-caps", "MultipleFiles", True),
    ("constrain-devices-off-case", conf("ConstrainDevices", "No"), "constrain-devices",
     "cgroup-conf", False),
    # (d) gres.conf against the node and its GPUs
    ("gres-conf-mig-caps-dropped", _n3_caps_dropped, "gres-conf-mig-caps", "MultipleFiles",
     True),
    ("gres-conf-mig-file-not-multiple", _n3_file_not_multiple, "gres-conf-mig-caps",
     "MultipleFiles", True),
    ("gres-conf-mig-cap-shared", gres_sub("nvidia-cap12,", "nvidia-cap10,"),
     "gres-conf-mig-caps", "gen gres-conf", True),
    ("gres-conf-same-gpu-twice", gres_sub("dev/n1/nvidia1", "dev/n1/nvidia0"),
     "gres-conf-devices", "File=", True),
    ("gres-conf-gpu-without-file",
     gres_sub(f"Type=a100 File={ROOT}/dev/n1/nvidia1", "Type=a100 Count=1"),
     "gres-conf-devices", "File=", True),
    ("gres-conf-live-gpu-unlisted",
     gres_lines(lambda ln: not ("NodeName=n3" in ln and "n3/nvidia1," in ln)),
     "gres-conf-devices", "gen gres-conf", True),
    ("gres-conf-mps-count", gres_sub("Name=mps Count=100", "Name=mps Count=50"),
     "gres-conf-count", "mps:200", True),
    ("gres-conf-type-differs", gres_sub("NodeName=n5 Name=gpu Type=a100",
                                        "NodeName=n5 Name=gpu Type=a10"),
     "gres-conf-count", "gres.conf", True),
    ("gres-conf-node-absent", gres_lines(lambda ln: "NodeName=n4" not in ln),
     "gres-conf-count", "gres.conf", True),
    ("gres-conf-unread", lambda s: s["gres_conf"].__setitem__("text", None),
     "gres-conf-missing", "gen gres-conf", True),
    # (e) QoS and preemption
    ("train-preempts-infer", qos_set("train", "Preempt", "infer"), "qos-preempt", "qos apply",
     False),  # was a qos-differs warning: training preempting serving is no mere difference
    ("train-grace-zero", qos_set("train", "GraceTime", "00:00:00"), "qos-grace", "qos apply",
     False),
    ("train-not-requeued", qos_set("train", "PreemptMode", "cluster"), "qos-preempt-mode",
     "qos apply", False),
    ("infer-preempts-nothing", qos_set("infer", "Preempt", "debug"), "qos-preempt", "qos apply",
     False),
    ("cluster-preempt-cancel", conf("PreemptMode", "CANCEL"), "preempt-mode", "REQUEUE", False),
    ("qos-grace-unparsable", qos_set("train", "GraceTime", "30s"), "qos-unread", "sacctmgr",
     True),  # doctor crashed: no report at all
    # (f) accounting and requeue
    ("job-requeue-0", conf("JobRequeue", "0"), "job-requeue", "JobRequeue=1", False),
    ("preempt-partition-prio", conf("PreemptType", "preempt/partition_prio"), "preempt-type",
     "preempt/qos", False),
    ("enforce-safe-no-qos", conf("AccountingStorageEnforce", "associations,limits,safe"),
     "accounting-enforce", "qos", False),
    ("accounting-storage-none", conf("AccountingStorageType", "accounting_storage/none"),
     "accounting-storage", "accounting_storage/slurmdbd", True),
    # (g) timeouts against what the hooks and GPUs need
    ("prolog-epilog-timeout-10s", conf("PrologEpilogTimeout", "10"), "prolog-timeout",
     "PrologEpilogTimeout=", True),
    ("unkillable-step-20s", conf("UnkillableStepTimeout", "20 sec"), "unkillable-timeout",
     "UnkillableStepTimeout=", True),
    # (h) partitions and nodes
    ("pool-partition-down", lambda s: s["partitions"]["mig"].__setitem__("State", "DOWN"),
     "partition-state", "State=UP", True),
    ("pool-node-undefined", lambda s: s["nodes"].pop("n5"), "node-missing", "NodeName=n5",
     True),
    ("mig-pending-off", lambda s: s["gpu_node"]["devices"][1].__setitem__("mig_pending", False),
     "mig-mode-pending", "-mig", True),
    ("pool-node-inval", lambda s: s["nodes"]["n2"].__setitem__("State", "IDLE+INVALID_REG"),
     "node-inval", "slurmd", True),
]


def problems(snap: Snap) -> List[Finding]:
    return [f for f in run_checks(snap, sandbox_config()) if f.is_problem]


@pytest.mark.parametrize("name,plant,code,fix_word,missed", CASES, ids=[c[0] for c in CASES])
def test_planted_case_is_found_with_its_fix(name: str, plant: Plant, code: str, fix_word: str,
                                            missed: bool) -> None:
    snap = copy.deepcopy(recorded())
    plant(snap)
    found = problems(snap)
    hits = [f for f in found if f.code == code]
    assert hits, (name, [(f.code, f.message) for f in found])
    for f in hits:
        assert f.message and "\n" not in f.message and fix_word in f.fix, (f.message, f.fix)


def test_the_table_is_wide() -> None:
    assert len(CASES) >= 20 and len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("mixed", [False, True])
def test_unmutated_snapshots_have_no_error(mixed: bool) -> None:
    snap = recorded(mixed)
    errors = [f for f in run_checks(snap, sandbox_config(mixed)) if f.severity == "error"]
    assert errors == []
    if not mixed:
        assert problems(snap) == []


#: Spellings Slurm reads as the fixture's own values: no finding may appear.
SAME_AS_FIXTURE: List[Tuple[str, Plant]] = [
    ("constrain-devices-Yes", conf("ConstrainDevices", "Yes")),
    ("preempt-mode-lower", conf("PreemptMode", "requeue")),
    ("task-plugin-order", conf("TaskPlugin", "task/affinity,task/cgroup")),
    ("enforce-all", conf("AccountingStorageEnforce", "all")),
    ("prolog-epilog-timeout-unset", conf("PrologEpilogTimeout", "65534")),
    ("plugstack-tabs-and-comment",
     plugstack_sub(FENCE_LINE, FENCE_LINE.replace(" ", "\t", 1) + "   # the fence")),
    ("plugstack-fence-via-include",
     lambda s: (plugstack_sub(FENCE_LINE, f"include {ROOT}/etc/plugstack.conf.d/*.conf")(s),
                s["plugstack"].__setitem__("includes", {
                    f"{ROOT}/etc/plugstack.conf.d/*.conf": {
                        f"{ROOT}/etc/plugstack.conf.d/fence.conf": FENCE_LINE + "\n"}}))),
    ("plugstack-relative-include",
     lambda s: (plugstack_sub(FENCE_LINE, "include plugstack.conf.d/*.conf")(s),
                s["plugstack"].__setitem__("includes", {
                    f"{ROOT}/etc/plugstack.conf.d/*.conf": {
                        f"{ROOT}/etc/plugstack.conf.d/fence.conf": FENCE_LINE + "\n"}}))),
    ("gres-conf-lowercase-spaced",
     lambda s: s["gres_conf"].__setitem__("text", s["gres_conf"]["text"].replace(
         "NodeName=n3 Name=gpu Type=", "nodename = n3  name=gpu  type=").replace(
         "Name=mps Count=100", "Name=mps  count = 100  # per GPU"))),
    ("prolog-symlinked", lambda s: (
        s["config"].__setitem__("Prolog", "/etc/slurm/prolog"),
        s["hooks"].__setitem__("Prolog", {
            "path": "/etc/slurm/prolog", "glob": False, "exists": True, "executable": True,
            "files": [{"path": "/etc/slurm/prolog", "exists": True, "executable": True,
                       "realpath": f"{ROOT}/bin/slurmiso-prolog"}]}))),
    ("qos-case", qos_set("train", "PreemptMode", "REQUEUE")),
    ("prolog-second-of-two", lambda s: (s["config"].update({  # 24.11+: each Prolog line
        "Prolog": "/etc/slurm/site.sh", "Prolog[0]": "/etc/slurm/site.sh",
        "Prolog[1]": f"{ROOT}/bin/slurmiso-prolog"}),
        s["hooks"]["Prolog"].update(path="/etc/slurm/site.sh"))),
]


@pytest.mark.parametrize("name,plant", SAME_AS_FIXTURE, ids=[c[0] for c in SAME_AS_FIXTURE])
def test_equivalent_spelling_is_no_finding(name: str, plant: Plant) -> None:
    snap = copy.deepcopy(recorded())
    plant(snap)
    assert [(f.code, f.message) for f in problems(snap)] == []


def test_snapshots_without_the_new_facts_keep_their_old_verdicts() -> None:
    """A snapshot recorded before doctor followed includes: an include line is a warning
    (the fence may be in a file it did not read), not an error."""
    snap = copy.deepcopy(recorded())
    plugstack_sub(FENCE_LINE, f"include {ROOT}/etc/plugstack.conf.d/*.conf")(snap)
    found = [f for f in problems(snap) if f.code == "fence-plugin"]
    assert [f.severity for f in found] == ["warning"]


def test_kill_wait_shorter_than_the_grace_a_relayout_requeue_needs() -> None:
    """A MIG re-layout that requeues training (scontrol requeue: SIGTERM, KillWait, SIGKILL)
    needs KillWait >= the checkpoint grace; the sandbox's 5 s only matters with it."""
    from slurmiso.config.model import Relayout
    from slurmiso.values import replace

    cfg = sandbox_config()
    monitor = replace(cfg.monitor, relayout=Relayout(drain="preempt-training"))
    relayout_cfg = replace(cfg, monitor=monitor)
    found = [f for f in run_checks(recorded(), relayout_cfg) if f.code == "kill-wait"]
    assert [f.severity for f in found] == ["warning"] and "KillWait=30" in found[0].fix
    assert "kill-wait" not in {f.code for f in run_checks(recorded(), cfg)}


#: Codes this file plants outside :data:`CASES`.
OTHER_CODES = {"kill-wait", "plugin-missing"}


def codes_planted() -> Set[str]:
    return {c[2] for c in CASES} | OTHER_CODES


def test_collector_follows_includes_and_finds_plugin_files(tmp_path: Any) -> None:
    """What a live doctor records for the plugstack checks: each include pattern (relative
    ones from the including file's directory) with the files it matches, and whether each
    plugin exists (a relative path looked up in PluginDir, as Slurm does)."""
    from slurmiso.doctor.collect import plugstack_facts

    etc, lib = tmp_path / "etc", tmp_path / "lib"
    (etc / "plugstack.conf.d").mkdir(parents=True)
    lib.mkdir()
    (lib / "slurmiso_fence.so").write_text("")
    (etc / "plugstack.conf").write_text("include plugstack.conf.d/*.conf # site\n")
    (etc / "plugstack.conf.d" / "a.conf").write_text(
        "required slurmiso_fence.so state_dir=/run/slurmiso\nrequired /nowhere/slurmiso.so\n")
    (etc / "plugstack.conf.d" / "b.conf.rpmsave").write_text("required /x.so\n")
    facts = plugstack_facts(str(etc / "plugstack.conf"), f"/usr/lib/none:{lib}")
    pattern = f"{etc}/plugstack.conf.d/*.conf"
    assert list(facts["includes"]) == [pattern]
    assert list(facts["includes"][pattern]) == [f"{etc}/plugstack.conf.d/a.conf"]
    assert facts["plugins"] == {
        "slurmiso_fence.so": {"resolved": f"{lib}/slurmiso_fence.so", "exists": True},
        "/nowhere/slurmiso.so": {"resolved": "/nowhere/slurmiso.so", "exists": False}}
    snap = copy.deepcopy(recorded())
    snap["plugstack"] = facts
    snap["config"]["PlugStackConfig"] = str(etc / "plugstack.conf")
    cfg = sandbox_config()
    found = [f for f in run_checks(snap, cfg) if f.code.startswith("fence-")]
    assert [f.code for f in found] == ["fence-state-dir"]  # loaded from the include; its dir
    missing = [f for f in run_checks(snap, cfg) if f.code == "plugin-missing"]
    assert [f.severity for f in missing] == ["error"] and "/nowhere/slurmiso.so" in missing[0].message
    assert facts["exists"] and plugstack_facts(str(tmp_path / "none.conf"), "")["exists"] is False
