"""A simulated node for hook tests: an isolation :class:`Context` for handler unit tests, and
a config file, a job's environment and a drain recorder for ``run_hook`` tests.

No Slurm here: the job's environment is given directly, the GPUs are the sim backend in
``tmp_path``, and state/journal live there too.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from slurmiso.config import parse_config
from slurmiso.config.model import Config
from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.isolation.base import Context
from slurmiso.slurm.jobenv import JobEnv
from slurmiso.state import JobRecord, Journal, NodeState


def sim_config(tmp: str, mode: str, model: str = "H100-80GB", gpus: int = 2, **pool: Any) -> Config:
    """A small valid config: classes infer/train/debug and one pool ``p`` of ``mode``."""
    pool_def: Dict[str, Any] = {
        "name": "p",
        "nodes": "node1",
        "partition": "part",
        "gpu_model": model,
        "gpus_per_node": gpus,
        "mode": mode,
    }
    pool_def.update(pool)
    layouts = {
        "version": "v1",
        "mig-configs": {
            "mixed": [
                {"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
                {"devices": [1], "mig-enabled": True, "mig-devices": {"4g.40gb": 1, "3g.40gb": 1}},
            ],
            "sevens": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
        },
    }
    if mode == "mig-static":
        pool_def.setdefault("mig_layout", "mixed")
    data = {
        "version": 1,
        "paths": {"state_dir": os.path.join(tmp, "state"), "journal": os.path.join(tmp, "journal.jsonl")},
        "gpu": {"backend": "sim", "sim_state": os.path.join(tmp, "sim.json")},
        "classes": [
            {"name": "infer", "match": {"qos": ["infer"]}, "isolation": "mps", "mig_profile": "3g.40gb",
             "mps": {"thread_percentage": 100, "memory_limit": "40G"}, "qos": {"preempt": ["train"]}},
            {"name": "train", "match": {"qos": ["train"]}, "isolation": "mps", "mig_profile": "1g.10gb",
             "mps": {"thread_percentage": 60, "memory_limit": "30G"}, "preemptible": True},
            {"name": "debug", "match": {"qos": ["debug"]}, "isolation": "exclusive"},
        ],
        "default_class": "train",
        "pools": [pool_def],
        "mig_layouts": layouts,
    }
    return parse_config(data, "test-config")


def make_context(
    tmp: str,
    mode: str,
    job_id: str = "100",
    cls: str = "train",
    gpus: Sequence[int] = (0,),
    uid: Optional[int] = None,
    model: str = "H100-80GB",
    ngpus: int = 2,
    mig: Optional[bool] = None,
    spank: Optional[Dict[str, str]] = None,
    init: bool = True,
) -> Context:
    """A Context for one job; the sim node is created on first use in ``tmp``."""
    cfg = sim_config(tmp, mode, model, ngpus)
    sim_path = cfg.gpu.sim_state
    if init and not os.path.exists(sim_path):
        init_state(sim_path, model, ngpus, mig=mode.startswith("mig") if mig is None else mig, node="node1")
    env = JobEnv(
        job_id=job_id,
        uid=os.getuid() if uid is None else uid,
        user="tester",
        node="node1",
        partition="part",
        account="research",
        qos=cls,
        gpus=tuple(gpus),
        restart_count=0,
        spank=dict(spank or {}),
    )
    state = NodeState(cfg.paths.state_dir)
    state.ensure()
    return Context(
        config=cfg,
        env=env,
        pool=cfg.pools[0],
        job_class=cfg.job_class(cls),
        state=state,
        journal=Journal(cfg.paths.journal),
        backend_factory=lambda: SimBackend(sim_path),
        record=JobRecord(job_id, mode=mode, gpus=list(gpus)),
    )


# -- run_hook on node1 of a written config ------------------------------------------------

def write_config(tmp: str, mode: str, model: str = "A100-80GB", **over: Any) -> str:
    """A config file for nodes node[1-2] (``%n`` in its paths), pool ``p`` of ``mode``, classes
    infer/train/debug; node1's simulated GPUs are (re)created. Returns the file's path."""
    data: Dict[str, Any] = {
        "version": 1,
        "paths": {"state_dir": f"{tmp}/state/%n", "journal": f"{tmp}/journal-%n.jsonl",
                  "dcgm_job_mapping_dir": f"{tmp}/dcgm"},
        "gpu": {"backend": "sim", "sim_state": f"{tmp}/sim/%n.json"},
        "classes": [
            {"name": "infer", "match": {"qos": ["infer"]}, "isolation": "mps", "qos": {"preempt": ["train"]}},
            {"name": "train", "match": {"qos": ["train"]}, "isolation": "timeslice", "preemptible": True},
            {"name": "debug", "match": {"qos": ["debug"]}, "isolation": "exclusive"},
        ],
        "default_class": "",
        "pools": [{"name": "p", "nodes": "node[1-2]", "partition": "part", "gpu_model": model,
                   "gpus_per_node": 2, "mode": mode}],
    }
    data.update(over)
    path = os.path.join(tmp, "slurmiso.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    init_state(f"{tmp}/sim/node1.json", model, 2, node="node1", force=True)
    return path


def job_env(job: str = "42", qos: str = "debug", gpus: str = "0", **extra: str) -> Dict[str, str]:
    """The environment slurmd gives a hook for ``job`` on node1."""
    env = {"SLURM_JOB_ID": job, "SLURM_JOB_UID": str(os.getuid()), "SLURM_JOB_USER": "u",
           "SLURMD_NODENAME": "node1", "SLURM_JOB_PARTITION": "part", "SLURM_JOB_ACCOUNT": "a",
           "SLURM_JOB_QOS": qos, "SLURM_JOB_GPUS": gpus}
    env.update(extra)
    return env


class Drains:
    """Stands in for draining the node: records (node, reason) per call."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, str]] = []

    def __call__(self, node: str, reason: str) -> None:
        self.calls.append((node, reason))


def state(tmp: str) -> NodeState:
    """node1's state dir under :func:`write_config`."""
    return NodeState(f"{tmp}/state/node1")


def journal(tmp: str) -> List[Dict[str, Any]]:
    """node1's journal under :func:`write_config`, as records."""
    return list(Journal(f"{tmp}/journal-node1.jsonl").read())
