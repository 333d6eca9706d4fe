"""Device fences against the job's own user, in every pool mode (issue 13).

The sandbox runs as a production GPU node does (task/cgroup, ConstrainDevices=yes) and its
device stand-ins carry the driver's modes (GPUs 0666, MIG caps 0444), so an unprivileged
``open`` tells the two apart without a GPU: ``ENXIO`` (no driver behind the file: the job may
reach it) against ``EPERM`` (the device cgroup closed it) or ``EACCES`` (its mode did).

In every pool two jobs of the SAME user run at once, each opening every GPU device and every
MIG capability device of its node: file modes cannot tell two jobs of one user apart, so what
keeps them apart is the cgroup fence (Slurm's, plus slurmiso_fence.so on mig-dynamic and for
refused jobs). Each must reach exactly its share: one GPU, plus its own instance's two caps on
MIG pools.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import uuid
from typing import Any, Dict, List, Set, Tuple

import pytest

from slurmiso.mig.gres import computed_cap_minor
from slurmiso.state import Journal
from slurmiso_sandbox import layout as L

PROBE = r"""#!/bin/bash
# wait (bounded) until the other job of the pair runs too, then open every device
touch {tag}.$SLURM_JOB_ID
for i in $(seq 1 150); do [ $(ls {tag}.* 2>/dev/null | wc -l) -ge 2 ] && break; sleep 0.2; done
{srun}{python} - <<'EOF'
import errno, glob, json, os
paths = sorted(glob.glob("{dev}/nvidia[0-9]*") + glob.glob("{dev}/nvidia-caps/nvidia-cap*"))
out = {{}}
for p in paths:
    try:
        os.close(os.open(p, os.O_RDONLY)); out[p] = "OPEN"
    except OSError as e:
        out[p] = errno.errorcode.get(e.errno, str(e.errno))
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
print("PROBE " + json.dumps({{"uid": os.getuid(), "cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                             "open": out, "host": os.uname().nodename, "pipe": pipe,
                             "pipe_seen": bool(pipe) and os.path.isdir(pipe),
                             "uid_map": open("/proc/self/uid_map").read().split()}}))
