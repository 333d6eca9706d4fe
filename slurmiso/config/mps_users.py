"""Which MPS pools the config means to share between users: MPS runs one server per user.

An MPS control daemon serves one Linux user at a time per GPU; clients of another user wait
for their own server, so jobs of different users on one GPU are time-sliced, not concurrent
(Slurm's gres.shtml, NVIDIA's MPS documentation). A pool whose classes are run by different
accounts (or by any account) will therefore serialise exactly the co-location it was set up
for. Pure: reads the :class:`~slurmiso.config.model.Config` only; check-config and doctor
report what it finds.
"""

from __future__ import annotations

from typing import List, Tuple

from slurmiso.config.model import ISOLATION_STRENGTH, Config, JobClass, Pool
from slurmiso.values import Value

#: The fix, as check-config, doctor and docs/security.md state it.
FIX = ("run the pool's classes under one service account (match.accounts and qos.accounts "
       "naming the same single account), or share across users with MIG (a mig-static or "
       "mig-dynamic pool; docs/security.md)")


class MpsMix(Value, eq=True):
    """An MPS pool whose classes come from more than one account."""

    pool: str
    classes: Tuple[str, ...]
    accounts: Tuple[str, ...]  # the accounts named; "*" when a class admits any account

    def describe(self) -> str:
        who = ", ".join("any account" if a == "*" else a for a in self.accounts)
        return (f"pool {self.pool!r} (mps) takes classes {', '.join(self.classes)}, run by "
                f"{who}: an MPS server is per user, so jobs of different users on one GPU are "
                "time-sliced, not concurrent")


def class_accounts(c: JobClass) -> Tuple[str, ...]:
    """The accounts whose jobs a class admits ("*": any, when it names none)."""
    named = sorted(set(c.match.accounts) | set(c.qos.accounts))
    return tuple(named) if named else ("*",)


def pool_classes(cfg: Config, pool: Pool) -> List[JobClass]:
    """Classes whose jobs can land on ``pool``: its partition (or any), isolation it gives."""
    from slurmiso.config.model import MODE_ISOLATION

    gives = ISOLATION_STRENGTH[MODE_ISOLATION[pool.mode]]
    return [c for c in cfg.classes
            if (not c.match.partitions or pool.partition in c.match.partitions)
            and ISOLATION_STRENGTH.get(c.isolation, 99) <= gives]


def mps_mixes(cfg: Config) -> List[MpsMix]:
    """Each MPS pool of per-class daemons that mixes classes of different accounts (or of
    any account); a shared (MPS v3 multi-user) server runs every user's clients together."""
    from slurmiso.config.model import MpsServer

    out: List[MpsMix] = []
    for pool in cfg.pools:
        if pool.mode != "mps" or pool.mps_server is MpsServer.SHARED:
            continue
        classes = pool_classes(cfg, pool)
        accounts = sorted({a for c in classes for a in class_accounts(c)})
        if len(classes) >= 2 and (len(accounts) > 1 or accounts == ["*"]):
            out.append(MpsMix(pool.name, tuple(c.name for c in classes), tuple(accounts)))
    return out
