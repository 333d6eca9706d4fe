"""What each mode gives the inference and the training job: Slurm's request per pool, and the
class's MPS limits and MIG profile, all from the config.

One GPU, shared as the mode shares it, except ``exclusive``, the reference, which is two GPUs on
one node. The pair runs as the two classes it stands for, so the prolog (through Slurm) or
:mod:`slurmiso.probe.local` (on this node) gives each exactly what its class would get.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

from slurmiso.config.model import Config, JobClass, Pool
from slurmiso.errors import UsageError
from slurmiso.gpu.profiles import lookup_model
from slurmiso.probe.recommend import MODE_ORDER
from slurmiso.values import Value

#: Modes only ``--local`` measures (a probe variant, not a pool mode): one MPS server for both
#: classes, limits from the clients' variables and training at NVIDIA's below-normal priority.
LOCAL_ONLY = ("mps-priority", "mps-v3", "mps-sm-partition")
#: ``CUDA_MPS_CLIENT_PRIORITY`` values (NVIDIA MPS docs, 4.2.8): 0 normal, 1 below normal.
PRIORITY = {"infer": "0", "train": "1"}


class Pair(Value):
    """The two classes a probe measures, with their MPS shares and MIG profiles."""

    infer: JobClass
    train: JobClass


def classes(cfg: Config, infer: str, train: str) -> Pair:
    found = []
    for name, what in ((infer, "--infer-class"), (train, "--train-class")):
        c = cfg.job_class(name)
        if c is None:
            raise UsageError(f"{what} {name!r} is not a class of {cfg.source}",
                             hint=f"classes: {', '.join(x.name for x in cfg.classes)}")
        found.append(c)
    return Pair(found[0], found[1])


def parse_modes(text: str, local: bool) -> List[str]:
    """``--modes timeslice,mps`` -> the list, checked and in the softest-first order."""
    wanted = [m.strip() for m in text.split(",") if m.strip()]
    allowed = [m for m in MODE_ORDER if local or m not in LOCAL_ONLY]
    bad = [m for m in wanted if m not in allowed]
    if bad:
        extra = "" if local else f" ({', '.join(LOCAL_ONLY)} needs --local)"
        raise UsageError(f"--modes: unknown mode {', '.join(bad)}; allowed: "
                         f"{', '.join(allowed)}{extra}")
    return [m for m in allowed if m in wanted]


def pools_to_probe(cfg: Config, modes: Sequence[str], pool_names: Sequence[str]) -> List[Pool]:
    """One pool per mode: those named with ``--pools``, else the config's first of each mode."""
    if pool_names:
        out = []
        for name in pool_names:
            pool = cfg.pool(name)
            if pool is None:
                raise UsageError(f"--pools: {name!r} is not a pool of {cfg.source}",
                                 hint=f"pools: {', '.join(p.name for p in cfg.pools)}")
            out.append(pool)
        return [p for p in out if not modes or p.mode in modes]
    chosen: Dict[str, Pool] = {}
    for pool in cfg.pools:
        if pool.partition and pool.mode not in chosen:
            chosen[pool.mode] = pool
    return [chosen[m] for m in MODE_ORDER if m in chosen and (not modes or m in modes)]


def mig_profile(pool_model: str, c: JobClass) -> Tuple[str, int, int]:
    """(profile, compute slices, memory MiB) of class ``c`` on ``pool_model``; UsageError if
    the class declares none for that GPU."""
    model = lookup_model(pool_model)
    name = c.mig_profile_for(model.name if model else pool_model)
    prof = model.profile(name) if model and name else None
    if prof is None:
        raise UsageError(f"class {c.name} has no MIG profile for {pool_model}",
                         hint="set mig_profile for the class")
    return prof.name, prof.compute_slices, prof.memory_mb


def mps_counts(pool: Pool, pair: Pair) -> Tuple[int, int]:
    """gres/mps counts for the pair that fit one GPU together, in the ratio of the classes'
    thread percentages, each within its class's own maximum (as job_submit.lua allows)."""
    total = pool.mps_shares_per_gpu
    pi, pt = pair.infer.mps.thread_percentage, pair.train.mps.thread_percentage
    ci = min(total * pi // 100, max(1, total * pi // (pi + pt)))
    ct = min(total * pt // 100, max(1, total - ci))
    return ci, ct


def gres(pool: Pool, pair: Pair, role: str) -> str:
    """The ``--gres`` a job of ``role`` asks for in ``pool`` (the pair must fit one GPU)."""
    c = pair.infer if role == "infer" else pair.train
    if pool.mode == "exclusive":
        return "gpu:1"
    if pool.mode == "mig-static":
        return f"gpu:{mig_profile(pool.gpu_model, c)[0]}:1"
    if pool.mode == "mig-dynamic":
        return f"shard:{mig_profile(pool.gpu_model, c)[1]}"
    if pool.mode == "mps":
        return f"mps:{mps_counts(pool, pair)[0 if role == 'infer' else 1]}"
    return "shard:1"  # timeslice


def class_option(c: JobClass) -> List[str]:
    """How a job says it is of class ``c``: its QoS, else the validated SPANK option."""
    if c.match.qos:
        return [f"--qos={c.match.qos[0]}"]
    if c.match.spank_class:
        return [f"--iso-class={c.match.spank_class}"]
    if c.match.partitions:
        return []  # the partition alone classifies it
    raise UsageError(f"class {c.name} matches no QoS, partition or --iso-class value",
                     hint="the probe submits jobs the way users do; give the class a match")


def sbatch_args(pool: Pool, pair: Pair, role: str) -> List[str]:
    """Partition, class and GRES for one of the pair's jobs in ``pool``."""
    c = pair.infer if role == "infer" else pair.train
    return ["-p", pool.partition, *class_option(c), f"--gres={gres(pool, pair, role)}",
            "--nodes=1", "--ntasks=1"]


def memory_limit_mb(mode: str, pool_model: str, c: JobClass,
                    gpu_total_mb: Optional[int] = None) -> Optional[int]:
    """The GPU memory the class may use in ``mode`` (for the training peak's headroom)."""
    if mode in ("mps", "mps-priority", "mps-v3") and c.mps.limit_mb(gpu_total_mb):
        return c.mps.limit_mb(gpu_total_mb)
    if mode.startswith("mig"):
        try:
            return mig_profile(pool_model, c)[2]
        except UsageError:
            return None
    if gpu_total_mb:
        return gpu_total_mb
    model = lookup_model(pool_model) if pool_model else None
    return model.memory_mb if model else None
