"""The job as Slurm describes it in the environment: the one reader of Slurm's variables.

The Prolog/Epilog hooks (:class:`JobEnv`), the TaskProlog, the ``slurmiso run`` wrapper
(:class:`JobEnvironment`) and the checkpoint helper (:func:`step_restart_count`) all read
the job's facts here, one variable per fact and context. Slurm sets different names in
different places (slurmd builds the Prolog/Epilog environment from the job credential;
slurmstepd gives tasks the job's own environment):

============== ============================ ================================================
fact           Prolog / Epilog (slurmd)     TaskProlog, batch script, step (slurmstepd)
============== ============================ ================================================
job id         ``SLURM_JOB_ID``             ``SLURM_JOB_ID`` (unique for array tasks too)
node           ``SLURMD_NODENAME``          ``SLURMD_NODENAME``
restart count  ``SLURM_JOB_RESTART_COUNT``  ``SLURM_RESTART_COUNT`` (absent on a first run)
user id        ``SLURM_JOB_UID``            (the process's own uid)
GPU indices    ``SLURM_JOB_GPUS`` [#]_      (not read: the record's ``env`` says what to see)
partition      ``SLURM_JOB_PARTITION``      -
account        ``SLURM_JOB_ACCOUNT``        -
QoS            ``SLURM_JOB_QOS`` (newer Slurm; absent on 22.05: one ``scontrol`` query then)
work dir       ``SLURM_JOB_WORK_DIR``       -
task rank      -                            ``SLURM_PROCID``
============== ============================ ================================================

.. [#] The one exception to one variable per fact: a job holding only ``gres/mps`` may not
   get ``SLURM_JOB_GPUS`` in its Prolog (Slurm's mps plugin sets ``CUDA_VISIBLE_DEVICES`` to
   the GPU it shares; not measured per release), so an absent or empty ``SLURM_JOB_GPUS``
   falls back to it, as slurmiso always did.

The Epilog's ``SLURM_JOB_RESTART_COUNT`` is the job's count *when the Epilog runs* (measured
on 22.05: a requeued attempt's Epilog already shows the next attempt's count); see
``hooks/runner.epilog`` for what that means for late Epilogs. ``SLURM_JOB_COMMENT``, the
job's own environment and paths are user-controlled and never used for anything privileged.
SPANK options arrive as ``SPANK__SLURM_SPANK_OPTION_<plugin>_<option>`` (the raw option,
Slurm 22.05+) or as ``SPANK_SLURMISO_<OPTION>`` (set by slurmiso's plugin after it validated
the value).

Plain classes, stdlib only at import: the hooks import this on every job start, and the
checkpoint helper from inside the user's program.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Tuple

from slurmiso.sluid import valid_sluid
from slurmiso.values import Value, field

SPANK_PLUGIN = "slurmiso"
_RAW_PREFIX = f"SPANK__SLURM_SPANK_OPTION_{SPANK_PLUGIN}_"
_VALIDATED_PREFIX = "SPANK_SLURMISO_"
#: Slurm writes uids as 32-bit unsigned; GRES indices are small; restart counts are 16-bit.
_UID_MAX = 2**32 - 2
_MAX_GPU_INDEX = 4096
_RESTART_MAX = 10**6

#: The variable of each fact, per context (the table above, as data).
HOOK_VARS = {
    "job_id": "SLURM_JOB_ID", "node": "SLURMD_NODENAME",
    "restart_count": "SLURM_JOB_RESTART_COUNT", "uid": "SLURM_JOB_UID",
    "user": "SLURM_JOB_USER", "gpus": "SLURM_JOB_GPUS", "partition": "SLURM_JOB_PARTITION",
    "account": "SLURM_JOB_ACCOUNT", "qos": "SLURM_JOB_QOS", "work_dir": "SLURM_JOB_WORK_DIR",
    "sluid": "SLURM_JOB_SLUID",
}
#: Read for the GPU indices only when ``SLURM_JOB_GPUS`` is absent (an mps-only job; see [#]).
MPS_ONLY_GPUS = "CUDA_VISIBLE_DEVICES"
#: Set by slurmiso's prolog for the job's tasks: the job's events file, and "1" when the
#: epilog requeues on the wrapper's request (hooks/requeue.py).
EVENTS_FILE = "SLURMISO_EVENTS_FILE"
EPILOG_REQUEUE = "SLURMISO_EPILOG_REQUEUE"
STEP_VARS = {
    "job_id": "SLURM_JOB_ID", "node": "SLURMD_NODENAME",
    "restart_count": "SLURM_RESTART_COUNT", "procid": "SLURM_PROCID",
}


def whole_number(text: Optional[str], default: int, most: int) -> int:
    """A bounded ASCII whole number; anything else (sign, 300 digits, other scripts) is
    ``default``."""
    if not text or len(text) > 12 or not all("0" <= ch <= "9" for ch in text):
        return default
    value = int(text)
    return value if value <= most else default


def hook_restart_count(env: Mapping[str, str]) -> int:
    """Slurm's restart count as a Prolog/Epilog sees it (0 when absent or malformed)."""
    return whole_number(env.get(HOOK_VARS["restart_count"]), 0, _RESTART_MAX)


