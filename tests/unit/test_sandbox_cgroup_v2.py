"""The sandbox's cgroup v2 mode, without Slurm: cgroup.conf, the namespace holder, daemons."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from slurmiso.errors import SandboxError
from slurmiso_sandbox import cgroups, services
from slurmiso_sandbox import layout as L

ROOT = "/var/lib/slurmiso-sbx-26.05-v2"
V2 = L.Site(root=ROOT, host="h", python="/usr/bin/python3", cgroup="v2", cgroup_ns=True,
            slurm="26.05", chroot="/roots/sid",
            hybrid_shim=f"{ROOT}/lib/slurmiso-hybrid-shim.so")


def test_v2_cgroup_conf_on_a_hybrid_host_turns_off_what_the_cgroup2_root_cannot_give():
    conf = L.render_cgroup_conf(replace(V2, v2_controllers=("hugetlb",)))
    lines = [ln for ln in conf.splitlines() if ln and not ln.startswith("#")]
    assert lines == ["CgroupPlugin=cgroup/v2", "ConstrainDevices=yes", "ConstrainCores=no",
                     "ConstrainRAMSpace=no", "IgnoreSystemd=yes",
                     "CgroupSlice=slurmiso_sbx_26_05_v2.slice"]
    assert "no cpuset controller" in conf and "no memory controller" in conf


def test_v2_cgroup_conf_on_a_pure_v2_host_constrains_all_three():
    conf = L.render_cgroup_conf(replace(V2, v2_controllers=("cpuset", "cpu", "io", "memory",
                                                            "pids"), slurm="24.11"))
    for key in ("ConstrainDevices", "ConstrainCores", "ConstrainRAMSpace"):
        assert f"{key}=yes\n" in conf
    assert "CgroupSlice" not in conf  # 24.11 has no such option: system.slice


def test_v1_is_as_before():
    site = L.Site(root="/x", host="h", python="p")
    assert L.v2_constrain_off(site) == [] and L.cgroup_slice(site) == ""


def test_daemons_enter_the_namespace_and_slurmd_gets_the_shim():
    svcs = {s.name: s for s in services.daemons(V2)}
    assert list(svcs)[0] == "cgroup-ns" and not svcs["cgroup-ns"].ns
    assert svcs["cgroup-ns"].argv[:4] == (services.UNSHARE, "--mount", "--propagation", "slave")
    assert not svcs["mariadb"].ns
    for name in ("slurmdbd", "slurmctld", "slurmd-n1", "slurmd-n5"):
        assert svcs[name].ns, name
    # slurmd is pivoted into its root, not chrooted: its containers need a user namespace
    argv = svcs["slurmd-n1"].argv
    assert argv[:4] == (services.UNSHARE, "--mount", "--propagation", "slave")
    assert argv[argv.index("slurmiso-pivot") + 1:][:3] == ("/roots/sid", services.ENV,
                                                           f"LD_PRELOAD={V2.hybrid_shim}")
    assert svcs["slurmctld"].argv[:2] == ("/usr/sbin/chroot", "/roots/sid")
    assert services.ENV not in svcs["slurmctld"].argv  # only slurmd (and its slurmstepds) read it
    assert "cgroup-ns" not in {s.name for s in services.daemons(replace(V2, cgroup_ns=False))}


def test_ns_argv_needs_the_holder(tmp_path):
    site = replace(V2, root=str(tmp_path))
    with pytest.raises(SandboxError, match="namespace holder is not running"):
        services.ns_argv(site, "true")
    assert services.ns_argv(replace(site, cgroup_ns=False), "true") == ["true"]


def _dir(tmp_path, **state):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "sandbox.json").write_text(json.dumps(state))
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "slurm.conf").write_text("ClusterName=slurmiso-sbx\n")
    return str(tmp_path)


def test_choose_cgroup(tmp_path, monkeypatch):
    monkeypatch.delenv("SLURMISO_SANDBOX_CGROUP", raising=False)
    monkeypatch.setattr(cgroups, "host_cgroup", lambda: "v1")
    root = _dir(tmp_path, cgroup="v2")
    assert cgroups.choose_cgroup(root, None) == "v2"  # recorded
    assert cgroups.choose_cgroup(root, "2") == "v2"
    with pytest.raises(SandboxError, match="holds a cgroup v2 sandbox"):
        cgroups.choose_cgroup(root, "v1")
    with pytest.raises(SandboxError, match="unknown cgroup version"):
        cgroups.choose_cgroup(root, "v3")
    monkeypatch.setenv("SLURMISO_SANDBOX_CGROUP", "v2")
    assert cgroups.choose_cgroup(str(tmp_path / "new"), None) == "v2"
    monkeypatch.setattr(cgroups, "host_cgroup", lambda: "v2")
    with pytest.raises(SandboxError, match="no cgroup v1 devices controller"):
        cgroups.choose_cgroup(str(tmp_path / "new"), "v1")


def test_proc_cgroup_is_hybrid(tmp_path):
    f = tmp_path / "cgroup"
    f.write_text("9:name=systemd:/\n0::/\n")
    assert cgroups.proc_cgroup_is_hybrid(str(f))
    f.write_text("0::/init.scope\n")
    assert not cgroups.proc_cgroup_is_hybrid(str(f))


def test_fstype_takes_the_last_mount_at_a_path(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text("30 1 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n"
                    "90 30 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n")
    assert cgroups.fstype("/sys/fs/cgroup", str(info)) == "cgroup2"
    assert cgroups.fstype("/nope", str(info)) == ""
