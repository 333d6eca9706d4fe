"""Host figures read from recorded cgroup v1/v2 and procfs trees (tests/fixtures/host/).

The fixtures follow the kernel's documented formats (sources in tests/fixtures/host/README.md);
``job_broken`` is hostile on purpose: every malformed figure must come back None, never 0.
"""

from __future__ import annotations

import os
import pathlib
import random
import subprocess

import pytest

from slurmiso.host import kernel_text
from slurmiso.host.cgroup_figures import (
    CgroupVersion,
    IoFigures,
    V1Dirs,
    _sum_blkio,
    _sum_io_stat,
    detect_version,
    read_v1,
    read_v2,
)
from slurmiso.host.node_figures import (
    parse_net_dev,
    read_link_speeds,
    read_net_dev,
    read_node_pressure,
)

HERE = os.path.dirname(os.path.abspath(__file__))
FIX = os.path.join(os.path.dirname(HERE), "fixtures", "host")
V1 = os.path.join(FIX, "v1")
JOB77 = os.path.join("slurm", "uid_1000", "job_77")


def test_v2_reads_every_documented_figure() -> None:
    figs = read_v2(os.path.join(FIX, "v2", "job_4242"))
    assert figs.version is CgroupVersion.V2
    assert (figs.cpu.usage_usec, figs.cpu.throttled_usec) == (8420000123, 96000000)
    assert (figs.cpu.nr_periods, figs.cpu.nr_throttled) == (5000, 1250)
    assert figs.memory.current_bytes == 32 * 2**30
    assert figs.memory.peak_bytes == 40 * 2**30
    assert (figs.memory.oom, figs.memory.oom_kill, figs.memory.high,
            figs.memory.max_events) == (1, 1, 17, 3)
    # io.stat summed over both devices (cgroup-v2.rst example lines, second wbytes changed)
    assert figs.io.rbytes == 1459200 + 90430464
    assert figs.io.wbytes == 314773504 + 759083520
    assert (figs.io.rios, figs.io.wios) == (192 + 8950, 353 + 1252)
    cpu = figs.pressure.cpu
    assert cpu is not None and cpu.some.avg10 == 23.51 and cpu.some.total_usec == 48211533
    assert cpu.full is not None and cpu.full.avg10 == 4.10
    io = figs.pressure.io
    assert io is not None and io.full is not None and io.full.avg10 == 1.05


def test_v2_hostile_files_read_as_unknown_never_zero() -> None:
    figs = read_v2(os.path.join(FIX, "v2", "job_broken"))
    assert figs.cpu.usage_usec is None  # over u64
    assert figs.cpu.nr_throttled is None  # negative
    assert figs.cpu.throttled_usec is None  # two values on one line
    assert figs.cpu.nr_periods is None  # key repeated: trust neither copy
    assert figs.memory.current_bytes is None  # "1.5e9"
    assert figs.memory.peak_bytes is None  # file missing
    assert figs.memory.oom is None and figs.memory.oom_kill == 2
    # a line with no valid device: the file is not the kernel's, every sum is unknown
    assert figs.io.rbytes is None and figs.io.wbytes is None and figs.io.wios is None
    assert figs.pressure.cpu is None  # avg10 over 100 %
    assert figs.pressure.memory is None  # full line without a some line
    assert figs.pressure.io is None  # empty file


def test_missing_directory_is_all_unknown() -> None:
    figs = read_v2(os.path.join(FIX, "v2", "no_such_job"))
    assert figs.cpu.usage_usec is None and figs.io.wbytes is None
    assert figs.pressure.cpu is None and figs.memory.current_bytes is None


