"""What admission remembers between cycles: the holds it placed, its gates, the nodes it lent
and the QoS caps it set.

Frozen records, as :mod:`slurmiso.monitor.ladder_state`'s: :func:`~slurmiso.monitor.decide.
decide` shares them between the memory it was given and the one it returns (20,000 jobs held
alike share one :class:`Hold`), so a change is a new record, never an edit. JSON through
:meth:`to_dict`/:meth:`from_dict`, with the keys the monitor's state file has always had
(``from_dict`` reads the files earlier versions wrote, where these were plain dicts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Mapping, Optional, Tuple


def _float(data: Mapping[str, Any], key: str, default: float = 0.0) -> float:
    value = data.get(key)
    return default if value is None else float(value)


@dataclass(frozen=True)
class Hold:
    """A hold this monitor placed on a pending job: when, for which scopes (partitions,
    ``slo``, ``stagger``, ``nodes``, ``reconciled``) and the reason the job shows."""

    ts: float = 0.0
    scopes: Tuple[str, ...] = ()
    reason: str = ""

    @property
    def kind(self) -> str:
        """The reason as a metric label: ``stagger``, ``reconciled``, ``slo`` or ``gate``
        (its GPUs were hot)."""
        first = self.scopes[0] if self.scopes else "gate"
        return first if first in ("stagger", "reconciled", "slo") else "gate"

    def to_dict(self) -> Dict[str, Any]:
        return {"ts": self.ts, "scopes": list(self.scopes), "reason": self.reason}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Hold:
        return cls(_float(data, "ts"), tuple(str(s) for s in data.get("scopes") or ()),
                   str(data.get("reason") or ""))


@dataclass(frozen=True)
class Gate:
    """A scope (partition, ``node:<name>``, ``slo``) closed to new training, or open again
    after it was: since when, since when calm (the dwell before opening) and why."""

    closed: bool = False
    since: float = 0.0
    calm_since: Optional[float] = None
    why: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return {"closed": self.closed, "since": self.since, "calm_since": self.calm_since,
                "why": self.why}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Gate:
        calm = data.get("calm_since")
        return cls(bool(data.get("closed")), _float(data, "since"),
                   None if calm is None else float(calm), str(data.get("why") or ""))


@dataclass(frozen=True)
class Loan:
    """A node lent: the inference partition it belongs to (``lender``; "" when a reclaim
    that never happened left it lent), the training partition it went to, and when."""

    lender: str
    borrower: str
    ts: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        return {"from": self.lender, "to": self.borrower, "ts": self.ts}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Loan:
        return cls(str(data.get("from") or ""), str(data.get("to") or ""), _float(data, "ts"))


@dataclass(frozen=True)
class Cap:
    """A training QoS capped (``qos-limit`` admission): its GrpTRES (``{"gpu": N}``), and
    when it was last set (a raise waits a stagger interval after it)."""

    tres: Dict[str, int] = field(default_factory=dict)
    ts: float = 0.0

    def to_dict(self) -> Dict[str, Any]:
        return {"tres": dict(self.tres), "ts": self.ts}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Cap:
        return cls({str(k): int(v) for k, v in (data.get("tres") or {}).items()},
                   _float(data, "ts"))
