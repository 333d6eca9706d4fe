"""Per-job isolation with the real slurmd running the real hooks on simulated GPUs.

Each pool mode: the job sees the right devices and limits, and when it ends the simulated GPUs
are exactly as before. Failure semantics: a job problem refuses the job and keeps the node; a
GPU that falls off the bus drains the node with slurmiso's reason in ``sinfo -R``.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Dict, Iterator, List

import pytest

from slurmiso.atomic import write_atomic
from slurmiso.gpu.sim import SimBackend
from slurmiso.state import Journal
from slurmiso_sandbox import layout as L
from slurmiso_sandbox.procs import wait_until

ENV_DUMP = "#!/bin/bash\nenv | sort\n"
HOLD = "#!/bin/bash\nenv | sort\nsleep {secs}\n"


def env_of(output: str) -> Dict[str, str]:
    return dict(ln.split("=", 1) for ln in output.splitlines() if "=" in ln)


def sim(sandbox: Any, node: str) -> SimBackend:
    return SimBackend(sandbox.path("sim", f"{node}.json"))


def gpu_snapshot(sandbox: Any, node: str) -> Dict[str, Any]:
    """What must be identical before and after a job: instances, processes, MIG mode."""
    state = sim(sandbox, node).state()
    for key in [k for k in state if "generation" in k]:  # UUID counters only ever grow
        state.pop(key)
    return state


def records(sandbox: Any, node: str) -> List[str]:
    folder = sandbox.path("state", node, "jobs")
    return sorted(os.listdir(folder)) if os.path.isdir(folder) else []


def journal(sandbox: Any, node: str, job: str) -> List[Dict[str, Any]]:
    path = sandbox.path("log", f"journal-{node}.jsonl")
    return [e for e in Journal(path).read() if e.get("job") == job]


def wait_event(sandbox: Any, node: str, job: str, event: str, timeout: float = 30) -> None:
    """Wait for the job's ``event`` record: RUNNING can show while the Prolog still works
    (PrologFlags=Alloc), and COMPLETED before the Epilog has finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(e["event"] == event for e in journal(sandbox, node, job)):
            return
        time.sleep(0.2)
    raise AssertionError(f"no {event} record for job {job} on {node}")


def wait_prolog(sandbox: Any, node: str, job: str) -> None:
    wait_event(sandbox, node, job, "prolog")


def wait_epilog(sandbox: Any, node: str, job: str) -> None:
    wait_event(sandbox, node, job, "job-end")


def test_exclusive_job(sandbox: Any, submit: Any, wait_for: Any, job_output: Any) -> None:
    before = gpu_snapshot(sandbox, "n1")
    job = submit(ENV_DUMP, "-p", "gpu", "--gres=gpu:1", "--qos=debug")
    wait_for(job)
    env = env_of(job_output(job))
    assert env["SLURMISO_CLASS"] == "debug"
    assert env["CUDA_VISIBLE_DEVICES"] in {"0", "1"}
    wait_epilog(sandbox, "n1", job)
    events = [e["event"] for e in journal(sandbox, "n1", job)]
    assert events[0] == "prolog" and "job-end" in events
    assert f"{job}.json" not in records(sandbox, "n1")
    assert gpu_snapshot(sandbox, "n1") == before


def test_mig_static_jobs_get_their_own_instances(sandbox: Any, submit: Any, wait_for: Any,
                                                 job_output: Any) -> None:
    """The three 3g.40gb GRES of n3 at once: each job gets a distinct 3g.40gb instance. This
    pins down how slurmd numbers MIG GRES in SLURM_JOB_GPUS (type, GPU, start)."""
    insts = {i.uuid: i for i in sim(sandbox, "n3").instances()}
    jobs = [submit(HOLD.format(secs=6), "-p", "mig", "--gres=gpu:3g.40gb:1", "--qos=infer")
            for _ in range(3)]
    for job in jobs:
        wait_for(job, {"RUNNING"}, timeout=40)
    for job in jobs:
        wait_for(job, timeout=60)
    seen = []
    for job in jobs:
        uuid = env_of(job_output(job))["CUDA_VISIBLE_DEVICES"]
        assert uuid.startswith("MIG-") and uuid in insts, job_output(job)
        assert insts[uuid].profile == "3g.40gb"
        seen.append(uuid)
    assert len(set(seen)) == 3
    for job in jobs:
        wait_epilog(sandbox, "n3", job)
    assert {i.uuid for i in sim(sandbox, "n3").instances()} == set(insts)  # static: kept


