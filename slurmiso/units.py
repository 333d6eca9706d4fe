"""Parsing of the sizes and durations people type: ``20G``, ``512M``, ``90s``, ``1-12:00:00``.

Shared by the CLI, the config loader and the audit so that one spelling means one thing
everywhere. Errors are :class:`ValueError` with a message that shows accepted forms; callers
turn them into :class:`~slurmiso.errors.UsageError` or :class:`~slurmiso.errors.ConfigError`.
"""

from __future__ import annotations

import math
import re
from typing import Dict, Optional

#: Multipliers to MiB. Like Slurm's ``--mem=20G``, a bare K/M/G/T is binary (GiB, not GB).
_SIZE_UNITS: Dict[str, float] = {
    "k": 1 / 1024,
    "m": 1,
    "g": 1024,
    "t": 1024 * 1024,
}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(?:([kmgt])(?:i?b)?)?\s*$", re.IGNORECASE)

_DURATION_UNITS: Dict[str, int] = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}

_UNIT_DURATION_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
_CLOCK_RE = re.compile(r"^\s*(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?\s*$")


def parse_size(text: str) -> int:
    """Memory size in MiB from ``"20G"``, ``"20GiB"``, ``"512M"``, ``"1.5T"`` or ``"4096"`` (MiB).

    Fractions of a MiB round up, so a limit is never silently lowered.
    """
    match = _SIZE_RE.match(str(text))
    if not match:
        raise ValueError(
            f"invalid size {text!r}: use a number with an optional unit K, M, G or T "
            "(binary; e.g. 512M, 20G, 20GiB, 1.5T); a bare number means MiB"
        )
    number, unit = match.groups()
    return int(math.ceil(float(number) * _SIZE_UNITS[(unit or "m").lower()]))


def parse_duration(text: str) -> int:
    """Duration in seconds from ``"90s"``, ``"5m"``, ``"2h"``, ``"1d"``, ``"1w"``, Slurm's
    ``"D-HH:MM:SS"`` / ``"D-HH:MM"`` / ``"D-HH"`` / ``"HH:MM:SS"`` / ``"MM:SS"``, or plain
    seconds (``"3600"``).

    Unlike Slurm's ``--time``, a bare number is seconds: the audit/monitor options count in
    seconds and the unit suffixes cover the rest.
    """
    raw = str(text)
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
