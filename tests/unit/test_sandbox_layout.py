"""The sandbox's generated files, checked without Slurm.

Golden files live in tests/golden/sandbox/; UPDATE_GOLDEN=1 rewrites them
(then review the diff).
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import replace

import pytest
import yaml

from slurmiso.gpu.profiles import free_placements, lookup_model
from slurmiso_sandbox import layout as L
from tests.goldens import check_golden as _check

GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "golden", "sandbox")

SITE = L.Site(root="/var/lib/slurmiso-sandbox", host="sbxhost", python="/usr/bin/python3",
              pythonpath="/opt/slurmiso")
HOOKED = L.Site(root="/srv/sbx/", host="sbxhost", python="/opt/venv/bin/python",
                prolog="/src/slurmiso/prolog/slurmiso-prolog",
                epilog="/src/slurmiso/epilog/slurmiso-epilog", pythonpath="/src/slurmiso",
                spank_plugin="/srv/sbx/lib/slurmiso.so")


def check_golden(name: str, text: str) -> None:
    _check(os.path.join(GOLDEN, name), text)


@pytest.mark.parametrize(
    "name, render, site",
    [
        ("slurm.conf", L.render_slurm_conf, SITE),
        ("slurm-hooks.conf", L.render_slurm_conf, HOOKED),
        ("gres.conf", L.render_gres_conf, SITE),
        ("slurmdbd.conf", L.render_slurmdbd_conf, SITE),
        ("slurmiso.yaml", L.render_slurmiso_yaml, SITE),
        ("plugstack.conf", lambda s: L.render_submit_files(s)["etc/plugstack.conf"], HOOKED),
        ("job_submit.lua", lambda s: L.render_submit_files(s)["etc/job_submit.lua"], SITE),
    ],
)
def test_rendered_file_matches_golden(name, render, site):
    check_golden(name, render(site))


def test_hook_wrappers_match_golden():
    wrappers = L.hook_wrappers(HOOKED)
    assert sorted(wrappers) == ["slurmiso-epilog", "slurmiso-oci-gate", "slurmiso-prolog",
                               "slurmiso-task-prolog"]
    for name, text in wrappers.items():
        check_golden(name, text)


def test_no_hooks_no_hook_lines_or_wrappers():
    conf = L.render_slurm_conf(SITE)
    assert "Prolog=" not in conf.replace("TaskProlog", "")
    assert "Epilog=" not in conf and "TaskProlog=" not in conf
    assert L.hook_wrappers(SITE) == {}
    assert all(not k.startswith("bin/") for k in L.rendered_files(SITE))


def test_hook_lines_point_at_wrappers_with_absolute_paths():
    conf = L.render_slurm_conf(HOOKED)
    assert "Prolog=/srv/sbx/bin/slurmiso-prolog\n" in conf
    assert "Epilog=/srv/sbx/bin/slurmiso-epilog\n" in conf
    assert "TaskProlog=/srv/sbx/bin/slurmiso-task-prolog\n" in conf
    prolog = L.hook_wrappers(HOOKED)["slurmiso-prolog"]
    assert "export SLURMISO_CONFIG=/srv/sbx/etc/slurmiso.yaml\n" in prolog
    assert prolog.rstrip().endswith(
        'exec /opt/venv/bin/python /src/slurmiso/prolog/slurmiso-prolog "$@"')


def test_wrapper_quotes_odd_paths():
    site = L.Site(root="/tmp/a b", host="h", python="/x/py'thon", prolog="/p", epilog="/e")
    text = L.render_hook_wrapper(site, [site.python, "-m", "slurmiso"])
    assert "export SLURMISO_CONFIG='/tmp/a b/etc/slurmiso.yaml'" in text
    assert "exec '/x/py'\"'\"'thon' -m slurmiso" in text


@pytest.mark.parametrize(
    "node, gres",
    [
        ("n1", "gpu:a100:2"),
        ("n2", "gpu:h100:2,mps:200"),
        ("n3", "gpu:3g.40gb:3"),
        ("n4", "gpu:h100:2,shard:14"),
        ("n5", "gpu:a100:2,shard:8"),
    ],
)
def test_node_gres(node, gres):
    n = L.find_node(node)
    assert n is not None
    assert L.node_gres(n) == gres
    assert f"NodeName={node} " in L.render_slurm_conf(SITE)
    assert f"Gres={gres} " in L.render_slurm_conf(SITE)


def test_essential_slurm_settings():
    conf = dict(
        line.split("=", 1) for line in L.render_slurm_conf(SITE).splitlines()
        if "=" in line and not line.startswith(("#", "NodeName", "PartitionName"))
    )
    assert conf["ClusterName"] == L.CLUSTER
    assert conf["PreemptType"] == "preempt/qos"
    assert conf["PreemptMode"] == "REQUEUE"
    assert conf["JobRequeue"] == "1"
    assert conf["PrologFlags"] == "Alloc,Contain"
    # the production GPU node's world: cgroup tracking and the device constraint
    assert conf["ProctrackType"] == "proctrack/cgroup"
    assert conf["TaskPlugin"] == "task/cgroup,task/affinity"
    assert conf["SelectType"] == "select/cons_tres"
    assert conf["GresTypes"] == "gpu,mps,shard"
    assert "%n" in conf["SlurmdSpoolDir"] and "%n" in conf["SlurmdPidFile"]
    assert "%n" in conf["SlurmdLogFile"]


def test_nodes_ports_partitions_unique_and_one_default():
    nodes = L.NODES
    assert len({n.port for n in nodes}) == len(nodes)
    assert len({n.partition for n in nodes}) == len(nodes)
    assert [n.name for n in nodes if n.default_partition] == ["n1"]
    assert {n.mode for n in nodes} == {"exclusive", "mps", "mig-static", "mig-dynamic",
                                       "timeslice"}


def test_device_nodes_distinct_per_node_and_character_numbers():
    devs = L.device_nodes(SITE)
    assert len({d.path for d in devs}) == len(devs)
    for n in L.NODES:
        mine = [d for d in devs if f"/dev/{n.name}/" in d.path]
        gpus = [d for d in mine if os.path.basename(d.path).startswith("nvidia")
                and os.path.basename(d.path)[6:].isdigit()]
        assert sorted((d.major, d.minor) for d in gpus) == [(195, g) for g in range(n.gpus)]
        names = {os.path.basename(d.path) for d in mine}
        assert {"nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"} <= names
        caps = [(d.major, d.minor) for d in mine if "nvidia-caps" in d.path]
        assert len(set(caps)) == len(caps)
        if n.mig_enabled:  # config + monitor + 15 GIs x (1 + 8 CIs) per GPU
            assert len(caps) == 2 + n.gpus * 15 * 9
        else:
            assert caps == []


def test_device_stand_ins_carry_the_drivers_modes():
    """0666 GPUs and 0444 caps, as nvidia-modprobe makes them: with narrower stand-ins an
    unprivileged open fails with EACCES everywhere and hides whether anything is fenced."""
    modes = {os.path.basename(d.path): d.mode for d in L.device_nodes(SITE)
             if "/dev/n4/" in d.path}
    assert modes["nvidia0"] == modes["nvidiactl"] == modes["nvidia-uvm"] == 0o666
    assert modes["nvidia-cap1"] == 0o400  # config: root only
    assert modes["nvidia-cap2"] == 0o444
    assert modes["nvidia-cap3"] == modes["nvidia-cap12"] == 0o444  # gpu0 gi0, gpu0 gi1


def test_mig_gres_caps_use_the_drivers_minors():
    """gres.conf names the GI/CI caps by the driver's numbering of the instance's ids."""
    from slurmiso.mig.gres import computed_cap_minor

    live = (L.MigSlot(0, "3g.40gb", 0, 2, 0), L.MigSlot(0, "3g.40gb", 4, 1, 0),
            L.MigSlot(1, "3g.40gb", 0, 1, 0))
    lines = [ln for ln in L.render_gres_conf(_relaid(live)).splitlines() if "MultipleFiles" in ln]
    assert lines[0].endswith(f"nvidia-cap{computed_cap_minor(0, 2)},"
                             f"/var/lib/slurmiso-sandbox/dev/n3/nvidia-caps/"
                             f"nvidia-cap{computed_cap_minor(0, 2, 0)}")
    assert f"nvidia-cap{computed_cap_minor(1, 1, 0)}" in lines[2]


def test_cgroup_conf_constrains_devices_cores_memory():
    conf = L.render_cgroup_conf(SITE)
    assert "CgroupPlugin=cgroup/v1\n" in conf
    for key in ("ConstrainDevices", "ConstrainCores", "ConstrainRAMSpace"):
        assert f"{key}=yes\n" in conf
    assert "CgroupPlugin=cgroup/v2\n" in L.render_cgroup_conf(replace(SITE, cgroup="v2"))
    assert L.rendered_files(SITE)["etc/cgroup.conf"] == conf


def test_mig_gres_lines_match_slots():
    gres = L.render_gres_conf(SITE)
    mig_lines = [ln for ln in gres.splitlines() if "MultipleFiles=" in ln]
    n3 = L.find_node("n3")
    assert n3 is not None
    assert len(mig_lines) == len(n3.mig_slots)
    types = Counter(ln.split("Type=")[1].split()[0] for ln in mig_lines)
    assert types == Counter({"3g.40gb": 3})  # one type: slurmctld 22.05 mis-schedules a mix
    # each MIG device names its parent GPU plus its own GI/CI capability files
    assert all(ln.count("/nvidia-caps/") == 2 for ln in mig_lines)


def test_mig_slots_fit_the_gpu_model():
    n3 = L.find_node("n3")
    assert n3 is not None
    model = lookup_model(n3.gpu_model)
    assert model is not None
    for gpu in range(n3.gpus):
        occupied = []
        for slot in (s for s in n3.mig_slots if s.gpu == gpu):
            prof = model.profile(slot.profile)
            assert prof is not None
            assert slot.placement in free_placements(model, prof, occupied)
            occupied.append((slot.placement, prof.memory_slices))


def test_slurmiso_yaml_describes_the_same_cluster():
    data = yaml.safe_load(L.render_slurmiso_yaml(SITE))
    pools = {p["nodes"]: p for p in data["pools"]}
    for n in L.NODES:
        assert pools[n.name]["mode"] == n.mode
        assert pools[n.name]["partition"] == n.partition
    layout = data["mig_layouts"]["mig-configs"][L.MIG_LAYOUT_NAME]
    assert layout == [
        {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
        {"devices": [1], "mig-enabled": True, "mig-devices": {"3g.40gb": 1}},
    ]
    assert data["paths"]["state_dir"] == "/var/lib/slurmiso-sandbox/state/%n"
    assert data["gpu"] == {"backend": "sim", "sim_state": "/var/lib/slurmiso-sandbox/sim/%n.json"}


def test_slurmiso_yaml_loads_with_the_real_loader():
    from slurmiso.config import loader

    cfg = loader.parse_config(yaml.safe_load(L.render_slurmiso_yaml(SITE)), "sandbox")
    assert [p.name for p in cfg.pools] == [n.pool for n in L.NODES]


def test_trailing_slash_in_root_is_harmless():
    assert "/srv/sbx//" not in L.render_slurm_conf(HOOKED)
    assert HOOKED.slurm_conf == "/srv/sbx/etc/slurm.conf"


def test_task_prolog_uses_the_interpreter_job_users_can_run():
    site = L.Site(root="/srv/sbx", host="h", python="/root/.pyenv/bin/python", prolog="/p",
                  epilog="/e", task_python="/usr/bin/python3")
    wrappers = L.hook_wrappers(site)
    assert "exec /usr/bin/python3 -m slurmiso.hooks.task_prolog" in wrappers["slurmiso-task-prolog"]
    assert "exec /root/.pyenv/bin/python /p" in wrappers["slurmiso-prolog"]


#: ``sacctmgr -P -n show qos format=`` QOS_FORMAT rows as ``up`` leaves them (22.05's forms)
SANDBOX_LIVE = (
    "normal|0|||00:00:00|||\n"
    "infer|1000|train|cluster|00:00:00|||\n"
    "train|100||requeue|00:00:30|||\n"
    "debug|500||cluster|00:00:00|||\n"
)


def _qos_plan(live_text):
    from slurmiso.slurm.qos import parse_qos_rows
    from slurmiso_sandbox.accounting import qos_changes, sandbox_qos

    return [c.describe() for c in qos_changes(sandbox_qos(SITE), parse_qos_rows(live_text))]


def test_sandbox_qos_are_its_configs_classes_without_per_job_limits():
    """One truth: the sandbox's QoS come from its slurmiso.yaml through the model sites use."""
    from slurmiso.slurm.qos import desired_qos
    from slurmiso_sandbox.accounting import sandbox_qos

    got = {q.name: q for q in sandbox_qos(SITE)}
    assert list(got) == ["infer", "train", "debug"]
    assert (got["infer"].priority, got["infer"].preempt, got["infer"].preempt_mode) == (
        1000, ("train",), "cluster")
    assert (got["train"].priority, got["train"].preempt_mode, got["train"].grace_s) == (
        100, "requeue", 30)
    assert all(q.max_wall_s is None and q.max_gpus_per_job is None for q in got.values())
    full = {q.name: q for q in desired_qos(L.sandbox_config(SITE))}
    assert full["debug"].max_gpus_per_job == 1  # what 'qos apply' adds and the sandbox leaves


