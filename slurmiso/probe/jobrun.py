"""Run one workload where the probe placed it (a Slurm job, or a process on this node).

``python -m slurmiso.probe.jobrun SPEC.json``. The probe never reads a job's stdout through
Slurm: everything comes back through files next to the spec, on a directory both sides see —

* ``started`` (JSON): node, pid and the GPU variables the job got (which GPU, MIG or MPS share
  it was given, so the probe can tell whether a pair really shared one GPU), and Slurm's
  restart count (``SLURM_RESTART_COUNT``: set only once the job was requeued);
* ``starts``: one JSON line appended per start of this runner. A run is started once; a second
  line means Slurm requeued the job (preemption, a node failure) and ran it again, so what it
  printed is from an interrupted run and the probe must not use it;
* ``output``: the command's stdout, line by line as it comes (the output contract), and
  ``times``: when each line came (training steps are counted only while inference ran);
* ``ready``: written once a training command has printed its first step (the pair's barrier:
  inference starts measuring only when training is really running beside it);
* ``result`` (JSON): exit status, signal, whether it timed out or was stopped and by what
  (``stop_cause``: ``stop-file``, or ``signal`` when this runner was sent SIGTERM/SIGINT, by the
  probe's cancel or from outside it: scancel, preemption), and when.

* ``result`` also holds ``gpu_mem``: the GPU memory the command's processes held, sampled
  through the node's GPU backend (:mod:`slurmiso.probe.gpumem`), or why it was not measured;
  and ``host``: the CPU the command used and the share of the run some task stalled on CPU,
  memory and IO, the job's own where its cgroup says (:mod:`slurmiso.probe.hostfigs`).

Output and times files are appended to, never truncated: a second start (a requeued job) adds to
the first start's lines instead of hiding them.

Stopping: the stop file (training beside inference, once inference is done), SIGTERM to this
runner (``scancel``, Ctrl-C of a local probe) or the spec's timeout all end the command's whole
process group: SIGTERM, then SIGKILL after a grace. The runner itself exits 0 whenever it could
write ``result``; the probe judges the run from that file, not from Slurm's job state.
It runs on the GPU node with whatever Python slurmiso has there: the standard library and
slurmiso's own light modules; the GPU memory sampling opens the node's backend (pynvml) lazily
and, where it cannot, records why and runs the command all the same.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List, Optional

#: Job variables recorded in ``started``: where the job runs and which GPU share it holds.
GPU_ENV = ("SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_JOB_GPUS", "SLURM_STEP_GPUS",
           "CUDA_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL", "SLURM_SHARDS_ON_NODE",
           "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
           "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_CLIENT_PRIORITY", "SLURMISO_CLASS")
STOP_GRACE_S = 10.0
_POLL_S = 0.05

_terminated = threading.Event()


def _write_json(path: str, data: Dict[str, Any]) -> None:
    from slurmiso.atomic import write_atomic

    write_atomic(path, json.dumps(data, sort_keys=True) + "\n", durable=False)


def _touch(path: str) -> None:
    with open(path, "a", encoding="utf-8"):
        pass


def _record_start(path: str, where: Dict[str, Any]) -> int:
    """Append this start to the ``starts`` file; the number of starts so far (1 normally)."""
    if not path:
        return 1
    line = json.dumps(where, sort_keys=True) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    with open(path, encoding="utf-8", errors="replace") as fh:
        return max(1, sum(1 for ln in fh if ln.strip()))


def _restart_count(env: Dict[str, str]) -> int:
    """``SLURM_RESTART_COUNT``: absent on a job's first run, 1.. after each requeue."""
    from slurmiso.slurm.jobenv import step_restart_count

    return step_restart_count(env)


def _is_step(line: str) -> bool:
    text = line.strip()
    try:
        return float(text) >= 0
    except ValueError:
        return text.startswith("{") and '"step_s"' in text


def _end_group(proc: subprocess.Popen, grace: float) -> Optional[str]:
    """SIGTERM the command's process group, SIGKILL what is left after ``grace``."""
    if proc.poll() is not None:
        return None
    how = "SIGTERM"
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return None
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        how = "SIGKILL"
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return how


def _is_sample(line: str, role: str) -> bool:
    if role == "train":
        return _is_step(line)
    text = line.strip()
    try:
        return float(text) >= 0
    except ValueError:
        return text.startswith("{") and ('"latency_ms"' in text or '"ok"' in text)


