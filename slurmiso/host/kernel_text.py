"""Readers for the kernel's cgroupfs and procfs text formats, hostile input in mind.

    >>> parse_flat_keyed("usage_usec 120\\nnr_throttled x\\n")
    {'usage_usec': 120}

A job can influence what its own cgroup files say (never their format, but a damaged or
unexpected file must not crash the agent), so every reader here returns ``None`` or leaves a
key out rather than raising: the caller turns "absent" into an unknown figure, never into 0.
Formats follow Documentation/admin-guide/cgroup-v2.rst ("Interface Files": flat-keyed,
nested-keyed, single value) and Documentation/accounting/psi.rst.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from typing import Dict, Optional

log = logging.getLogger("slurmiso")

#: cgroup and PSI counters are u64 in the kernel; anything larger is not a kernel figure.
U64_MAX = 2**64 - 1
#: The largest file read: io.stat on a host with many devices stays far below this.
MAX_READ_BYTES = 256 * 1024

_UINT_RE = re.compile(r"^[0-9]{1,20}$")
_PCT_RE = re.compile(r"^[0-9]{1,3}\.[0-9]{1,2}$|^[0-9]{1,3}$")
_DEVICE_RE = re.compile(r"^[0-9]{1,10}:[0-9]{1,10}$")
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def read_text(path: str) -> Optional[str]:
    """The file's text, or None when absent, unreadable, a symlink, too big or not UTF-8."""
    try:
        fd = os.open(path, os.O_RDONLY | _CLOEXEC | _NOFOLLOW)
    except OSError:
        return None
    chunks: list[bytes] = []
    size = 0
    try:
        while size <= MAX_READ_BYTES:  # seq_file reads may come back short: read to EOF
            chunk = os.read(fd, MAX_READ_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > MAX_READ_BYTES:
        log.warning("host figures: %s is over %d bytes; ignored", path, MAX_READ_BYTES)
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def parse_uint(token: str) -> Optional[int]:
    """A u64 counter from ``token``; None for signs, decimals, words or values over u64."""
    token = token.strip()
    if not _UINT_RE.match(token):
        return None
    value = int(token)
    return value if value <= U64_MAX else None


def parse_percent(token: str) -> Optional[float]:
    """A PSI average (``12.34``, a share of time in %); None outside 0..100 or malformed."""
    if not _PCT_RE.match(token):
        return None
    value = float(token)
    return value if value <= 100.0 else None


def parse_single(text: Optional[str]) -> Optional[int]:
    """A single-value file (``memory.current``): one u64 on one line."""
    if text is None:
        return None
    lines = text.strip().split("\n")
    return parse_uint(lines[0]) if len(lines) == 1 else None


def parse_flat_keyed(text: Optional[str]) -> Dict[str, int]:
    """``key value`` lines (cpu.stat, memory.events); malformed or repeated keys dropped."""
    out: Dict[str, int] = {}
    seen: set[str] = set()
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) != 2:
            continue
        key, value = parts[0], parse_uint(parts[1])
        if key in seen:
            out.pop(key, None)  # a repeated key is not a kernel file: trust neither copy
            continue
        seen.add(key)
        if value is not None:
            out[key] = value
    return out


def parse_nested_keyed(text: Optional[str]) -> Optional[Dict[str, Dict[str, int]]]:
    """``MAJ:MIN key=value ...`` lines (io.stat) by device; a value that is not a u64 leaves
    its key out. None for the whole file when a line has no valid device or repeats one:
    the file is not the kernel's, and a sum without that line would under-read."""
    if text is None:
        return None
    out: Dict[str, Dict[str, int]] = {}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if not _DEVICE_RE.match(parts[0]) or parts[0] in out:
            return None
        fields: Dict[str, int] = {}
        for item in parts[1:]:
            key, sep, raw = item.partition("=")
            value = parse_uint(raw) if sep else None
            if value is not None:
                fields[key] = value
        out[parts[0]] = fields
    return out


@dataclass(frozen=True)
class PsiLine:
    """One ``some`` or ``full`` line: stall share in % over 10 s and 60 s, total in µs."""

    avg10: float
    avg60: float
    total_usec: int


@dataclass(frozen=True)
class Psi:
    """One resource's pressure; ``full`` is None where the kernel prints no full line."""

    some: PsiLine
    full: Optional[PsiLine]


def _psi_line(parts: list[str]) -> Optional[PsiLine]:
    fields: Dict[str, str] = {}
    for item in parts:
        key, _, raw = item.partition("=")
        fields.setdefault(key, raw)
    avg10 = parse_percent(fields.get("avg10", ""))
    avg60 = parse_percent(fields.get("avg60", ""))
    total = parse_uint(fields.get("total", ""))
    if avg10 is None or avg60 is None or total is None:
        return None
    return PsiLine(avg10=avg10, avg60=avg60, total_usec=total)


def parse_psi(text: Optional[str]) -> Optional[Psi]:
    """A pressure file; None unless a well-formed ``some`` line is there (psi.rst format)."""
    lines: Dict[str, Optional[PsiLine]] = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if parts and parts[0] in ("some", "full") and parts[0] not in lines:
            lines[parts[0]] = _psi_line(parts[1:])
    some = lines.get("some")
    if some is None:
        return None
    return Psi(some=some, full=lines.get("full"))
