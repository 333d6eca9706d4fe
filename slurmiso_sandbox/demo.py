"""``slurmiso sandbox demo``: a short mixed inference/training scenario on the sandbox.

Each step submits real jobs to the sandbox's Slurm, shows what the jobs saw and what slurmiso
did, and checks it; the summary says which steps held. Holds the sandbox session lock, so it
never runs into a test session.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import tempfile
import time
from typing import Any, Callable, Dict, List, Tuple

from slurmiso.errors import SandboxError
from slurmiso_sandbox.client import SandboxClient, session_lock
from slurmiso_sandbox.procs import wait_until
from slurmiso_sandbox.scenes import monitor_config, record_gpu

ENV_LINES = "env | grep -E '^(CUDA_|SLURMISO_CLASS|SLURMISO_REFUSED)' | sort\n"


def _script(hold_s: int = 0) -> str:
    return "#!/bin/bash\n" + ENV_LINES + (f"sleep {hold_s}\n" if hold_s else "")


def _env(output: str) -> Dict[str, str]:
    return dict(ln.split("=", 1) for ln in output.splitlines() if "=" in ln)


def _say(text: str = "") -> None:
    print(text, flush=True)


def _show_job(sbx: SandboxClient, job: str, label: str) -> Dict[str, str]:
    out = sbx.job_output(job)
    _say(f"  job {job} ({label}) saw:")
    for line in out.splitlines() or ["(no output)"]:
        _say(f"    {line}")
    return _env(out)


def _gpu_state(sbx: SandboxClient, node: str) -> Any:
    from slurmiso.gpu.sim import SimBackend

    state = SimBackend(sbx.path("sim", f"{node}.json")).state()
    return {k: v for k, v in state.items() if "generation" not in k}


def _wait_released(sbx: SandboxClient, node: str, jobs: List[str], timeout: float = 30) -> None:
    """The job is COMPLETED before its epilog ends; wait until its record is gone."""
    wait_until(f"the epilog to release {', '.join(jobs)} on {node}", lambda: not any(
        os.path.exists(sbx.path("state", node, "jobs", f"{j}.json")) for j in jobs),
        timeout=timeout)


def step_qos(sbx: SandboxClient) -> str:
    """The classes' QoS as the config declares them (assert, then act)."""
    first = sbx.slurmiso("qos", "apply")
    second = sbx.slurmiso("qos", "apply")
    for line in first.stdout.splitlines():
        _say(f"    {line}")
    if first.returncode != 0 or second.returncode != 0:
        raise SandboxError(f"qos apply failed: {first.stderr or second.stderr}")
    if "nothing to change" not in second.stdout:
        raise SandboxError("a second 'qos apply' still changed something")
    return "QoS infer (preempts train), train (requeue, grace), debug applied; rerun: no change"


def step_exclusive(sbx: SandboxClient) -> str:
    job = sbx.submit(_script(), "-p", "gpu", "--gres=gpu:1", "--qos=debug")
    sbx.wait_for(job)
    env = _show_job(sbx, job, "qos debug, partition gpu: a whole simulated A100")
    if env.get("SLURMISO_CLASS") != "debug" or env.get("CUDA_VISIBLE_DEVICES") not in ("0", "1"):
        raise SandboxError("the debug job did not get one whole GPU")
    return f"job {job} ran on GPU {env['CUDA_VISIBLE_DEVICES']} of n1 as class debug"


def step_mig_dynamic(sbx: SandboxClient) -> str:
    before = _gpu_state(sbx, "n4")
    infer = sbx.submit(_script(6), "-p", "migd", "--gres=shard:3", "--qos=infer")
    train = sbx.submit(_script(6), "-p", "migd", "--gres=shard:4", "--qos=train")
    for job in (infer, train):
        sbx.wait_for(job, {"RUNNING"}, timeout=40)
    time.sleep(1.0)
    _say("  while both run, 'slurmiso status --node n4':")
    status = sbx.slurmiso("status", "--node", "n4")
    for line in status.stdout.splitlines():
        _say(f"    {line}")
    for job in (infer, train):
        sbx.wait_for(job, timeout=60)
    e1 = _show_job(sbx, infer, "qos infer, 3 shards -> MIG 3g.40gb")
    e2 = _show_job(sbx, train, "qos train, 4 shards -> MIG 4g.40gb")
    _wait_released(sbx, "n4", [infer, train])
    uuids = {e1.get("CUDA_VISIBLE_DEVICES", ""), e2.get("CUDA_VISIBLE_DEVICES", "")}
    if len(uuids) != 2 or not all(u.startswith("MIG-") for u in uuids):
        raise SandboxError("the two jobs did not get two MIG instances")
    if _gpu_state(sbx, "n4") != before:
        raise SandboxError("MIG instances were left on n4 after the jobs ended")
    return "infer (3g.40gb) and train (4g.40gb) shared an H100 through MIG; GPU clean after"


