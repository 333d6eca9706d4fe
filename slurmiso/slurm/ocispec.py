"""Can a container reach a host path at the same path? Read from its OCI config.json.

    >>> cfg = {"mounts": [{"destination": "/run/slurmiso", "source": "/run/slurmiso",
    ...                    "type": "bind", "options": ["rbind"]}]}
    >>> pipe_reachable(cfg, "/run/slurmiso/mps/gpu0/u1000-t50-m0/pipe").reachable
    True

For the rule "an MPS job whose container cannot reach its pipe directory is refused with
that reason": a CUDA client that cannot reach its pipe directory does not use the job's
daemon, so the prolog's limits would not hold. The config.json is the user's (hostile
input): anything this function cannot read as a plain bind of the same host path is a
refusal with its reason, never a pass.

Mounts schema: https://github.com/opencontainers/runtime-spec/blob/main/config.md#mounts
(``destination`` required, ``source``, ``type`` and ``options`` optional; the runtime mounts
the entries in the listed order, so a later mount over a path hides an earlier one). A
mount is a bind when ``type`` is ``bind`` or ``options`` hold ``bind`` or ``rbind``.

Judge the config.json the runtime will read: with Slurm 23.02+ that is the copy slurmstepd
writes into the step's spool directory (``%b`` in oci.conf's RunTime* patterns), which has
Slurm's own mounts appended after the bundle's.
"""

from __future__ import annotations

import enum
import posixpath
from dataclasses import dataclass
from typing import Any, List, Mapping, Sequence

#: More mounts than any real bundle has: beyond it the file is refused, not walked.
MAX_MOUNTS = 4096


class Reach(enum.Enum):
    """Why a path is (or is not) the host's own inside the container."""

    REACHABLE = "reachable"
    NOT_MOUNTED = "not-mounted"  # no mount covers it: the image's own directory, if any
    HIDDEN = "hidden"  # a later mount covers it with something else
    OTHER_SOURCE = "other-source"  # bound from another host path
    NOT_BIND = "not-bind"  # a tmpfs or other filesystem over it
    MALFORMED = "malformed"  # the config.json cannot be read as the spec says


@dataclass(frozen=True)
class Verdict:
    reach: Reach
    reason: str
    read_only: bool = False

    @property
    def reachable(self) -> bool:
        return self.reach is Reach.REACHABLE


def _covers(dest: str, path: str) -> bool:
    return dest == "/" or path == dest or path.startswith(dest + "/")


def _clean(value: Any, what: str) -> str:
    """An absolute, normalized path, or ValueError (relative, '..', NUL, not a string)."""
    if not isinstance(value, str) or not value.startswith("/") or "\0" in value \
            or ".." in value.split("/"):
        raise ValueError(f"{what} {str(value)[:80]!r} is not a plain absolute path")
    return _norm(value)


def _norm(path: str) -> str:
    """normpath, with POSIX's kept leading '//' folded to '/' (Linux treats them alike)."""
    out = posixpath.normpath(path)
    return "/" + out.lstrip("/") if out.startswith("//") else out


def _options(mount: Mapping[str, Any]) -> List[str]:
    opts = mount.get("options", [])
    if not isinstance(opts, list) or not all(isinstance(o, str) for o in opts):
        raise ValueError("a mount's options are not a list of strings")
    return opts


def _mounts(config: Any) -> Sequence[Mapping[str, Any]]:
    if not isinstance(config, Mapping):
        raise ValueError("config.json is not a JSON object")
    mounts = config.get("mounts", [])
    if not isinstance(mounts, list) or len(mounts) > MAX_MOUNTS:
        raise ValueError("'mounts' is not a list (or is absurdly long)")
    if not all(isinstance(m, Mapping) for m in mounts):
        raise ValueError("a 'mounts' entry is not an object")
    return mounts


def _is_bind(mount: Mapping[str, Any]) -> bool:
    opts = _options(mount)
    return mount.get("type") == "bind" or "bind" in opts or "rbind" in opts


def _covering(mounts: Sequence[Mapping[str, Any]], path: str) -> List[Mapping[str, Any]]:
    """The mounts whose destination is ``path`` or a directory above it, in mount order:
    the last decides what ``path`` is (an earlier one is hidden under it)."""
    return [m for m in mounts if _covers(_clean(m.get("destination"), "a mount destination"),
                                         path)]


def _judge(mount: Mapping[str, Any], path: str, where: str, hides: bool) -> Verdict:
    dest = _clean(mount.get("destination"), "a mount destination")
    if not _is_bind(mount):
        kind = str(mount.get("type") or "filesystem")[:40]
        return Verdict(Reach.HIDDEN if hides else Reach.NOT_BIND,
                       f"{where}: the container mounts a {kind} at {dest} over it"
                       + (", after the bind that would have shown it" if hides else ""))
    source = _clean(mount.get("source"), "a bind source")
    seen = _norm(source + "/" + path[len(dest):])
    if seen != path:
        return Verdict(Reach.HIDDEN if hides else Reach.OTHER_SOURCE,
                       f"{where}: the container binds {dest} from host {source}, so it "
                       f"sees the host's {seen} there")
    return Verdict(Reach.REACHABLE, f"{where} is bound from the same host path at {dest}",
                   read_only="ro" in _options(mount))


def pipe_reachable(config: Any, pipe_dir: str) -> Verdict:
    """Whether the host's ``pipe_dir`` is the same directory inside the container that
    ``config`` (a parsed config.json, untrusted) describes, with the reason either way."""
    where = f"MPS pipe directory {pipe_dir}"
    try:
        path = _clean(pipe_dir, "the pipe directory")
        covering = _covering(_mounts(config), path)
        if not covering:
            return Verdict(Reach.NOT_MOUNTED, f"{where}: no mount in the container's "
                           "config.json covers it, so the container sees its image's "
                           "own directory there, if any")
        earlier = any(_judge(m, path, where, False).reachable for m in covering[:-1])
        return _judge(covering[-1], path, where, earlier)
    except ValueError as exc:
        return Verdict(Reach.MALFORMED, f"{where}: cannot read the container's config.json: "
                       f"{exc}")


#: A config.json larger than this is refused unread (real ones are a few KiB).
MAX_CONFIG_BYTES = 1 << 20


def pipe_reachable_text(text: str, pipe_dir: str) -> Verdict:
    """:func:`pipe_reachable` on config.json as read from disk: too large or not JSON is a
    refusal with its reason, like any other unreadable bundle."""
    import json

    where = f"MPS pipe directory {pipe_dir}"
    if len(text) > MAX_CONFIG_BYTES:
        return Verdict(Reach.MALFORMED, f"{where}: the container's config.json is over "
                       f"{MAX_CONFIG_BYTES} bytes; not read")
    try:
        config = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return Verdict(Reach.MALFORMED, f"{where}: the container's config.json is not JSON "
                       f"({str(exc)[:80]})")
    return pipe_reachable(config, pipe_dir)
