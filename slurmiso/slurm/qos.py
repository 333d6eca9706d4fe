"""The QoS a config asks for, the QoS slurmdbd holds, and the changes between them.

Pure core (:func:`desired_qos`, :func:`parse_qos_rows`, :func:`diff`) plus one applier
(:func:`apply_changes`) that talks to ``sacctmgr`` through :class:`~slurmiso.slurm.client.SlurmCli`.
Assert, then act: the plan is the dry-run, and a second ``qos apply`` finds nothing to change.

What is managed, and why: ``Priority``, ``Preempt`` and ``PreemptMode`` always (they *are*
the classes: infer preempts train, train is requeued); ``GraceTime`` for preemptible classes
(the checkpoint must fit in it); ``MaxWall``/``MaxTRESPerJob=gres/gpu`` only where the config
sets them (a site's own limits on the same QoS are left alone). Non-preemptible classes keep
the cluster's ``PreemptMode`` (``cluster``), so ``PreemptMode=REQUEUE`` in slurm.conf rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Protocol, Sequence, Tuple

from slurmiso.config.model import Config
from slurmiso.units import parse_slurm_time

#: ``sacctmgr show qos format=...`` columns, in this order (``-P -n``).
QOS_FORMAT = "Name,Priority,Preempt,PreemptMode,GraceTime,MaxWall,MaxTRESPerJob,Flags"
#: Fields :func:`diff` compares, in the order changes are listed.
FIELDS = ("Priority", "Preempt", "PreemptMode", "GraceTime", "MaxWall", "MaxTRESPerJob")


class Runner(Protocol):
    """What the applier needs of :class:`~slurmiso.slurm.client.SlurmCli` (tests fake it)."""

    def run(self, cmd: str, args: Sequence[str], timeout: Optional[float] = None) -> str: ...


@dataclass(frozen=True)
class Qos:
    """One QoS as slurmiso compares it; ``None`` = not set (live) or not managed (desired)."""

    name: str
    priority: Optional[int] = 0
    preempt: Optional[Tuple[str, ...]] = ()
    preempt_mode: Optional[str] = "cluster"
    grace_s: Optional[int] = None
    max_wall_s: Optional[int] = None
    max_gpus_per_job: Optional[int] = None
    flags: Tuple[str, ...] = ()
    accounts: Tuple[str, ...] = field(default=(), compare=False)

    def value(self, name: str) -> Optional[str]:
        """Field ``name`` (a :data:`FIELDS` entry) as sacctmgr shows and takes it."""
        v = {
            "Priority": self.priority,
            "Preempt": None if self.preempt is None else ",".join(self.preempt),
            "PreemptMode": self.preempt_mode,
            "GraceTime": self.grace_s,
            "MaxWall": None if self.max_wall_s is None else slurm_duration(self.max_wall_s),
            "MaxTRESPerJob": None if self.max_gpus_per_job is None
            else f"gres/gpu={self.max_gpus_per_job}",
        }[name]
        return None if v is None else str(v)


@dataclass(frozen=True)
class Change:
    """One step of the plan: ``add`` a QoS, ``set`` one field, or ``grant`` it to an account."""

    action: str  # "add" | "set" | "grant"
    qos: str
    field: str = ""
    live: str = ""
    want: str = ""
    account: str = ""

    def describe(self) -> str:
        if self.action == "add":
            return f"+ qos {self.qos}: create"
        if self.action == "grant":
            return f"+ account {self.account}: grant qos {self.qos}"
        return f"~ qos {self.qos}: {self.field} {self.live or '(unset)'} -> {self.want or '(none)'}"

    def to_dict(self) -> Dict[str, str]:
        return {"action": self.action, "qos": self.qos, "field": self.field, "live": self.live,
                "want": self.want, "account": self.account, "text": self.describe()}


# ------------------------------------------------------------------------------ values
def slurm_duration(seconds: int) -> str:
    """Seconds as sacctmgr shows a wall time: ``[D-]HH:MM:SS``."""
    days, rest = divmod(int(seconds), 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hms}" if days else hms


def tres_count(tres: str, name: str = "gres/gpu") -> Optional[int]:
    """The count of ``name`` in a TRES string (``cpu=4,gres/gpu=8`` -> 8), None if absent."""
    for item in tres.split(","):
        key, _, value = item.partition("=")
        if key.strip() == name and value.strip().isdigit():
            return int(value)
    return None


def _names(text: str) -> Tuple[str, ...]:
    return tuple(sorted(x for x in text.replace("'", "").split(",") if x))


# ------------------------------------------------------------------------ desired / live
def desired_qos(cfg: Config) -> List[Qos]:
    """The QoS of every class, as ``qos apply`` should make them (one per QoS name)."""
    out: Dict[str, Qos] = {}
    for c in cfg.classes:
        q = c.qos
        grace = c.checkpoint.grace_s if (c.preemptible and c.checkpoint) else None
        out.setdefault(q.name, Qos(
            name=q.name,
            priority=q.priority,
            preempt=tuple(sorted(q.preempt)),
            preempt_mode="requeue" if c.preemptible else "cluster",
            grace_s=grace,
            max_wall_s=q.max_wall_s,
            max_gpus_per_job=q.max_gpus_per_job,
            accounts=q.accounts,
        ))
    return list(out.values())


def parse_qos_rows(text: str) -> Dict[str, Qos]:
    """``sacctmgr -P -n show qos format=`` :data:`QOS_FORMAT` output -> name -> :class:`Qos`."""
    out: Dict[str, Qos] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        cols = (line.split("|") + [""] * 8)[:8]
        name, prio, preempt, mode, grace, wall, tres, flags = (c.strip() for c in cols)
        out[name] = Qos(
            name=name,
            priority=int(prio) if prio.isdigit() else 0,
            preempt=_names(preempt),
            preempt_mode=(mode or "cluster").lower(),
            grace_s=parse_slurm_time(grace) or 0,
            max_wall_s=parse_slurm_time(wall),
            max_gpus_per_job=tres_count(tres),
            flags=_names(flags),
        )
    return out


def qos_from_rows(rows: Sequence[Dict[str, str]]) -> Dict[str, Qos]:
    """Same as :func:`parse_qos_rows` for rows kept as dicts (doctor's recorded snapshot)."""
    cols = QOS_FORMAT.split(",")
    return parse_qos_rows("\n".join("|".join(r.get(c, "") for c in cols) for r in rows))


# ---------------------------------------------------------------------------- the diff
def diff(desired: Sequence[Qos], live: Dict[str, Qos]) -> List[Change]:
    """Changes that make ``live`` what ``desired`` says (grants are :func:`grant_changes`).

    A missing QoS is an ``add`` followed by the fields that differ from a fresh QoS.
    """
    changes: List[Change] = []
    for want in desired:
        have = live.get(want.name)
        if have is None:
            changes.append(Change("add", want.name))
            have = Qos(want.name, grace_s=0)  # what 'sacctmgr add qos' makes
        for f in FIELDS:
            target = want.value(f)
            if target is None:
                continue  # not managed
            current = have.value(f) or ""
            if current.lower() != target.lower():
                changes.append(Change("set", want.name, f, current, target))
    return changes


def parse_account_qos(text: str) -> Dict[str, Tuple[str, ...]]:
    """``show assoc format=Account,User,QOS`` -> account -> QoS of its account-level row."""
    out: Dict[str, Tuple[str, ...]] = {}
    for line in text.splitlines():
        cols = (line.split("|") + ["", "", ""])[:3]
        if line.strip() and not cols[1].strip():
            out[cols[0].strip()] = tuple(sorted(set(out.get(cols[0].strip(), ()))
                                                | set(_names(cols[2]))))
    return out


def grant_changes(desired: Sequence[Qos], account_qos: Dict[str, Tuple[str, ...]]
                  ) -> Tuple[List[Change], List[str]]:
    """(grants to make, configured accounts slurmdbd does not know)."""
    changes: List[Change] = []
    unknown: List[str] = []
    for q in desired:
        for acct in q.accounts:
            if acct not in account_qos:
                if acct not in unknown:
                    unknown.append(acct)
            elif q.name not in account_qos[acct]:
                changes.append(Change("grant", q.name, "QOS", ",".join(account_qos[acct]),
                                      f"+{q.name}", account=acct))
    return changes, unknown


def accounts_of(desired: Sequence[Qos]) -> List[str]:
    return sorted({a for q in desired for a in q.accounts})


# ------------------------------------------------------------------------- live access
def read_live(cli: Runner) -> Dict[str, Qos]:
    return parse_qos_rows(cli.run("sacctmgr", ["-P", "-n", "show", "qos",
                                               f"format={QOS_FORMAT}"]))


def read_account_qos(cli: Runner, accounts: Sequence[str]) -> Dict[str, Tuple[str, ...]]:
    if not accounts:
        return {}
    return parse_account_qos(cli.run("sacctmgr", [
        "-P", "-n", "show", "assoc", "where", f"account={','.join(accounts)}",
        "format=Account,User,QOS"]))


@dataclass
class Plan:
    """Everything ``qos apply`` would do, and what it cannot do."""

    changes: List[Change]
    unknown_accounts: List[str]
    grants_managed: bool

    def to_dict(self) -> Dict[str, object]:
        return {"changes": [c.to_dict() for c in self.changes],
                "unknown_accounts": self.unknown_accounts,
                "grants_managed": self.grants_managed}


def plan(cfg: Config, cli: Runner) -> Plan:
    """Read slurmdbd and compare it with the config (read only)."""
    desired = desired_qos(cfg)
    changes = diff(desired, read_live(cli))
    accounts = accounts_of(desired)
    grants, unknown = grant_changes(desired, read_account_qos(cli, accounts))
    return Plan(changes + grants, unknown, bool(accounts))


def apply_changes(cli: Runner, changes: Sequence[Change]) -> None:
    """Act on a plan: creates first (Preempt may name them), one ``modify`` per QoS, grants."""
    for c in changes:
        if c.action == "add":
            cli.run("sacctmgr", ["-i", "add", "qos", c.qos])
    settings: Dict[str, List[str]] = {}
    for c in changes:
        if c.action == "set":  # measured on 22.05: "Preempt=" clears, TRES limits merge
            settings.setdefault(c.qos, []).append(f"{c.field}={c.want}")
    for qos, sets in settings.items():
        cli.run("sacctmgr", ["-i", "modify", "qos", "where", f"name={qos}", "set", *sets])
    for c in changes:
        if c.action == "grant":
            cli.run("sacctmgr", ["-i", "modify", "account", "where", f"name={c.account}",
                                 "set", f"qos+={c.qos}"])