MIXED_LAYOUT = """    sandbox-mixed:
      - devices: [0]
        mig-enabled: true
        mig-devices:
          3g.40gb: 2
      - devices: [1]
        mig-enabled: true
        mig-devices:
          4g.40gb: 1
          3g.40gb: 1
"""


@pytest.fixture
def n3_mixed(sandbox: Any, tmp_path: Any) -> Iterator[None]:
    """n3 re-laid for one test as 3g.40gb x2 | 4g.40gb + 3g.40gb (``mig apply`` with a config
    copy that has that layout, then ``sandbox sync-gres``); its own layout again after."""
    from slurmiso_sandbox.scenes import monitor_config

    cfg = monitor_config(sandbox, str(tmp_path), MIXED_LAYOUT)
    steps = [("--config", cfg, "mig", "apply", "--layout", "sandbox-mixed", "--node", "n3"),
             ("sandbox", "sync-gres")]
    try:
        for args in steps:
            cp = sandbox.slurmiso(*args)
            assert cp.returncode == 0, cp.stdout + cp.stderr
        node = sandbox.cmd("scontrol", "show", "node", "n3")
        assert "Gres=gpu:3g.40gb:3,gpu:4g.40gb:1" in node, node
        yield
    finally:
        sandbox.cmd("scancel", "-p", "mig", check=False)
        for args in [("mig", "apply", "--node", "n3"), ("sandbox", "sync-gres")]:
            cp = sandbox.slurmiso(*args)
            assert cp.returncode == 0, cp.stdout + cp.stderr


MIXED_TYPES_BROKEN = (
    "measured on Debian's Slurm 22.05.8: with an explicit MultipleFiles gres.conf whose node "
    "mixes MIG types (3x 3g.40gb + 1x 4g.40gb), slurmctld records the 4g device as 3g with "
    "count 0 (DebugFlags=Gres topo dump), so --gres=gpu:4g.40gb:1 runs with JOB_GRES "
    "gpu:4g.40gb:0 and no device; independent of line order and of saved node state. "
    "So the sandbox's n3 has one MIG type and doctor warns about mixing (mig-mixed-gpu). "
    "strict: the day Slurm gets it right, this test says so (24.11.5 and 26.05.5 do)")


def test_mig_static_second_type_is_scheduled(sandbox: Any, n3_mixed: None, submit: Any,
                                             wait_for: Any, job_output: Any) -> None:
    """A strict xfail on the releases slurmiso.slurm.versions says lack it, a test elsewhere."""
    from slurmiso.slurm import versions

    fixed = versions.has("mig_mixed_types", sandbox.slurm_version())
    try:
        job = submit(ENV_DUMP, "-p", "mig", "--gres=gpu:4g.40gb:1", "--qos=infer")
        wait_for(job, timeout=60)
        uuid = env_of(job_output(job)).get("CUDA_VISIBLE_DEVICES", "")
        profiles = {i.uuid: i.profile for i in sim(sandbox, "n3").instances()}
        assert profiles.get(uuid) == "4g.40gb", job_output(job)
    except AssertionError:
        if fixed:
            raise
        pytest.xfail(MIXED_TYPES_BROKEN)
    if not fixed:
        pytest.fail(f"XPASS(strict) on Slurm {sandbox.slurm_version()}: {MIXED_TYPES_BROKEN}",
                    pytrace=False)


