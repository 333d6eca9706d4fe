"""Refuse hosts whose Slurm or munge the sandbox did not create.

``sandbox up`` apt-installs Slurm, MariaDB and munge, uses the host's ``/etc/munge/munge.key``
and starts daemons as root. On a site's controller that would mean a second cluster sharing
the site's munge key, so before it touches anything ``up`` looks for what a real cluster has:
a Slurm config in ``/etc/slurm``, a munge key, running Slurm or munge daemons. Each one is
fine only when the sandbox made it:

* a file (the munge key, a Slurm config) is the sandbox's when the host marker
  (:data:`HOST_MARKER`) records it with the same SHA-256: what ``up`` found absent before
  and present after its own steps (apt's munge postinst makes the key), or what an admin
  adopted with ``--force``. A key without a record is foreign, whoever made it;
* a Slurm daemon is the sandbox's when its config (``-f``, else ``SLURM_CONF``) lies in a
  sandbox directory (``<dir>/etc/``, beside ``<dir>/run/sandbox.json``), or its parent is one;
* ``munged`` is the sandbox's when the key it reads is;
* a process running in another root (a sandbox's Debian root for another Slurm release) is
  never the host's.

The marker lives beside the sandbox directories, not in one: ``down --purge`` removes a
directory, while the key it recorded stays on the host. Every path is taken under
:attr:`Host.root` and the process list from :attr:`Host.procs`, so tests run on a fake root.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from slurmiso.errors import SandboxError

log = logging.getLogger(__name__)

#: What the sandbox created (or was told to adopt) on this host; kept across 'down --purge'.
HOST_MARKER = "/var/lib/slurmiso-sandbox-host.json"
MUNGE_KEY = "/etc/munge/munge.key"
#: Configs a real Slurm host has and the sandbox never writes (its own live in its dir).
SLURM_CONFS = ("/etc/slurm/slurm.conf", "/etc/slurm/slurmdbd.conf", "/etc/slurm-llnl/slurm.conf")
GUARDED_FILES = SLURM_CONFS + (MUNGE_KEY,)
SLURM_DAEMONS = ("slurmctld", "slurmd", "slurmdbd")
MUNGED = "munged"


@dataclass(frozen=True)
class Proc:
    """A running process as the guard judges it."""

    pid: int
    ppid: int
    name: str
    argv: Tuple[str, ...]
    #: ``SLURM_CONF`` from its environment ("" when absent or unreadable)
    env_conf: str = ""
    #: False when it runs in another root (chroot): not the host's daemon
    host_root: bool = True
    started: float = 0.0


def host_processes() -> List[Proc]:
    """Slurm and munge daemons on this host (psutil; unreadable details read as foreign)."""
    import psutil

    out: List[Proc] = []
    for p in psutil.process_iter(["pid", "ppid", "name", "cmdline", "create_time"]):
        name = p.info.get("name") or ""
        if name not in SLURM_DAEMONS + (MUNGED,):
            continue
        try:
            conf = p.environ().get("SLURM_CONF", "")
        except (psutil.Error, OSError):
            conf = ""
        try:
            in_host = os.readlink(f"/proc/{p.info['pid']}/root") == "/"
        except OSError:
            in_host = True  # cannot tell: judge it as the host's
        out.append(Proc(p.info["pid"], p.info.get("ppid") or 0, name,
                        tuple(p.info.get("cmdline") or ()), conf, in_host,
                        float(p.info.get("create_time") or 0.0)))
    return out


@dataclass
class Host:
    """The host the guard looks at: a root directory and its process list (tests fake both)."""

    root: str = "/"
    procs: Callable[[], List[Proc]] = field(default=host_processes)

    def path(self, p: str) -> str:
        return os.path.join(self.root, p.lstrip("/"))


@dataclass(frozen=True)
class Foreign:
    """One thing on the host the sandbox did not create."""

    what: str  # a path, or "slurmctld pid 812"
    why: str
    #: how to recognise it again once adopted: a file's SHA-256, or a process's start time
    key: str = ""
    proc: Optional[Proc] = None

    def describe(self) -> str:
        return f"{self.what} ({self.why})"


def file_digest(host: Host, path: str) -> Optional[str]:
    """SHA-256 of a guarded file; None when it does not exist, "" when it cannot be read."""
    try:
        with open(host.path(path), "rb") as fh:
            return hashlib.sha256(fh.read()).hexdigest()
    except FileNotFoundError:
        return None
    except OSError:
        return ""


def present(host: Host) -> Dict[str, str]:
    """Guarded file -> digest, for the files that exist."""
    digests = {p: file_digest(host, p) for p in GUARDED_FILES}
    return {p: d for p, d in digests.items() if d is not None}


def read_marker(host: Host) -> Dict[str, Any]:
    try:
        with open(host.path(HOST_MARKER), encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {"files": {}, "procs": {}}
    if not isinstance(data, dict):
        return {"files": {}, "procs": {}}
    data["files"] = data.get("files") if isinstance(data.get("files"), dict) else {}
    data["procs"] = data.get("procs") if isinstance(data.get("procs"), dict) else {}
    return data


def _write_marker(host: Host, data: Dict[str, Any]) -> None:
    from slurmiso.atomic import write_atomic

    data["version"] = 1
    path = host.path(HOST_MARKER)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n", mode=0o600)


def _recorded(marker: Dict[str, Any], path: str, digest: str) -> bool:
    entry = marker["files"].get(path)
    return bool(digest) and isinstance(entry, dict) and entry.get("sha256") == digest


def _sandbox_conf(host: Host, conf: str) -> bool:
    """Whether ``conf`` is a config in a sandbox directory (``<dir>/etc/<file>``)."""
    if not conf.startswith("/"):
        return False
    etc = os.path.dirname(os.path.normpath(conf))
    return (os.path.basename(etc) == "etc"
            and os.path.isfile(host.path(os.path.join(os.path.dirname(etc), "run",
                                                      "sandbox.json"))))


def _argv_value(argv: Sequence[str], *names: str) -> str:
    """The value of option ``names`` in ``argv`` (``-f X``, ``--key-file=X``), "" if absent."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if name.startswith("--") and arg.startswith(name + "="):
                return arg[len(name) + 1:]
    return ""


