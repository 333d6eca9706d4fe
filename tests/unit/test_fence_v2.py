"""The cgroup v2 device fence of slurmiso_fence.so, measured on this host's unified hierarchy.

``spank/slurmiso_fence.c`` built with ``-DSLURMISO_FENCE_TEST`` is a small program that runs the
plugin's own ``fence_v2()`` (what ``slurm_spank_task_post_fork`` calls) on a process, without
Slurm. Each test lays out cgroups the way Slurm's cgroup/v2 plugin does
(``job_<j>/step_<s>/user/task_<t>``) under a temporary directory of the cgroup2 mount, stands in
for Slurm's own device programs where it matters (``fence_test attach``, with the flags Slurm's
``ebpf.c`` uses: ``BPF_F_ALLOW_OVERRIDE`` on job and step, none on a task), puts a waiting probe
process in the task's cgroup, fences it, then lets it open every device stand-in.

The stand-ins are ``mknod`` character devices with NVIDIA's majors and no driver behind them:
an open that the fence lets through fails with ``ENXIO``, one the fence stops fails with
``EPERM``. On a hybrid host (cgroup v1 controllers plus ``/sys/fs/cgroup/unified``) the
kernel runs the BPF device programs of a task's unified cgroup before the v1 check, so the
v2 fence is measurable here; the plugin itself would take its v1 path on such a host.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import uuid
from typing import Dict, Iterator, List, Optional, Sequence, Set

import pytest

from slurmiso.isolation import fence
from slurmiso.mig.gres import computed_cap_minor
from slurmiso.state.record import JobRecord, Resource

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(REPO, "spank", "slurmiso_fence.c")
GCC = shutil.which("gcc") or shutil.which("cc")
#: spank/Makefile's flags, plus the switch that makes the file a test program
CFLAGS = ["-O2", "-Wall", "-Wextra", "-Werror", "-std=gnu99", "-DSLURMISO_FENCE_TEST"]
GPU_MAJORS = "gpu_majors=195,237,238"

#: GPU 0 and 1 each with instances gi 1 and gi 2 (ci 0): the caps a node would show
CAPS = {1: "config", 2: "monitor"}
for _g in (0, 1):
    for _gi in (1, 2):
        CAPS[computed_cap_minor(_g, _gi)] = f"gpu{_g}/gi{_gi}"
        CAPS[computed_cap_minor(_g, _gi, 0)] = f"gpu{_g}/gi{_gi}/ci0"

PROBE = r"""
import errno, json, os, sys
sys.stdin.readline()  # wait until the test has fenced this process
out = {}
for root, _dirs, files in os.walk(sys.argv[1]):
    for name in files:
        path = os.path.join(root, name)
        try:
            os.close(os.open(path, os.O_RDONLY)); out[path] = "OPEN"
        except OSError as exc:
            out[path] = errno.errorcode.get(exc.errno, str(exc.errno))