def test_v1_equivalents_and_no_pressure() -> None:
    dirs = V1Dirs(
        cpu=os.path.join(V1, "cpu,cpuacct", JOB77),
        cpuacct=os.path.join(V1, "cpu,cpuacct", JOB77),
        memory=os.path.join(V1, "memory", JOB77),
        blkio=os.path.join(V1, "blkio", JOB77),
    )
    figs = read_v1(dirs)
    assert figs.version is CgroupVersion.V1
    assert figs.cpu.usage_usec == 9053820811  # cpuacct.usage ns -> µs
    assert figs.cpu.throttled_usec == 2500000  # throttled_time ns -> µs
    assert figs.cpu.nr_throttled == 100
    assert figs.memory.current_bytes == 155578368
    assert figs.memory.peak_bytes == 4186865664
    assert figs.memory.oom_kill == 2 and figs.memory.max_events == 5
    assert figs.memory.oom is None and figs.memory.high is None  # v1 counts neither
    assert (figs.io.rbytes, figs.io.wbytes) == (4096000 + 100, 1048576 + 200)
    assert (figs.io.rios, figs.io.wios) == (1001, 258)
    assert figs.pressure.cpu is None and figs.pressure.memory is None
    assert figs.pressure.io is None


def test_v1_unset_controller_is_unknown() -> None:
    figs = read_v1(V1Dirs(memory=os.path.join(V1, "memory", JOB77)))
    assert figs.cpu.usage_usec is None and figs.io.rbytes is None
    assert figs.memory.current_bytes == 155578368


def test_io_stat_device_missing_a_key_makes_that_sum_unknown() -> None:
    io = _sum_io_stat("8:0 rbytes=10 wbytes=20 rios=1 wios=2\n8:16 wbytes=7 rios=1 wios=x\n")
    assert io.rbytes is None  # not the 10 bytes of 8:0 alone
    assert (io.wbytes, io.rios, io.wios) == (27, 2, None)
    assert _sum_io_stat("") == IoFigures(0, 0, 0, 0)  # no IO yet: measured zero
    assert _sum_io_stat("8:0 rbytes=1\n8:0 rbytes=2\n").rbytes is None  # device repeated


def test_blkio_malformed_line_is_unknown() -> None:
    assert _sum_blkio("8:0 Read 5\n8:0 Write 6\nbogus 1 2\nTotal 11\n") == (None, None)
    assert _sum_blkio("8:0 Read 5\n8:0 Total 5\nTotal 5\n") == (5, None)  # no Write line


def test_blkio_with_only_total_line_is_zero_io() -> None:
    """A v1 cgroup that did no IO prints ``Total 0``: that is a measured zero."""
    assert kernel_text.parse_uint("0") == 0
    assert _sum_blkio("Total 0\n") == (0, 0)
    assert _sum_blkio(None) == (None, None)


def test_detect_version(tmp_path: pathlib.Path) -> None:
    assert detect_version(V1) is CgroupVersion.V1
    assert detect_version(str(tmp_path)) is None  # neither layout
    v2 = os.path.join(str(tmp_path), "v2")
    os.makedirs(v2)
    open(os.path.join(v2, "cgroup.controllers"), "w").close()
    assert detect_version(v2) is CgroupVersion.V2
    os.makedirs(os.path.join(str(tmp_path), "v1", "memory"))
    assert detect_version(os.path.join(str(tmp_path), "v1")) is CgroupVersion.V1


def test_symlinked_file_is_not_followed(tmp_path: pathlib.Path) -> None:
    target = os.path.join(str(tmp_path), "elsewhere")
    with open(target, "w") as fh:
        fh.write("123\n")
    link = os.path.join(str(tmp_path), "memory.current")
    os.symlink(target, link)
    assert kernel_text.read_text(link) is None


