"""Parsing of the sizes and durations people type: ``20G``, ``512M``, ``90s``, ``1-12:00:00``.

Shared by the CLI, the config loader and the audit so that one spelling means one thing
everywhere. Errors are :class:`ValueError` with a message that shows accepted forms; callers
turn them into :class:`~slurmiso.errors.UsageError` or :class:`~slurmiso.errors.ConfigError`.
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

#: Multipliers to MiB. Like Slurm's ``--mem=20G``, a bare K/M/G/T is binary (GiB, not GB).
#: As (numerator, denominator): exact integer arithmetic, so "0.1G" is 103 MiB everywhere.
_SIZE_UNITS: Dict[str, Tuple[int, int]] = {
    "k": (1, 1024),
    "m": (1, 1),
    "g": (1024, 1),
    "t": (1024 * 1024, 1),
}

#: ASCII digits only (``\d`` takes other scripts' digits) and bounded: a 310-digit number must
#: be a clear "invalid", never an OverflowError in a root hook.
_SIZE_RE = re.compile(
    r"^\s*([0-9]{1,12}(?:\.[0-9]{1,6})?)\s*(?:([kmgt])(?:i?b)?)?\s*$", re.IGNORECASE
)

_DURATION_UNITS: Dict[str, int] = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

_UNIT_DURATION_RE = re.compile(
    r"^\s*([0-9]{1,9}(?:\.[0-9]{1,6})?)\s*([smhdw])\s*$", re.IGNORECASE
)
_CLOCK_RE = re.compile(
    r"^\s*(?:([0-9]{1,6})-)?([0-9]{1,9})(?::([0-9]{1,2}))?(?::([0-9]{1,2}))?\s*$"
)


def parse_size(text: str) -> int:
    """Memory size in MiB from ``"20G"``, ``"20GiB"``, ``"512M"``, ``"1.5T"`` or ``"4096"`` (MiB).

    Fractions of a MiB round up, so a limit is never silently lowered.
    """
    text = str(text)
    match = _SIZE_RE.match(text) if len(text) <= 64 else None
    if not match:
        raise ValueError(
            f"invalid size {text[:40]!r}: use a number with an optional unit K, M, G or T "
            "(binary; e.g. 512M, 20G, 20GiB, 1.5T); a bare number means MiB"
        )
    number, unit = match.groups()
    whole, _, frac = number.partition(".")
    mul, div = _SIZE_UNITS[(unit or "m").lower()]
    scaled = int(whole + frac) * mul
    return int(-(-scaled // (div * 10 ** len(frac))))


def parse_duration(text: str) -> int:
    """Duration in seconds from ``"90s"``, ``"5m"``, ``"2h"``, ``"1d"``, ``"1w"``, Slurm's
    ``"D-HH:MM:SS"`` / ``"D-HH:MM"`` / ``"D-HH"`` / ``"HH:MM:SS"`` / ``"MM:SS"``, or plain
    seconds (``"3600"``).

    Unlike Slurm's ``--time``, a bare number is seconds: the audit/monitor options count in
    seconds and the unit suffixes cover the rest.
    """
    raw = str(text)
    if len(raw) > 64:
        raise ValueError(f"invalid duration {raw[:40]!r}...: too long")
    unit = _UNIT_DURATION_RE.match(raw)
    if unit:
        return int(round(float(unit.group(1)) * _DURATION_UNITS[unit.group(2).lower()]))
    clock = _CLOCK_RE.match(raw)
    if clock:
        return _clock_seconds(raw, *clock.groups())
    raise ValueError(
        f"invalid duration {text!r}: use 90s, 5m, 2h, 1d, 1w, D-HH:MM:SS, HH:MM:SS, MM:SS "
        "or plain seconds"
    )


#: What Slurm prints instead of a time: no limit (``UNLIMITED``/``INFINITE``), the partition's
#: limit applies (``Partition_Limit``, sacct), not set (``""``, ``N/A``, ``NONE``), or a value
#: it could not render (``INVALID``). None of them is a number of seconds.
SLURM_NOT_A_TIME = frozenset(
    {"", "UNLIMITED", "INFINITE", "N/A", "NONE", "PARTITION_LIMIT", "INVALID"}
)


def parse_slurm_time(text: str) -> Optional[int]:
    """Seconds of a time as Slurm prints it (sacctmgr, scontrol, sacct, squeue); None when
    Slurm printed no time (:data:`SLURM_NOT_A_TIME`).

    Slurm's forms: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``. A
    bare number is minutes, as in Slurm (unlike :func:`parse_duration`, where it is seconds).
    Anything else is a ValueError: a misread limit must not pass as "no limit".
    """
    raw = str(text).strip()
    if raw.upper() in SLURM_NOT_A_TIME:
        return None
    clock = _CLOCK_RE.match(raw) if len(raw) <= 64 else None
    if not clock:
        raise ValueError(
            f"invalid Slurm time {raw[:40]!r}: expected [D-]HH:MM:SS, MM:SS, D-HH[:MM], "
            "minutes or UNLIMITED"
        )
    days, first, second, third = clock.groups()
    if days is None and second is None:
        return int(first) * 60
    return _clock_seconds(raw, days, first, second, third)


def _clock_seconds(
    raw: str, days: Optional[str], first: str, second: Optional[str], third: Optional[str]
) -> int:
    """Seconds of a Slurm-style clock; the meaning of the fields depends on the day prefix."""
    d = int(days) if days else 0
    if days:  # D-HH[:MM[:SS]]
        h, m, s = int(first), int(second or 0), int(third or 0)
    elif third is not None:  # HH:MM:SS
        h, m, s = int(first), int(second or 0), int(third)
    elif second is not None:  # MM:SS
        h, m, s = 0, int(first), int(second)
    else:  # plain seconds
        return int(first)
    if m >= 60 or s >= 60:
        raise ValueError(f"invalid duration {raw!r}: minutes and seconds must be below 60")
    return ((d * 24 + h) * 60 + m) * 60 + s