print(json.dumps({os.path.relpath(p, sys.argv[1]): r for p, r in out.items()}), flush=True)
"""


def _cgroup2_mount() -> Optional[str]:
    try:
        with open("/proc/self/mountinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                fields, _sep, fstype = line.partition(" - ")
                if fstype.startswith("cgroup2 "):
                    return fields.split()[4]
    except OSError:
        return None
    return None


#: Every test here runs the plugin's fence code, built here, on cgroups and devices of its own.
pytestmark = [
    pytest.mark.needs_root(reason="cgroups, mknod and BPF device programs are root's"),
    pytest.mark.needs_toolchain("cc", reason="builds the plugin's fence code"),
]


@pytest.fixture(scope="module")
def harness(tmp_path_factory: pytest.TempPathFactory) -> str:
    if _cgroup2_mount() is None:
        pytest.skip("no cgroup2 (unified) hierarchy is mounted on this host")
    assert GCC is not None  # the module's needs_toolchain mark
    exe = str(tmp_path_factory.mktemp("fence") / "fence_test")
    subprocess.run([GCC, *CFLAGS, "-o", exe, SOURCE], check=True)
    probe = subprocess.run([exe, "load", "Apache-2.0"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"the kernel refuses BPF device programs here: {probe.stdout.strip()}")
    return exe


class World:
    """Stand-in devices, a node state dir and a private cgroup tree; close() undoes it all."""

    def __init__(self, exe: str, tmp: str) -> None:
        self.exe = exe
        self.mount = _cgroup2_mount() or ""
        self.root = os.path.join(self.mount, f"slurmiso-test-{uuid.uuid4().hex[:10]}")
        self.dev = os.path.join(tmp, "dev")
        self.state = os.path.join(tmp, "state")
        self.procs: List[subprocess.Popen[str]] = []
        os.makedirs(os.path.join(self.dev, "nvidia-caps"))
        os.makedirs(self.state)
        for name, major, minor in [(f"nvidia{i}", 195, i) for i in range(4)] + [
                ("nvidiactl", 195, 255), ("nvidia-uvm", 238, 0)]:
            os.mknod(os.path.join(self.dev, name), 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        for minor in CAPS:
            os.mknod(os.path.join(self.dev, "nvidia-caps", f"nvidia-cap{minor}"),
                     0o444 | stat.S_IFCHR, os.makedev(237, minor))
        os.mkdir(self.root)

    # ---------------------------------------------------------------- cgroups and tasks
    def cgroup(self, rel: str) -> str:
        path = os.path.join(self.root, rel)
        os.makedirs(path, exist_ok=True)
        return path

    def task(self, rel: str) -> subprocess.Popen[str]:
        """A probe process, moved into cgroup rel as Slurm moves a forked task."""
        proc = subprocess.Popen([sys.executable, "-c", PROBE, self.dev], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        self.procs.append(proc)
        with open(os.path.join(self.cgroup(rel), "cgroup.procs"), "w") as fh:
            fh.write(str(proc.pid))
        return proc

    def probe(self, proc: subprocess.Popen[str]) -> Dict[str, str]:
        out, _err = proc.communicate("go\n", timeout=60)
        return dict(json.loads(out))

    # ---------------------------------------------------------------- fences
    def write_fence(self, job: str, rules: Sequence[str], narrow: Sequence[str] = ()) -> None:
        fence.write(self.state, job, "test", rules, narrow)

    def apply(self, job: str, task: int, proc: subprocess.Popen[str],
              state_dir: Optional[str] = None,
              stepd: Optional[subprocess.Popen[str]] = None) -> subprocess.CompletedProcess[str]:
        """fence_v2(), as slurm_spank_task_post_fork runs it (in slurmstepd: ``stepd`` stands
        in for it, a process in the step's ``slurm`` cgroup; default: this test program)."""
        extra = [f"stepd={stepd.pid}"] if stepd is not None else []
        return subprocess.run([self.exe, "v2", job, str(task), str(proc.pid), *extra,
                               f"state_dir={state_dir or self.state}", GPU_MAJORS],
                              capture_output=True, text=True)

    def stepd(self, rel: str) -> subprocess.Popen[str]:
        """A stand-in for slurmstepd, in cgroup rel (Slurm's <job dir>/step_<s>/slurm)."""
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                                stdin=subprocess.PIPE, text=True)
        self.procs.append(proc)
        with open(os.path.join(self.cgroup(rel), "cgroup.procs"), "w") as fh:
            fh.write(str(proc.pid))
        return proc

    def attach(self, rel: str, flags: str, *rules: str) -> subprocess.CompletedProcess[str]:
        """A stand-in for one of Slurm's device programs (deny rules, default allow)."""
        return subprocess.run([self.exe, "attach", self.cgroup(rel), flags, *rules],
                              capture_output=True, text=True)

    def query(self, rel: str) -> Dict[str, List[int]]:
        out = subprocess.run([self.exe, "query", self.cgroup(rel)], capture_output=True,
                             text=True, check=True).stdout.splitlines()
        return {ln.split()[0]: [int(x) for x in ln.split()[1:]] for ln in out}

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
            proc.communicate()
        for top, _dirs, _files in os.walk(self.root, topdown=False):
            try:
                with open(os.path.join(top, "cgroup.procs")) as fh:
                    left = fh.read().split()
                for pid in left:  # nothing of ours should be left; never leave a cgroup behind
                    with open(os.path.join(self.mount, "cgroup.procs"), "w") as out:
                        out.write(pid)
                os.rmdir(top)
            except OSError:
                pass
        assert not os.path.exists(self.root), f"cgroup {self.root} left behind"