def test_oversized_file_is_ignored(tmp_path: pathlib.Path) -> None:
    path = os.path.join(str(tmp_path), "io.stat")
    with open(path, "w") as fh:
        fh.write("8:0 rbytes=1\n" * (kernel_text.MAX_READ_BYTES // 10))
    assert kernel_text.read_text(path) is None


def test_node_pressure_and_nics() -> None:
    psi = read_node_pressure(os.path.join(FIX, "proc"))
    assert psi.cpu is not None and psi.cpu.some.avg10 == 41.2
    assert psi.io is not None and psi.io.full is not None and psi.io.full.avg10 == 11.0
    nics = read_net_dev(os.path.join(FIX, "proc"))
    assert set(nics) == {"lo", "eth0"}  # bad0's line is malformed
    assert (nics["eth0"].rx_bytes, nics["eth0"].tx_bytes) == (9876543210, 1234567890)
    assert read_net_dev(os.path.join(FIX, "nowhere")) == {}
    assert read_node_pressure(os.path.join(FIX, "nowhere")).cpu is None


def test_net_dev_ignores_headers_only() -> None:
    assert parse_net_dev("a|b\nc|d\n") == {}


def _fs_type(path: str) -> str:
    try:
        return subprocess.run(["stat", "-fc", "%T", path], capture_output=True, text=True,
                              check=False).stdout.strip()
    except OSError:
        return ""


def _real_v2_mount() -> str:
    for path in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if os.path.isdir(path) and _fs_type(path) == "cgroup2fs":
            return path
    return ""


@pytest.mark.skipif(not _real_v2_mount(),
                    reason="this machine mounts no cgroup2fs at /sys/fs/cgroup(/unified)")
def test_real_v2_root_parses() -> None:
    """The real kernel's files parse: a figure the kernel prints must not come back None."""
    mount = _real_v2_mount()
    figs = read_v2(mount)
    if os.path.exists(os.path.join(mount, "cpu.stat")):
        assert figs.cpu.usage_usec is not None
    if os.path.exists(os.path.join(mount, "cpu.pressure")):
        assert figs.pressure.cpu is not None


@pytest.mark.skipif(not os.path.exists("/proc/pressure/cpu"),
                    reason="this kernel exports no /proc/pressure (CONFIG_PSI off or psi=0)")
def test_real_node_pressure_parses() -> None:
    psi = read_node_pressure("/proc")
    assert psi.cpu is not None and 0.0 <= psi.cpu.some.avg10 <= 100.0
    assert "lo" in read_net_dev("/proc")


def _own_v1_memory_dir() -> str:
    """This process's v1 memory cgroup directory, or "" where there is none."""
    mount = "/sys/fs/cgroup/memory"
    if _fs_type(mount) != "cgroupfs":  # stat -f names v1 "cgroupfs", v2 "cgroup2fs"
        return ""
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            if "memory" in controllers.split(","):
                return os.path.join(mount, path.lstrip("/"))
    return ""


@pytest.mark.skipif(not _own_v1_memory_dir(),
                    reason="this machine mounts no cgroup v1 memory controller")
def test_real_v1_memory_cgroup_parses() -> None:
    figs = read_v1(V1Dirs(memory=_own_v1_memory_dir(), cpuacct="/sys/fs/cgroup/cpuacct"))
    assert figs.memory.current_bytes is not None and figs.memory.current_bytes > 0
    assert figs.pressure.cpu is None  # v1: no pressure, whatever the kernel
    if os.path.exists("/sys/fs/cgroup/cpuacct/cpuacct.usage"):
        assert figs.cpu.usage_usec is not None


def test_link_speeds_unknown_for_virtual_and_missing() -> None:
    speeds = read_link_speeds(os.path.join(FIX, "sys"), ["eth0", "veth1", "gone0", "../x"])
    assert speeds == {"eth0": 25000 * 1_000_000 / 8, "veth1": None, "gone0": None}


def test_parsers_never_raise_on_random_bytes() -> None:
    """Hostile files: whatever the bytes, each reader returns a value or None."""
    rng = random.Random(36)
    alphabet = "0123456789 :=.-\nsomefullavg10total8:0RdWrTx\x00é"
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80)))
        kernel_text.parse_flat_keyed(text)
        kernel_text.parse_nested_keyed(text)
        kernel_text.parse_psi(text)
        kernel_text.parse_single(text)
        _sum_io_stat(text)
        _sum_blkio(text)
        parse_net_dev(text)
        for value in kernel_text.parse_flat_keyed(text).values():
            assert 0 <= value <= kernel_text.U64_MAX
