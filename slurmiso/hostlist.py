"""Slurm node names: this node's own name, and hostlist expressions
(``rack[1-2]-gpu[01-16],login1``), expanded and compressed.

The grammar is slurm.conf(5)'s: comma-separated items, each a name with any number of bracket
groups (``rack[0-1]_blade[0-1]`` is the cartesian product, leftmost group slowest), a group
holding comma-separated numbers and ranges. Zero padding is per range and comes from the
range's first number (``gpu[098-101]`` is gpu098 ... gpu101), as in Slurm.

Pure functions; :func:`expand` uses no regular expression, because the hooks load the config,
and the config expands hostlists, on every job start (ClusterShell's NodeSet costs ~18 ms to
import; see the commit that introduced this module's grammar for the measurements).
"""

from __future__ import annotations

import itertools
import os
from typing import Dict, Iterable, List, Sequence, Tuple

MAX_HOSTS = 100_000


def node_name(explicit: str = "") -> str:
    """This node's Slurm name: explicit, else ``$SLURMD_NODENAME``, else the short hostname."""
    return explicit or os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]


def expand_node(path: str, node: str = "") -> str:
    """``path`` with ``%n`` replaced by :func:`node_name` (as in slurm.conf; one host can run
    several slurmd, each with its own state)."""
    return path.replace("%n", node_name(node)) if "%n" in path else path


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


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _expand_group(body: str, item: str) -> List[str]:
    """``001-003,010`` -> ["001", "002", "003", "010"] (padding from each range's start)."""
    out: List[str] = []
    for rng in body.split(","):
        lo_s, dash, hi_s = rng.strip().partition("-")
        hi_s = hi_s if dash else lo_s
        if not (_digits(lo_s) and _digits(hi_s)):
            raise HostlistError(f"bad range {rng!r} in hostlist part {item!r}; use e.g. 001-016")
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise HostlistError(f"descending range {rng!r} in hostlist part {item!r}")
        if hi - lo > MAX_HOSTS:
            raise HostlistError(f"range {rng!r} is implausibly large")
        width = len(lo_s) if lo_s.startswith("0") else 0
        out.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return out


def _expand_one(item: str) -> List[str]:
    """One comma-free item: text and bracket groups, expanded as their cartesian product."""
    choices: List[List[str]] = []
    size = 1
    rest = item
    while rest:
        open_at = rest.find("[")
        close_at = rest.find("]")
        if open_at < 0:
            if close_at >= 0:
                raise HostlistError(f"cannot parse hostlist part {item!r}")
            choices.append([rest])
            break
        if close_at < open_at:
            raise HostlistError(f"cannot parse hostlist part {item!r}")
        if open_at:
            choices.append([rest[:open_at]])
        body = rest[open_at + 1:close_at]
        if not body:
            raise HostlistError(f"empty brackets in hostlist part {item!r}")
        group = _expand_group(body, item)
        size *= len(group)
        if size > MAX_HOSTS:
            raise HostlistError(f"hostlist part {item!r} names more than {MAX_HOSTS} hosts")
        choices.append(group)
        rest = rest[close_at + 1:]
    return ["".join(combo) for combo in itertools.product(*choices)]


def expand(expr: str) -> List[str]:
    """``"n[1-3],x"`` -> ``["n1", "n2", "n3", "x"]`` (order kept, duplicates removed)."""
    seen: Dict[str, None] = {}
    for part in _split_top(expr):
        for host in _expand_one(part):
            seen.setdefault(host, None)
    return list(seen)


# ------------------------------------------------------------------------------- compress
def _width(digits: str) -> int:
    return len(digits) if digits.startswith("0") and len(digits) > 1 else 0


def _ranges(numbers: Iterable[str]) -> str:
    """Digit strings -> Slurm range text: ``098,099,100,101`` -> ``098-101``.

    A run keeps going while each next number is one more and renders the same under the run's
    padding (taken from its first number), so the text expands back to exactly these strings.
    """
    items = sorted(set(numbers), key=lambda d: (int(d), len(d)))
    runs: List[Tuple[str, str]] = []
    start = prev = items[0]
    for d in items[1:]:
        w = _width(start)
        if int(d) == int(prev) + 1 and f"{int(d):0{w}d}" == d:
            prev = d
            continue
        runs.append((start, prev))
        start = prev = d
    runs.append((start, prev))
    return ",".join(lo if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def _render(texts: Sequence[str], fields: Sequence[str]) -> str:
    out = [texts[0]]
    for field, text in zip(fields, texts[1:]):
        out.append(f"[{field}]" if ("," in field or "-" in field) else field)
        out.append(text)
    return "".join(out)


def _compress_shape(texts: Tuple[str, ...], rows: List[Tuple[str, ...]]) -> List[str]:
    """Hosts sharing the text between their numbers; fold the numeric fields right to left."""
    n = len(texts) - 1
    entries: List[Tuple[str, ...]] = [tuple(r) for r in rows]
    for i in reversed(range(n)):
        groups: Dict[Tuple[str, ...], List[str]] = {}
        for e in entries:
            groups.setdefault(e[:i] + e[i + 1:], []).append(e[i])
        entries = [k[:i] + (_ranges(v),) + k[i:] for k, v in groups.items()]
    return [_render(texts, e) for e in entries]


def compress(hosts: Iterable[str]) -> str:
    """Inverse of :func:`expand`: ``n1,n2,n3,x`` -> ``n[1-3],x``.

    Every numeric field of a name is folded, so ``rack1-gpu01 .. rack2-gpu16`` becomes
    ``rack[1-2]-gpu[01-16]``; ``expand(compress(h))`` is ``h`` as a set, and compressing an
    expansion gives back the canonical form (``gpu[098-101]`` stays one range).
    """
    import re  # compress runs in the monitor and audit, not in the hooks

    split = re.compile(r"(\d+)").split
    tokenised = {h: split(h) for h in set(hosts)}  # each name split once, for order and shape
    shapes: Dict[Tuple[str, ...], List[Tuple[str, ...]]] = {}
    plain: List[str] = []
    for h in sorted(tokenised, key=lambda name: _key_of(tokenised[name])):
        tokens = tokenised[h]
        if len(tokens) == 1:
            plain.append(h)
            continue
        shapes.setdefault(tuple(tokens[0::2]), []).append(tuple(tokens[1::2]))
    out: List[str] = []
    for texts, rows in shapes.items():
        out.extend(_compress_shape(texts, rows))
    return ",".join(out + plain)


def _natural_key(s: str) -> Tuple[object, ...]:
    import re

    return _key_of(re.split(r"(\d+)", s))


def _key_of(tokens: List[str]) -> Tuple[object, ...]:
    """A split name's natural order: numbers by value (then width), text as text."""
    return tuple((0, int(tok), len(tok)) if i % 2 else (1, tok, 0)
                 for i, tok in enumerate(tokens))

