"""Job wrapper: signal forwarding latency, and how fast inference gets the GPUs on preemption.

1. Forwarding: SIGTERM to ``slurmiso run`` -> the program's checkpoint handler runs, median of
   20, against the same signal sent to the program directly (baseline, same run).
2. Preemption (only when the sandbox is up; takes the sandbox lock): time from
   ``sbatch --qos=infer`` to RUNNING while a training job holds every GPU of partition gpu,
   with the training job under ``srun slurmiso run`` (checkpoint, then requeue at once) vs a
   bare batch script (Slurm waits out the QoS GraceTime, then requeues).
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

from common import ROOT, median_ms, python_env, report

RUNS = 20
LOCK = "/tmp/slurmiso-sandbox-tests.lock"
SANDBOX = os.environ.get("SLURMISO_SANDBOX_DIR", "/var/lib/slurmiso-sandbox")

# The program: on USR2 (the checkpoint signal) it appends the monotonic time to a file.
PROGRAM = r"""
import os, signal, sys, time
out = sys.argv[1]
def h(s, f):
    t = time.monotonic()
    with open(out, "a") as fh:
        fh.write(f"{t}\n")
signal.signal(signal.SIGUSR2, h)
open(out + ".ready", "w").close()
while True:
    time.sleep(3600)
"""


def _wait_file(path: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"benchmark program did not start ({path})")
        time.sleep(0.005)


def _one_latency(wrapped: bool, tmp: str, n: int) -> float:
    out = os.path.join(tmp, f"t{n}-{int(wrapped)}")
    prog = [sys.executable, "-c", PROGRAM, out]
    argv = (
        [sys.executable, "-m", "slurmiso", "run", "--grace", "5",
         "--ckpt-dir", os.path.join(tmp, "ckpt"), "--", *prog]
        if wrapped else prog
    )
    env = python_env()
    for k in ("SLURM_JOB_ID", "SLURMISO_EVENTS_FILE"):
        env.pop(k, None)
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_file(out + ".ready")
        time.sleep(0.05)  # the wrapper is in its wait loop, as it is for most of a job
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM if wrapped else signal.SIGUSR2)
        _wait_file(out)
        text = ""
        while not text.endswith("\n"):
            with open(out) as fh:
                text = fh.read()
        return float(text.split()[0]) - t0
    finally:
        import psutil

        kids = psutil.Process(proc.pid).children(recursive=True)  # the program's own group
        for p in [*kids]:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        proc.kill()
        proc.wait()


def forwarding() -> bool:
    direct: List[float] = []
    wrapped: List[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(RUNS):  # interleaved so machine noise hits both alike
            direct.append(_one_latency(False, tmp, n))
            wrapped.append(_one_latency(True, tmp, n))
    base = median_ms(direct)
    print(f"baseline: USR2 sent straight to the program, median of {RUNS}: {base:.3f} ms")
    w = median_ms(wrapped)
    return report(
        "SIGTERM -> wrapper -> program's handler", f"{w:.3f} ms", w / base,
        "of direct delivery",
    )


# -- preemption in the sandbox ------------------------------------------------------------


# A training stand-in: holds the GPUs; on USR2 reports a checkpoint (the marker contract,
# without importing slurmiso, so the bare script runs it too) and exits.
TRAIN_STANDIN = r"""
import json, os, signal, sys, time
def on_usr2(signum, frame):
    marker = os.environ.get("SLURMISO_CKPT_MARKER")
    if marker:
        with open(marker + ".tmp", "w") as fh:
            json.dump({"path": "WORK/prog.py"}, fh)
        os.replace(marker + ".tmp", marker)
    sys.exit(0)
signal.signal(signal.SIGUSR2, on_usr2)
open("WORK/running", "w").close()
while True:
    time.sleep(3600)