def _mps_pair(sbx: SandboxClient, infer_script: str, labels: Tuple[str, str]
              ) -> Tuple[Dict[str, str], Dict[str, str]]:
    """An infer and a train job on n2's MPS pool at once; what each saw. One GPU, each class
    through its own MPS daemon, whose limits the job cannot undo (docs/security.md, MPS):
    two pipe directories under the same GPU."""
    infer = sbx.submit(infer_script, "-p", "mps", "--gres=mps:50", "--qos=infer", "-w", "n2")
    train = sbx.submit(_script(4), "-p", "mps", "--gres=mps:50", "--qos=train", "-w", "n2")
    for job in (infer, train):
        sbx.wait_for(job, timeout=90)
    e1 = _show_job(sbx, infer, labels[0])
    e2 = _show_job(sbx, train, labels[1])
    _wait_released(sbx, "n2", [infer, train])
    pipes = [e1.get("CUDA_MPS_PIPE_DIRECTORY") or "", e2.get("CUDA_MPS_PIPE_DIRECTORY") or ""]
    gpus = {e1.get("CUDA_VISIBLE_DEVICES"), e2.get("CUDA_VISIBLE_DEVICES")}
    if not all(pipes) or pipes[0] == pipes[1] or len(gpus) != 1:
        raise SandboxError(f"the two jobs did not share one GPU through their own MPS daemons "
                           f"(GPUs {sorted(map(str, gpus))}, pipes {pipes})")
    return e1, e2


def step_mps(sbx: SandboxClient) -> str:
    before = _gpu_state(sbx, "n2")
    e1, e2 = _mps_pair(sbx, _script(4), ("qos infer on the MPS pool",
                                         "qos train on the MPS pool"))
    if _gpu_state(sbx, "n2") != before:
        raise SandboxError("n2's GPUs changed after the MPS jobs ended")
    return (f"one GPU, a daemon per class: infer at "
            f"{e1.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')}% / train at "
            f"{e2.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')}% of the SMs, set on the daemon; "
            "daemons stopped after")


class Skipped(SandboxError):
    """A step this sandbox cannot run, with the reason and where it runs."""


def step_container(sbx: SandboxClient) -> str:
    """An inference job in an OCI container (``srun --container``, crun, the gate) beside a
    bare training job on one MPS GPU: each gets its own class's daemon and limits, and the
    container reaches its daemon's pipe directory."""
    bundle = sbx.path("oci", "bundle")
    from slurmiso.slurm.ociconf import env_after_task_prolog

    if not os.path.exists(sbx.path("etc", "oci.conf")) or \
            not env_after_task_prolog(sbx.slurm_version()):
        raise Skipped("containers keep their share on Slurm 23.02+ (22.05's gate refuses "
                      "them all): make demo SLURM=26.05 CGROUP=v2")
    look = ("import os; e = os.environ; p = e.get('CUDA_MPS_PIPE_DIRECTORY', ''); "
            "[print(k + '=' + e[k]) for k in sorted(e) if k.startswith(('CUDA_', "
            "'SLURMISO_CLASS'))]; print('CONTAINER=' + os.uname().nodename); "
            "print('PIPE_SEEN=' + str(bool(p) and os.path.isdir(p)))")
    e1, e2 = _mps_pair(
        sbx, f'#!/bin/bash\nsrun --container={bundle} /usr/bin/python3 -c "{look}"\nsleep 4\n',
        ("qos infer, in a container", "qos train, bare"))
    if e1.get("CONTAINER") != "sbx-container" or e1.get("PIPE_SEEN") != "True":
        raise SandboxError("the inference job did not run in its container with its MPS "
                           f"pipe directory in sight ({e1})")
    return (f"one GPU: infer in a container at {e1.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')}% "
            f"of the SMs, {e1.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}; train bare at "
            f"{e2.get('CUDA_MPS_ACTIVE_THREAD_PERCENTAGE')}%, "
            f"{e2.get('CUDA_MPS_PINNED_DEVICE_MEM_LIMIT')}; limits on each class's daemon")


