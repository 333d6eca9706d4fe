"""The job as Slurm describes it to a Prolog/Epilog, parsed from the environment.

Only values slurmd sets are read. ``SLURM_JOB_COMMENT``, the job's own environment and paths
are user-controlled and never used for anything privileged. SPANK options arrive as
``SPANK__SLURM_SPANK_OPTION_<plugin>_<option>`` (the raw option, Slurm 22.05+) or as
``SPANK_SLURMISO_<OPTION>`` (set by slurmiso's plugin after it validated the value).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional, Tuple

from slurmiso.isolation.base import JobProblem

SPANK_PLUGIN = "slurmiso"
_RAW_PREFIX = f"SPANK__SLURM_SPANK_OPTION_{SPANK_PLUGIN}_"
_VALIDATED_PREFIX = "SPANK_SLURMISO_"
#: SPANK options slurmiso knows, with the pattern a value must match.
SPANK_OPTIONS: Dict[str, re.Pattern[str]] = {
    "iso_class": re.compile(r"[A-Za-z0-9_.-]{1,64}"),
    "iso_mps_mem": re.compile(r"[0-9]+(\.[0-9]+)?[KMGTkmgt]?(i?[Bb])?"),
    "iso_mig_profile": re.compile(r"[1-7]g\.[0-9]+gb(\+me)?"),
    "iso_ckpt_dir": re.compile(r"/[^\x00\n]{0,4095}"),
}


@dataclass(frozen=True)
class JobEnv:
    job_id: str
    uid: int
    user: str
    node: str
    partition: str
    account: str
    qos: str  # "" when this Slurm version does not export it
    gpus: Tuple[int, ...]  # SLURM_JOB_GPUS: the job's GPU GRES indices on this node
    restart_count: int
    spank: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_env(cls, env: Mapping[str, str], node: str = "") -> JobEnv:
        from slurmiso.config.model import node_name
        from slurmiso.errors import StateError
        from slurmiso.state import validate_job_id

        job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
        try:
            job_id = validate_job_id(job_id)
        except StateError:
            raise JobProblem(
                f"SLURM_JOB_ID={job_id!r} is not a Slurm job id; run this from Slurm's Prolog"
            ) from None
        return cls(
            job_id=job_id,
            uid=_int(env.get("SLURM_JOB_UID"), -1),
            user=env.get("SLURM_JOB_USER", ""),
            node=node_name(node),
            partition=env.get("SLURM_JOB_PARTITION", ""),
            account=env.get("SLURM_JOB_ACCOUNT", ""),
            qos=env.get("SLURM_JOB_QOS", ""),
            gpus=parse_gpu_list(env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES", "")),
            restart_count=_int(
                env.get("SLURM_JOB_RESTART_COUNT") or env.get("SLURM_RESTART_COUNT"), 0
            ),
            spank=spank_options(env),
        )


def _int(text: Optional[str], default: int) -> int:
    try:
        return int(text) if text not in (None, "") else default
    except ValueError:
        return default


def parse_gpu_list(text: str) -> Tuple[int, ...]:
    """``"0,2"`` -> (0, 2). Non-numeric entries (UUIDs, ``NoDevFiles``) are not GRES indices."""
    out = []
    for part in text.split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
    return tuple(out)


def spank_options(env: Mapping[str, str]) -> Dict[str, str]:
    """slurmiso's SPANK options from the Prolog environment, each validated by pattern.

    A value that does not match is a job problem (the plugin validates at submit, so this
    only happens if the plugin is missing on the login node).
    """
    out: Dict[str, str] = {}
    for key, value in env.items():
        if key.startswith(_RAW_PREFIX):
            name = key[len(_RAW_PREFIX) :].lower().replace("-", "_")
        elif key.startswith(_VALIDATED_PREFIX):
            name = key[len(_VALIDATED_PREFIX) :].lower()
            if not name.startswith("iso_"):
                name = "iso_" + name
        else:
            continue
        pattern = SPANK_OPTIONS.get(name)
        if pattern is None:
            continue
        if not pattern.fullmatch(value):
            raise JobProblem(
                f"--{name.replace('_', '-')}={value!r} is not a valid value",
                hint="see 'slurmiso --help' for the accepted forms",
            )
        out[name] = value
    return out
