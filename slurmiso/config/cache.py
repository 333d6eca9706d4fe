"""A JSON cache of the parsed config file, for the hooks' start-up path.

Keyed by the file's path, inode, size and mtime and slurmiso's version, so any edit is seen at
once. Used only by root and only in a root-owned directory nobody else can write
(``$SLURMISO_CACHE_DIR``, default ``/run/slurmiso-cache``): a cache a user could write would
let that user change root's policy. Any problem means "no cache": it can only make things
faster, never different.
"""

from __future__ import annotations

import json
import logging
import os
import stat
from typing import Any, Dict, Optional

log = logging.getLogger(__name__)
DEFAULT_DIR = "/run/slurmiso-cache"


def _dir() -> Optional[str]:
    if os.geteuid() != 0:
        return None
    return os.environ.get("SLURMISO_CACHE_DIR", DEFAULT_DIR) or None


def _key(src: str) -> Optional[Dict[str, Any]]:
    from slurmiso import __version__

    try:
        st = os.stat(src)
    except OSError:
        return None
    return {"path": os.path.abspath(src), "ino": st.st_ino, "size": st.st_size,
            "mtime_ns": st.st_mtime_ns, "version": __version__}


def _path(folder: str, src: str) -> str:
    name = os.path.abspath(src).strip("/").replace("%", "%25").replace("/", "%2F")
    return os.path.join(folder, f"{name[-200:]}.json")


def _safe_dir(folder: str) -> bool:
    try:
        st = os.lstat(folder)
    except OSError:
        return False
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == 0
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


def lookup(src: str) -> Optional[Any]:
    """The cached parsed YAML of ``src`` if it is still current, else None."""
    folder = _dir()
    if folder is None or not _safe_dir(folder):
        return None
    key = _key(src)
    try:
        fd = os.open(_path(folder, src), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, encoding="utf-8") as fh:
            entry = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    return entry.get("data")


def store(src: str, data: Any) -> None:
    """Cache ``data`` (the parsed YAML of ``src``); silently skipped when not possible."""
    folder = _dir()
    key = _key(src)
    if folder is None or key is None:
        return
    try:
        text = json.dumps({"key": key, "data": data})
    except (TypeError, ValueError):  # YAML dates and the like: not worth a cache
        return
    from slurmiso.atomic import write_atomic

    try:
        os.makedirs(folder, 0o700, exist_ok=True)
        if not _safe_dir(folder):
            return
        write_atomic(_path(folder, src), text, 0o600)
    except OSError as exc:
        log.debug("config cache not written: %s", exc)
