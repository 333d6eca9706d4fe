"""plugstack.conf as Slurm's SPANK loader reads it (src/common/plugstack.c), for doctor.

Reading it the way Slurm does is the point: a plugin named in a comment, on an ``optional``
line (a plugin that fails to load is then skipped in silence: jobs run unfenced), on a line
whose keyword is not exactly ``required``/``optional``/``include`` (Slurm ignores the line),
or in a file no ``include`` matches, is not loaded, though the file's text mentions it.

Slurm's rules: ``#`` starts a comment anywhere on a line; fields are split on blanks and tabs;
a relative plugin path is looked up in ``PluginDir`` (colon-separated); a relative include
pattern is relative to the including file's directory and is a glob (no match: nothing); a
missing plugstack.conf is an empty one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

KEYWORDS = ("required", "optional", "include")
MAX_DEPTH = 8  # include nesting doctor follows (Slurm has no limit; loops are an admin error)


@dataclass(frozen=True)
class StackLine:
    """One non-blank line of a plugstack file, as Slurm classifies it."""

    file: str
    lineno: int
    kind: str  # "required" | "optional" | "include" | "invalid" | "comment"
    path: str  # plugin path or include pattern, as written ("" when none)
    args: Tuple[str, ...]
    raw: str


def parse_lines(text: str, file: str) -> List[StackLine]:
    """Every line that is not blank; commented-out and invalid lines are kept (kind says so),
    so a finding can point at the line an admin thinks loads a plugin."""
    out: List[StackLine] = []
    for n, raw in enumerate(text.splitlines(), 1):
        code, hash_, _comment = raw.partition("#")
        fields = code.split()
        if not fields:
            if hash_ and raw.strip():
                out.append(StackLine(file, n, "comment", "", (), raw.strip()))
            continue
        kind = fields[0] if fields[0] in KEYWORDS else "invalid"
        if len(fields) < 2:
            kind = "invalid"
        out.append(StackLine(file, n, kind, fields[1] if len(fields) > 1 else "",
                             tuple(fields[2:]), raw.strip()))
    return out


def include_pattern(pattern: str, file: str) -> str:
    """An include pattern made absolute as Slurm does (relative to the including file)."""
    return pattern if pattern.startswith("/") else os.path.join(os.path.dirname(file), pattern)


def resolve_plugin(path: str, plugin_dir: str) -> str:
    """The file Slurm loads for ``path``: absolute as written, else the first ``PluginDir``
    entry holding it (else the path as written, which then fails to load)."""
    if path.startswith("/"):
        return path
    for d in (plugin_dir or "").split(":"):
        if d and os.path.isfile(os.path.join(d, path)):
            return os.path.join(d, path)
    return path


def stack(plug: Dict[str, Any]) -> Tuple[List[StackLine], List[str]]:
    """(every line Slurm reads, main file first and includes in place; include patterns
    whose files the snapshot did not record). ``plug`` is ``snap["plugstack"]``: ``text`` of
    ``path``, and ``includes`` (pattern -> {file: text}) where the collector followed them."""
    includes: Optional[Dict[str, Dict[str, Optional[str]]]] = plug.get("includes")
    unread: List[str] = []

    def walk(text: str, file: str, depth: int) -> List[StackLine]:
        out: List[StackLine] = []
        for line in parse_lines(text, file):
            out.append(line)
            if line.kind != "include":
                continue
            pattern = include_pattern(line.path, file)
            files = None if includes is None else includes.get(pattern)
            if files is None or depth >= MAX_DEPTH:
                unread.append(pattern)
                continue
            for path in sorted(files):
                if files[path] is None:
                    unread.append(path)
                else:
                    out += walk(str(files[path]), path, depth + 1)
        return out

    lines = walk(str(plug.get("text") or ""), str(plug.get("path") or "plugstack.conf"), 0)
    return lines, unread


def read_includes(text: str, file: str, depth: int = 0,
                  found: Optional[Dict[str, Dict[str, Optional[str]]]] = None
                  ) -> Dict[str, Dict[str, Optional[str]]]:
    """What the collector records: each include pattern (absolute) -> {file it matches: text
    (None when unreadable)}, followed into included files."""
    import glob

    found = {} if found is None else found
    if depth >= MAX_DEPTH:
        return found
    for line in parse_lines(text, file):
        if line.kind != "include":
            continue
        pattern = include_pattern(line.path, file)
        if pattern in found:
            continue
        found[pattern] = {}
        for path in sorted(glob.glob(pattern)):
            try:
                with open(path, encoding="utf-8", errors="replace") as fh:
                    body: Optional[str] = fh.read()
            except OSError:
                body = None
            found[pattern][path] = body
            if body is not None:
                read_includes(body, path, depth + 1, found)
    return found


def near_miss(lines: List[StackLine], plugin: str) -> str:
    """Why a line that mentions ``plugin`` does not load it (" (file:N ...)"), or ""."""
    stem = plugin[:-3] if plugin.endswith(".so") else plugin
    for ln in lines:
        if stem not in ln.raw:
            continue
        where = f"{ln.file}:{ln.lineno}"
        if ln.kind == "comment":
            return f" ({where} is commented out)"
        if ln.kind == "invalid":
            word = ln.raw.split()[0]
            return (f" ({where}: '{word}' is not a plugstack keyword (required, optional or "
                    "include, in lower case), so Slurm ignores the line)")
        if stem in ln.path and os.path.basename(ln.path) != plugin:
            return f" ({where} names {os.path.basename(ln.path)}, not {plugin})"
        if stem not in ln.path:
            return f" ({where} names it only in a comment)"
    return ""


def sibling(lines: List[StackLine], plugin: str) -> str:
    """Where ``plugin`` most likely is: beside slurmiso's other plugin, else the default."""
    from slurmiso.submit.plugstack import DEFAULT_FENCE_PLUGIN

    for ln in lines:
        if ln.kind in ("required", "optional") and ln.path.startswith("/") \
                and os.path.basename(ln.path).startswith("slurmiso"):
            return os.path.join(os.path.dirname(ln.path), plugin)
    return os.path.join(os.path.dirname(DEFAULT_FENCE_PLUGIN), plugin)


def check_read_path(snap: Dict[str, Any], path: str) -> List[Any]:
    """A warning when slurm.conf's PlugStackConfig is not the file this snapshot read (an
    edited snapshot, or the setting changed since): that file's plugins are unknown."""
    from slurmiso.doctor import Finding

    config = snap.get("config") or {}
    if "PlugStackConfig" not in config:
        return []
    want = str(config.get("PlugStackConfig") or "").strip()
    if want in ("", "(null)"):
        conf = str(config.get("SLURM_CONF") or "/etc/slurm/slurm.conf")
        want = os.path.join(os.path.dirname(conf), "plugstack.conf")
    if os.path.normpath(want) == os.path.normpath(path):
        return []
    return [Finding("warning", "fence-plugin",
                    f"slurm.conf names PlugStackConfig={want}, but {path} was read: whether "
                    f"{want} loads slurmiso's plugins is unknown",
                    "run 'slurmiso doctor' again where slurm.conf is current (it reads "
                    "PlugStackConfig), or fix PlugStackConfig=")]