@pytest.fixture
def world(harness: str, tmp_path) -> Iterator[World]:
    w = World(harness, str(tmp_path))
    try:
        yield w
    finally:
        w.close()


# ------------------------------------------------------------------------ helpers
GPUS = {f"nvidia{i}" for i in range(4)}
OTHERS = {"nvidiactl", "nvidia-uvm"}
ALL_CAPS = {f"nvidia-caps/nvidia-cap{m}" for m in CAPS}


def cap(gpu: int, gi: int, ci: Optional[int] = None) -> str:
    return f"nvidia-caps/nvidia-cap{computed_cap_minor(gpu, gi, ci)}"


def reached(result: Dict[str, str]) -> Set[str]:
    """Every open was either let through (ENXIO: no driver) or fenced (EPERM)."""
    odd = {p: r for p, r in result.items() if r not in ("ENXIO", "EPERM")}
    assert not odd, f"neither reachable nor fenced: {odd}"
    assert set(result) == GPUS | OTHERS | ALL_CAPS
    return {p for p, r in result.items() if r == "ENXIO"}


def migd_fence(gpu: int, gi: int, gpus_per_node: int, dev: str) -> List[str]:
    record = JobRecord(mode="mig-dynamic", resources=[Resource("mig-dynamic", gpu=gpu, gi=gi, ci=0)])
    _why, rules, _narrow = fence.job_fence(record, False, dev, gpus_per_node)
    return rules


def slurm_denies(own_gpu: int) -> List[str]:
    """What Slurm's job or step program denies for a job given one GPU of four."""
    return [f"c 195:{i}" for i in range(4) if i != own_gpu]


TASK = "job_42/step_0/user/task_0"


# ------------------------------------------------------------------------ the measurements
def test_stand_ins_are_reachable_without_a_fence(world: World) -> None:
    proc = world.task("elsewhere")
    assert reached(world.probe(proc)) == GPUS | OTHERS | ALL_CAPS


def test_deny_one_gpu(world: World) -> None:
    world.write_fence("42", ["c 195:1"])
    proc = world.task(TASK)
    assert world.apply("42", 0, proc).returncode == 0
    assert reached(world.probe(proc)) == (GPUS - {"nvidia1"}) | OTHERS | ALL_CAPS


def test_refused_job_reaches_no_nvidia_device(world: World) -> None:
    world.write_fence("42", fence.deny_all_rules(world.dev))
    proc = world.task(TASK)
    assert world.apply("42", 0, proc).returncode == 0
    assert reached(world.probe(proc)) == set()


def test_missing_fence_on_a_managed_node_denies_every_nvidia_major(world: World) -> None:
    proc = world.task(TASK)  # the state dir exists, fence/42 does not
    res = world.apply("42", 0, proc)
    assert res.returncode == 0 and "every GPU device denied" in res.stderr
    assert reached(world.probe(proc)) == set()


def test_node_slurmiso_does_not_manage_is_left_to_slurm(world: World) -> None:
    proc = world.task(TASK)
    assert world.apply("42", 0, proc, state_dir=world.state + "-absent").returncode == 0
    assert reached(world.probe(proc)) == GPUS | OTHERS | ALL_CAPS