def _proc_foreign(host: Host, proc: Proc, marker: Dict[str, Any],
                  ours: Dict[int, bool]) -> str:
    """Why ``proc`` is not the sandbox's ("" when it is)."""
    adopted = marker["procs"].get(str(proc.pid))
    if isinstance(adopted, dict) and adopted.get("started") == proc.started:
        return ""
    if proc.name == MUNGED:
        key = _argv_value(proc.argv, "--key-file") or MUNGE_KEY
        if _recorded(marker, key, file_digest(host, key) or ""):
            return ""
        return f"reads {key}, which the sandbox did not create"
    conf = _argv_value(proc.argv, "-f") or proc.env_conf
    if conf and _sandbox_conf(host, conf):
        return ""
    if ours.get(proc.ppid):
        return ""
    return f"config {conf or '/etc/slurm/slurm.conf'}, not a sandbox's"


def scan(host: Host) -> List[Foreign]:
    """Everything on the host that says "a real cluster lives here" and is not the sandbox's."""
    marker = read_marker(host)
    found: List[Foreign] = []
    for path, digest in sorted(present(host).items()):
        if not _recorded(marker, path, digest):
            why = ("unreadable" if not digest else
                   f"the sandbox did not create it: no record in {HOST_MARKER}")
            found.append(Foreign(path, why, digest))
    procs = [p for p in host.procs() if p.host_root]
    ours: Dict[int, bool] = {}
    # parents first, so a daemon's helper (slurmctld's slurmscriptd) follows its parent
    for proc in sorted(procs, key=lambda p: (p.started, p.pid)):
        why = _proc_foreign(host, proc, marker, ours)
        ours[proc.pid] = not why
        if why:
            found.append(Foreign(f"{proc.name} pid {proc.pid}", why, str(proc.started), proc))
    return found


def check_host(host: Host, force: bool = False) -> Dict[str, str]:
    """Refuse (SandboxError) when the host has a Slurm or munge setup the sandbox did not
    create; with ``force``, record those as the sandbox's and go on. Returns the guarded files
    present now, for :func:`record_created` after ``up`` has run its steps."""
    foreign = scan(host)
    if foreign and not force:
        raise SandboxError(
            "this host has a Slurm or munge setup the sandbox did not create: "
            + "; ".join(f.describe() for f in foreign),
            hint="the sandbox apt-installs Slurm, MariaDB and munge, shares "
            f"{MUNGE_KEY} and starts daemons as root: run it on a scratch machine. On a "
            "machine that is only ever a sandbox host, 'slurmiso sandbox up --force' runs "
            f"anyway and records these as the sandbox's in {HOST_MARKER}")
    if foreign:
        adopt(host, foreign)
    return present(host)


def adopt(host: Host, foreign: Sequence[Foreign]) -> None:
    """Record ``foreign`` as the sandbox's (``up --force``): later runs accept them as they
    are now; a changed file or a restarted foreign daemon is foreign again."""
    marker = read_marker(host)
    for f in foreign:
        if f.proc is not None:
            marker["procs"][str(f.proc.pid)] = {"name": f.proc.name, "started": f.proc.started,
                                               "how": "adopted"}
        elif f.key:
            marker["files"][f.what] = {"sha256": f.key, "how": "adopted"}
        log.warning("sandbox up --force: adopting %s", f.describe())
    _write_marker(host, marker)


def record_created(host: Host, before: Dict[str, str]) -> List[str]:
    """Record the guarded files that appeared since ``before`` (``up``'s own steps made them:
    apt's munge postinst, or ``mungekey``); returns their paths."""
    marker = read_marker(host)
    made = [p for p, d in present(host).items()
            if p not in before and d and not _recorded(marker, p, d)]
    for p in made:
        marker["files"][p] = {"sha256": file_digest(host, p), "how": "created"}
    if made:
        _write_marker(host, marker)
    return made
