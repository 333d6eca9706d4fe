"""The job as Slurm describes it to a Prolog/Epilog, parsed from the environment.

Only values slurmd sets are read. ``SLURM_JOB_COMMENT``, the job's own environment and paths
are user-controlled and never used for anything privileged. SPANK options arrive as
``SPANK__SLURM_SPANK_OPTION_<plugin>_<option>`` (the raw option, Slurm 22.05+) or as
``SPANK_SLURMISO_<OPTION>`` (set by slurmiso's plugin after it validated the value).
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

from slurmiso.errors import JobProblem
from slurmiso.values import Value, field

SPANK_PLUGIN = "slurmiso"
_RAW_PREFIX = f"SPANK__SLURM_SPANK_OPTION_{SPANK_PLUGIN}_"
_VALIDATED_PREFIX = "SPANK_SLURMISO_"
#: Slurm writes uids as 32-bit unsigned; GRES indices are small.
_UID_MAX = 2**32 - 2
_MAX_GPU_INDEX = 4096


class JobEnv(Value, eq=True):
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
    #: One line per SPANK option value the validator refused: the prolog refuses the job
    #: with these (and a record), it never runs it without them.
    option_problems: Tuple[str, ...] = ()
    #: SLURM_JOB_WORK_DIR: where the job's own files (its events file) belong; "" if unknown.
    work_dir: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str], node: str = "") -> JobEnv:
        from slurmiso.errors import StateError
        from slurmiso.hostlist import node_name
        from slurmiso.state import validate_job_id

        job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID") or ""
        try:
            job_id = validate_job_id(job_id)
        except StateError:
            raise JobProblem(
                f"SLURM_JOB_ID={job_id[:40]!r} is not a Slurm job id; run this from Slurm's "
                "Prolog"
            ) from None
        spank, problems = spank_options(env)
        return cls(
            job_id=job_id,
            uid=_int(env.get("SLURM_JOB_UID"), -1, _UID_MAX),
            user=env.get("SLURM_JOB_USER", ""),
            node=node_name(node),
            partition=env.get("SLURM_JOB_PARTITION", ""),
            account=env.get("SLURM_JOB_ACCOUNT", ""),
            qos=env.get("SLURM_JOB_QOS", ""),
            gpus=parse_gpu_list(env.get("SLURM_JOB_GPUS") or env.get("CUDA_VISIBLE_DEVICES", "")),
            restart_count=_int(
                env.get("SLURM_JOB_RESTART_COUNT") or env.get("SLURM_RESTART_COUNT"), 0, 10**6
            ),
            spank=spank,
            option_problems=problems,
            work_dir=env.get("SLURM_JOB_WORK_DIR", ""),
        )


def _int(text: Optional[str], default: int, most: int) -> int:
    """A bounded ASCII whole number; anything else (sign, 300 digits, other scripts) is
    ``default``."""
    if not text or len(text) > 12 or not all("0" <= ch <= "9" for ch in text):
        return default
    value = int(text)
    return value if value <= most else default


def parse_gpu_list(text: str) -> Tuple[int, ...]:
    """``"0,2"`` -> (0, 2). Non-numeric entries (UUIDs, ``NoDevFiles``) are not GRES indices."""
    out = []
    for part in text.split(",")[:_MAX_GPU_INDEX]:
        part = part.strip()
        if 0 < len(part) <= 4 and all("0" <= ch <= "9" for ch in part):
            out.append(int(part))
    return tuple(out)


def spank_options(env: Mapping[str, str]) -> Tuple[Dict[str, str], Tuple[str, ...]]:
    """slurmiso's SPANK options from the Prolog environment, and what is wrong with them.

    Every value goes through :func:`slurmiso.submit.options.problem` (the rules the plugin
    and job_submit.lua apply; allow-lists are checked by the prolog, which has the config).
    A refused value is reported, not raised: the prolog must write a refusal record for it,
    because no record would let the job start on the raw GPU.
    """
    out: Dict[str, str] = {}
    problems = []
    for key, value in env.items():
        if key.startswith(_RAW_PREFIX):
            name = key[len(_RAW_PREFIX) :].lower().replace("-", "_")
        elif key.startswith(_VALIDATED_PREFIX):
            name = key[len(_VALIDATED_PREFIX) :].lower()
            if not name.startswith("iso_"):
                name = "iso_" + name
        else:
            continue
        from slurmiso.submit.options import OPTIONS, problem  # only jobs with options need it

        if name not in OPTIONS:
            continue
        why = problem(name, value)
        if why:
            problems.append(why)
        elif name in out and out[name] != value:
            problems.append(f"--{name.replace('_', '-')} was passed twice with different values")
        else:
            out[name] = value
    return out, tuple(sorted(set(problems)))