def test_mig_dynamic_job_reaches_its_gpu_and_its_two_caps_beside_slurms_fence(world: World) -> None:
    """Slurm's job and step programs (ALLOW_OVERRIDE) close GPUs 0, 2, 3; slurmiso's fence, for
    an instance on GPU 1 of an 8-GPU node (1080 cap minors denied), closes every other cap."""
    assert world.attach("job_42", "override", *slurm_denies(1)).returncode == 0
    assert world.attach("job_42/step_0/user", "override", *slurm_denies(1)).returncode == 0
    world.write_fence("42", migd_fence(1, 2, 8, world.dev))
    proc = world.task(TASK)
    res = world.apply("42", 0, proc)
    assert res.returncode == 0, res.stderr
    assert reached(world.probe(proc)) == {"nvidia1", *OTHERS, cap(1, 2), cap(1, 2, 0)}


def test_a_program_below_slurms_replaces_it_unless_slurms_is_attached_again(world: World) -> None:
    """Why fence_attach() re-attaches: the kernel runs an ancestor's ALLOW_OVERRIDE program only
    while nothing is attached below it, even with ALLOW_MULTI below (GPU 0 reopens)."""
    assert world.attach("job_42/step_0/user", "override", *slurm_denies(1)).returncode == 0
    proc = world.task(TASK)
    assert world.attach(TASK, "multi", "c 237:*").returncode == 0  # naive: ours alone
    assert reached(world.probe(proc)) == GPUS | OTHERS  # Slurm's fence is gone


def test_slurms_task_program_is_kept_beside_the_fence(world: World) -> None:
    """Slurm attaches a task's GRES-binding program with no flag: a MULTI program cannot join it
    (EPERM); fence_v2 makes the task's list MULTI with Slurm's program first, then its own."""
    assert world.attach("job_42/step_0/user", "override", *slurm_denies(1)).returncode == 0
    proc = world.task(TASK)
    assert world.attach(TASK, "none", *slurm_denies(1)).returncode == 0
    slurm_task = world.query(TASK)["own"]
    naive = world.attach(TASK, "multi", "c 237:*")
    assert naive.returncode == 1 and "Operation not permitted" in naive.stdout
    world.write_fence("42", migd_fence(1, 1, 2, world.dev))
    res = world.apply("42", 0, proc)
    assert res.returncode == 0, res.stderr
    after = world.query(TASK)
    assert after["flags"] == [2] and after["own"][0] == slurm_task[0] and len(after["own"]) == 2
    assert reached(world.probe(proc)) == {"nvidia1", *OTHERS, cap(1, 1), cap(1, 1, 0)}


def test_a_multi_program_already_on_the_task_stays_beside_the_fence(world: World) -> None:
    proc = world.task(TASK)
    assert world.attach(TASK, "multi", "c 195:3").returncode == 0
    world.write_fence("42", ["c 195:1"])
    assert world.apply("42", 0, proc).returncode == 0
    assert len(world.query(TASK)["own"]) == 2
    assert reached(world.probe(proc)) == {"nvidia0", "nvidia2", *OTHERS, *ALL_CAPS}


def test_two_jobs_each_reach_exactly_their_share(world: World) -> None:
    for job, gpu, gi in (("42", 0, 1), ("43", 1, 2)):
        assert world.attach(f"job_{job}", "override", *slurm_denies(gpu)).returncode == 0
        world.write_fence(job, migd_fence(gpu, gi, 2, world.dev))
    a = world.task("job_42/step_0/user/task_0")
    b = world.task("job_43/step_0/user/task_0")
    assert world.apply("42", 0, a).returncode == 0
    assert world.apply("43", 0, b).returncode == 0
    assert reached(world.probe(a)) == {"nvidia0", *OTHERS, cap(0, 1), cap(0, 1, 0)}
    assert reached(world.probe(b)) == {"nvidia1", *OTHERS, cap(1, 2), cap(1, 2, 0)}


def test_sibling_tasks_with_different_fences_keep_their_own(world: World) -> None:
    t0 = world.task("job_42/step_0/user/task_0")
    t1 = world.task("job_42/step_0/user/task_1")
    world.write_fence("42", ["c 195:0", "c 237:*"])
    assert world.apply("42", 0, t0).returncode == 0
    world.write_fence("42", ["c 195:1"])
    assert world.apply("42", 1, t1).returncode == 0
    assert reached(world.probe(t0)) == (GPUS - {"nvidia0"}) | OTHERS
    assert reached(world.probe(t1)) == (GPUS - {"nvidia1"}) | OTHERS | ALL_CAPS