def test_mig_dynamic_infer_and_train_share_one_gpu(sandbox: Any, submit: Any, wait_for: Any,
                                                   job_output: Any) -> None:
    before = gpu_snapshot(sandbox, "n4")
    infer = submit(HOLD.format(secs=8), "-p", "migd", "--gres=shard:3", "--qos=infer")
    train = submit(HOLD.format(secs=8), "-p", "migd", "--gres=shard:4", "--qos=train")
    for job in (infer, train):
        wait_for(job, {"RUNNING"}, timeout=40)
        wait_prolog(sandbox, "n4", job)
    live = sim(sandbox, "n4").instances(0)
    assert sorted(i.profile for i in live) == ["3g.40gb", "4g.40gb"]
    status = json.loads(sandbox.slurmiso("status", "--node", "n4", "--json").stdout)
    owners = {r["uuid"]: j["job"] for j in status["jobs"] for r in j["resources"]}
    assert sorted(owners.values()) == sorted([infer, train])
    wait_for(infer)
    wait_for(train)
    by_job = {j: env_of(job_output(j))["CUDA_VISIBLE_DEVICES"] for j in (infer, train)}
    assert {by_job[infer], by_job[train]} == {i.uuid for i in live}
    for job in (infer, train):
        wait_epilog(sandbox, "n4", job)
    assert sim(sandbox, "n4").instances() == []
    assert gpu_snapshot(sandbox, "n4") == before


def wait_node_clean(sandbox: Any, node: str, timeout: float = 60) -> None:
    """A placement-dependent test starts from ``node`` idle with no MIG instance (the epilogs
    of earlier tests' jobs may still be running); it fails, never skips, when that never comes."""
    deadline = time.monotonic() + timeout
    state, live = "?", []
    while time.monotonic() < deadline:
        state, live = sandbox.node_states().get(node, "?"), sim(sandbox, node).instances()
        if state == "idle" and not live:
            return
        time.sleep(0.5)
    raise AssertionError(f"{node} not idle and clean after {timeout:.0f}s: {state}, {live}")


def test_mig_dynamic_profile_that_cannot_fit_refuses_only_the_job(
        sandbox: Any, submit: Any, wait_for: Any, job_output: Any) -> None:
    """A 1g.10gb job on a GPU with a free shard but no free memory slice: refused, node kept.

    The placement is forced, not hoped for. Slurm never gives out shards of a GPU a job holds
    whole, and one job's shards come from one GPU (gres.html, "Sharding"; 22.05's cons_tres
    filters GPUs allocated as the other GRES). So on an idle n4 a whole-GPU job takes GPU A;
    both 3-shard jobs must go to GPU B, where their 3g.40gb instances fill memory slices 0-3
    and 4-7 and leave one of its 7 shards. That is the only free shard on n4, so the 1-shard
    job lands on B, where no 1g.10gb fits. Four jobs: n4 has four CPUs. The placement is
    asserted before the probe, so a Slurm that placed otherwise fails here, with the layout.
    """
    wait_node_clean(sandbox, "n4")
    blocker = submit(HOLD.format(secs=40), "-p", "migd", "-w", "n4", "--gres=gpu:1",
                     "--qos=infer")
    wait_for(blocker, {"RUNNING"}, timeout=40)
    wait_prolog(sandbox, "n4", blocker)
    holders = [submit(HOLD.format(secs=40), "-p", "migd", "-w", "n4", "--gres=shard:3",
                      "--qos=infer") for _ in range(2)]
    for job in holders:
        wait_for(job, {"RUNNING"}, timeout=40)
        wait_prolog(sandbox, "n4", job)

    backend = sim(sandbox, "n4")
    status = json.loads(sandbox.slurmiso("status", "--node", "n4", "--json").stdout)
    owners = {r["uuid"]: j["job"] for j in status["jobs"] for r in j["resources"]
              if r.get("uuid")}
    gpu_of = {owners.get(i.uuid, i.uuid): i.gpu_index for i in backend.instances()}
    full = gpu_of.get(holders[0])
    assert full is not None and gpu_of.get(holders[1]) == full, gpu_of
    assert gpu_of.get(blocker) == 1 - full, gpu_of
    assert sorted((i.profile, i.placement_start) for i in backend.instances(full)) == [
        ("3g.40gb", 0), ("3g.40gb", 4)]

    probe = submit(ENV_DUMP, "-p", "migd", "-w", "n4", "--gres=shard:1", "--qos=infer",
                   "--iso-mig-profile=1g.10gb")
    wait_for(probe, timeout=60)
    out = job_output(probe)
    env = env_of(out)
    assert env.get("CUDA_VISIBLE_DEVICES") == "", out
    assert f"does not fit on GPU {full}" in env["SLURMISO_REFUSED"]
    assert "refused" in out
    assert len(backend.instances()) == 3  # the refused job left nothing behind
    state = sandbox.node_states()["n4"]
    assert not any(bad in state for bad in ("drain", "down", "fail")), state  # node kept
    for job in (blocker, *holders):
        wait_for(job, timeout=60)


