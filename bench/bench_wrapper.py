"""Job wrapper: signal forwarding, and the latency slurmiso run adds when a job is stopped.

1. Forwarding: SIGTERM to ``slurmiso run`` -> the program's checkpoint handler runs, median of
   20, against the same signal sent to the program directly (baseline, same run).
2. Stop latency, no Slurm needed: a well-behaved program that, on its stop signal, finishes
   its current 0.25 s step, saves a checkpoint and exits. Bare, the signal is SIGTERM; under
   ``slurmiso run`` it is the wrapper's checkpoint signal, with the environment slurmiso's
   prolog exports (the wrapper writes the requeue request for the epilog, its path on a
   cluster with slurmiso's hooks). Measured: SIGTERM to every process (as Slurm does) -> the
   last one gone. The program's own time (waiting for the step, saving) is taken out of both
   and replaced by their common median, so the figure is what the wrapper adds: forwarding,
   the marker, the job-state query, the request, its exit.
3. Preemption (only as root with the sandbox up; takes the sandbox lock): the infer job's
   start while a training job holds every GPU of partition gpu, bare Slurm (hooks off,
   ``srun prog``) against slurmiso (``srun slurmiso run -- prog``), with a timeline. Lives in
   bench_preempt_start.py. Target: at most 0.3 s more than bare.
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List, Tuple

from common import ROOT, median_ms, python_env, report

RUNS = 20
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


# -- stop latency: the same well-behaved program, bare and under the wrapper -----------------

STEP_S = 0.25
STOP_RUNS = 15

# Bare, it stops on SIGTERM; under the wrapper on the checkpoint signal (SIGTERM stays ignored
# as the wrapper starts it). Either way: the handler sets a flag, the current step finishes,
# a checkpoint is saved and fsynced, reported if there is a marker (the contract), and the
# program exits. It writes when it got the signal and when its checkpoint was saved.
from bench_preempt_start import PROGRAM as STEPPED  # noqa: E402  (one program for both)


def _tree(pid: int) -> List[int]:
    import psutil

    try:
        return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def _one_stop(wrapped: bool, tmp: str, n: int, phase: float) -> Tuple[float, float]:
    """(seconds from SIGTERM to gone, of which the program's own) for one run."""
    sys.path.insert(0, ROOT)
    from tests.localsim import LocalSlurm

    out = os.path.join(tmp, f"s{n}-{int(wrapped)}")
    prog = [sys.executable, "-c", STEPPED, out, str(STEP_S)]
    argv = ([sys.executable, "-m", "slurmiso", "run", "--grace", "30",
             "--ckpt-dir", os.path.join(tmp, f"ckpt{n}"), "--", *prog] if wrapped else prog)
    # SLURM_JOB_ID, a stand-in scontrol, and what slurmiso's prolog exports: the wrapper
    # leaves the requeue to the epilog, its path on a cluster with slurmiso's hooks
    sim = LocalSlurm(argv, env=python_env(), workdir=os.path.join(tmp, f"job{n}-{int(wrapped)}"),
                     epilog_requeue=True)
    env = sim.env_for(0)
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.DEVNULL)
    try:
        _wait_file(out + ".ready")
        time.sleep(0.1 + phase)  # anywhere within a step, as a preemption comes
        pids = _tree(proc.pid)
        t0 = time.monotonic()
        for sig in (signal.SIGCONT, signal.SIGTERM):  # as Slurm signals every process
            for pid in pids:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
        proc.wait(60)
        gone = time.monotonic() - t0
        with open(out) as fh:
            got, saved = (float(x) for x in fh.read().split())
        if wrapped and not sim.epilog_asked(0, 0):
            raise SystemExit("the wrapper did not ask for the requeue: the measured path is not "
                             "the real one")
        return gone, saved - got
    finally:
        for pid in _tree(proc.pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def stop_latency() -> bool:
    import random

    rng = random.Random(14)
    bare: List[Tuple[float, float]] = []
    wrapped: List[Tuple[float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(STOP_RUNS):  # interleaved, same phase for both
            phase = rng.uniform(0.0, STEP_S)
            bare.append(_one_stop(False, tmp, n, phase))
            wrapped.append(_one_stop(True, tmp, n, phase))
    own = statistics.median(o for _, o in bare + wrapped)
    b_over = statistics.median(g - o for g, o in bare)
    w_over = statistics.median(g - o for g, o in wrapped)
    print(f"baseline: bare program, SIGTERM -> gone at its next {STEP_S:g} s step, median of "
          f"{STOP_RUNS}: {statistics.median(g for g, _ in bare):.3f} s; its own time "
          f"(step + checkpoint) {own:.3f} s, after it {1000 * b_over:.1f} ms")
    print(f"slurmiso run, same program and phases: "
          f"{statistics.median(g for g, _ in wrapped):.3f} s; beyond the program's own time "
          f"{1000 * w_over:.1f} ms")
    added = w_over - b_over
    return report(
        "SIGTERM -> gone, added by slurmiso run", f"+{1000 * added:.1f} ms",
        (own + w_over) / (own + b_over), "of the bare program (own time matched)", 1.25,
    )


# -- preemption in the sandbox ------------------------------------------------------------


def preemption() -> bool:
    """Infer start under preemption, bare Slurm vs slurmiso: bench_preempt_start.py."""
    import bench_preempt_start

    return bench_preempt_start.main()


def main() -> bool:
    ok = forwarding()
    ok = stop_latency() and ok
    return preemption() and ok


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
