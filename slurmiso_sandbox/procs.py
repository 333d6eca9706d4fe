"""Process plumbing for the sandbox: bounded commands, pid files, waits, log tails.

Every external command runs by absolute path with a timeout, and every failure becomes a
:class:`~slurmiso.errors.SandboxError` that names what failed and shows the end of the log
that explains it, so ``sandbox up`` never ends in a traceback or a hang.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import (
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
)

from slurmiso.errors import SandboxError

log = logging.getLogger(__name__)


T = TypeVar("T")


def tail(path: str | Path, lines: int = 15) -> str:
    """Last ``lines`` lines of a log file ("" when it does not exist)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(0, fh.tell() - 16384))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def with_tail(message: str, logfile: str | Path | None) -> str:
    body = tail(logfile) if logfile else ""
    return f"{message}\n--- last lines of {logfile} ---\n{body}" if body else message


def run(
    argv: Sequence[str],
    *,
    env: Optional[Mapping[str, str]] = None,
    timeout: float = 60,
    check: bool = True,
    input: Optional[str] = None,
    logfile: str | Path | None = None,
) -> subprocess.CompletedProcess:
    """Run a command to completion; a non-zero exit (when ``check``) is a SandboxError."""
    log.debug("run: %s", " ".join(argv))
    try:
        cp = subprocess.run(
            list(argv), env=dict(env) if env is not None else None, input=input,
            capture_output=True, text=True, timeout=timeout,
            stdin=None if input is not None else subprocess.DEVNULL,
        )
    except FileNotFoundError as exc:
        raise SandboxError(f"{argv[0]} is not installed") from exc
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(with_tail(f"'{' '.join(argv)}' timed out after {timeout:g}s",
                                     logfile)) from exc
    if check and cp.returncode != 0:
        out = (cp.stderr or cp.stdout).strip()
        raise SandboxError(with_tail(
            f"'{' '.join(argv)}' failed (exit {cp.returncode}): {out}", logfile))
    return cp


def spawn(argv: Sequence[str], *, env: Mapping[str, str], logfile: str | Path) -> int:
    """Start a foreground daemon detached from us (own session, output to ``logfile``)."""
    log.debug("spawn: %s", " ".join(argv))
    with open(logfile, "ab") as out:
        proc = subprocess.Popen(
            list(argv), env=dict(env), stdin=subprocess.DEVNULL, stdout=out, stderr=out,
            start_new_session=True, close_fds=True,
        )
    return proc.pid


def read_pid(pidfile: str | Path) -> Optional[int]:
    try:
        return int(Path(pidfile).read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def process_matches(pid: int, names: Iterable[str], needles: Sequence[str] = (),
                    env: Optional[Tuple[str, str]] = None) -> bool:
    """Whether ``pid`` is alive, is one of ``names``, has every needle in its argv and,
    if ``env`` is given, that variable set to that value.

    Pid files outlive crashes and pids are reused: these checks keep ``up`` from mistaking an
    unrelated process (or another sandbox's daemon) for one of ours.
    """
    import psutil

    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        cmd = proc.cmdline()
        base = os.path.basename(cmd[0]) if cmd else ""
        if proc.name() not in names and base not in names:
            return False
        line = " ".join(cmd)
        if not all(n in line for n in needles):
            return False
        return env is None or has_env(pid, *env)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def has_env(pid: int, key: str, value: str) -> bool:
    """Whether ``pid``'s environment holds ``key=value``.

    Reads /proc directly: daemons that set their process title (slurmstepd) overwrite the
    start of their environment block, which psutil's parser then gives up on.
    """
    try:
        with open(f"/proc/{pid}/environ", "rb") as fh:
            entries = fh.read().split(b"\0")
    except OSError:
        return False
    return f"{key}={value}".encode() in entries


def wait_until(
    what: str, ok: Callable[[], T], *, timeout: float, logfile: str | Path | None = None,
    interval: float = 0.2, alive: Optional[Callable[[], bool]] = None,
) -> T:
    """The sandbox's one poll: ``ok()``'s first truthy value; fail early when ``alive`` says
    the daemon died, and after ``timeout`` (a hang guard) naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        got = ok()
        if got:
            return got
        if alive is not None and not alive():
            raise SandboxError(with_tail(f"{what}: the daemon exited", logfile))
        if time.monotonic() > deadline:
            raise SandboxError(with_tail(f"{what}: not ready after {timeout:g}s", logfile))
        time.sleep(interval)


def terminate(pids: Sequence[int], *, timeout: float = 15) -> List[int]:
    """SIGTERM, wait, then SIGKILL; returns the pids that had to be killed."""
    import psutil

    procs = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
            p.send_signal(signal.SIGTERM)
            procs.append(p)
        except psutil.NoSuchProcess:
            continue
    _gone, alive = psutil.wait_procs(procs, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(alive, timeout=5)
    return [p.pid for p in alive]


@contextmanager
def file_lock(path: str, what: str, timeout: float = 300) -> Iterator[None]:
    """Hold an exclusive flock on ``path``: one ``up``/``down`` at a time per sandbox."""
    from slurmiso.state.lock import FileLock, LockTimeout

    os.makedirs(os.path.dirname(path), exist_ok=True)
    lock = FileLock(path, timeout=timeout)
    try:
        lock.acquire()
    except LockTimeout:
        raise SandboxError(f"{what}: {path} stayed locked for {timeout:g}s "
                           "(another 'slurmiso sandbox' command is running)") from None
    try:
        yield
    finally:
        lock.release()


def environ_with(extra: Dict[str, str]) -> Dict[str, str]:
    """A minimal, predictable environment for daemons and clients."""
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "LANG": "C.UTF-8",
        "HOME": os.environ.get("HOME", "/root"),
    }
    env.update(extra)
    return env
