"""The device fence the prolog writes and slurmiso_fence.so applies (rules, file, majors)."""

from __future__ import annotations

import os
import stat

import pytest

from slurmiso.isolation import bpf_probe, fence
from slurmiso.mig.gres import computed_cap_minor
from slurmiso.state.record import JobRecord, RecordStatus, Resource

#: Only root may mknod: the tests that make stand-in device nodes carry this mark.
mknod = pytest.mark.needs_root(reason="mknod of stand-in NVIDIA device nodes")


@pytest.fixture
def devroot(tmp_path):
    """A /dev stand-in (its tests are marked :data:`mknod`)."""
    root = tmp_path / "dev"
    (root / "nvidia-caps").mkdir(parents=True)
    for name, major, minor in (("nvidia0", 195, 0), ("nvidiactl", 195, 255),
                               ("nvidia-uvm", 238, 0)):
        os.mknod(root / name, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    for minor in (1, 2, 3, 4):
        os.mknod(root / "nvidia-caps" / f"nvidia-cap{minor}", 0o444 | stat.S_IFCHR,
                 os.makedev(237, minor))
    return str(root)


@mknod
def test_majors_come_from_the_device_files(devroot):
    assert fence.caps_major(devroot) == 237
    assert fence.nvidia_majors(devroot) == [195, 237, 238]
    assert fence.deny_all_rules(devroot) == ["c 195:*", "c 237:*", "c 238:*"]


@mknod
def test_refused_job_is_denied_every_nvidia_device(devroot):
    why, rules, narrow = fence.job_fence(JobRecord(mode="exclusive"), True, devroot, 2)
    assert "refused" in why and narrow == []
    assert rules == ["c 195:*", "c 237:*", "c 238:*"]


@mknod
@pytest.mark.parametrize("mode", ["exclusive", "mig-static", "mps", "timeslice"])
def test_modes_slurm_fences_alone_need_no_rules(devroot, mode):
    assert fence.job_fence(JobRecord(mode=mode), False, devroot, 2)[1] == []


@mknod
def test_mig_static_narrows_to_its_own_caps_where_the_cgroup_can():
    """Slurm closes the other instances' caps (gres.conf); the monitor cap and cap files of
    no instance are closed too where cgroup v1 can, never at the price of the job."""
    record = JobRecord(mode="mig-static", resources=[Resource("mig-static", gpu=0, gi=1, ci=0)])
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        os.makedirs(f"{tmp}/nvidia-caps")
        os.mknod(f"{tmp}/nvidia-caps/nvidia-cap2", 0o444 | stat.S_IFCHR, os.makedev(237, 2))
        _why, rules, narrow = fence.job_fence(record, False, tmp, 1)
    assert rules == []
    assert "c 237:2" in narrow and f"c 237:{computed_cap_minor(0, 1)}" not in narrow


@mknod
def test_mig_dynamic_denies_every_cap_but_its_own_instance(devroot):
    record = JobRecord(mode="mig-dynamic",
                       resources=[Resource("mig-dynamic", gpu=1, gi=2, ci=0)])
    _why, rules, narrow = fence.job_fence(record, False, devroot, 2)
    assert narrow == []
    denied = {int(r.split(":")[1]) for r in rules}
    own = {computed_cap_minor(1, 2), computed_cap_minor(1, 2, 0)}
    assert not own & denied
    assert all(r.startswith("c 237:") for r in rules)
    # everything else of both GPUs, config and monitor included
    assert len(denied) == 2 + 2 * 15 * 9 - 2
    assert {1, 2, computed_cap_minor(0, 1), computed_cap_minor(1, 2, 1)} <= denied


def test_mig_dynamic_without_caps_devices_fails_closed(tmp_path):
    _why, rules, _narrow = fence.job_fence(JobRecord(mode="mig-dynamic"), False,
                                           str(tmp_path), 2)
    assert rules == ["c 195:*"]


def test_driver_table_wins_over_the_computed_numbering():
    minors = {"config": 1, "monitor": 2, "gpu0/gi7/access": 70, "gpu0/gi7/ci0/access": 71,
              "gpu0/gi8/access": 80, "gpu0/gi8/ci0/access": 81}
    node = fence.node_cap_minors([0], minors)
    own = fence.own_cap_minors([(0, 7, 0)], minors)
    assert own == {70, 71}
    assert fence.mig_rules(500, node, own) == ["c 500:1", "c 500:2", "c 500:80", "c 500:81"]


def test_fence_file_is_root_only_and_round_trips(tmp_path):
    path = fence.write(str(tmp_path), "42", "why", ["c 195:*", "c 237:12"], ["c 237:2"])
    st = os.stat(path)
    assert stat.S_IMODE(st.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert fence.read_rules(str(tmp_path), "42") == ["c 195:*", "c 237:12"]
    assert fence.read_rules(str(tmp_path), "42", "narrow") == ["c 237:2"]
    with open(path) as fh:
        assert fh.read().startswith("# slurmiso fence v1: job 42: why\n")
    fence.remove(str(tmp_path), "42")
    assert fence.read_rules(str(tmp_path), "42") is None
    fence.remove(str(tmp_path), "42")  # idempotent


def test_proc_devices_parsed_char_section_only(tmp_path):
    (tmp_path / "devices").write_text(
        "Character devices:\n  1 mem\n195 nvidia-frontend\n508 nvidia-caps\n510 nvidia-uvm\n\n"
        "Block devices:\n  7 loop\n259 nvidia-fake-block\n")
    assert fence._proc_majors(str(tmp_path)) == {"mem": 1, "nvidia-frontend": 195,
                                                "nvidia-caps": 508, "nvidia-uvm": 510}
    assert {195, 508, 510} <= set(fence.nvidia_majors("/dev", proc_root=str(tmp_path)))
    assert 259 not in fence.nvidia_majors("/dev", proc_root=str(tmp_path))


# --------------------------------------------------------------- written by the hooks
def _hook_world(tmp: str, mode: str, model: str = "A100-80GB") -> str:
    from tests.hookctx import write_config

    return write_config(tmp, mode, model)


def test_prolog_fences_a_refused_job_and_the_epilog_removes_it(tmp_path):
    from slurmiso.hooks.runner import run_hook
    from tests.hookctx import Drains, job_env

    tmp = str(tmp_path)
    cfg = _hook_world(tmp, "timeslice")
    assert run_hook("prolog", job_env(qos="debug"), cfg, Drains()) == 0  # debug needs exclusive
    rules = fence.read_rules(f"{tmp}/state/node1", "42")
    assert rules and "c 195:*" in rules
    assert run_hook("epilog", job_env(qos="debug"), cfg, Drains()) == 0
    assert fence.read_rules(f"{tmp}/state/node1", "42") is None


def test_prepared_job_gets_its_modes_fence(tmp_path):
    from slurmiso.hooks.runner import run_hook
    from tests.hookctx import Drains, job_env

    tmp = str(tmp_path)
    cfg = _hook_world(tmp, "exclusive")
    assert run_hook("prolog", job_env(), cfg, Drains()) == 0
    assert fence.read_rules(f"{tmp}/state/node1", "42") == []  # Slurm's constraint suffices


def test_prolog_that_dies_before_the_end_leaves_a_deny_all_fence(tmp_path, monkeypatch):
    from slurmiso.hooks import runner
    from tests.hookctx import Drains, job_env

    tmp = str(tmp_path)
    cfg = _hook_world(tmp, "exclusive")

    def boom(ctx):
        raise KeyboardInterrupt  # stands for SIGKILL between the first fence and the last

    monkeypatch.setattr(runner, "_open_events_file", boom)
    with pytest.raises(KeyboardInterrupt):
        runner.run_hook("prolog", job_env(), cfg, Drains())
    assert "c 195:*" in (fence.read_rules(f"{tmp}/state/node1", "42") or [])


def test_a_prolog_rerun_of_the_same_attempt_owes_no_skip(tmp_path):
    from slurmiso.hooks.runner import run_hook
    from tests.hookctx import Drains, job_env, state

    tmp = str(tmp_path)
    cfg = _hook_world(tmp, "exclusive")
    assert run_hook("prolog", job_env(), cfg, Drains()) == 0
    rec = state(tmp).read_job("42")
    rec.status = RecordStatus.PREPARING  # as a prolog killed half-way leaves it
    state(tmp).write_job("42", rec)
    assert run_hook("prolog", job_env(), cfg, Drains()) == 0
    assert state(tmp).read_job("42").late_epilogs == 0
    assert run_hook("epilog", job_env(), cfg, Drains()) == 0
    assert state(tmp).read_job("42") is None


def _kernel_config():
    import gzip
    import platform

    try:
        with gzip.open("/proc/config.gz", "rt") as fh:
            return fh.read()
    except OSError:
        pass
    try:
        with open(f"/boot/config-{platform.release()}") as fh:
            return fh.read()
    except OSError:
        return None


def test_bpf_device_support_is_measured_as_root_and_unknown_otherwise(monkeypatch):
    """doctor's cgroup v2 fact: this kernel loads the program type the v2 fence needs."""
    ok, detail = bpf_probe.bpf_device_support()
    config = _kernel_config()
    if os.geteuid() != 0:
        assert ok is None and "root" in detail
    elif config is not None:  # the kernel's own word on it
        assert ok is ("CONFIG_CGROUP_BPF=y" in config.splitlines()), detail
    else:
        assert ok is not None, detail
    monkeypatch.setattr(bpf_probe.platform, "machine", lambda: "vax")
    assert bpf_probe.bpf_device_support() == (None, "bpf(2) number unknown for vax")


def test_cgroup2_mount_read_from_mountinfo(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(
        "30 25 0:26 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro,mode=755\n"
        "34 30 0:29 / /sys/fs/cgroup/unified rw,nosuid shared:10 - cgroup2 cgroup2 rw\n")
    assert bpf_probe.cgroup2_mount(str(info)) == "/sys/fs/cgroup/unified"
    info.write_text("30 25 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs ro\n")
    assert bpf_probe.cgroup2_mount(str(info)) is None
    assert bpf_probe.cgroup2_mount(str(tmp_path / "absent")) is None
