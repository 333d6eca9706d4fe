"""SIGKILL a real prolog and epilog at random points on a mig-dynamic (or mps) sim node, then
run the epilog to completion and ``reconcile``, and count what is left behind.

Shared by tests/unit/test_hook_kills.py (a few rounds) and bench/bench_hooks.py (200 rounds,
issue 13's "Done when"). Each hook runs as its own process, as slurmd runs it, with every
simulated driver call taking ``delay_ms`` (half before the change, half after: a kill can land
with an instance made but not yet recorded).
"""

from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE = "node1"


def setup_node(tmp: str, mode: str = "mig-dynamic") -> str:
    """A node of two simulated H100s in pool ``mode`` (MIG on for mig-dynamic); returns the
    config path."""
    from slurmiso.gpu.sim import SimBackend, init_state

    data = {
        "version": 1,
        "paths": {"state_dir": f"{tmp}/state/%n", "journal": f"{tmp}/journal-%n.jsonl"},
        "gpu": {"backend": "sim", "sim_state": f"{tmp}/sim/%n.json"},
        "classes": [{"name": "debug", "match": {"qos": ["debug"]},
                     "isolation": "mig" if mode == "mig-dynamic" else "mps",
                     "mig_profile": "3g.40gb"}],
        "default_class": "",
        "pools": [{"name": "p", "nodes": NODE, "partition": "part", "gpu_model": "H100-80GB",
                   "gpus_per_node": 2, "mode": mode}],
    }
    path = os.path.join(tmp, "slurmiso.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    init_state(f"{tmp}/sim/{NODE}.json", "H100-80GB", 2, mig=mode == "mig-dynamic", node=NODE,
               force=True)
    assert len(SimBackend(f"{tmp}/sim/{NODE}.json").devices()) == 2
    os.makedirs(f"{tmp}/work", exist_ok=True)
    return path


def hook_env(tmp: str, cfg: str, job: str, gpu: int, delay_ms: int) -> Dict[str, str]:
    return {
        "PYTHONPATH": ROOT, "SLURMISO_CONFIG": cfg, "SLURMISO_SIM_DELAY_MS": str(delay_ms),
        "SLURMISO_CACHE_DIR": os.environ.get("SLURMISO_CACHE_DIR", f"{tmp}/cache"),
        "SLURM_JOB_ID": job, "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_USER": "u",
        "SLURMD_NODENAME": NODE, "SLURM_JOB_PARTITION": "part", "SLURM_JOB_ACCOUNT": "a",
        "SLURM_JOB_QOS": "debug", "SLURM_JOB_GPUS": str(gpu),
        "SLURM_JOB_WORK_DIR": f"{tmp}/work",
    }


@dataclass(frozen=True)
class KillPoint:
    """One ``SLURMISO_SIM_KILL_AT`` value and the step it names, for messages."""

    spec: str
    step: str


def traced_kill_points(trace: str, pid: int) -> List[KillPoint]:
    """Every kill point of process ``pid``'s run as ``SLURMISO_SIM_TRACE`` recorded it: before
    and after each of its driver calls and node-state writes, in the order they ran.

    Kill points name steps, not moments, so the same ones are hit on a fast or a loaded
    machine (issue 22: a random delay meant a different step on a faster machine)."""
    points: List[KillPoint] = []
    with open(trace, encoding="utf-8") as fh:
        for line in fh:
            owner, kind, number, name = line.rstrip("\n").split(" ", 3)
            if int(owner) != pid:
                continue
            if kind == "write":
                name = "/".join(name.split("/")[-2:])  # jobs/42.json, node1/allocations.json
            where = number if kind == "call" else f"write:{number}"
            points += [KillPoint(f"{when}:{where}", f"{when} {kind} {number} ({name})")
                       for when in ("before", "after")]
    return points


@dataclass
class Outcome:
    kills: int = 0
    rounds: int = 0
    drains: int = 0
    reconcile_fixes: List[str] = field(default_factory=list)
    leftovers: List[str] = field(default_factory=list)  # after epilog and reconcile
    left_by_epilog: List[str] = field(default_factory=list)  # before reconcile
    made_before_kill: int = 0  # rounds whose killed prolog had already made an instance


def _run_and_kill(argv: List[str], env: Dict[str, str], after_s: float) -> bool:
    """Start a hook, SIGKILL it after ``after_s`` unless it ended; True if it was killed."""
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=after_s)
        return False
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return True


def mps_daemons(tmp: str) -> List[int]:
    """Pids of simulated MPS control daemons serving this node's state dir."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read()
        except OSError:
            continue
        if b"mps_sim" in cmd and f"{tmp}/state/".encode() in cmd:
            out.append(int(pid))
    return out


def leftovers(tmp: str) -> List[str]:
    """Everything a finished job may not leave: instances, records, claims, events files,
    MPS daemons."""
    from slurmiso.gpu.sim import SimBackend
    from slurmiso.state import NodeState

    st = NodeState(f"{tmp}/state/{NODE}")
    out = [f"instance GPU {i.gpu_index} GI {i.gi_id}"
           for i in SimBackend(f"{tmp}/sim/{NODE}.json").instances()]
    out += [f"record {j}" for j in st.jobs()]
    out += [f"allocation {k}" for k in st.allocations()]
    out += [f"events file {p}" for p in glob.glob(f"{tmp}/work/.slurmiso-events.*")]
    out += [f"MPS daemon pid {p}" for p in mps_daemons(tmp)]
    return out


def run_rounds(tmp: str, rounds: int, delay_ms: int = 150, seed: int = 13,
               window_s: float = 1.2, mode: str = "mig-dynamic",
               until_kills: Optional[int] = None) -> Outcome:
    """``rounds`` rounds, or as many as it takes to deliver ``until_kills`` SIGKILLs (a hook
    that ends before its random moment is not killed)."""
    from slurmiso.config import load_config
    from slurmiso.gpu.sim import SimBackend
    from slurmiso.isolation.lifecycle import reconcile_node
    from slurmiso.state import NodeState

    cfg_path = setup_node(tmp, mode)
    cfg = load_config(cfg_path)
    sim = SimBackend(f"{tmp}/sim/{NODE}.json")
    rng = random.Random(seed)
    py = sys.executable
    prolog = [py, os.path.join(ROOT, "prolog", "slurmiso-prolog")]
    epilog = [py, os.path.join(ROOT, "epilog", "slurmiso-epilog")]
    out = Outcome()
    for r in range(rounds):
        if until_kills is not None and out.kills >= until_kills:
            break
        job = str(1000 + r)
        env = hook_env(tmp, cfg_path, job, r % 2, delay_ms)
        if _run_and_kill(prolog, env, rng.uniform(0.0, window_s)):
            out.kills += 1
            out.made_before_kill += bool(sim.instances())
        rec = NodeState(f"{tmp}/state/{NODE}").read_job(job)
        if rec and rec.events_file:  # the job ran far enough to report something
            with open(rec.events_file, "a") as fh:
                fh.write('{"event": "resume", "attempt": 1}\n')
        if _run_and_kill(epilog, env, rng.uniform(0.0, window_s)):
            out.kills += 1
        done = subprocess.run(epilog, env=env, capture_output=True, text=True, timeout=120)
        out.drains += done.returncode != 0
        out.left_by_epilog += [f"round {r}: {x}" for x in leftovers(tmp)]
        fixes = reconcile_node(cfg, NODE, dry_run=False, live_jobs=[])
        out.reconcile_fixes += [f"round {r}: {f}" for f in fixes]
        out.leftovers += [f"round {r}: {x}" for x in leftovers(tmp)]
        out.rounds += 1
    return out