def step_refusal(sbx: SandboxClient) -> str:
    job = sbx.submit(_script(), "-p", "tslice", "--gres=shard:1", "--qos=debug")
    sbx.wait_for(job)
    env = _show_job(sbx, job, "qos debug on the timeslice pool")
    if "needs exclusive isolation" not in env.get("SLURMISO_REFUSED", ""):
        raise SandboxError("the debug job on the timeslice pool was not refused")
    states = sbx.node_states()
    if not states.get("n5", "").startswith(("idle", "mix")):
        raise SandboxError(f"node n5 is {states.get('n5')} after a job problem")
    return "a debug job on the unfenced pool was refused (GPUs hidden); node n5 stayed up"


def preemption_scenario(sbx: SandboxClient, steps: int = 480, step_time: float = 0.05,
                        preemptions: int = 3, container: str = "") -> Dict[str, Any]:
    """A ``train`` job counting steps under ``srun slurmiso run`` on both GPUs of n1, preempted
    ``preemptions`` times by ``infer`` jobs; returns what happened (steps logged, restarts,
    checkpoint records, how long each inference job waited to start). With ``container`` (an
    OCI bundle) the step runs in it (``srun --container``), ``slurmiso run`` as its program."""
    import re

    work = tempfile.mkdtemp(prefix="wrapper-", dir=sbx.jobs_dir)
    os.chmod(work, 0o1777)
    log = os.path.join(work, "steps.log")
    py, repo = sbx.job_python, sbx.job_pythonpath  # in the job: the root's in a root sandbox
    # shipped in slurmiso-sandbox: the demo runs from the installed packages too
    workload = os.path.join(repo, "slurmiso_sandbox", "train_counter.py")

    def logged() -> List[int]:
        try:
            with open(log) as fh:
                return [int(m) for m in re.findall(r"^step=(\d+) ", fh.read(), re.M)]
        except FileNotFoundError:
            return []

    def records() -> List[Dict[str, Any]]:
        """The job's lines in the node journals, as production has them: its wrapper's report,
        folded in by each attempt's epilog (``source: job``), and the hooks' own lines."""
        from slurmiso.state.journal import Journal

        found: List[Dict[str, Any]] = []
        for path in sorted(glob.glob(sbx.path("log", "journal-*.jsonl"))):
            found += [e for e in Journal(path).read() if e.get("job") == job]
        return sorted(found, key=lambda e: str(e.get("ts", "")))

    script = (
        "#!/bin/bash\n"
        f"export PYTHONPATH={repo}\n"
        f"srun {f'--container={container} ' if container else ''}"
        f"{py} -m slurmiso run --ckpt-dir {work}/ckpt -- "
        f"{py} {workload} --steps {steps} --step-time {step_time} --log {log}\n"
    )
    job = sbx.submit(script, "--qos=train", "--requeue", "-p", "gpu", "--gres=gpu:2",
                     "--open-mode=append", "-J", "train-demo")
    waits: List[float] = []
    for n in range(preemptions):
        base = len(logged())

        def progressed(base: int = base) -> bool:
            return len(logged()) >= base + 20

        wait_until(f"training run {n + 1} to progress", progressed, timeout=150)
        t0 = time.monotonic()
        infer = sbx.submit("sleep 1\n", "--qos=infer", "-p", "gpu", "--gres=gpu:1", "-J", "infer")

        def started(infer: str = infer) -> bool:
            return sbx.job_state(infer) in ("RUNNING", "COMPLETED")

        wait_until(f"inference job {infer} to start", started, timeout=60)
        waits.append(round(time.monotonic() - t0, 2))
        sbx.wait_for(infer, timeout=60)

        def requeued(n: int = n) -> bool:
            if sum(e["event"] == "requeue" for e in records()) > n:
                return True
            if len(set(logged())) >= steps:  # each attempt runs 20 steps + the preemption's delay
                raise SandboxError(f"the training job finished its {steps} steps before "
                                   f"preemption {n + 1}: give it more steps")
            return False

        wait_until(f"requeue {n + 1} of the training job", requeued, timeout=120)
    final = final_states(sbx)
    state = sbx.wait_for(job, final, timeout=steps * step_time + 150)
    with open(log) as fh:
        text = fh.read()
    fields = sbx.job_fields(job)
    return {
        "job": job,
        "steps": logged(),
        "target": steps,
        "restarts": fields.get("Restarts"),
        "state": state,
        "exit_code": fields.get("ExitCode"),
        "final_states": final,
        "finished": f"# finished steps={steps}" in text,
        "events": records(),
        "infer_waits_s": waits,
    }