def _pump(proc: subprocess.Popen, out_path: str, times_path: str, ready_path: str, role: str,
          counts: List[int], sampler: Any = None) -> None:
    """Copy the command's stdout to the output file, line by line, flushed at once, and each
    line's arrival time (Unix s) to the times file: the pair's overlap is cut from those. The
    first step or latency is also a GPU memory sample, taken before ``ready`` is written."""
    assert proc.stdout is not None
    ready = role != "train" or not ready_path
    first = sampler is not None
    with open(out_path, "a", encoding="utf-8") as out, \
            open(times_path, "a", encoding="utf-8") as times:
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace").replace("\r", "")
            out.write(line if line.endswith("\n") else line + "\n")
            out.flush()
            times.write(f"{time.time():.6f}\n")
            times.flush()
            counts[0] += 1
            if first and _is_sample(line, role):
                sampler.sample(force=True)
                first = False
            if not ready and _is_step(line):
                _touch(ready_path)
                ready = True


def run(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Run the spec's command to its end (or stop/timeout); return what ``result`` holds."""
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (spec.get("env") or {}).items()})
    started = time.time()
    where = {"node": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
             "pid": os.getpid(), "time": started,
             "env": {k: env[k] for k in GPU_ENV if k in env},
             "restart_count": _restart_count(env), "job": env.get("SLURM_JOB_ID", "")}
    where["start_no"] = _record_start(spec.get("starts", ""), where)
    from slurmiso.probe import gpumem, hostfigs

    sampler, why = gpumem.open_sampler(spec.get("gpu_mem"), str(where["node"]))
    cgroup = hostfigs.own_job_cgroup()
    host0, cpu0 = hostfigs.snapshot(cgroup), hostfigs.children_cpu_s()
    try:
        result = _run(spec, env, started, where, sampler)
    finally:
        gpumem.close(sampler)
    result["gpu_mem"] = sampler.result() if sampler is not None else gpumem.unmeasured(why)
    result["host"] = hostfigs.figures(host0, hostfigs.snapshot(cgroup),
                                      float(result.get("seconds") or 0.0),
                                      hostfigs.children_cpu_s() - cpu0)
    return result


def _run(spec: Dict[str, Any], env: Dict[str, str], started: float, where: Dict[str, Any],
         sampler: Any) -> Dict[str, Any]:
    with open(spec["stderr"], "a", encoding="utf-8") as err:
        try:
            proc = subprocess.Popen(spec["argv"], stdout=subprocess.PIPE, stderr=err,
                                    stdin=subprocess.DEVNULL, env=env, start_new_session=True,
                                    cwd=spec.get("cwd") or None)
        except OSError as exc:
            _write_json(spec["started"], where)
            return {"exit_code": None, "error": f"cannot start: {exc}", "started_at": started,
                    "ended_at": time.time(), "seconds": 0.0, "lines": 0, "timed_out": False,
                    "stopped": False, "stop_cause": None,
                    "restart_count": where["restart_count"], "start_no": where["start_no"]}
    # the command's process group, for whoever must end it if this runner is killed outright
    _write_json(spec["started"], dict(where, child_pgid=proc.pid))
    if sampler is not None:
        sampler.track(proc.pid)  # a session leader: its sid is its pid
    counts = [0]
    pump = threading.Thread(target=_pump, args=(proc, spec["output"], spec["times"],
                                                spec.get("ready", ""), spec["role"], counts,
                                                sampler),
                            daemon=True)
    pump.start()
    timeout = float(spec.get("timeout_s") or 0)
    stop_file = spec.get("stop_file") or ""
    timed_out = stopped = False
    ended_by: Optional[str] = None
    while proc.poll() is None:
        if _terminated.is_set():
            ended_by = _end_group(proc, STOP_GRACE_S)
            stopped = True
            break
        if stop_file and os.path.exists(stop_file):
            stopped = True  # the contract: training is ended with SIGTERM
            ended_by = _end_group(proc, STOP_GRACE_S)
            break
        if timeout and time.time() - started > timeout:
            timed_out = True
            ended_by = _end_group(proc, STOP_GRACE_S)
            break
        if sampler is not None:
            sampler.sample()
        time.sleep(_POLL_S)
    code = proc.wait()
    pump.join(5.0)
    ended = time.time()
    # A signal to this runner counts whenever it came: Slurm signals every process of the job
    # at once, so the command may have ended from it before this loop saw the flag.
    cause = "signal" if _terminated.is_set() else ("stop-file" if stopped else None)
    return {"exit_code": code if code >= 0 else None, "signal": -code if code < 0 else None,
            "ended_by": ended_by, "timed_out": timed_out, "stopped": stopped or cause == "signal",
            "stop_cause": cause, "started_at": started, "ended_at": ended,
            "seconds": round(ended - started, 3), "lines": counts[0],
            "restart_count": where["restart_count"], "start_no": where["start_no"]}


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m slurmiso.probe.jobrun SPEC.json", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as fh:
        spec = json.load(fh)

    def on_signal(_signum: int, _frame: Any) -> None:
        _terminated.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    result = run(spec)
    _write_json(spec["result"], result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