def test_qos_changes_assert_then_act():
    assert _qos_plan(SANDBOX_LIVE) == []  # a second 'up' changes nothing
    fresh = _qos_plan("normal|0|||00:00:00|||\n")
    assert [c for c in fresh if c.startswith("+")] == [
        "+ qos infer: create", "+ qos train: create", "+ qos debug: create"]
    assert "~ qos train: GraceTime 0 -> 30" in fresh
    assert "~ qos infer: Preempt (unset) -> train" in fresh


@pytest.mark.parametrize("grace, live", [
    ("00:01:00", "60"),
    ("1-12", "129600"),  # Slurm's D-HH: the old sandbox parser read 86412
    ("2-00:00:00", "172800"),
])
def test_qos_grace_is_read_with_the_one_slurm_time_parser(grace, live):
    text = SANDBOX_LIVE.replace("train|100||requeue|00:00:30", f"train|100||requeue|{grace}")
    assert _qos_plan(text) == [f"~ qos train: GraceTime {live} -> 30"]


def test_qos_changes_are_applied_through_the_qos_applier(monkeypatch):
    """ensure_accounting reads and writes QoS with slurmiso.slurm.qos (read_live, apply)."""
    from slurmiso_sandbox import accounting as A

    calls = []

    def fake(site, *args, check=True, commit=True):
        calls.append((commit,) + args)
        if args[:4] == ("-n", "-P", "show", "cluster"):
            return f"{L.CLUSTER}\n"
        if args[:3] == ("-P", "-n", "show") and args[3] == "qos":
            return SANDBOX_LIVE.replace("00:00:30", "00:02:00")
        if args[:4] == ("-n", "-P", "show", "account"):
            return "research\nops\n"
        if args[:4] == ("-n", "-P", "show", "assoc"):
            return "".join(f"research|{u}|debug,infer,normal,train|normal\n" for u in A.USERS)
        if args[:4] == ("-n", "-P", "show", "user"):
            return "".join(f"{u}|research\n" for u in A.USERS)
        return ""

    monkeypatch.setattr(A, "sacctmgr", fake)
    assert A.ensure_accounting(SITE) == ["qos train"]
    writes = [c for c in calls if "modify" in c or "add" in c]
    assert writes == [(False, "-i", "modify", "qos", "where", "name=train", "set",
                       "GraceTime=30")]