def final_states(sbx: SandboxClient) -> Tuple[str, ...]:
    """How a training job that was preempted and requeued ends once its program finishes.

    From Slurm 24.05 a job signalled for a preemption grace keeps that mark through
    ``scontrol requeue``; ``slurmiso run`` turns its requeue off when the program ends, and
    Slurm then names the finished job PREEMPTED (exit code 0:0) instead of COMPLETED
    (measured on 24.11.5; versions table ``grace_preempt_sticky``)."""
    from slurmiso.wrapper.requeue import needs_close

    return ("COMPLETED", "PREEMPTED") if needs_close(sbx.slurm_version()) else ("COMPLETED",)


def step_preemption(sbx: SandboxClient) -> str:
    r = preemption_scenario(sbx)
    ckpts = [e for e in r["events"] if e["event"] == "checkpoint-end" and e.get("source")]
    _say(f"  training job {r['job']}: restarts={r['restarts']}, checkpoints "
         + ", ".join(f"{e.get('duration_s', 0):.2f}s" for e in ckpts)
         + f"; inference waited {r['infer_waits_s']} s to start")
    if sorted(r["steps"]) != list(range(1, r["target"] + 1)):
        raise SandboxError("a training step was lost or counted twice")
    if r["restarts"] != "3" or not r["finished"] or r["exit_code"] != "0:0":
        raise SandboxError(f"expected 3 restarts and a finished run, got {r['restarts']} "
                           f"restarts, exit code {r['exit_code']}")
    return (f"train job preempted 3 times by infer jobs; all {r['target']} steps counted once, "
            f"restart count 3, ended {r['state']} (exit 0), inference started within "
            f"{max(r['infer_waits_s'])} s")


def run_monitor(sbx: SandboxClient, config: str, folder: str, *args: str) -> str:
    """One applied ``slurmiso monitor --once`` cycle (in-process GPU reads: one host)."""
    cp = sbx.slurmiso("--config", config, "monitor", "--once", "--telemetry", "local",
                      "--state", os.path.join(folder, "monitor-state.json"),
                      "--lock", os.path.join(folder, "monitor.lock"), *args, timeout=120)
    if cp.returncode != 0:
        raise SandboxError(f"slurmiso monitor failed: {cp.stdout}{cp.stderr}")
    return str(cp.stdout)


def monitor_hold_scenario(sbx: SandboxClient, folder: str) -> Dict[str, Any]:
    """An inference job on the MPS node n2 runs its GPUs hot (simulated load); a training job
    that arrives for that partition is held by one monitor cycle (``admission: hold``), nothing
    more happens while it stays hot, and it is released once the inference job is done and
    the GPUs are calm. Training's own load would hold nothing: only GPUs inference uses count.

    The training job arrives with a begin time (as one arriving between cycles would), so it
    cannot start before the cycle that holds it."""
    config = monitor_config(sbx, folder)
    with open(config) as fh:
        text = fh.read()
    with open(config, "w") as fh:
        fh.write(text.replace("\nmonitor:\n", "\nmonitor:\n  admission: hold\n", 1))
    state = sbx.path("sim", "n2.json")
    flag = os.path.join(sbx.jobs_dir, f"stop-load-{os.getpid()}")
    sim = (f"PYTHONPATH={sbx.job_pythonpath} {sbx.job_python} -m slurmiso sim load "
           f"--state {state}")
    load = sbx.submit(f"#!/bin/bash\n{sim} --gpu 0 --sm 95 --mem 70G\n"
                      f"{sim} --gpu 1 --sm 95 --mem 70G\necho loaded\n"
                      f"while [ ! -e {flag} ]; do sleep 0.3; done\n"
                      f"{sim} --gpu 0 --sm 0\n{sim} --gpu 1 --sm 0\n",
                      "-p", "mps", "--qos=infer", "--gres=mps:50", "-w", "n2", "-J", "infer-load")
    out: Dict[str, Any] = {"load_job": load}
    try:
        sbx.wait_for(load, {"RUNNING"}, timeout=40)
        wait_until("the load to start", lambda: "loaded" in sbx.job_output(load), timeout=30)
        pending = sbx.submit("#!/bin/bash\nsleep 1\n", "-p", "mps", "--qos=train",
                             "--gres=mps:50", "--begin=now+600")
        out["pending_job"] = pending
        out["hot"] = run_monitor(sbx, config, folder)
        out["held"] = sbx.job_fields(pending).get("Reason", "") in ("JobHeldAdmin",
                                                                     "JobHeldUser")
        sbx.cmd("scontrol", "update", f"JobId={pending}", "StartTime=now")
        out["still_hot"] = run_monitor(sbx, config, folder)
        open(flag, "w").close()
        sbx.wait_for(load, timeout=40)
        _wait_released(sbx, "n2", [load])
        out["calm"] = run_monitor(sbx, config, folder)
        sbx.wait_for(pending, timeout=60)
        out["pending_state"] = sbx.job_state(pending)
    finally:
        open(flag, "w").close()
        for gpu in ("0", "1"):
            sbx.slurmiso("sim", "load", "--state", state, "--clear", "--gpu", gpu)
    return out