"""


def _events(path: str) -> List[dict]:
    import json

    try:
        with open(path) as fh:
            return [json.loads(x) for x in fh if x.strip()]
    except FileNotFoundError:
        return []


def _sandbox_up() -> bool:
    conf = os.path.join(SANDBOX, "etc", "slurm.conf")
    if os.geteuid() != 0 or not os.path.exists(conf):
        return False
    env = dict(os.environ, SLURM_CONF=conf)
    cp = subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True)
    return cp.returncode == 0 and "UP" in cp.stdout


def _slurm(*argv: str) -> str:
    env = dict(os.environ, SLURM_CONF=os.path.join(SANDBOX, "etc", "slurm.conf"),
               SLURMISO_CONFIG=os.path.join(SANDBOX, "etc", "slurmiso.yaml"))
    return subprocess.run(list(argv), env=env, capture_output=True, text=True, check=True).stdout


def _state(job: str) -> str:
    out = _slurm("squeue", "-h", "-j", job, "-o", "%T")
    return out.strip() or "GONE"


def _preempt_once(script: str, work: str) -> Optional[float]:
    """Submit the training script on all GPUs, then an infer job; seconds until it runs."""
    path = os.path.join(work, f"train-{time.monotonic_ns()}.sh")
    with open(path, "w") as fh:
        fh.write(script)
    os.chmod(path, 0o755)
    train = _slurm("sbatch", "--parsable", "--qos=train", "--requeue", "-p", "gpu",
                   "--gres=gpu:2", f"--chdir={work}", "-o", os.path.join(work, "t-%j.out"),
                   path).strip()
    infer = ""
    try:
        deadline = time.monotonic() + 60
        while _state(train) != "RUNNING" or not os.path.exists(os.path.join(work, "running")):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)
        t0 = time.monotonic()
        infer = _slurm("sbatch", "--parsable", "--qos=infer", "-p", "gpu", "--gres=gpu:1",
                       "-o", "/dev/null", "--wrap", "sleep 1").strip()
        while _state(infer) not in ("RUNNING", "COMPLETING", "GONE"):
            if time.monotonic() - t0 > 120:
                return None
            time.sleep(0.05)
        return time.monotonic() - t0
    finally:
        _slurm("scancel", train, *([infer] if infer else []))
        while _state(train) != "GONE":
            time.sleep(0.2)
        try:
            os.unlink(os.path.join(work, "running"))
        except FileNotFoundError:
            pass


def preemption(runs: int = 2) -> bool:
    if not _sandbox_up():
        print("preemption benchmark skipped: the sandbox is not up (make sandbox)")
        return True
    import fcntl

    work = tempfile.mkdtemp(prefix="bench-wrapper-", dir="/tmp")
    os.chmod(work, 0o1777)
    py = sys.executable
    with open(os.path.join(work, "prog.py"), "w") as fh:
        fh.write(TRAIN_STANDIN.replace("WORK", work))
    prog = f"{py} {work}/prog.py"
    bare = f"#!/bin/bash\n{prog}\n"
    wrapped = (f"#!/bin/bash\nexport PYTHONPATH={ROOT}\n"
               f"srun {py} -m slurmiso run --ckpt-dir {work}/ckpt --events {work}/ev.jsonl "
               f"-- {prog}\n")
    with open(LOCK, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        bare_s: List[float] = []
        wrap_s: List[float] = []
        for _ in range(runs):
            for script, out in ((bare, bare_s), (wrapped, wrap_s)):
                got = _preempt_once(script, work)
                if got is not None:
                    out.append(got)
    if not bare_s or not wrap_s:
        print("preemption benchmark: the sandbox did not run the jobs in time; no figure")
        return True
    b, w = statistics.median(bare_s), statistics.median(wrap_s)
    ckpt = [e for e in _events(os.path.join(work, "ev.jsonl")) if e["event"] == "checkpoint-end"]
    if ckpt:
        waits = statistics.median(e["duration_s"] for e in ckpt)
        print(f"of which waiting on the checkpoint (checkpoint-end duration_s): {waits:.3f} s")
    print(f"baseline: bare batch script (no slurmiso), median of {len(bare_s)}: {b:.2f} s "
          "(QoS GraceTime 30 s)")
    return report("sbatch --qos=infer -> RUNNING (slurmiso run)", f"{w:.2f} s", w / b,
                  "of the bare script", 0.5)


def main() -> bool:
    ok = forwarding()
    return preemption() and ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