MIXED_LIVE = (L.MigSlot(0, "3g.40gb", 0), L.MigSlot(0, "3g.40gb", 4),
              L.MigSlot(1, "4g.40gb", 0), L.MigSlot(1, "3g.40gb", 4))


def _relaid(live):
    """SITE with n3's simulated GPUs laid out as ``live`` (what ``sync-gres`` renders)."""
    return replace(SITE, nodes=tuple(replace(n, live_slots=live) if n.mig_slots else n
                                     for n in SITE.nodes))


def test_mig_gres_lines_grouped_by_type_then_gpu_then_start():
    """slurmctld 22.05 indexes typed GRES type by type: one type's lines must be contiguous."""
    site = _relaid(MIXED_LIVE)
    lines = [ln for ln in L.render_gres_conf(site).splitlines() if "MultipleFiles=" in ln]
    order = [(ln.split("Type=")[1].split()[0], ln.split("/dev/n3/nvidia")[1][0]) for ln in lines]
    assert order == [("3g.40gb", "0"), ("3g.40gb", "0"), ("3g.40gb", "1"), ("4g.40gb", "1")]
    assert "Gres=gpu:3g.40gb:3,gpu:4g.40gb:1 " in L.render_slurm_conf(site)


def test_re_laid_node_is_rendered_from_its_live_instances_config_keeps_the_plan():
    live = tuple(L.MigSlot(g, "3g.40gb", p) for g in (0, 1) for p in (0, 4))
    site = _relaid(live)
    assert "Gres=gpu:3g.40gb:4 " in L.render_slurm_conf(site)
    lines = [ln for ln in L.render_gres_conf(site).splitlines() if "MultipleFiles=" in ln]
    assert len(lines) == 4
    caps = {d.path for d in L.device_nodes(site) if "nvidia-caps" in d.path}
    named = {f for ln in lines for f in ln.split("MultipleFiles=")[1].split(",")[1:]}
    assert len(named) == 8 and named <= caps  # the fourth instance has its own cap devices
    assert L.render_slurmiso_yaml(site) == L.render_slurmiso_yaml(SITE)  # the plan is unchanged
    assert L.render_gres_conf(_relaid(None)) == L.render_gres_conf(SITE)