def test_task_outside_a_task_cgroup_gets_its_own_leaf(world: World) -> None:
    world.write_fence("42", ["c 195:2"])
    proc = world.task("job_42/step_0")
    assert world.apply("42", 7, proc).returncode == 0
    with open(f"/proc/{proc.pid}/cgroup") as fh:
        assert any(ln.startswith("0::") and ln.rstrip().endswith("/job_42/step_0/task_7")
                   for ln in fh)
    assert reached(world.probe(proc)) == (GPUS - {"nvidia2"}) | OTHERS | ALL_CAPS


# ------------------------------------------------------------------------ fail closed
@pytest.mark.parametrize("case, message", [
    ("bad-line", "bad line"),
    ("not-root", "not a root-owned file"),
    ("other-job", "not in this job's cgroup"),
    ("shared-task-cgroup", "other processes than the task"),
])
def test_a_fence_that_cannot_be_applied_refuses_the_task(world: World, case: str,
                                                         message: str) -> None:
    world.write_fence("42", ["c 195:1"])
    rel = "job_43/step_0/user/task_0" if case == "other-job" else TASK
    proc = world.task(rel)
    if case == "bad-line":
        with open(fence.fence_path(world.state, "42"), "a") as fh:
            fh.write("deny c 195:1; echo\n")
    elif case == "not-root":
        os.chown(fence.fence_path(world.state, "42"), 65534, 65534)
    elif case == "shared-task-cgroup":
        assert world.attach(TASK, "none", "c 195:3").returncode == 0
        world.task(TASK)  # a second process in the task's cgroup
    res = world.apply("42", 0, proc)
    assert res.returncode == 1 and message in res.stderr and "does not start" in res.stderr


def test_narrow_lines_alone_never_refuse_a_task_outside_its_job_cgroup(world: World) -> None:
    """As on v1: "narrow" lines close what Slurm already covers, where the cgroup can take them."""
    world.write_fence("42", [], ["c 237:2"])
    inside, outside = world.task(TASK), world.task("job_43/step_0/user/task_0")
    assert world.apply("42", 0, inside).returncode == 0
    assert world.apply("42", 0, outside).returncode == 0
    assert reached(world.probe(inside)) == GPUS | OTHERS | (ALL_CAPS - {cap_minor_path(2)})
    assert reached(world.probe(outside)) == GPUS | OTHERS | ALL_CAPS


# ------------------------------------------------------------------------ 26.05: SLUID paths
#: Slurm 26.05 names a job's v2 cgroup by its SLUID ("s" + 13 Crockford base32 digits,
#: src/common/sluid.c print_sluid), not job_<id>, unless CgroupJobIdPaths=yes.
SLUID = "s42DM918PDCP00"
OTHER_SLUID = "s42DM918PDCQ00"


def test_sluid_job_dir_is_this_jobs_when_slurmstepd_lives_in_it(world: World) -> None:
    """Nothing tells a SLUID's job id to a SPANK plugin: the job dir is this job's when it is
    also the job dir of the step's slurmstepd (in <job dir>/step_<s>/slurm)."""
    world.write_fence("42", ["c 195:1"])
    stepd = world.stepd(f"{SLUID}/step_0/slurm")
    proc = world.task(f"{SLUID}/step_0/user/task_0")
    res = world.apply("42", 0, proc, stepd=stepd)
    assert res.returncode == 0, res.stderr
    assert reached(world.probe(proc)) == (GPUS - {"nvidia1"}) | OTHERS | ALL_CAPS