def step_monitor(sbx: SandboxClient) -> str:
    folder = tempfile.mkdtemp(prefix="monitor-", dir=sbx.jobs_dir)
    r = monitor_hold_scenario(sbx, folder)
    for phase in ("hot", "still_hot", "calm"):
        _say(f"  monitor cycle ({phase.replace('_', ' ')}):")
        for line in r[phase].splitlines():
            _say(f"    {line}")
    if not r["held"] or f"did release {r['pending_job']}" not in r["calm"]:
        raise SandboxError("the monitor did not hold and then release the training job")
    return (f"inference ran n2's GPUs hot: training job {r['pending_job']} held, released "
            f"when calm, then {r['pending_state']}")


PERNODE_PART = "slurmiso-demo-pernode"


def _queue(sbx: SandboxClient, jobs: List[str]) -> Dict[str, Dict[str, str]]:
    """Each job's state, node, reason, ExcNodeList and comment, as squeue/scontrol show."""
    out = {}
    for job in jobs:
        f = sbx.job_fields(job)
        comment = sbx.cmd("squeue", "-h", "-j", job, "-o", "%k", check=False).strip()
        out[job] = {"state": f.get("JobState", ""), "node": f.get("NodeList", ""),
                    "reason": f.get("Reason", ""), "exclude": f.get("ExcNodeList", ""),
                    "comment": "" if comment == "(null)" else comment}
    return out


def _say_queue(sbx: SandboxClient, jobs: List[str]) -> None:
    text = sbx.cmd("squeue", "-j", ",".join(jobs), "-o", "%.9i %.9T %.6N %.12R %k",
                   check=False)
    for line in text.splitlines():
        _say(f"    {line}")