def test_mps_jobs_share_one_daemon_with_their_class_limits(
        sandbox: Any, submit: Any, wait_for: Any, job_output: Any) -> None:
    before = gpu_snapshot(sandbox, "n2")
    infer = submit(HOLD.format(secs=6), "-p", "mps", "--gres=mps:50", "--qos=infer", "-w", "n2")
    train = submit(HOLD.format(secs=6), "-p", "mps", "--gres=mps:50", "--qos=train", "-w", "n2")
    for job in (infer, train):
        wait_for(job, timeout=60)
    ei, et = env_of(job_output(infer)), env_of(job_output(train))
    for env in (ei, et):
        assert env["CUDA_MPS_PIPE_DIRECTORY"].startswith(sandbox.path("state", "n2"))
        assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert ei["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert et["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "60"
    # the classes' limits as the sandbox's config states them: 32G/24G on an 80 GB GPU, less
    # on a smaller one (sandbox up --plain-gpu L40S)
    from slurmiso.config import load_config

    limit = {c.name: c.mps.memory_limit_mb for c in load_config(sandbox.slurmiso_config).classes}
    assert limit["infer"] > limit["train"] > 0
    assert ei["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={limit['infer']}M"
    assert et["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={limit['train']}M"
    for job in (infer, train):
        wait_epilog(sandbox, "n2", job)
    events = [e["event"] for e in Journal(sandbox.path("log", "journal-n2.jsonl")).read()]
    assert "mps-daemon-stopped" in events
    status = json.loads(sandbox.slurmiso("status", "--node", "n2", "--json").stdout)
    assert status["jobs"] == []
    # the arrangement in force, and MPS v3 read from the (stand-in) control binary
    assert status["mps"]["arrangement"] == "per-class daemons" and status["mps"]["v3"] is True
    assert gpu_snapshot(sandbox, "n2") == before


def test_class_needing_stronger_isolation_is_refused_node_stays_up(
        sandbox: Any, submit: Any, wait_for: Any, job_output: Any) -> None:
    job = submit(ENV_DUMP, "-p", "tslice", "--gres=shard:1", "--qos=debug")
    wait_for(job)
    env = env_of(job_output(job))
    assert env["CUDA_VISIBLE_DEVICES"] == ""
    assert "needs exclusive isolation" in env["SLURMISO_REFUSED"]
    assert sandbox.node_states()["n5"] == "idle"


def test_timeslice_pool_gets_its_time_slice_from_the_prolog(
        sandbox: Any, submit: Any, wait_for: Any, job_output: Any) -> None:
    """n5's pool says ``timeslice: short``: a job on both its GPUs leaves both at short (the
    simulated ``nvidia-smi compute-policy``), root's record for this boot says so, every
    ``timeslice-set`` line says short, and doctor on n5 finds nothing to say about it."""
    from slurmiso.gpu.timeslice import boot_id, read_record

    job = submit(ENV_DUMP, "-p", "tslice", "--gres=gpu:2", "--qos=train")
    assert wait_for(job) == "COMPLETED"
    assert env_of(job_output(job))["SLURMISO_CLASS"] == "train"
    node = sim(sandbox, "n5")
    assert [node.compute_timeslice(g) for g in (0, 1)] == ["short", "short"]
    uuids = [d.uuid for d in node.devices()]
    record = read_record(sandbox.path("state", "n5"))
    assert {u: record.get(u) for u in uuids} == dict.fromkeys(
        uuids, {"value": "short", "boot": boot_id()})
    sets = [e for e in Journal(sandbox.path("log", "journal-n5.jsonl")).read()
            if e.get("event") == "timeslice-set"]
    assert sets and {e["value"] for e in sets} == {"short"}

    def said() -> List[str]:
        doctor = json.loads(sandbox.node_slurmiso("doctor", "--node", "n5", "--json").stdout)
        return [f["message"] for f in doctor["findings"] if f["code"] == "timeslice"]

    assert said() == []
    path = sandbox.path("state", "n5", "timeslice.json")
    os.replace(path, path + ".aside")  # as after a reboot that cleared /run: not set yet
    try:
        (message,) = said()
    finally:
        os.replace(path + ".aside", path)
    assert "wants the short time slice" in message
    assert "GPU 0: never set by slurmiso; GPU 1: never set by slurmiso" in message


def test_gpu_off_the_bus_drains_the_node_with_the_reason(sandbox: Any, submit: Any,
                                                         wait_for: Any) -> None:
    node_sim = sim(sandbox, "n1")
    node_sim.set_lost(0, True)
    try:
        # both of n1's GPUs: infer (debug may have only one, job_submit.lua says)
        job = submit(ENV_DUMP, "-p", "gpu", "--gres=gpu:2", "--qos=infer")
        deadline = time.monotonic() + 40
        reason = ""
        while time.monotonic() < deadline:
            reason = sandbox.cmd("sinfo", "-h", "-R", "-n", "n1", "-o", "%E")
            if "slurmiso" in reason:
                break
            time.sleep(0.5)
        assert "slurmiso prolog" in reason and "fallen off the bus" in reason, reason
        assert sandbox.node_states()["n1"].startswith("drain")
        sandbox.cmd("scancel", job)
    finally:
        node_sim.set_lost(0, False)
        sandbox.cmd("scontrol", "update", "NodeName=n1", "State=RESUME", check=False)
    wait_idle = time.monotonic() + 30
    while sandbox.node_states()["n1"] != "idle" and time.monotonic() < wait_idle:
        time.sleep(0.5)
    assert sandbox.node_states()["n1"] == "idle"


# (partition, sbatch GRES, what the pool gives)
POOLS = [
    ("gpu", "--gres=gpu:1", "exclusive"),
    ("mig", "--gres=gpu:3g.40gb:1", "mig"),
    ("migd", "--gres=shard:3", "mig"),
    ("mps", "--gres=mps:50", "mps"),
    ("tslice", "--gres=shard:1", "timeslice"),
]
#: mig-dynamic shards must match the class's MIG profile (job_submit.lua checks it): 3g=3, 4g=4
SHARDS = {"infer": "--gres=shard:3", "train": "--gres=shard:4"}
STRENGTH = {"timeslice": 0, "mps": 1, "mig": 2, "exclusive": 3}
#: the sandbox config's classes and the isolation each needs at least
CLASSES = {"infer": "mps", "train": "timeslice", "debug": "exclusive"}


@pytest.mark.parametrize("cls", sorted(CLASSES))
@pytest.mark.parametrize("partition,gres,gives", POOLS, ids=[p[0] for p in POOLS])
def test_every_class_in_every_pool(sandbox: Any, submit: Any, wait_for: Any, job_output: Any,
                                   cls: str, partition: str, gres: str, gives: str) -> None:
    """Each class in each mode: isolated with the mode's devices where the pool is strong
    enough for the class, refused where it is not — at sbatch by job_submit.lua when it can
    tell, else by the prolog (the job starts with no GPU and the reason; the node is kept)."""
    from slurmiso.errors import SandboxError

    if partition == "migd":
        gres = SHARDS.get(cls, gres)
    too_weak = STRENGTH[gives] < STRENGTH[CLASSES[cls]]
    try:
        job = submit(ENV_DUMP, "-p", partition, gres, f"--qos={cls}")
    except SandboxError as refused_at_submit:
        assert too_weak and "slurmiso:" in str(refused_at_submit), refused_at_submit
        return
    wait_for(job, timeout=60)
    env = env_of(job_output(job))
    if too_weak:
        assert env["CUDA_VISIBLE_DEVICES"] == "" and "SLURMISO_REFUSED" in env
        return
    assert env.get("SLURMISO_CLASS") == cls and "SLURMISO_REFUSED" not in env
    cvd = env["CUDA_VISIBLE_DEVICES"]
    if gives == "mig":
        assert cvd.startswith("MIG-")
    elif gives == "mps":
        assert cvd == "0" and env["CUDA_MPS_PIPE_DIRECTORY"]
    else:
        assert cvd in {"0", "1"}


def test_text_the_user_chose_cannot_pick_the_class(sandbox: Any, submit: Any, wait_for: Any,
                                                   job_output: Any) -> None:
    """22.05 and 24.11 do not give the Prolog the job's QoS, so the prolog asks slurmctld.
    ``scontrol show job -o`` prints the comment and error path, unquoted, after ``QOS=``: read
    that way, this train job was ``infer``. The prolog reads only Slurm's own fields."""
    forged = "x QOS=infer JobState=RUNNING Restarts=0"
    job = submit(ENV_DUMP, "-p", "gpu", "--gres=gpu:1", "--qos=train", f"--comment={forged}",
                 f"--job-name=n {forged}", f"--error={sandbox.jobs_dir}/err {forged}.%j")
    wait_for(job, timeout=60)
    env = env_of(job_output(job))
    assert env.get("SLURMISO_CLASS") == "train" and "SLURMISO_REFUSED" not in env, env


#: A CUDA client starting, as the stand-in plays it (the system's Python: a job of another
#: user cannot run root's, and a root sandbox has only its own).
CLIENT = ("c() {{ env \"$@\" PYTHONPATH={root} /usr/bin/python3 -m slurmiso.isolation.mps_sim "
          "client; }}\n")
WAIT_FLAG = "for i in $(seq 900); do [ -e {flag} ] && break; sleep 0.2; done\n"


@contextlib.contextmanager
def shared_mps_pool(sandbox: Any) -> Iterator[None]:
    """The sandbox's MPS pool with ``mps_server: shared`` for the test's length (the hooks
    read the config on every run; its cache is keyed by the file's mtime and size)."""
    import yaml

    with open(sandbox.slurmiso_config) as fh:
        original = fh.read()
    mode = os.stat(sandbox.slurmiso_config).st_mode & 0o777
    data = yaml.safe_load(original)
    (pool,) = [p for p in data["pools"] if p["mode"] == "mps"]
    pool["mps_server"] = "shared"
    try:
        write_atomic(sandbox.slurmiso_config, yaml.safe_dump(data, sort_keys=False), mode)
        yield
    finally:
        write_atomic(sandbox.slurmiso_config, original, mode)


def test_a_shared_mps_server_serves_two_users_classes_each_in_its_namespace(
        sandbox: Any, submit: Any, wait_for: Any, job_output: Any, tmp_path: Any) -> None:
    """Issue 35 item 1 on the MPS node: one MPS v3 server for an inference job of root and a
    training job of another user on one GPU; status shows the server and both namespaces
    with their priorities; the training job's own attempts to leave its namespace reach
    nothing, and its thread share holds whatever it sets."""
    root = sandbox.job_pythonpath  # this checkout, as a job sees it
    flag = os.path.join(sandbox.jobs_dir, f"shared-done-{os.getpid()}-{time.time_ns()}")
    before = gpu_snapshot(sandbox, "n2")
    hold = WAIT_FLAG.format(flag=flag)
    with shared_mps_pool(sandbox):
        infer = submit("#!/bin/bash\n" + CLIENT.format(root=root) + "echo \"own=$(c)\"\n"
                       + hold, "-p", "mps", "--gres=mps:50", "--qos=infer", "-w", "n2")
        try:
            own_infer = _said(sandbox, job_output, infer, "own")
            infer_dir = own_infer["pipe"]
            top = os.path.dirname(os.path.dirname(infer_dir))
            tries = "".join(f"echo \"{name}=$(c {env})\"\n" for name, env in (
                ("own", ""), ("threads", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100"),
                ("infer_ns", f"CUDA_MPS_PIPE_DIRECTORY={infer_dir}"),
                ("top", f"CUDA_MPS_PIPE_DIRECTORY={top}"),
                ("server", f"CUDA_MPS_PIPE_DIRECTORY={os.path.dirname(infer_dir)}")))
            raise_own = ("CUDA_MPS_CLIENT_PRIORITY=0 sleep 600 &\nraised=$!\n"
                         "echo \"raised_pid=$raised\"\nwait $raised\necho \"raised_rc=$?\"\n")
            train = submit("#!/bin/bash\n" + CLIENT.format(root=root) + tries + raise_own
                           + hold,
                           "-p", "mps", "--gres=mps:50", "--qos=train", "-w", "n2",
                           user=L.TEST_USER)
            said = {k: _said(sandbox, job_output, train, k)
                    for k in ("own", "threads", "infer_ns", "top", "server")}
            status = json.loads(sandbox.slurmiso("status", "--node", "n2", "--json").stdout)
            raised_pid = int(_line(job_output, train, "raised_pid"))
            ended = _agent_priority_round(sandbox)
            raised_rc = _line(job_output, train, "raised_rc")
        finally:
            with open(flag, "w"):
                pass
        for job in (infer, train):
            wait_for(job, timeout=90)
            wait_epilog(sandbox, "n2", job)
        after = json.loads(sandbox.slurmiso("status", "--node", "n2", "--json").stdout)
    mps = status["mps"]
    assert mps["arrangement"] == "shared-v3" and mps["asked"] == "shared", mps
    (gpu,) = mps["gpus"]
    assert gpu["per_class_daemons"] == [] and gpu["shared"]["daemon_pid"], gpu
    got = {ns["job"]: (ns["class"], ns["client_priority"], ns["active_thread_percentage"])
           for ns in gpu["shared"]["namespaces"]}
    assert got == {infer: ("infer", "0", "100"), train: ("train", "1", "60")}, got
    assert {own_infer["server"], said["own"]["server"]} == {"slurmiso"}
    assert own_infer["namespace"] != said["own"]["namespace"]
    assert (own_infer["client_priority"], said["own"]["client_priority"]) == (0, 1)
    assert said["own"]["uid"] != own_infer["uid"]  # two users, one server
    assert said["threads"]["active_thread_percentage"] == 60.0
    for door in ("infer_ns", "top", "server"):
        assert said[door]["mps"] is False and "PermissionError" in said[door]["error"], said
    # its own priority wins in MPS (NVIDIA documents so): the agent ends the process
    assert raised_rc == "137" and len(ended) == 1 and f"process {raised_pid} " in ended[0]
    assert sandbox.job_state(train) == "COMPLETED"  # the rest of the job ran on
    assert after["mps"]["gpus"] == []  # the last job out stopped the daemon
    events = [e["event"] for j in (infer, train) for e in journal(sandbox, "n2", j)]
    assert events.count("mps-namespace-opened") == 2 == events.count("mps-namespace-closed")
    assert gpu_snapshot(sandbox, "n2") == before


def _line(job_output: Any, job: str, name: str) -> str:
    """What a job printed as ``name=...``, waiting until it has."""
    def line() -> str:
        return next((ln[len(name) + 1:] for ln in job_output(job).splitlines()
                     if ln.startswith(f"{name}=")), "")

    return wait_until(f"job {job} says {name}", line, timeout=90)


def _agent_priority_round(sandbox: Any) -> List[str]:
    """One round of n2's agent watch on jobs' own MPS priorities (the agent's code, here)."""
    from slurmiso.agent.mps_priority import priority_round
    from slurmiso.config import load_config
    from slurmiso.state import NodeState

    cfg = load_config(sandbox.slurmiso_config)
    records = NodeState(cfg.paths.state_dir_for("n2")).jobs()
    return priority_round(records, "n2", Journal(cfg.paths.journal_for("n2")))


def _said(sandbox: Any, job_output: Any, job: str, name: str) -> Dict[str, Any]:
    """The JSON a job printed as ``name=...`` (waiting until it has), with its pipe dir."""
    got: Dict[str, Any] = json.loads(_line(job_output, job, name))
    if name == "own":
        rec = json.loads(sandbox.slurmiso("status", "--node", "n2", "--json").stdout)
        (mine,) = [j for j in rec["jobs"] if j["job"] == job]
        got["pipe"] = mine["env"]["CUDA_MPS_PIPE_DIRECTORY"]
    return got