def test_sluid_mig_static_narrow_lines_are_applied(world: World) -> None:
    """The mig-static fence is "narrow" lines only: on a SLUID job dir they must still be
    applied (the 26.05 sandbox measured every cap open before this check knew SLUIDs)."""
    world.write_fence("42", [], ["c 237:2"])
    stepd = world.stepd(f"{SLUID}/step_batch/slurm")
    proc = world.task(f"{SLUID}/step_batch/user/task_0")
    assert world.apply("42", 0, proc, stepd=stepd).returncode == 0
    assert reached(world.probe(proc)) == GPUS | OTHERS | (ALL_CAPS - {cap_minor_path(2)})


@pytest.mark.parametrize("stepd_rel", [f"{OTHER_SLUID}/step_0/slurm", None, "elsewhere"],
                         ids=["other-job", "no-stepd", "stepd-not-in-a-job"])
def test_sluid_job_dir_of_another_job_refuses_the_task(world: World,
                                                      stepd_rel: Optional[str]) -> None:
    world.write_fence("42", ["c 195:1"])
    stepd = world.stepd(stepd_rel) if stepd_rel else None
    proc = world.task(f"{SLUID}/step_0/user/task_0")
    res = world.apply("42", 0, proc, stepd=stepd)
    assert res.returncode == 1 and "not in this job's cgroup" in res.stderr


def test_a_job_id_dir_must_be_exactly_this_jobs(world: World) -> None:
    """job_420 is not job_42's: the job dir is compared whole."""
    world.write_fence("42", ["c 195:1"])
    proc = world.task("job_420/step_0/user/task_0")
    res = world.apply("42", 0, proc)
    assert res.returncode == 1 and "not in this job's cgroup" in res.stderr


def test_malformed_sluid_is_not_a_job_dir(world: World) -> None:
    world.write_fence("42", ["c 195:1"])
    stepd = world.stepd("s42dm918pdcp00/step_0/slurm")
    proc = world.task("s42dm918pdcp00/step_0/user/task_0")  # lower case: not print_sluid's
    res = world.apply("42", 0, proc, stepd=stepd)
    assert res.returncode == 1 and "not in this job's cgroup" in res.stderr


def cap_minor_path(minor: int) -> str:
    return f"nvidia-caps/nvidia-cap{minor}"


# ------------------------------------------------------------------------ the v1 path
def test_v1_path_still_fences_through_devices_deny(harness: str, tmp_path) -> None:
    """The unchanged v1 path, on this host's v1 devices controller, through the same program."""
    v1 = "/sys/fs/cgroup/devices"
    if not os.path.exists(os.path.join(v1, "devices.deny")):
        pytest.skip("no cgroup v1 devices controller on this host")
    world = World(harness, str(tmp_path))
    step = os.path.join(v1, f"slurmiso-test-{uuid.uuid4().hex[:10]}", "job_42", "step_0")
    os.makedirs(step)
    try:
        world.write_fence("42", ["c 195:1"], ["c 237:2"])
        res = subprocess.run(
            [harness, "v1", "42", "3", step, sys.executable, "-c", PROBE, world.dev, "--",
             f"state_dir={world.state}", GPU_MAJORS], input="go\n", capture_output=True,
            text=True, timeout=60)
        assert res.returncode == 0, res.stderr
        assert reached(json.loads(res.stdout)) == (
            (GPUS - {"nvidia1"}) | OTHERS | (ALL_CAPS - {"nvidia-caps/nvidia-cap2"}))
        assert os.path.isdir(os.path.join(step, "task_3"))  # the task's own v1 cgroup
    finally:
        for top, _d, _f in os.walk(os.path.dirname(os.path.dirname(step)), topdown=False):
            os.rmdir(top)
        world.close()


def test_the_plugin_picks_v1_where_the_task_has_a_v1_devices_controller(harness: str) -> None:
    with open("/proc/self/cgroup") as fh:
        has_v1 = any(":devices:" in ln or ",devices:" in ln or ":devices," in ln for ln in fh)
    out = subprocess.run([harness, "dispatch", str(os.getpid())], capture_output=True,
                         text=True, check=True).stdout.strip()
    assert out == ("v1" if has_v1 else "v2")
