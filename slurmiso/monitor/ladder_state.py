"""What the ladder remembers between cycles: where it stands per GPU, what it did per job.

Frozen records: :func:`~slurmiso.monitor.decide.decide` shares them between the memory it was
given and the one it returns, so a change is a new record (``dataclasses.replace``), never an
edit. JSON through :meth:`to_dict`/:meth:`from_dict` (the monitor's state file).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Dict, Optional, Tuple, Type, TypeVar

R = TypeVar("R")


def _from(cls: Type[R], data: Dict[str, Any]) -> R:
    names = {f.name for f in fields(cls)}  # type: ignore[arg-type]
    return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class Rung:
    """The step in force on one GPU (``""``: none) and the timers that move it: since when
    the breach (or the calm) has lasted, and what the breach was when the ladder stepped."""

    step: str = ""
    #: When this step was taken or stepped back to (each dwell counts from here too).
    since: float = 0.0
    breach_since: Optional[float] = None
    calm_since: Optional[float] = None
    #: The inference job and signal behind the last step, as a reason a user can read.
    cause: str = ""
    signal: str = ""
    why: str = ""
    #: The SLO figure (ms, or error rate) and its limit when the ladder first stepped here.
    figure: Optional[float] = None
    limit: Optional[float] = None
    #: Why the next step waits although the breach lasts (a budget spent), "" if it does not.
    capped: str = ""
    #: Every inference job whose breach moved or kept this rung: once all of them have left
    #: the GPU the rung has no cause left and goes at once (``cause`` is the latest).
    causes: Tuple[str, ...] = ()
    #: The last cycle that judged this GPU calm: a calm dwell goes on across a gap (the
    #: monitor down, signals unknown) only where the agents' windows prove the gap calm.
    calm_seen: Optional[float] = None
    #: Since when its cause has not been hot (unknown, between or calm): at the step's
    #: ``max_s`` the rung ends (:mod:`slurmiso.monitor.bound`). None while hot.
    not_hot_since: Optional[float] = None
    #: The latest diagnosis of its breach (issue 36): the rule's one line and its cause
    #: (``slurmiso.host.diagnosis.Cause`` value); "" where no node's agent gave host figures.
    diagnosis: str = ""
    diagnosis_cause: str = ""

    def to_dict(self) -> Dict[str, Any]:
        """The keys earlier versions wrote, and the newer ones only where they say
        something (a state file read back by the version before stays the same)."""
        out = asdict(self)
        out["causes"] = list(self.causes)
        for name in ("causes", "calm_seen", "diagnosis", "diagnosis_cause"):
            if not out[name] and out[name] != 0:
                del out[name]
        return out

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Rung:
        rung = _from(cls, data)
        causes = data.get("causes")
        return replace(rung, causes=tuple(str(c) for c in causes)
                       if isinstance(causes, (list, tuple)) else ())


@dataclass(frozen=True)
class Restraint:
    """A training job the ladder slowed or stopped: on which GPU, because of whom, since
    when (the journal's durations come from here)."""

    node: str
    gpu: int
    cause: str = ""
    why: str = ""
    signal: str = ""
    #: The SLO figure when the job was first restrained (the "before" of the journal).
    figure: Optional[float] = None
    throttled_since: Optional[float] = None
    suspended_since: Optional[float] = None
    #: Why its cause is gone, while a release it began (resume) ends a cycle later
    #: (unthrottle): the words of that later line.
    gone: str = ""
    #: Since when its CUDA processes are parked (the ``park`` step's note; the node parks).
    parked_since: Optional[float] = None
    #: Why the node would not park it (its agent said so): suspend stands in for park.
    park_refused: str = ""

    def to_dict(self) -> Dict[str, Any]:
        out = asdict(self)
        for name in ("gone", "parked_since", "park_refused"):
            if not out[name]:
                del out[name]  # the journal's and the state file's words as they were
        return out

    def held(self) -> bool:
        """Whether the ladder holds the job in any way (throttled, parked or suspended)."""
        return not (self.throttled_since is None and self.suspended_since is None
                    and self.parked_since is None)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> Restraint:
        return _from(cls, data)


@dataclass(frozen=True)
class HostRung:
    """The host rung of one node (issue 36): the level in force (0: none) and the timers
    that move it, like a GPU's :class:`Rung`, and the breach behind it: the inference job,
    its GPU (the note's ``gpu=``), the host cause the diagnosis named and its words."""

    level: int = 0
    #: When this level was taken or stepped back to (each dwell counts from here too).
    since: float = 0.0
    breach_since: Optional[float] = None
    calm_since: Optional[float] = None
    #: Since when no host cause has been hot here: at the rung's ``max_s`` it ends.
    not_hot_since: Optional[float] = None
    cause: str = ""
    gpu: int = 0
    host_cause: str = ""
    why: str = ""
    #: Why the next level waits although the breach lasts (a budget spent), "" if it does not.
    capped: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> HostRung:
        return _from(cls, data)


@dataclass(frozen=True)
class HostLimited:
    """A training job the host rung limits: on which node, at which level, since when, and
    the breach behind it (the note's ``gpu=`` and ``cause=``)."""

    node: str
    level: int
    since: float
    gpu: int = 0
    cause: str = ""
    host_cause: str = ""
    why: str = ""

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> HostLimited:
        return _from(cls, data)