def test_submit_files_wired_next_to_slurm_conf():
    files = L.rendered_files(HOOKED)
    assert files["etc/cli_filter.lua"] == files["etc/job_submit.lua"]
    conf = files["etc/slurm.conf"]
    assert "JobSubmitPlugins=lua\n" in conf and "CliFilterPlugins=lua\n" in conf
    assert f"PlugStackConfig={HOOKED.plugstack_conf}\n" in conf
    assert "etc/plugstack.conf" not in L.rendered_files(SITE)  # no plugin built: no plugstack
    assert "PlugStackConfig" not in L.rendered_files(SITE)["etc/slurm.conf"]


def test_packaged_hooks_run_the_installed_executables_without_pythonpath():
    """``sandbox up --from-packages``: Slurm runs what the packages installed, as installed."""
    site = replace(HOOKED, prolog="/usr/bin/slurmiso-prolog", epilog="/usr/bin/slurmiso-epilog",
                   pythonpath="", packaged=True,
                   spank_plugin="/usr/lib/slurmiso/slurmiso.so")
    wrappers = L.hook_wrappers(site)
    assert wrappers["slurmiso-prolog"].rstrip().endswith('exec /usr/bin/slurmiso-prolog "$@"')
    assert wrappers["slurmiso-task-prolog"].rstrip().endswith(
        'exec /usr/bin/slurmiso-task-prolog "$@"')
    assert all("PYTHONPATH" not in w for w in wrappers.values())
    plug = L.render_submit_files(site)["etc/plugstack.conf"]
    assert "required /usr/lib/slurmiso/slurmiso_fence.so " in plug


