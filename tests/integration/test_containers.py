"""Jobs in Slurm's OCI containers keep their share (issue 37): ``srun --container`` with crun.

The sandbox's Debian roots (Slurm 26.05 in CI) run containers: oci.conf from ``slurmiso gen
oci-conf``'s own renderer, RunTimeRun through slurmiso-oci-gate, and a bundle made from the
root by its own ``crun spec`` (slurmiso_sandbox/oci.py). The host's 22.05 cannot carry the
TaskProlog's exports into a container step that srun does not pass them to
(docs/admin-guide.md, "Containers"): there one test shows the gate refusing such containers,
and the rest skip.

Each pool mode runs the fence probe of test_fences.py inside a container, two jobs of one
user at once: each reaches exactly its share, as bare jobs do, because the container's
processes stay in the step's task cgroup.
"""

from __future__ import annotations

import json
import os
import pwd
import uuid
from typing import Any, Dict

import pytest

from slurmiso.slurm.ociconf import env_after_task_prolog
from slurmiso_sandbox import layout as L
from tests.integration.test_fences import (
    FENCED,
    POOLS,
    PROBE,
    _probe,
    _reached,
    assert_exact_shares,
)


def _oci(sandbox: Any) -> str:
    """The sandbox's bundle; skipped where the sandbox has no container runtime."""
    if not os.path.exists(sandbox.path("etc", "oci.conf")):
        pytest.skip("this sandbox has no oci.conf: 'sandbox up' installs crun and writes it")
    return str(sandbox.path("oci", "bundle"))


@pytest.fixture
def bundle(sandbox: Any) -> str:
    """Where containers keep their share: Slurm 23.02 and later."""
    path = _oci(sandbox)
    if not env_after_task_prolog(sandbox.slurm_version()):
        pytest.skip("Slurm 22.05 writes config.json before the TaskProlog, so the gate "
                    "refuses a container without its job's exports (test_on_22_05_a_container_without_its_jobs_exports_is_refused); "
                    "these run on 26.05 (make integration SLURM=26.05 CGROUP=v2, as CI does)")
    return path


#: The pools whose record exports what 22.05 sets only after config.json (CUDA_VISIBLE_DEVICES
#: and the MPS variables). tslice's record exports nothing its container lacks there: the
#: gate lets it pass, as it should, and the host's crun 1.8.1 then fails on the hybrid cgroup
#: layout ("cgroups in hybrid mode not supported", measured).
REFUSED_ON_22_05 = [p for p in POOLS if p[0] != "tslice"]


@pytest.mark.parametrize("partition,node,gres,qos", REFUSED_ON_22_05,
                         ids=[p[0] for p in REFUSED_ON_22_05])
def test_on_22_05_a_container_without_its_jobs_exports_is_refused(
    sandbox: Any, submit: Any, wait_for: Any, job_output: Any,
    partition: str, node: str, gres: str, qos: str,
) -> None:
    """22.05 writes config.json before the step's TaskProlog and GRES, so a container step
    carries the job's exports only as far as srun passes its caller's environment on
    (measured: a batch script's plain ``srun --container`` does, and the gate lets it run).
    With ``--export=NONE``, as many sites ask, it lacks them: the gate, reading the job's
    record, refuses the container, naming what it lacks, and the program never starts."""
    path = _oci(sandbox)
    if env_after_task_prolog(sandbox.slurm_version()):
        pytest.skip("Slurm 23.02 and later carry the TaskProlog's exports into containers")
    ran = os.path.join(sandbox.jobs_dir, f"ran22-{uuid.uuid4().hex[:8]}")
    script = (f"#!/bin/bash\nsrun --export=NONE --container={path} /bin/touch {ran}\n"
              "echo srun-rc=$?\n")
    job = submit(script, "-p", partition, gres, f"--qos={qos}", user=L.TEST_USER)
    wait_for(job, timeout=90)
    out = job_output(job)
    assert "slurmiso: container refused:" in out and "22.05" in out, out
    assert "lacks or changes" in out, out  # named from the job's record
    assert "srun-rc=0" not in out, out
    assert not os.path.exists(ran)


def _in_container(bundle: str) -> str:
    return f"srun --container={bundle} "


