"""Slurm hostlist expressions (``gpu[001-016,020],login1``), expanded and compressed.

Pure functions, so configs can name nodes the way Slurm admins write them and the monitor can
hand node sets back to ``scontrol`` in the same form.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Tuple

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class HostlistError(ValueError):
    """A malformed hostlist expression; the message names the bad part."""


def _split_top(expr: str) -> List[str]:
    """Split on commas that are not inside brackets."""
    parts: List[str] = []
    cur: List[str] = []
    depth = 0
    for ch in expr:
        if ch == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"nested brackets in hostlist {expr!r}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"unbalanced ']' in hostlist {expr!r}")
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise HostlistError(f"unbalanced '[' in hostlist {expr!r}")
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def _expand_one(item: str) -> List[str]:
    m = re.match(r"^([^\[\]]*)\[([^\[\]]+)\]([^\[\]]*)$", item)
    if not m:
        if "[" in item or "]" in item:
            raise HostlistError(f"cannot parse hostlist part {item!r}")
        return [item]
    prefix, body, suffix = m.groups()
    out: List[str] = []
    for rng in body.split(","):
        r = _RANGE.match(rng.strip())
        if not r:
            raise HostlistError(f"bad range {rng!r} in hostlist part {item!r}; use e.g. 001-016")
        lo_s, hi_s = r.group(1), r.group(2) or r.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise HostlistError(f"descending range {rng!r} in hostlist part {item!r}")
        if hi - lo > 100_000:
            raise HostlistError(f"range {rng!r} is implausibly large")
        width = len(lo_s) if lo_s.startswith("0") else 0
        out.extend(f"{prefix}{n:0{width}d}{suffix}" for n in range(lo, hi + 1))
    return out


def expand(expr: str) -> List[str]:
    """``"n[1-3],x"`` -> ``["n1", "n2", "n3", "x"]`` (order kept, duplicates removed)."""
    seen: Dict[str, None] = {}
    for part in _split_top(expr):
        for host in _expand_one(part):
            seen.setdefault(host, None)
    return list(seen)


def compress(hosts: Iterable[str]) -> str:
    """Inverse of :func:`expand` for names ending in digits: ``n1,n2,n3,x`` -> ``n[1-3],x``."""
    groups: Dict[Tuple[str, int], List[int]] = {}
    plain: List[str] = []
    order: List[Tuple[str, int]] = []
    for h in sorted(set(hosts), key=_natural_key):
        m = re.match(r"^(.*?)(\d+)$", h)
        if not m:
            plain.append(h)
            continue
        key = (m.group(1), len(m.group(2)) if m.group(2).startswith("0") else 0)
        if key not in groups:
            groups[key] = []
            order.append(key)
        groups[key].append(int(m.group(2)))
    out: List[str] = []
    for prefix, width in order:
        nums = groups[(prefix, width)]
        ranges: List[str] = []
        start = prev = nums[0]
        tail: List[Optional[int]] = [*nums[1:], None]
        for n in tail:
            if n is not None and n == prev + 1:
                prev = n
                continue
            ranges.append(
                f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}"
            )
            if n is not None:
                start = prev = n
        if len(ranges) == 1 and "-" not in ranges[0]:
            out.append(f"{prefix}{ranges[0]}")
        else:
            out.append(f"{prefix}[{','.join(ranges)}]")
    return ",".join(out + plain)


def _natural_key(s: str) -> Tuple[str, int, str]:
    m = re.match(r"^(.*?)(\d+)$", s)
    return (m.group(1), int(m.group(2)), s) if m else (s, -1, s)