def test_from_packages_names_what_is_not_installed(tmp_path, monkeypatch):
    from slurmiso.errors import SandboxError
    from slurmiso_sandbox import sites

    monkeypatch.setattr(sites, "PACKAGED_BIN", str(tmp_path))
    monkeypatch.setattr(sites, "PACKAGED_SPANK", str(tmp_path / "slurmiso.so"))
    with pytest.raises(SandboxError, match="slurmiso-prolog") as err:
        sites.packaged_site(HOOKED)
    assert "make deb" in err.value.hint


# ------------------------------------------------ a non-MIG GPU on the plain nodes (issue 26)
@pytest.mark.parametrize("spec,model,gres,memory", [
    ("L40S", "L40S", "l40s", 0),
    ("nvidia l4", "L4", "l4", 0),
    ("RTX-A5000:24G", "RTX-A5000", "rtxa5000", 24576),
    ("B200", "B200-180GB", "b200", 0),  # a MIG model may play a plain node too
])
def test_plain_gpu_on_exclusive_mps_timeslice_nodes(spec, model, gres, memory):
    nodes = L.with_plain_gpu(L.NODES, spec)
    plain = {n.name for n in nodes if n.mode in L.PLAIN_MODES}
    assert plain == {"n1", "n2", "n5"}
    for n, before in zip(nodes, L.NODES):
        if n.name in plain:
            assert (n.gpu_model, n.gres_type, n.gpu_memory_mb) == (model, gres, memory)
        else:
            assert n == before  # MIG nodes keep their MIG model and layout
    site = replace(SITE, nodes=nodes)
    conf = L.render_slurm_conf(site)
    assert "NodeName=n1 " in conf and f"Gres=gpu:{gres}:2" in conf
    assert f"gpu:{gres}:2,mps:200" in conf
    assert f"Name=gpu Type={gres} File=" in L.render_gres_conf(site)
    cfg = L.sandbox_config(site)  # loads: the MPS limits fit the GPU the node plays
    assert {p.name: p.gpu_model for p in cfg.pools}["mps"] == model
    assert {p.name: p.gpu_model for p in cfg.pools}["migs"] == "H100-80GB"