def step_restart_count(env: Mapping[str, str]) -> int:
    """Slurm's restart count inside the job (batch script, step, TaskProlog); 0 on the
    first run, where Slurm does not set it."""
    return whole_number(env.get(STEP_VARS["restart_count"]), 0, _RESTART_MAX)


def job_id(env: Mapping[str, str]) -> str:
    """The raw job id (unvalidated; "" outside Slurm)."""
    return env.get("SLURM_JOB_ID", "")


class JobEnv(Value, eq=True):
    """The job as a Prolog/Epilog sees it (read-only; built once per hook)."""

    job_id: str
    uid: int  # -1: unknown
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
    #: SLURM_JOB_SLUID (Slurm 26.05+): the name of the job's cgroup/v2 directory unless
    #: CgroupJobIdPaths=yes; "" before 26.05 or when malformed.
    sluid: str = ""

    @classmethod
    def from_env(cls, env: Mapping[str, str], node: str = "") -> JobEnv:
        """Read a Prolog/Epilog environment; JobProblem if it names no valid job."""
        from slurmiso.errors import JobProblem, StateError
        from slurmiso.hostlist import node_name
        from slurmiso.state import validate_job_id

        raw = job_id(env)
        try:
            valid = validate_job_id(raw)
        except StateError:
            raise JobProblem(
                f"SLURM_JOB_ID={raw[:40]!r} is not a Slurm job id; run this from Slurm's "
                "Prolog"
            ) from None
        spank, problems = spank_options(env)
        return cls(
            job_id=valid,
            uid=whole_number(env.get(HOOK_VARS["uid"]), -1, _UID_MAX),
            user=env.get(HOOK_VARS["user"], ""),
            node=node_name(node or env.get(HOOK_VARS["node"], "")),
            partition=env.get(HOOK_VARS["partition"], ""),
            account=env.get(HOOK_VARS["account"], ""),
            qos=env.get(HOOK_VARS["qos"], ""),
            gpus=parse_gpu_list(env.get(HOOK_VARS["gpus"]) or env.get(MPS_ONLY_GPUS, "")),
            restart_count=hook_restart_count(env),
            spank=spank,
            option_problems=problems,
            work_dir=env.get(HOOK_VARS["work_dir"], ""),
            sluid=valid_sluid(env.get(HOOK_VARS["sluid"], "")),
        )


class JobEnvironment(Value, eq=True):
    """The job as a task sees it (``slurmiso run``): what the wrapper needs, read once.

    Like submitit's environment object, it is injected (tests describe a job with a dict).
    ``events_file`` is the file slurmiso's prolog named (its epilog folds it);
    ``epilog_requeue`` says that epilog requeues a job whose wrapper asks for it there
    (hooks/requeue.py says why that matters).
    """

    job_id: str = ""
    restart_count: int = 0
    procid: int = 0
    node: str = ""
    events_file: str = ""
    epilog_requeue: bool = False

    @property
    def in_slurm(self) -> bool:
        return bool(self.job_id)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> JobEnvironment:
        """``SLURM_JOB_ID`` is unique even for array tasks, and is what ``scontrol requeue``
        takes; the restart count is absent on a job's first run."""
        return cls(
            job_id=job_id(env),
            restart_count=step_restart_count(env),
            procid=whole_number(env.get(STEP_VARS["procid"]), 0, 10**7),
            node=env.get(STEP_VARS["node"], ""),
            events_file=env.get(EVENTS_FILE, ""),
            epilog_requeue=env.get(EPILOG_REQUEUE, "") == "1",
        )


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
