"""SLO ladder reaction: from a breach reaching the agent to training suspended and requeued.

Issue 24's measure of the ladder on the live sandbox (root, ``slurmiso sandbox up``): the
scene of ``slurmiso_sandbox.protect`` (the stand-in inference server and a training job under
``slurmiso run`` on one MPS GPU of n2, a real agent, a real monitor daemon), with every dwell
at 0 so what is timed is the ladder's own path, not its patience: one step per cycle at most
(hold, throttle, suspend, requeue), each applied through the Slurm CLI.

Per round the stand-in's latency is switched over the SLO; the clock starts when the agent's
scrape first shows the breach (polled every 50 ms), and stops when Slurm shows the training
job SUSPENDED (its SMs released) and when it shows it off the GPU (requeued: PENDING, its
checkpoint taken and its epilog done). Baselines, in the issue's words: the monitor interval
(the ratio is the number of cycles the reaction costs; the floor is one per step) and the
training class's checkpoint grace time (what the requeue may take at most). Then the latency
calms and the requeued job starts again for the next round.

The park rung (issue 35) in two more scenes on the same GPU, every dwell at 0, the training
program registered on its simulated GPU: ``hold, throttle, park``, and the fastest safe steps
``hold, park`` (one cycle fewer: throttle is the program's cooperation, not a restraint).
The clock runs from the latency switch to the simulated driver showing the program
``checkpointed`` (its GPU memory and SMs yielded, its processes kept), against the issue's
target: one agent refresh (the scene's ``signals.refresh``, 1 s) + 2 s.

Skipped, with the reason, when this is not root or no sandbox is up. ``SLURMISO_BENCH_ROUNDS``
(2) and ``SLURMISO_BENCH_INTERVAL`` (1 s) change the rounds and the monitor interval.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Optional, Tuple

from common import ROOT, report

#: The fastest safe ladder for a park: hold (no new training there) then park, whose node
#: falls back to suspend where cuda-checkpoint is missing or refuses; throttle, cooperative,
#: left out. The ladder climbs one step a cycle, so this parks one cycle after the hold.
FASTEST_SAFE = ("hold", "park")
SANDBOX_DIR = os.environ.get("SLURMISO_SANDBOX_DIR", "/var/lib/slurmiso-sandbox")
HANG = 180.0  # seconds: only guards a hang


def skip_reason() -> Optional[str]:
    if os.geteuid() != 0:
        return "needs root (the sandbox's jobs, agent and monitor run as root)"
    conf = os.path.join(SANDBOX_DIR, "etc", "slurm.conf")
    if not os.path.exists(conf):
        return f"no sandbox at {SANDBOX_DIR} (slurmiso sandbox up)"
    cp = subprocess.run(["sinfo", "-h", "-o", "%N"], env=dict(os.environ, SLURM_CONF=conf),
                        capture_output=True, text=True, timeout=30, check=False)
    if cp.returncode != 0:
        return f"the sandbox at {SANDBOX_DIR} is not up (sinfo: {cp.stderr.strip()[:80]})"
    return None


def _until(cond: Callable[[], Any], what: str, every: float = 0.05) -> float:
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline:
        if cond():
            return time.monotonic()
        time.sleep(every)
    raise SystemExit(f"bench_reaction: timed out waiting for {what}")


def measure(rounds: int, interval_s: float) -> Dict[str, Any]:
    sys.path.insert(0, ROOT)
    from slurmiso.config import load_config
    from slurmiso_sandbox.client import SandboxClient, session_lock
    from slurmiso_sandbox.protect import CALM_MS, HOT_MS, SLO_MS, Ladder

    out: Dict[str, Any] = {"agent": [], "suspended": [], "off": [], "restarted": []}
    with session_lock(SANDBOX_DIR):
        jobs = tempfile.mkdtemp(prefix="slurmiso-bench-jobs-")
        os.chmod(jobs, 0o1777)
        sbx = SandboxClient(SANDBOX_DIR, jobs)
        os.environ.update({k: sbx.env[k] for k in ("SLURM_CONF", "SLURMISO_CONFIG")
                           if k in sbx.env})
        sbx.clear_queue()
        grace = [c.checkpoint.grace_s for c in load_config(sbx.slurmiso_config).classes
                 if c.name == "train" and c.checkpoint is not None]
        out["grace_s"] = float(grace[0]) if grace else None
        lad = Ladder(sbx, ("hold", "throttle", "suspend", "requeue"), dwell_s=0, window_s=4,
                     budgets={"throttle": "per_job: 20, per_hour: 120",
                              "suspend": "per_job: 20, per_hour: 120",
                              "requeue": "per_job: 20, per_hour: 120"},
                     interval_s=interval_s)
        out["work"] = lad.work

        def state() -> str:
            return sbx.cmd("squeue", "-h", "-j", lad.train, "-o", "%T", check=False).strip()

        try:
            lad.start_jobs()
            lad.start_daemons()
            for n in range(rounds):
                _until(lambda: state() == "RUNNING" and not lad.memory().get("ladder"),
                       "the scene to be calm with training running", every=0.3)
                restarts = sbx.job_fields(lad.train).get("Restarts", "0")
                lad.set_latency(HOT_MS)
                t_set = time.monotonic()
                t_agent = _until(lambda: (lad.job_p99() or 0) * 1000 > SLO_MS,
                                 "the agent to show the breach")
                t_susp = _until(lambda: state() == "SUSPENDED", "Slurm to show SUSPENDED",
                                every=0.02)
                t_off = _until(lambda: state() == "PENDING", "the job to be requeued")
                out["agent"].append(t_agent - t_set)
                out["suspended"].append(t_susp - t_agent)
                out["off"].append(t_off - t_agent)
                print(f"  round {n + 1}: agent {t_agent - t_set:.2f} s after the switch; "
                      f"SUSPENDED +{t_susp - t_agent:.2f} s, PENDING +{t_off - t_agent:.2f} s")
                lad.set_latency(CALM_MS)
                t_calm = time.monotonic()
                _until(lambda before=restarts: state() == "RUNNING"
                       and sbx.job_fields(lad.train).get("Restarts", "0") != before,
                       "the requeued job to run again", every=0.3)
                out["restarted"].append(time.monotonic() - t_calm)
            out["actions"] = lad.ladder_kinds(lad.train)
        finally:
            lad.stop()
            sbx.clear_queue()
    return out


def measure_park(rounds: int, interval_s: float,
                 steps: Tuple[str, ...] = ("hold", "throttle", "park")) -> Dict[str, Any]:
    """Latency switch -> the training program parked, and calm -> restored, per round."""
    sys.path.insert(0, ROOT)
    from slurmiso.gpu.sim import SimBackend
    from slurmiso_sandbox.client import SandboxClient, session_lock
    from slurmiso_sandbox.protect import CALM_MS, HOT_MS, Ladder

    out: Dict[str, Any] = {"parked": [], "restored": []}
    with session_lock(SANDBOX_DIR):
        jobs = tempfile.mkdtemp(prefix="slurmiso-bench-jobs-")
        os.chmod(jobs, 0o1777)
        sbx = SandboxClient(SANDBOX_DIR, jobs)
        sbx.clear_queue()
        lad = Ladder(sbx, steps, dwell_s=0, window_s=4,
                     budgets={"throttle": "per_job: 20, per_hour: 120"},
                     interval_s=interval_s)
        try:
            lad.start_jobs(train_args=f"--sim-cuda {lad.sim_path()}")
            pid = lad.hold_sim_gpu()
            sim = SimBackend(lad.sim_path())
            lad.start_daemons()

            def cuda() -> str:
                return sim.cuda_state(pid).value

            for n in range(rounds):
                _until(lambda: cuda() == "running" and not lad.memory().get("ladder"),
                       "the scene to be calm with training running", every=0.3)
                lad.set_latency(HOT_MS)
                t_set = time.monotonic()
                t_park = _until(lambda: cuda() == "checkpointed", "the park", every=0.02)
                lad.set_latency(CALM_MS)
                t_calm = time.monotonic()
                t_back = _until(lambda: cuda() == "running", "the release", every=0.02)
                out["parked"].append(t_park - t_set)
                out["restored"].append(t_back - t_calm)
                print(f"  park round {n + 1}: parked {t_park - t_set:.2f} s after the switch, "
                      f"restored {t_back - t_calm:.2f} s after calm")
            out["actions"] = lad.ladder_kinds(lad.train)
        finally:
            lad.stop()
            sbx.clear_queue()
    return out


def main() -> bool:
    why = skip_reason()
    if why:
        print(f"ladder reaction: skipped: {why}")
        return True
    rounds = max(1, int(os.environ.get("SLURMISO_BENCH_ROUNDS", "2")))
    interval = float(os.environ.get("SLURMISO_BENCH_INTERVAL", "1"))
    r = measure(rounds, interval)
    print(f"  ladder actions on the training job: {' -> '.join(r['actions'])}")
    n = len(r["off"])
    susp, off = statistics.median(r["suspended"]), statistics.median(r["off"])
    report("breach -> training SUSPENDED", f"{susp:.2f} s (n={n})", susp / interval,
           f"vs monitor interval {interval:g} s")
    report("breach -> training off the GPU (PENDING)", f"{off:.2f} s (n={n})", off / interval,
           f"vs monitor interval {interval:g} s")
    if r["grace_s"]:
        report("breach -> training off the GPU (PENDING)", f"{off:.2f} s (n={n})",
               off / r["grace_s"], f"vs checkpoint grace {r['grace_s']:g} s")
    for steps, what in ((("hold", "throttle", "park"), "with throttle first"),
                        (FASTEST_SAFE, "fastest safe steps: " + ", ".join(FASTEST_SAFE))):
        p = measure_park(rounds, interval, steps)
        parked = statistics.median(p["parked"])
        print(f"  park scene's actions on the training job: {' -> '.join(p['actions'])}")
        report(f"latency switch -> training parked (GPU yielded), {what}",
               f"{parked:.2f} s (n={len(p['parked'])})", parked / (1.0 + 2.0),
               "vs target: one agent refresh (1 s) + 2 s")
    agent = statistics.median(r["agent"])
    print(f"  (latency switched -> agent shows it: {agent:.2f} s median; calm -> requeued job "
          f"running again: {statistics.median(r['restarted']):.1f} s, Slurm's BeginTime "
          "wait included; not part of the figures above)")
    return True


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