@pytest.mark.parametrize("spec,limits", [
    ("", ("32G", "24G")), ("B200", ("32G", "24G")), ("L4", ("8G", "6G")),
    ("RTX-A5000:24G", ("9G", "7G")), ("L40S", ("17G", "13G")),
])
def test_mps_limits_follow_the_mps_nodes_gpu(spec, limits):
    assert L.mps_limits(replace(SITE, nodes=L.with_plain_gpu(L.NODES, spec))) == limits


@pytest.mark.parametrize("spec", ["", None])
def test_no_plain_gpu_changes_nothing(spec):
    assert L.with_plain_gpu(L.NODES, spec or "") == L.NODES


@pytest.mark.parametrize("spec,text", [
    ("Unknown-X", "NAME:MEMORY"), ("L4:lots", "plain GPU 'L4:lots'"), (":24G", "NAME:MEMORY"),
])
def test_bad_plain_gpu_is_a_usage_error(spec, text):
    from slurmiso.errors import UsageError

    with pytest.raises(UsageError, match=text):
        L.parse_plain_gpu(spec)


def test_sim_nodes_play_the_plain_gpu(tmp_path, monkeypatch):
    """init_sim makes the plain nodes' simulated GPUs of the chosen model (an idle one is
    re-made when the model changes) and keeps the MIG nodes' H100s and layout."""
    from slurmiso.gpu.sim import SimBackend
    from slurmiso_sandbox import files, sites, state

    site = replace(SITE, root=str(tmp_path), nodes=L.with_plain_gpu(L.NODES, "RTX-A5000:24G"))
    files.init_sim(site)
    devs = {n.name: SimBackend(L.sim_path(site, n)).device(0) for n in site.nodes}
    assert (devs["n2"].name, devs["n2"].memory_total_mb) == ("NVIDIA RTX-A5000", 24576)
    assert devs["n3"].model == "H100-80GB" and devs["n3"].mig_enabled
    site = replace(site, nodes=L.with_plain_gpu(L.NODES, "L40S"))
    files.init_sim(site)
    assert SimBackend(L.sim_path(site, site.nodes[0])).device(0).model == "L40S"
    assert state.plain_spec(site) == "L40S"
    monkeypatch.setenv("SLURMISO_SANDBOX_PLAIN_GPU", "L4")
    assert sites.plain_gpu(str(tmp_path)) == "L4"
    assert sites.plain_gpu(str(tmp_path), "T4") == "T4"
