"""SIGKILL a real prolog and epilog on a mig-dynamic (or mps) sim node, then run the epilog to
completion and ``reconcile``, and count what is left behind.

Two ways to choose where a kill lands:

* :func:`run_kill_points` (tests/unit/test_hook_kills.py): at every step, deterministically.
  ``SLURMISO_SIM_KILL_AT`` (see slurmiso.gpu.sim) kills a hook before or after its Nth driver
  call or node-state write, and a traced unkilled run lists the steps there are. The same
  steps are hit on any machine, fast or loaded (issue 22).
* :func:`run_rounds` (bench/bench_hooks.py, 200 SIGKILLs: issue 13's "Done when"): at random
  moments, with every simulated driver call taking ``delay_ms`` (half before the change,
  half after). A soak: where its kills land depends on the machine's speed, so no test
  asserts on where they landed.

Each hook runs as its own process, as slurmd runs it.
"""

from __future__ import annotations

import glob
import os
import random
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Dict, List, NamedTuple, Optional, Tuple

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE = "node1"


def setup_node(tmp: str, mode: str = "mig-dynamic") -> str:
    """A node of two simulated H100s in pool ``mode`` (MIG on for mig-dynamic; ``mps-shared``:
    an MPS pool with one shared MPS v3 server per GPU); returns the config path."""
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
                   "gpus_per_node": 2, "mode": "mps" if mode == "mps-shared" else mode}],
    }
    if mode == "mps-shared":
        data["pools"][0]["mps_server"] = "shared"  # type: ignore[index]
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
    prolog_kills: int = 0  # rounds whose prolog was killed
    points: List[str] = field(default_factory=list)  # run_kill_points: the steps killed at
    not_killed: List[str] = field(default_factory=list)  # kill points a hook ran past


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


class Ran(NamedTuple):
    returncode: int
    pid: int
    stderr: str


def _run(argv: List[str], env: Dict[str, str], kill_at: str = "", trace: str = "") -> Ran:
    """Run a hook to its end; with ``kill_at``, it SIGKILLs itself at that step."""
    extra = {"SLURMISO_SIM_KILL_AT": kill_at} if kill_at else {}
    if trace:
        extra["SLURMISO_SIM_TRACE"] = trace
    proc = subprocess.Popen(argv, env=dict(env, **extra), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    _, err = proc.communicate(timeout=120)
    return Ran(proc.returncode, proc.pid, err)


def run_kill_points(tmp: str, mode: str = "mig-dynamic") -> Outcome:
    """Kill the prolog at each of its steps, the epilog at each of its steps after a whole
    prolog, and the epilog at each of its steps after a prolog killed at each of its steps;
    each round then runs the epilog to its end, and ``reconcile``.

    ``not_killed`` names the kill points where the hook ran to its end instead: the steps a
    traced run listed must all be there the next time, or the rounds proved less than they
    claim.
    """
    from slurmiso.config import load_config
    from slurmiso.gpu.sim import SimBackend
    from slurmiso.isolation.lifecycle import reconcile_node
    from slurmiso.state import NodeState

    cfg_path = setup_node(tmp, mode)
    cfg = load_config(cfg_path)
    sim = SimBackend(f"{tmp}/sim/{NODE}.json")
    py = sys.executable
    prolog = [py, os.path.join(ROOT, "prolog", "slurmiso-prolog")]
    epilog = [py, os.path.join(ROOT, "epilog", "slurmiso-epilog")]
    out = Outcome()

    def killed(done: Ran, hook: str, point: KillPoint) -> None:
        if done.returncode == -signal.SIGKILL:
            out.kills += 1
        else:
            last = (done.stderr.strip().splitlines() or [""])[-1]
            out.not_killed.append(f"round {out.rounds}: {hook} {point.step} "
                                  f"(exit {done.returncode}: {last})")

    def round_(prolog_at: Optional[KillPoint], epilog_at: Optional[KillPoint],
               trace: str = "") -> Tuple[int, int]:
        """One job; returns the pids of its unkilled prolog (0 if killed) and last epilog."""
        r = out.rounds
        job = str(1000 + r)
        env = hook_env(tmp, cfg_path, job, 0, 0)
        pro = _run(prolog, env, prolog_at.spec if prolog_at else "", trace)
        if prolog_at:
            killed(pro, "prolog", prolog_at)
            out.prolog_kills += 1
            out.made_before_kill += bool(sim.instances())
        rec = NodeState(f"{tmp}/state/{NODE}").read_job(job)
        if rec and rec.events_file:  # the job ran far enough to report something
            with open(rec.events_file, "a") as fh:
                fh.write('{"event": "resume", "attempt": 1}\n')
        if epilog_at:
            killed(_run(epilog, env, epilog_at.spec), "epilog", epilog_at)
        done = _run(epilog, env, trace=trace)
        out.drains += done.returncode != 0
        where = f"round {r} (prolog {prolog_at.step if prolog_at else 'whole'}, epilog " \
                f"{epilog_at.step if epilog_at else 'whole'})"
        out.left_by_epilog += [f"{where}: {x}" for x in leftovers(tmp)]
        fixes = reconcile_node(cfg, NODE, dry_run=False, live_jobs=[])
        out.reconcile_fixes += [f"{where}: {f}" for f in fixes]
        out.leftovers += [f"{where}: {x}" for x in leftovers(tmp)]
        out.rounds += 1
        return (0 if prolog_at else pro.pid), done.pid

    calm = f"{tmp}/trace-calm"
    prolog_pid, epilog_pid = round_(None, None, calm)
    prolog_points = traced_kill_points(calm, prolog_pid)
    epilog_points = traced_kill_points(calm, epilog_pid)
    out.points = [f"prolog {p.step}" for p in prolog_points]
    out.points += [f"epilog {p.step}" for p in epilog_points]
    after_killed: List[Tuple[KillPoint, List[KillPoint]]] = []
    for i, point in enumerate(prolog_points):
        trace = f"{tmp}/trace-{i}"
        _, epilog_pid = round_(point, None, trace)
        after_killed.append((point, traced_kill_points(trace, epilog_pid)))
    for point in epilog_points:
        round_(None, point)
    for point, its_epilog in after_killed:
        for then in its_epilog:
            out.points.append(f"prolog {point.step}, epilog {then.step}")
            round_(point, then)
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
            out.prolog_kills += 1
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