EOF
sleep 2
"""

REACHABLE = {"ENXIO", "OPEN"}  # no driver behind the stand-in: the open got through
FENCED = {"EPERM", "EACCES"}

# (partition, node, sbatch GRES per job, qos)
POOLS = [
    ("gpu", "n1", "--gres=gpu:1", "debug"),
    ("mps", "n2", "--gres=mps:50", "infer"),
    ("mig", "n3", "--gres=gpu:3g.40gb:1", "infer"),
    ("migd", "n4", "--gres=shard:3", "infer"),
    ("tslice", "n5", "--gres=shard:1", "train"),
]


def _probe(sandbox: Any, job_output: Any, job: str) -> Dict[str, Any]:
    lines = [ln for ln in job_output(job).splitlines() if ln.startswith("PROBE ")]
    assert lines, job_output(job)
    return json.loads(lines[-1][6:])


def _reached(probe: Dict[str, Any]) -> Set[str]:
    bad = {p: r for p, r in probe["open"].items() if r not in REACHABLE | FENCED}
    assert not bad, f"unexpected errors (neither reachable nor fenced): {bad}"
    return {p for p, r in probe["open"].items() if r in REACHABLE}


def _gpus(paths: Set[str]) -> Set[str]:
    return {p for p in paths if re.search(r"/nvidia\d+$", p)}


def _caps(paths: Set[str]) -> Set[str]:
    return {p for p in paths if "/nvidia-caps/" in p}


def _static_instances(sandbox: Any, node: str) -> List[Tuple[str, ...]]:
    """The MultipleFiles of each MIG device gres.conf lists for ``node``."""
    with open(sandbox.path("etc", "gres.conf")) as fh:
        return [tuple(ln.split("MultipleFiles=")[1].split(","))
                for ln in fh.read().splitlines()
                if ln.startswith(f"NodeName={node} ") and "MultipleFiles=" in ln]


def _own_dynamic_caps(sandbox: Any, node: str, job: str) -> Set[str]:
    events = [e for e in Journal(sandbox.path("log", f"journal-{node}.jsonl")).read()
              if e.get("job") == job and e.get("event") == "prolog"]
    assert events and events[-1].get("outcome") == "ready", events
    caps = set()
    for res in events[-1]["resources"]:
        for minor in (computed_cap_minor(res["gpu"], res["gi"]),
                      computed_cap_minor(res["gpu"], res["gi"], res["ci"])):
            caps.add(sandbox.path("dev", node, "nvidia-caps", f"nvidia-cap{minor}"))
    return caps


@pytest.mark.parametrize("srun", ["", "srun "], ids=["batch", "srun"])
@pytest.mark.parametrize("partition,node,gres,qos", POOLS, ids=[p[0] for p in POOLS])
def test_two_jobs_of_one_user_reach_exactly_their_share(
    sandbox: Any, submit: Any, wait_for: Any, job_output: Any,
    partition: str, node: str, gres: str, qos: str, srun: str,
) -> None:
    """In the batch step and in an srun step (Slurm sets a step's task cgroup up later)."""
    tag = os.path.join(sandbox.jobs_dir, f"fence-{uuid.uuid4().hex[:8]}")
    script = PROBE.format(tag=tag, python="/usr/bin/python3", dev=sandbox.path("dev", node),
                          srun=srun)
    jobs = [submit(script, "-p", partition, gres, f"--qos={qos}", user=L.TEST_USER)
            for _ in range(2)]
    for job in jobs:
        wait_for(job, timeout=90)
    probes = {job: _probe(sandbox, job_output, job) for job in jobs}
    assert all(p["uid"] != 0 for p in probes.values())
    # they ran together: each saw the other's marker before probing
    assert len([f for f in os.listdir(sandbox.jobs_dir) if f.startswith(os.path.basename(tag))]) == 2
    assert_exact_shares(sandbox, partition, node, probes)


def assert_exact_shares(sandbox: Any, partition: str, node: str,
                        probes: Dict[str, Dict[str, Any]]) -> None:
    """Each of two jobs of one user reached exactly its own share of ``node`` (also used by
    test_containers.py, with the probes run inside containers)."""
    node_gpus = {sandbox.path("dev", node, f"nvidia{g}") for g in range(2)}
    statics = _static_instances(sandbox, node)
    for job, probe in probes.items():
        reached = _reached(probe)
        assert len(_gpus(reached)) == 1, (job, sorted(reached))
        assert node_gpus - _gpus(reached) <= {p for p, r in probe["open"].items() if r in FENCED}
        caps = _caps(reached)
        if partition == "mig":
            mine = [inst for inst in statics if set(inst[1:]) == caps]
            assert len(mine) == 1 and mine[0][0] in reached, (job, sorted(caps))
            others = {c for inst in statics for c in inst[1:]} - caps
            assert all(probe["open"][c] in FENCED for c in others), job
        elif partition == "migd":
            assert caps == _own_dynamic_caps(sandbox, node, job), (job, sorted(caps))
            everything = _caps(set(probe["open"]))
            assert all(probe["open"][c] in FENCED for c in everything - caps)
        else:
            assert caps == set(), (job, sorted(caps))
    if partition == "gpu":  # whole GPUs: the two jobs' shares never meet
        a, b = (_reached(p) for p in probes.values())
        assert not (a & b), sorted(a & b)
    if partition in ("mig", "migd"):  # MIG instances: never the same one
        a, b = (_caps(_reached(p)) for p in probes.values())
        assert len(a) == len(b) == 2 and not (a & b)


def test_refused_job_reaches_no_gpu_even_if_it_resets_the_variables(
    sandbox: Any, submit: Any, wait_for: Any, job_output: Any,
) -> None:
    """A job the prolog refuses (class debug needs exclusive; tslice gives timeslice) has its
    GPU fenced, not merely hidden in CUDA_VISIBLE_DEVICES: setting the variable back to every
    GPU reaches nothing."""
    tag = os.path.join(sandbox.jobs_dir, f"refused-{uuid.uuid4().hex[:8]}")
    dev = sandbox.path("dev", "n5")
    script = ("export CUDA_VISIBLE_DEVICES=0,1\n"
              + PROBE.format(tag=tag, python="/usr/bin/python3", dev=dev, srun="")
              .replace("#!/bin/bash\n", "").replace("-ge 2", "-ge 1"))
    job = submit("#!/bin/bash\n" + script, "-p", "tslice", "--gres=shard:1", "--qos=debug",
                 user=L.TEST_USER)
    wait_for(job, timeout=60)
    events = [e for e in Journal(sandbox.path("log", "journal-n5.jsonl")).read()
              if e.get("job") == job and e.get("event") == "prolog"]
    assert events and events[-1]["outcome"] == "refused", events
    probe = _probe(sandbox, job_output, job)
    assert probe["cvd"] == "0,1"  # the job undid what the task prolog set ...
    assert _reached(probe) == set(), sorted(_reached(probe))  # ... and still reaches nothing
    assert all(r in FENCED for r in probe["open"].values())


def test_step_of_a_job_whose_fence_vanished_reaches_no_gpu(
    sandbox: Any, submit: Any, wait_for: Any, job_output: Any,
) -> None:
    """No fence file on a managed node means slurmiso never isolated the job: the plugin
    denies every NVIDIA device (fail closed) rather than let the step run on Slurm's alone."""
    from slurmiso.isolation import fence

    dev = sandbox.path("dev", "n1")
    gate = os.path.join(sandbox.jobs_dir, f"gate-{uuid.uuid4().hex[:8]}")
    probe = PROBE.format(tag=gate, python="/usr/bin/python3", dev=dev, srun="").replace(
        "#!/bin/bash\n", "").replace("-ge 2", "-ge 1")
    step = os.path.join(sandbox.jobs_dir, f"step-{uuid.uuid4().hex[:8]}.sh")
    with open(step, "w") as fh:
        fh.write("#!/bin/bash\n" + probe)
    os.chmod(step, 0o755)
    script = (f"#!/bin/bash\nfor i in $(seq 1 100); do [ -e {gate}.go ] && break; sleep 0.2; done\n"
              f"srun {step}\n")
    job = submit(script, "-p", "gpu", "--gres=gpu:1", "--qos=debug", user=L.TEST_USER)
    wait_for(job, {"RUNNING"}, timeout=60)
    state_dir = sandbox.path("state", "n1")
    from tests.integration.test_isolation import wait_prolog

    wait_prolog(sandbox, "n1", job)  # RUNNING shows while the Prolog works (PrologFlags=Alloc)
    assert fence.read_rules(state_dir, job) == []  # the prepared job's own fence: Slurm's
    fence.remove(state_dir, job)
    open(f"{gate}.go", "w").close()
    wait_for(job, timeout=60)
    result = _probe(sandbox, job_output, job)
    assert _reached(result) == set(), sorted(_reached(result))


PLACEMENT = r"""#!/bin/bash
touch {tag}.$SLURM_JOB_ID
for i in $(seq 1 150); do [ $(ls {tag}.[0-9]* 2>/dev/null | wc -l) -ge 2 ] && break; sleep 0.2; done
echo "BATCH $(grep -m1 '^0::' /proc/self/cgroup)"
echo "BATCHDEV $(grep -m1 -E '^[0-9]+:([^:]*,)?devices(,[^:]*)?:' /proc/self/cgroup)"
echo "SLUID ${{SLURM_JOB_SLUID:-}}"
srun bash -c 'echo "STEP $(grep -m1 "^0::" /proc/self/cgroup)"'
touch {tag}.printed.$SLURM_JOB_ID
for i in $(seq 1 150); do [ -e {tag}.go ] && break; sleep 0.2; done
"""


def _line(out: str, key: str) -> str:
    found = [ln[len(key) + 1:] for ln in out.splitlines() if ln.startswith(key + " ")]
    assert found, (key, out)
    return found[-1]


def test_each_job_sees_slurms_placement_of_the_sandboxs_cgroup_version(
    sandbox: Any, submit: Any, wait_for: Any, job_output: Any,
) -> None:
    """Which cgroup version fences the jobs above: each job's own /proc/self/cgroup.

    cgroup v2: the unified ("0::") line is Slurm's cgroup/v2 placement,
    ``<slice>/<node>_slurmstepd.scope/<job dir>/step_batch/user/task_0`` (and ``step_0`` for an
    srun step), where the job dir is ``job_<id>`` or, from 26.05 (CgroupJobIdPaths=no), the
    job's SLUID, the one in its environment and in ``scontrol show job -d``; on a hybrid host
    the task's v1 devices cgroup is the root (it allows everything), so the BPF programs alone
    decide. While the jobs run, that cgroup exists at /sys/fs/cgroup as the daemons see it (the
    sandbox's mount namespace). cgroup v1: the v1 devices line is the job's and step's."""
    tag = os.path.join(sandbox.jobs_dir, f"place-{uuid.uuid4().hex[:8]}")
    jobs = [submit(PLACEMENT.format(tag=tag), "-p", "gpu", "--gres=gpu:1", "--qos=debug",
                   user=L.TEST_USER) for _ in range(2)]
    try:
        for job in jobs:
            for _ in range(300):
                if os.path.exists(f"{tag}.printed.{job}"):
                    break
                time.sleep(0.2)
        outs = {job: job_output(job) for job in jobs}
        dirs = set()
        for job, out in outs.items():
            batch, step = _line(out, "BATCH"), _line(out, "STEP")
            if sandbox.cgroup_version == 1:
                dev = _line(out, "BATCHDEV")
                assert f"/job_{job}/step_batch" in dev, (job, out)
                continue
            m = re.fullmatch(r"0::(/.*)/([^/]+)/step_batch/user/task_0", batch)
            assert m, (job, batch)
            scope, job_dir = m.groups()
            assert re.fullmatch(r"/[^/]+\.slice/n1_slurmstepd\.scope", scope), (job, batch)
            assert step == f"0::{scope}/{job_dir}/step_0/user/task_0", (job, step)
            sluid = _line(out, "SLUID") if "SLUID " in out else ""
            if job_dir.startswith("job_"):
                assert job_dir == f"job_{job}" and not sluid, (job, job_dir, sluid)
            else:  # 26.05's default: the SLUID
                fields = sandbox.cmd("scontrol", "show", "job", "-d", job)
                assert re.fullmatch(r"s[0-9A-HJKMNP-TV-Z]{13}", job_dir), job_dir
                assert job_dir == sluid and f"SLUID={job_dir}" in fields, (job, job_dir, sluid)
            dev = [ln for ln in out.splitlines() if ln.startswith("BATCHDEV ")]
            if dev and dev[-1].strip() != "BATCHDEV":  # a hybrid host: v1 devices is the root
                assert dev[-1].rstrip().endswith(":/"), (job, dev)
            cg = f"/sys/fs/cgroup{batch[3:]}"
            seen = subprocess.run(sandbox.ns_argv("cat", f"{cg}/cgroup.procs"),
                                  capture_output=True, text=True, timeout=30)
            assert seen.returncode == 0 and seen.stdout.split(), (cg, seen.stderr)
            dirs.add(job_dir)
        if sandbox.cgroup_version == 2:
            assert len(dirs) == 2  # two jobs, two job dirs
    finally:
        open(f"{tag}.go", "w").close()
    for job in jobs:
        wait_for(job, timeout=60)


def test_doctor_sees_slurms_and_slurmisos_device_programs_on_a_v2_node(
    sandbox: Any, submit: Any, wait_for: Any,
) -> None:
    """doctor on the mig-dynamic node while two jobs run there (a batch task, an srun task):
    on cgroup v2 it finds Slurm's device program on each job's cgroup and slurmiso_fence's in
    effect beside it on each task (BPF_PROG_QUERY, by program name), and nothing wrong."""
    if sandbox.cgroup_version != 2:
        pytest.skip("the cgroup v2 fence check (doctor on a cgroup/v2 node)")
    gate = os.path.join(sandbox.jobs_dir, f"doctor-{uuid.uuid4().hex[:8]}")
    wait = f"for i in $(seq 1 300); do [ -e {gate} ] && break; sleep 0.2; done\n"
    jobs = [submit("#!/bin/bash\n" + wait, "-p", "migd", "--gres=shard:3", "--qos=infer",
                   user=L.TEST_USER),
            submit(f"#!/bin/bash\nsrun bash -c '{wait.strip()}'\n", "-p", "migd",
                   "--gres=shard:3", "--qos=infer", user=L.TEST_USER)]
    try:
        for job in jobs:
            wait_for(job, {"RUNNING"}, timeout=60)
        report: Dict[str, Any] = {}
        for _ in range(50):  # until the srun step's task runs
            cp = sandbox.node_slurmiso("doctor", "--node", "n4", "--json")
            report = json.loads(cp.stdout)
            v2 = {f["code"]: f for f in report["findings"] if f["code"].startswith("cgroup-v2")}
            if "2 running job(s), 3 task(s)" in v2.get("cgroup-v2-fences", {}).get("message", ""):
                break
            time.sleep(0.5)
        assert set(v2) == {"cgroup-v2-fences"}, v2
        assert v2["cgroup-v2-fences"]["severity"] == "info"
        assert "3 task(s) with slurmiso's fence in effect beside Slurm's" in \
            v2["cgroup-v2-fences"]["message"], v2
    finally:
        open(gate, "w").close()
    for job in jobs:
        wait_for(job, timeout=60)