def pernode_admission_scenario(sbx: SandboxClient, folder: str, hold_s: int = 25,
                               ) -> Dict[str, Any]:
    """``admission: nodes`` on one partition of two shared nodes (a temporary one: n4, n5).

    An inference job's GPU on n4 runs hot (simulated load); three training jobs of 4 shards
    each (a whole GPU's worth on n5) wait for the monitor's cycle (a begin time: what
    arrives between cycles).
    The cycle keeps them off n4 (ExcNodeList, comment); once free to start, two run on n5
    (all its shards) and the third waits although n4 is free, its comment saying why. When
    n4 is calm again a cycle restores the job's own list and it starts on n4. A control job
    submitted with both nodes calm and free shows n4 is Slurm's own first choice, so the
    jobs on n5 were the exclusion's doing."""
    from slurmiso.gpu.sim import SimBackend

    config = monitor_config(sbx, folder)
    with open(config) as fh:
        text = fh.read()
    with open(config, "w") as fh:
        fh.write(text.replace("\nmonitor:\n", "\nmonitor:\n  admission: nodes\n", 1))
    hot = SimBackend(sbx.path("sim", "n4.json"))
    out: Dict[str, Any] = {"hot_node": "n4", "calm_node": "n5", "partition": PERNODE_PART}
    jobs: List[str] = []
    sbx.cmd("scontrol", "create", f"PartitionName={PERNODE_PART}", "Nodes=n4,n5",
            "State=UP", "MaxTime=INFINITE", "Default=NO")
    infer = ""
    try:
        # The hot GPU is one an inference job uses: training's own load never holds training.
        infer = sbx.submit("#!/bin/bash\nsleep 600\n", "-p", "migd", "--qos=infer",
                           "--gres=shard:3", "-w", "n4", "-J", "infer-hot")
        sbx.wait_for(infer, {"RUNNING"}, timeout=60)
        gpu = record_gpu(sbx, "n4", infer)
        out["infer_job"], out["hot_gpu"] = infer, gpu
        hot.set_load(gpu, util=95, sm_active=95, memory_used_mb=72 * 1024)  # of 80 GB
        script = f"#!/bin/bash\necho ran on $SLURMD_NODENAME\nsleep {hold_s}\n"
        jobs = [sbx.submit(script, "-p", PERNODE_PART, "--qos=train", "--gres=shard:4",
                           "--begin=now+600", "-J", f"train-{n}") for n in (1, 2, 3)]
        out["jobs"] = list(jobs)
        out["hot"] = run_monitor(sbx, config, folder)
        out["after_hot_cycle"] = _queue(sbx, jobs)
        _say("  after one monitor cycle (n4 hot, jobs not yet eligible):")
        _say_queue(sbx, jobs)
        sbx.cmd("scontrol", "update", f"JobId={','.join(jobs)}", "StartTime=now")
        for job in jobs[:2]:
            sbx.wait_for(job, {"RUNNING"}, timeout=60)
        time.sleep(3.0)  # a scheduling pass with n4 free and the third job eligible
        out["while_hot"] = _queue(sbx, jobs)
        _say("  once eligible, n4 still hot:")
        _say_queue(sbx, jobs)
        hot.clear_load(gpu)
        sbx.cmd("scancel", infer, check=False)
        sbx.wait_for(infer, {"CANCELLED"}, timeout=60)
        _wait_released(sbx, "n4", [infer])
        out["calm"] = run_monitor(sbx, config, folder)
        sbx.wait_for(jobs[2], {"RUNNING", "COMPLETED"}, timeout=60)
        out["after_calm"] = _queue(sbx, jobs)
        _say("  n4 calm again, one monitor cycle later:")
        _say_queue(sbx, jobs)
        for job in jobs:
            sbx.wait_for(job, timeout=hold_s + 60)
        out["ran_on"] = {j: sbx.job_output(j).strip() for j in jobs}
        _wait_released(sbx, "n4", jobs[2:])
        # the control: with both nodes calm and free, Slurm's own first choice
        control = sbx.submit("#!/bin/bash\necho ran on $SLURMD_NODENAME\n", "-p",
                             PERNODE_PART, "--qos=train", "--gres=shard:4", "-J", "train-control")
        jobs.append(control)
        sbx.wait_for(control, timeout=60)
        out["control"] = sbx.job_output(control).strip()
        _wait_released(sbx, "n4", [control])
    finally:
        for g in (0, 1):
            hot.clear_load(g)
        for job in jobs + ([infer] if infer else []):
            sbx.cmd("scancel", job, check=False)
        for _ in range(50):  # a partition with jobs in it cannot be deleted
            if not sbx.cmd("squeue", "-h", "-p", PERNODE_PART, check=False).strip():
                break
            time.sleep(0.5)
        sbx.cmd("scontrol", "delete", f"PartitionName={PERNODE_PART}", check=False)
    return out


def step_pernode(sbx: SandboxClient) -> str:
    folder = tempfile.mkdtemp(prefix="monitor-pernode-", dir=sbx.jobs_dir)
    before = _gpu_state(sbx, "n4")
    r = pernode_admission_scenario(sbx, folder)
    j1, j2, j3 = r["jobs"][:3]
    first, hot, after = r["after_hot_cycle"], r["while_hot"], r["after_calm"]
    if not all(first[j]["exclude"] == "n4" for j in (j1, j2, j3)):
        raise SandboxError(f"the hot cycle did not keep the training jobs off n4: {first}")
    if [hot[j]["node"] for j in (j1, j2)] != ["n5", "n5"]:
        raise SandboxError(f"new training did not land on the calm node n5: {hot}")
    waiting = hot[j3]
    if waiting["state"] != "PENDING" or "kept off n4" not in waiting["comment"]:
        raise SandboxError(f"job {j3} does not wait with a reason in words: {waiting}")
    if after[j3]["node"] != "n4" or after[j3]["exclude"] not in ("", "(null)"):
        raise SandboxError(f"job {j3} did not start on n4 once it calmed: {after[j3]}")
    if [r["ran_on"][j] for j in (j1, j2, j3)] != ["ran on n5", "ran on n5", "ran on n4"]:
        raise SandboxError(f"jobs ran on {r['ran_on']}")
    if r["control"] != "ran on n4":  # else n5 may have been Slurm's choice anyway
        raise SandboxError(f"with both nodes calm the control job {r['control']}, not on n4")
    if _gpu_state(sbx, "n4") != before:
        raise SandboxError("n4's GPUs changed after the demo's jobs ended")
    return (f"n4 hot: training {j1}, {j2} ran on n5 of the same partition, {j3} waited "
            f"with n4 free ({waiting['reason']}; comment '{waiting['comment'][:60]}...'); "
            f"n4 calm: {j3} started on n4, as does a control job (Slurm's first choice); "
            "partition and load removed")