@pytest.mark.parametrize("partition,node,gres,qos", POOLS, ids=[p[0] for p in POOLS])
def test_two_containerised_jobs_of_one_user_reach_exactly_their_share(
    sandbox: Any, submit: Any, wait_for: Any, job_output: Any, bundle: str,
    partition: str, node: str, gres: str, qos: str,
) -> None:
    tag = os.path.join(sandbox.jobs_dir, f"oci-{uuid.uuid4().hex[:8]}")
    script = PROBE.format(tag=tag, python="/usr/bin/python3", dev=sandbox.path("dev", node),
                          srun=_in_container(bundle))
    jobs = [submit(script, "-p", partition, gres, f"--qos={qos}", user=L.TEST_USER)
            for _ in range(2)]
    for job in jobs:
        wait_for(job, timeout=90)
    probes = {job: _probe(sandbox, job_output, job) for job in jobs}
    assert {p["host"] for p in probes.values()} == {"sbx-container"}  # ran inside
    # root of a user namespace that maps it to the test user alone: no privilege on the host
    user_uid = pwd.getpwnam(L.TEST_USER).pw_uid
    assert all(p["uid_map"] == ["0", str(user_uid), "1"] for p in probes.values()), probes
    assert_exact_shares(sandbox, partition, node, probes)
    if partition == "mps":  # the client sees its daemon's pipe directory inside
        assert all(p["pipe"] and p["pipe_seen"] for p in probes.values()), probes


