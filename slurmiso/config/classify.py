"""Which job class a job belongs to — from what Slurm enforces, never from free text.

Precedence: the QoS (enforced through associations) decides when a class lists it; then the
partition or account; a SPANK ``--iso-class`` may only pick a class that the QoS does not
contradict and that does not require a QoS the job lacks; else ``default_class``.
"""

from __future__ import annotations

from typing import Optional, Tuple

from slurmiso.config.model import Config, JobClass
from slurmiso.errors import JobProblem


def classify(
    config: Config, qos: str, partition: str, account: str, spank_class: str = ""
) -> Tuple[Optional[JobClass], str]:
    """(class, how it was decided); class None means "no class": the job is not managed.

    Raises JobProblem when the job asks for a class it may not have.
    """
    by_qos = next((c for c in config.classes if qos and qos in c.match.qos), None)
    if spank_class:
        wanted = config.job_class(spank_class)
        if wanted is None:
            allowed = ", ".join(c.name for c in config.classes)
            raise JobProblem(f"--iso-class={spank_class} is not a job class (allowed: {allowed})")
        if by_qos is not None and by_qos.name != wanted.name:
            raise JobProblem(
                f"--iso-class={spank_class} conflicts with QoS {qos!r}, which is class "
                f"{by_qos.name!r}",
                hint=f"submit with --qos={wanted.match.qos[0]}" if wanted.match.qos else "",
            )
        if wanted.match.qos and qos not in wanted.match.qos:
            raise JobProblem(
                f"class {wanted.name!r} requires QoS {' or '.join(wanted.match.qos)} "
                f"(job has {qos or 'none'})",
                hint=f"submit with --qos={wanted.match.qos[0]}",
            )
        return wanted, f"spank --iso-class={spank_class}"
    if by_qos is not None:
        return by_qos, f"qos {qos}"
    for c in config.classes:
        if c.match.qos:
            continue  # a QoS-bound class is only ever reached through its QoS
        if partition and partition in c.match.partitions:
            return c, f"partition {partition}"
        if account and account in c.match.accounts:
            return c, f"account {account}"
    if config.default_class:
        return config.job_class(config.default_class), "default_class"
    return None, "no class matched and no default_class"