def step_protect(sbx: SandboxClient) -> str:
    """An inference job's latency over its SLO: the ladder throttles and then parks the
    training job on its GPU (the simulated cuda-checkpoint: its GPU memory to host, its
    processes kept), and restores it once calm (slurmiso_sandbox.protect)."""
    from slurmiso_sandbox import protect

    r = protect.protect_scenario(sbx, ("hold", "throttle", "park", "suspend"))
    _say(f"  ladder on training job {r['train']}: {' -> '.join(r['all_kinds'])}")
    _say(f"  inference job {r['infer']}: P99 {r['calm_p99_ms']} ms calm, {r['hot_p99_ms']} ms "
         f"driven; state {r['infer_state_while_hot']} throughout")
    return protect.check(r)


STEPS: List[Tuple[str, Callable[[SandboxClient], str]]] = [
    ("the classes' QoS applied to slurmdbd", step_qos),
    ("a job on a simulated GPU", step_exclusive),
    ("inference + training share one GPU through MIG", step_mig_dynamic),
    ("inference + training share one GPU through MPS", step_mps),
    ("a containerised inference job and a training job share one MPS GPU, each held to its "
     "class", step_container),
    ("a job slurmiso cannot isolate is refused, the node is not", step_refusal),
    ("training preempted three times by inference loses nothing", step_preemption),
    ("the monitor holds training while a GPU runs hot, releases it when calm", step_monitor),
    ("per-node admission: a hot node takes no new training, a calm one in the same "
     "partition does", step_pernode),
    ("running inference is protected: over its SLO, the training on its GPU is throttled, "
     "parked (its GPU memory to host, its processes kept), then restored", step_protect),
]


def _verdict(ok: bool, skipped: bool) -> str:
    return "SKIPPED" if skipped else "OK" if ok else "FAILED"


def run_demo(root: str, as_json: bool = False) -> int:
    """Run every step; 0 when all held. Requires a running sandbox (``sandbox up``)."""
    if not os.path.exists(os.path.join(root, "etc", "slurm.conf")):
        raise SandboxError(f"no sandbox at {root}", hint="run 'slurmiso sandbox up' first")
    results: List[Dict[str, Any]] = []
    with session_lock(root, timeout=600):
        jobs_dir = tempfile.mkdtemp(prefix="slurmiso-demo-")
        os.chmod(jobs_dir, 0o1777)
        sbx = SandboxClient(root, jobs_dir)
        try:
            sbx.clear_queue()
            sbx.idle_gpus()
            for n, (title, step) in enumerate(STEPS, 1):
                _say(f"\n== {n}. {title}")
                started = time.monotonic()
                skipped = False
                try:
                    detail, ok = step(sbx), True
                except Skipped as exc:
                    detail, ok, skipped = str(exc), True, True
                except SandboxError as exc:
                    detail, ok = str(exc), False
                secs = round(time.monotonic() - started, 1)
                results.append({"step": title, "ok": ok, "detail": detail, "seconds": secs,
                                "skipped": skipped})
                _say(f"  -> {_verdict(ok, skipped)}: {detail} ({secs}s)")
        finally:
            sbx.clear_queue()
            shutil.rmtree(jobs_dir, ignore_errors=True)
    _say("\n== summary")
    for r in results:
        _say(f"  {_verdict(r['ok'], r['skipped']):<7}{r['step']}: {r['detail']}")
    if as_json:
        print(json.dumps(results, indent=2))
    return 0 if all(r["ok"] for r in results) else 1