def _hiding_bundle(sandbox: Any, bundle: str) -> str:
    """The sandbox bundle with a tmpfs over the nodes' state dirs, where the MPS pipe root
    lies: what a user's image that never bound it looks like."""
    with open(os.path.join(bundle, "config.json"), encoding="utf-8") as fh:
        cfg: Dict[str, Any] = json.load(fh)
    cfg["mounts"].append({"destination": sandbox.path("state"), "type": "tmpfs",
                          "source": "tmpfs", "options": ["nosuid", "nodev"]})
    out = os.path.join(sandbox.jobs_dir, f"bundle-{uuid.uuid4().hex[:8]}")
    os.makedirs(out)
    with open(os.path.join(out, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(cfg, fh)
    os.chmod(out, 0o755)
    return out


def test_mps_container_that_cannot_reach_its_pipe_is_refused_with_the_reason(
    sandbox: Any, submit: Any, wait_for: Any, job_output: Any, bundle: str,
) -> None:
    hiding = _hiding_bundle(sandbox, bundle)
    ran = os.path.join(sandbox.jobs_dir, f"ran-{uuid.uuid4().hex[:8]}")
    script = f"#!/bin/bash\n{_in_container(hiding)}/bin/touch {ran}\necho srun-rc=$?\n"
    job = submit(script, "-p", "mps", "--gres=mps:50", "--qos=infer", user=L.TEST_USER)
    wait_for(job, timeout=90)
    out = job_output(job)
    assert "slurmiso: container refused: MPS pipe directory" in out, out
    assert "mounts a tmpfs" in out and "slurmiso gen oci-conf --config-json" in out, out
    assert "srun-rc=0" not in out, out
    assert not os.path.exists(ran)  # the program never started


def test_refused_job_reaches_no_gpu_inside_its_container_either(
    sandbox: Any, submit: Any, wait_for: Any, job_output: Any, bundle: str,
) -> None:
    """The prolog refuses class debug on the timeslice pool: its container runs (the
    TaskProlog's refusal reached it) and every GPU stays fenced inside."""
    tag = os.path.join(sandbox.jobs_dir, f"oci-refused-{uuid.uuid4().hex[:8]}")
    script = ("#!/bin/bash\n" + PROBE.format(
        tag=tag, python="/usr/bin/python3", dev=sandbox.path("dev", "n5"),
        srun=_in_container(bundle))
        .replace("#!/bin/bash\n", "").replace("-ge 2", "-ge 1"))
    job = submit(script, "-p", "tslice", "--gres=shard:1", "--qos=debug", user=L.TEST_USER)
    wait_for(job, timeout=90)
    probe = _probe(sandbox, job_output, job)
    assert probe["host"] == "sbx-container" and probe["cvd"] == ""  # the TaskProlog's refusal
    assert _reached(probe) == set(), sorted(_reached(probe))
    assert probe["open"] and all(r in FENCED for r in probe["open"].values())


def test_slurmiso_run_in_a_container_preempted_three_times_loses_nothing(
    sandbox: Any, bundle: str,
) -> None:
    """``slurmiso run`` as the container's program (Python and slurmiso bound from the host):
    each preemption's SIGTERM reaches it through the runtime the gate keeps alive, it
    checkpoints, Slurm requeues, and every step is counted once."""
    from collections import Counter

    from slurmiso_sandbox.demo import preemption_scenario
    from tests.integration.test_wrapper_sandbox import STEP_TIME, STEPS

    r = preemption_scenario(sandbox, steps=STEPS, step_time=STEP_TIME, container=bundle)
    assert sorted(r["steps"]) == list(range(1, STEPS + 1)), "a step was lost or counted twice"
    assert not [s for s, c in Counter(r["steps"]).items() if c > 1]
    assert r["restarts"] == "3" and r["finished"] and r["exit_code"] == "0:0", r
    ends = [e for e in r["events"] if e["event"] == "checkpoint-end"]
    assert len(ends) == 3 and all(e["ok"] for e in ends), ends


def test_a_requeued_job_runs_again_after_its_runtime_was_killed(
    sandbox: Any, submit: Any, wait_for: Any, job_output: Any, bundle: str,
) -> None:
    """The first attempt's program ignores SIGTERM (pid 1 without a handler), so Slurm's
    SIGKILL ends the runtime and leaves its state under the step's container name; the
    requeued attempt, same name, still starts (the gate removes the stopped container)."""
    import time

    tag = os.path.join(sandbox.jobs_dir, f"oci-again-{uuid.uuid4().hex[:8]}")
    program = (f"if [ -e {tag}.first ]; then echo again > {tag}.second; "
               f"else touch {tag}.first; exec sleep 300; fi")
    script = f"#!/bin/bash\n{_in_container(bundle)}/bin/sh -c '{program}'\n"
    job = submit(script, "-p", "gpu", "--gres=gpu:1", "--qos=train", "--requeue",
                 user=L.TEST_USER)
    deadline = time.monotonic() + 60
    while not os.path.exists(f"{tag}.first"):
        assert time.monotonic() < deadline, "the first attempt never started"
        time.sleep(0.2)
    sandbox.cmd("scontrol", "requeue", job)
    wait_for(job, timeout=120)
    with open(f"{tag}.second", encoding="utf-8") as fh:
        assert fh.read().strip() == "again"
    assert sandbox.job_fields(job).get("Restarts") == "1"
    assert "slurmiso: removed the stopped container" in job_output(job), job_output(job)


def test_the_ladder_protects_a_containerised_server_from_containerised_training(
    sandbox: Any, bundle: str,
) -> None:
    """The stand-in server (``--iso-metrics``) and ``slurmiso run`` training, each in a
    container on one MPS GPU: the agent reads the server inside (its listener's owner
    checked: the node's network), the monitor throttles training over the SLO, the throttle
    signal reaches the wrapper inside (its throttle file), and calm releases it."""
    import functools

    from slurmiso.wrapper.throttle import throttle_path
    from slurmiso_sandbox.protect import CALM_MS, HOT_MS, Ladder
    from tests import waiting

    until = functools.partial(waiting.wait_for, every=0.3, timeout=120)
    lad = Ladder(sandbox, ("hold", "throttle"), dwell_s=2, window_s=4)
    throttled = functools.partial(os.path.lexists,
                                  throttle_path(os.path.join(lad.work, "ckpt")))
    try:
        lad.start_jobs(container=bundle)
        assert len(set(lad.gpus().values())) == 1, lad.gpus()
        lad.start_daemons()
        until(lambda: lad.job_p99() is not None, "the agent to read the containerised server")
        lad.set_latency(HOT_MS)
        until(lambda: "throttle" in lad.ladder_kinds(lad.train), "a throttle on training")
        until(throttled, "the wrapper inside its container to create the throttle file")
        lad.set_latency(CALM_MS)
        until(lambda: "unthrottle" in lad.ladder_kinds(lad.train), "the unthrottle")
        until(lambda: not throttled(), "the throttle file to go")
        assert [e for e in lad.actions() if e.get("target") == lad.infer] == []
        assert sandbox.job_fields(lad.infer).get("JobState") == "RUNNING"
    finally:
        lad.stop()


def test_a_server_in_a_container_with_its_own_network_is_named_not_read(
    sandbox: Any, bundle: str,
) -> None:
    """Its listener is on the container's loopback, which the node's does not reach: the
    agent reports the latency unknown, saying why (``other-netns``), never calm."""
    import re

    from slurmiso_sandbox.protect import Ladder, read_text
    from tests import waiting

    with open(os.path.join(bundle, "config.json"), encoding="utf-8") as fh:
        cfg: Dict[str, Any] = json.load(fh)
    cfg["linux"]["namespaces"].append({"type": "network"})
    netns_bundle = os.path.join(sandbox.jobs_dir, f"bundle-net-{uuid.uuid4().hex[:8]}")
    os.makedirs(netns_bundle)
    with open(os.path.join(netns_bundle, "config.json"), "w", encoding="utf-8") as fh:
        json.dump(cfg, fh)
    os.chmod(netns_bundle, 0o755)
    lad = Ladder(sandbox, ("hold", "throttle"), dwell_s=2, window_s=4)
    try:
        py, here = sandbox.job_python, os.path.join(sandbox.job_pythonpath, "slurmiso_sandbox")
        lad.infer = sandbox.submit(
            f"#!/bin/bash\nsrun --container={netns_bundle} {py} {here}/latency_server.py "
            f"--port {lad.port} --control {lad.control} --log {lad.infer_log}\n",
            "-p", "mps", "--qos=infer", "--gres=mps:50", "-w", "n2",
            f"--iso-metrics={lad.port}", user=L.TEST_USER)
        waiting.wait_for(lambda: "# listening" in read_text(lad.infer_log),
                         "the server to listen in its container", timeout=60, every=0.3)
        lad.start_agent()
        unknown = re.compile(r'^slurmiso_job_signal_unknown\{[^}]*job="' + lad.infer +
                             r'"[^}]*reason="other-netns"[^}]*\} 1', re.M)
        waiting.wait_for(lambda: unknown.search(lad.scrape()), "the agent to name the cause",
                         timeout=60, every=0.5)
        assert lad.job_p99() is None
    finally:
        lad.stop()


def _host_pid_of(marker: str, cgroup_holds: str) -> int:
    """The host pid of the process whose command line is ``sleep MARKER`` and whose cgroup
    path holds ``cgroup_holds`` (0 until there is one)."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                argv = fh.read().split(b"\0")
            with open(f"/proc/{entry}/cgroup", encoding="utf-8") as fh:
                cgroup = fh.read()
        except OSError:
            continue
        if len(argv) > 1 and os.path.basename(argv[0]) == b"sleep" \
                and argv[1] == marker.encode() and cgroup_holds in cgroup:
            return int(entry)
    return 0


def test_the_agent_gives_a_containerised_process_to_its_job(
    sandbox: Any, submit: Any, bundle: str,
) -> None:
    """NVML names a GPU process by its host pid, also for a container with its own pid
    namespace: the agent maps that pid through its cgroup (the step's, which the container
    stays in) to the job and its class, and counts its GPU memory there. The driver is
    played by registering the container's host pid with the simulated node."""
    from slurmiso.agent.gpus import gather_node
    from slurmiso.config import load_config
    from slurmiso.gpu.sim import SimBackend
    from slurmiso.state import NodeState
    from tests import waiting

    marker = f"{300 + uuid.uuid4().int % 1000}.25"
    job = submit(f"#!/bin/bash\n{_in_container(bundle)}/bin/sleep {marker}\n", "-p", "mps",
                 "--gres=mps:50", "--qos=infer", "-w", "n2", user=L.TEST_USER)
    cfg = load_config(sandbox.slurmiso_config)
    state = NodeState(cfg.paths.state_dir_for("n2"))
    waiting.wait_for(lambda: (state.read_job(job) or None) is not None
                     and state.read_job(job).status == "ready", "the job's record", timeout=60,
                     every=0.3)
    rec = state.read_job(job)
    holds = str(rec.fence.get("sluid") or f"job_{job}")
    pid = waiting.wait_for(lambda: _host_pid_of(marker, holds), "the container's process",
                           timeout=60, every=0.3)
    with open(f"/proc/{pid}/status", encoding="ascii") as fh:
        ns_pids = [ln.split()[1:] for ln in fh if ln.startswith("NSpid:")][0]
    assert len(ns_pids) == 2 and ns_pids[1] == "1", "its own pid namespace: pid 1 inside"
    (gpu,) = {r.gpu for r in rec.resources if r.gpu is not None}
    # the entry goes with the process (the sim keeps only live pids with their start time)
    SimBackend(sandbox.path("sim", "n2.json")).add_process(gpu, pid, 1234, name="in-container")
    report = gather_node(cfg, "n2")
    assert report.memory.get((job, "infer", gpu, "")) == 1234, report.memory
