"""Starting, finding and stopping one MPS control daemon per GPU.

:class:`MpsControl` is the narrow interface the MPS handler needs. :class:`NvidiaMpsControl`
drives NVIDIA's ``nvidia-cuda-mps-control``; :class:`SimMpsControl` drives
:mod:`slurmiso.isolation.mps_sim`, a real detached daemon, on simulated nodes.
:func:`mps_control_for` picks one from the GPU backend.

Facts from NVIDIA's MPS documentation this relies on: ``nvidia-cuda-mps-control -d`` starts
the daemon in the background for the GPUs in ``CUDA_VISIBLE_DEVICES`` (UUIDs avoid index
remapping ambiguity), communicating through ``CUDA_MPS_PIPE_DIRECTORY`` and logging to
``CUDA_MPS_LOG_DIRECTORY``; it writes ``nvidia-cuda-mps-control.pid`` into the pipe directory;
``echo quit | nvidia-cuda-mps-control`` (same pipe directory) shuts it down and
``get_server_list`` lists the pids of its ``nvidia-cuda-mps-server`` instances.

Limits: a client's ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` / ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``
can only narrow what the control daemon allows, and it allows everything by default. So
:meth:`MpsControl.set_limits` gives the daemon ``set_default_active_thread_percentage`` and
``set_default_device_pinned_mem_limit`` right after it starts, before any server exists (a
default applies to servers started afterwards), and reads them back: a daemon that does not
confirm them is a node fault, never a job that runs unlimited.

Who the daemon is, root alone says. The pipe directory is handed to the job's user once the
daemon holds its limits, and from then on everything in it (the pid file, the control socket)
is that user's to rewrite or swap. So :func:`remember` writes the daemon's pid and start time
beside the pipe directory, in its root-owned parent, while the directory is still root's;
:meth:`MpsControl.running` believes only that record, checked against the live process (start
time, command line, owner, pipe directory), and finds an unrecorded daemon (a prolog killed
between start and record) from the process table, never from the pipe directory. Commands go
through the control socket only while it is still the root-owned socket the daemon made; stop
ends the verified pid with signals whatever the socket does.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import stat
import subprocess
import sys
import time
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Protocol

import psutil

from slurmiso.atomic import write_atomic
from slurmiso.errors import NodeFault
from slurmiso.isolation import mps_sim
from slurmiso.isolation.mps_dirs import PRIVATE_MODE, has_leftovers

if TYPE_CHECKING:
    from slurmiso.gpu.backend import GpuInventory
    from slurmiso.isolation.mps_protocol import MpsProtocol
from slurmiso.isolation.processes import end_processes
from slurmiso.pids import start_ticks

log = logging.getLogger(__name__)

#: Where distributions and the CUDA toolkit put the binary; absolute because hooks get no PATH.
NVIDIA_BINARIES = (
    "/usr/bin/nvidia-cuda-mps-control",
    "/usr/local/cuda/bin/nvidia-cuda-mps-control",
)
NVIDIA_PID_FILE = "nvidia-cuda-mps-control.pid"
#: The control socket both daemons make in the pipe directory (as root, before hand-over).
CONTROL_SOCKET = "control"
#: Root's record of the daemon, beside (never inside) its pipe directory.
IDENTITY_SUFFIX = ".daemon"
#: The daemon inherits only this plus the MPS variables: never the hook's environment.
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}
START_TIMEOUT_S = 10.0
COMMAND_TIMEOUT_S = 10.0
#: The daemon serves one GPU (``CUDA_VISIBLE_DEVICES`` = its UUID), which is its device 0.
DEVICE = 0
#: More entries than a daemon makes: the job's user filled the directory; signals, then.
_MAX_PIPE_ENTRIES = 256
_PID_LIMIT = 1 << 23  # above Linux's pid_max ceiling (4194304)
_NUMBER_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(G|GB|GiB|M|MB|MiB)?(?![A-Za-z])")


class MpsControl(Protocol):
    """One MPS control daemon per pipe directory."""

    name: str

    def start(self, gpu_uuid: str, pipe_dir: str, log_dir: str, protocol: int = 2,
              multiuser: bool = False, static_sms: int = 0) -> int:
        """Start a daemon serving only ``gpu_uuid``; return its pid once it is reachable.
        ``protocol`` 3: MPS v3 (``-p 3``), where :meth:`protocol` says the binary has it.
        ``static_sms``: static SM partitions (``-S``) on a GPU of that many SMs."""

    def sm_partition(self, pipe_dir: str, gpu_uuid: str, chunks: int) -> str:
        """A static SM partition of ``chunks`` (``sm_partition add``): its full ID, as a
        client names it in ``CUDA_MPS_SM_PARTITION``; NodeFault when refused."""

    def stop(self, pipe_dir: str, timeout: float) -> None:
        """Ask the daemon to quit, then SIGTERM/SIGKILL it; no daemon is fine."""

    def running(self, pipe_dir: str) -> Optional[int]:
        """Pid of the live daemon of ``pipe_dir``, None if there is none (or only a corpse)."""

    def servers(self, pipe_dir: str) -> List[int]:
        """Pids of the daemon's MPS servers (best effort: [] when it cannot tell)."""

    def set_limits(self, pipe_dir: str, thread_percentage: int, memory_limit_mb: int) -> None:
        """Make the limits every server of this daemon starts with; NodeFault unless confirmed.

        ``memory_limit_mb`` 0 means no pinned-memory limit.
        """

    def protocol(self) -> MpsProtocol:
        """Whether this node's control binary speaks MPS v3, read from it."""

    def v3(self, pipe_dir: str, argv: List[str]) -> str:
        """One MPS v3 verb (``server create NAME``...) to a ``-p 3`` daemon: its output;
        NodeFault when it fails."""


def mps_control_for(backend: GpuInventory) -> MpsControl:
    """The daemon implementation that matches a GPU backend: simulated GPUs get the sim."""
    if backend.capabilities.simulated:
        return SimMpsControl()
    return NvidiaMpsControl()


_PARTITION_RE = re.compile(r"GPU-[0-9A-Za-z-]+/[0-9A-Za-z+=_-]+")


def _partition_id(answer: str) -> str:
    """The full partition ID in ``sm_partition add``'s answer (NVIDIA documents a bare
    ``GPU-.../<id>`` line; some drivers print it inside a sentence)."""
    found = _PARTITION_RE.search(answer)
    if found is None:
        raise NodeFault(f"sm_partition add answered no partition ID: {answer.strip()[:200]}")
    return found.group(0)


def _package_root() -> str:
    """Where this slurmiso is, for the stand-in's own interpreter (a root sandbox's Python
    has slurmiso only on its path)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(mps_sim.__file__)))


def _protocol_args(protocol: int, multiuser: bool) -> List[str]:
    """``-p 3`` selects MPS v3; ``-m`` its multi-user mode (root's servers for every uid)."""
    if protocol != 3:
        return []
    return ["-p", "3", *(["-m"] if multiuser else [])]


def _read_pid(path: str) -> Optional[int]:
    """The pid in a daemon's pid file, read without trusting the file.

    The pipe directory belongs to the job's user, who can put a symlink, a FIFO (an open
    that never returns) or a huge file there: no symlink is followed, nothing but a regular
    file is read, and only its first bytes.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        text = os.read(fd, 32).decode("ascii", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return int(text) if text.isdigit() and 0 < int(text) < _PID_LIMIT else None


def _ours(pid: int, pipe_dir: Optional[str] = None) -> bool:
    """Whether ``pid`` runs as us (a daemon we started) and, if given, serves ``pipe_dir``.

    A user who owns the pipe directory can write any pid into its pid file, e.g. another
    user's daemon: stopping "the daemon" must never reach a process that is not this one.
    """
    try:
        proc = psutil.Process(pid)
        if proc.uids().real != os.geteuid():
            return False
        if pipe_dir is None:
            return True
        return proc.environ().get("CUDA_MPS_PIPE_DIRECTORY") == pipe_dir
    except psutil.Error:
        return False


def _live_cmdline(pid: int) -> Optional[List[str]]:
    """The command line of a live (non-zombie) process, None if it is gone."""
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return None
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        return []  # alive, but not ours to inspect


def _serves(server: int, daemon: int, pipe_dir: str) -> bool:
    """Whether an MPS server pid is this daemon's: its child, or started for its pipe dir.

    The pid list comes through a socket in a directory the job's user owns; a server of
    another daemon (another user's) must never be killed on its word.
    """
    try:
        proc = psutil.Process(server)
        if proc.ppid() == daemon:
            return True
        return proc.environ().get("CUDA_MPS_PIPE_DIRECTORY") == pipe_dir
    except psutil.Error:
        return False


def _wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _live_cmdline(pid) is not None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _read_number(answer: str, unit_mb: bool) -> Optional[float]:
    """The first number of a control answer, in MiB when ``unit_mb`` (a bare number is MiB)."""
    m = _NUMBER_RE.search(answer)
    if not m:
        return None
    value = float(m.group(1))
    if unit_mb and (m.group(2) or "M").upper().startswith("G"):
        value *= 1024
    return value


def apply_limits(
    send: Callable[[str], str], where: str, thread_percentage: int, memory_limit_mb: int
) -> None:
    """Set the daemon-wide defaults through ``send`` (one command -> answer), then verify them.

    Shared by the NVIDIA and the simulated daemon so both are held to the same check.
    """
    if not 0 < thread_percentage <= 100 or memory_limit_mb < 0:
        raise NodeFault(f"MPS limits out of range for {where}: threads {thread_percentage}%, "
                        f"pinned memory {memory_limit_mb} MiB")
    send(f"set_default_active_thread_percentage {thread_percentage}")
    got = _read_number(send("get_default_active_thread_percentage"), unit_mb=False)
    problems = []
    if got is None or abs(got - thread_percentage) > 0.01:
        problems.append(f"active thread percentage {got} instead of {thread_percentage}")
    if memory_limit_mb:
        send(f"set_default_device_pinned_mem_limit {DEVICE} {memory_limit_mb}M")
        mem = _read_number(send(f"get_default_device_pinned_mem_limit {DEVICE}"), unit_mb=True)
        if mem is None or abs(mem - memory_limit_mb) > 0.5:
            problems.append(f"pinned memory limit {mem} MiB instead of {memory_limit_mb} MiB")
    if problems:
        raise NodeFault(
            f"the MPS control daemon of {where} did not take its limits: {'; '.join(problems)}",
            hint="server-side MPS limits need a Volta or newer GPU and a driver whose "
            "nvidia-cuda-mps-control knows set_default_active_thread_percentage and "
            "set_default_device_pinned_mem_limit; use another pool mode on this node",
        )


def _kill_if_alive(pid: int, what: str, grace_s: float = 3.0) -> None:
    if _live_cmdline(pid) is not None:
        log.warning("%s pid %d did not quit; sending SIGTERM, then SIGKILL", what, pid)
        end_processes([pid], grace_s)


def identity_path(pipe_dir: str) -> str:
    """Root's record of ``pipe_dir``'s daemon: a file beside the pipe directory, in its parent
    (root-owned 0755 in the state dir's layout), where the job's user cannot write."""
    return os.path.abspath(pipe_dir).rstrip("/") + IDENTITY_SUFFIX


def _root_only_dir(path: str) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid() and not st.st_mode & 0o022


def remember(pipe_dir: str, pid: int) -> None:
    """Record ``pid`` (and its start time) as the daemon of ``pipe_dir``; NodeFault if the
    record cannot be made where only root writes: a daemon root cannot name again would leak."""
    where = identity_path(pipe_dir)
    ticks = start_ticks(pid)
    if ticks is None or not _root_only_dir(os.path.dirname(where)):
        raise NodeFault(
            f"cannot record MPS control daemon pid {pid}: it is gone, or {os.path.dirname(where)} "
            "is not a directory only root may write",
            hint="the state dir must be root's (see the admin guide, state dir)",
        )
    try:
        write_atomic(where, json.dumps({"pid": pid, "start": ticks}) + "\n", mode=0o600)
    except OSError as exc:
        raise NodeFault(f"cannot record MPS control daemon pid {pid} in {where}: "
                        f"{exc.strerror or exc}") from None


def remembered(pipe_dir: str) -> Optional[int]:
    """The pid root recorded for ``pipe_dir``'s daemon, if that very process still lives.

    The record counts only as a regular file of root's in a directory only root writes, and
    only while the pid's start time is the recorded one (a reused pid is another process).
    """
    where = identity_path(pipe_dir)
    if not _root_only_dir(os.path.dirname(where)):
        return None
    try:
        fd = os.open(where, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
            return None
        data = json.loads(os.read(fd, 256).decode("ascii"))
        pid, ticks = int(data["pid"]), int(data["start"])
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)
    if not 0 < pid < _PID_LIMIT or start_ticks(pid) != ticks:
        return None
    return pid


def forget(pipe_dir: str) -> None:
    with contextlib.suppress(OSError):
        os.unlink(identity_path(pipe_dir))


def has_record(pipe_dir: str) -> bool:
    return os.path.lexists(identity_path(pipe_dir))


def _find_in_process_table(matches: Callable[[int, List[str]], bool]) -> Optional[int]:
    """A live process of ours that ``matches`` (pid, cmdline): how root finds a daemon it
    started but never recorded. Only what the kernel says about the process is read."""
    me = os.geteuid()
    for proc in psutil.process_iter(["pid", "uids", "cmdline", "status"]):
        try:
            info = proc.info
            if (info["uids"] is None or info["uids"].real != me
                    or info["status"] == psutil.STATUS_ZOMBIE):
                continue
            if matches(info["pid"], info["cmdline"] or []):
                return int(info["pid"])
        except psutil.Error:
            continue
    return None


def control_socket_ok(pipe_dir: str, required: bool = False) -> bool:
    """Whether root may talk to the daemon through ``pipe_dir``: it is a real directory with no
    symlink in it, and its control socket, if there, is still the one root's daemon made.

    The job's user owns the directory and may plant a symlink to another daemon's socket
    (another user's): root must never carry its commands (``quit``) to whatever that names.
    ``required``: the socket must be there (the simulated daemon's name is known for sure).
    """
    seen = not required
    try:
        if not stat.S_ISDIR(os.lstat(pipe_dir).st_mode):
            return False
        with os.scandir(pipe_dir) as entries:
            for n, entry in enumerate(entries):
                if n >= _MAX_PIPE_ENTRIES or entry.is_symlink():
                    return False
                if entry.name == CONTROL_SOCKET:
                    st = entry.stat(follow_symlinks=False)
                    if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
                        return False
                    seen = True
    except OSError:
        return False
    return seen


def take_back(pipe_dir: str) -> None:
    """Make the pipe directory root's again (0700) before root talks through it to stop the
    daemon: checked and then used by name, a directory the job's user still owned could have
    a symlink swapped in between the check and the client's connect. A symlink where the
    directory was is left alone (the check after refuses it)."""
    try:
        if stat.S_ISDIR(os.lstat(pipe_dir).st_mode):
            os.chown(pipe_dir, os.geteuid(), -1, follow_symlinks=False)
            os.chmod(pipe_dir, PRIVATE_MODE)  # the parent is root's: the dir cannot be swapped
    except (OSError, NotImplementedError) as exc:
        log.warning("cannot take back %s before stopping its daemon: %s", pipe_dir, exc)


def _children(pid: int) -> List[int]:
    try:
        return [c.pid for c in psutil.Process(pid).children()]
    except psutil.Error:
        return []


def _running(pipe_dir: str, is_daemon: Callable[[int, List[str], str], bool]) -> Optional[int]:
    """The live daemon of ``pipe_dir``: root's record, checked against the process; else, where
    there is no record but the daemon's files are there (a prolog killed between start and
    record, while the directory was still root's), the process table. Never the pid file."""
    pid = remembered(pipe_dir)
    if pid is not None:
        cmd = _live_cmdline(pid)
        return pid if cmd and is_daemon(pid, cmd, pipe_dir) else None
    if has_record(pipe_dir):
        return None  # the recorded daemon is gone (or its pid was reused)
    if not has_leftovers(pipe_dir):
        return None
    return _find_in_process_table(lambda p, cmd: is_daemon(p, cmd, pipe_dir))


def _remember_or_end(pipe_dir: str, pid: int, what: str) -> None:
    """Record a daemon just started; one root could not record is ended, not left running."""
    try:
        remember(pipe_dir, pid)
    except NodeFault:
        _kill_if_alive(pid, what, grace_s=1.0)
        raise


class NvidiaMpsControl:
    """NVIDIA's ``nvidia-cuda-mps-control``; nothing is looked up until a method runs."""

    name = "nvidia"

    def __init__(
        self, binary: Optional[str] = None, start_timeout: float = START_TIMEOUT_S
    ) -> None:
        self._binary_override = binary
        self.start_timeout = start_timeout

    def binary(self) -> str:
        candidates = (self._binary_override,) if self._binary_override else NVIDIA_BINARIES
        for path in candidates:
            if path and os.access(path, os.X_OK):
                return path
        looked = ", ".join(c for c in candidates if c)
        raise NodeFault(
            f"nvidia-cuda-mps-control not found (looked in {looked})",
            hint="install the CUDA MPS package (nvidia-compute-utils / nvidia-utils for the "
            "installed driver) on this MPS node",
        )

    def protocol(self) -> MpsProtocol:
        from slurmiso.isolation.mps_protocol import MpsProtocol, read_protocol

        try:
            binary = self.binary()
        except NodeFault as exc:
            return MpsProtocol(False, str(exc))
        return read_protocol([binary])

    def _env(self, pipe_dir: str, log_dir: str = "", gpu_uuid: str = "") -> Dict[str, str]:
        env = dict(CLEAN_ENV, CUDA_MPS_PIPE_DIRECTORY=pipe_dir)
        if log_dir:
            env["CUDA_MPS_LOG_DIRECTORY"] = log_dir
        if gpu_uuid:
            env["CUDA_VISIBLE_DEVICES"] = gpu_uuid
        return env

    def _client_env(self, pipe_dir: str) -> Dict[str, str]:
        """The env the daemon was started with (as root we can read it), for client calls."""
        pid = self.running(pipe_dir)
        daemon_env: Dict[str, str] = {}
        if pid:
            with contextlib.suppress(psutil.Error):
                daemon_env = psutil.Process(pid).environ()
        return self._env(
            pipe_dir,
            daemon_env.get("CUDA_MPS_LOG_DIRECTORY", ""),
            daemon_env.get("CUDA_VISIBLE_DEVICES", ""),
        )

    def _command(self, pipe_dir: str, command: str, timeout: float) -> str:
        """Send one command through the control client, as ``echo CMD | ...control`` does."""
        if not control_socket_ok(pipe_dir):
            log.warning("not sending '%s' to %s: its control socket is not the daemon's",
                        command, pipe_dir)
            return ""
        result = subprocess.run(
            [self.binary()],
            input=command + "\n",
            env=self._client_env(pipe_dir),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if result.returncode != 0:
            log.warning(
                "'%s' to MPS control of %s failed (exit %d): %s",
                command, pipe_dir, result.returncode, result.stderr.strip(),
            )
        return result.stdout

    def _strict_command(self, pipe_dir: str, command: str) -> str:
        """A command whose failure is a node fault (limits must not be skipped silently)."""
        if not control_socket_ok(pipe_dir):
            raise NodeFault(f"'{command}' not sent: the control socket in {pipe_dir} is not "
                            "the MPS control daemon's")
        try:
            result = subprocess.run(
                [self.binary()], input=command + "\n", env=self._client_env(pipe_dir),
                capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NodeFault(f"'{command}' to the MPS control daemon of {pipe_dir} failed: "
                            f"{exc}") from None
        if result.returncode != 0:
            raise NodeFault(
                f"'{command}' to the MPS control daemon of {pipe_dir} failed (exit "
                f"{result.returncode}): {(result.stderr or result.stdout).strip()[:300]}"
            )
        return result.stdout

    def set_limits(self, pipe_dir: str, thread_percentage: int, memory_limit_mb: int) -> None:
        apply_limits(lambda cmd: self._strict_command(pipe_dir, cmd), pipe_dir,
                     thread_percentage, memory_limit_mb)

    def v3(self, pipe_dir: str, argv: List[str]) -> str:
        binary = self.binary()
        try:
            cp = subprocess.run([binary, *argv], env=self._env(pipe_dir),
                                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=COMMAND_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NodeFault(f"{binary} {' '.join(argv)}: {exc}") from None
        if cp.returncode != 0:
            raise NodeFault(f"{binary} {' '.join(argv)} failed (exit {cp.returncode}): "
                            f"{(cp.stderr or cp.stdout).strip()[:300]}")
        return cp.stdout

    def sm_partition(self, pipe_dir: str, gpu_uuid: str, chunks: int) -> str:
        return _partition_id(self._strict_command(pipe_dir,
                                                  f"sm_partition add {gpu_uuid} {chunks}"))

    def start(self, gpu_uuid: str, pipe_dir: str, log_dir: str, protocol: int = 2,
              multiuser: bool = False, static_sms: int = 0) -> int:
        binary = self.binary()
        try:
            result = subprocess.run(
                [binary, "-d", *_protocol_args(protocol, multiuser),
                 *(["-S"] if static_sms else [])],
                env=self._env(pipe_dir, log_dir, gpu_uuid),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.start_timeout,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NodeFault(f"cannot run {binary} -d for GPU {gpu_uuid}: {exc}") from None
        if result.returncode != 0:
            raise NodeFault(
                f"{binary} -d failed for GPU {gpu_uuid} (exit {result.returncode}): "
                f"{(result.stderr or result.stdout).strip()[:300]}",
                hint=f"see {os.path.join(log_dir, 'control.log')}",
            )
        deadline = time.monotonic() + self.start_timeout
        while True:
            # The pipe directory is still root's (hand-over comes after the limits): its pid
            # file can be believed this once, and what it says is recorded where root alone
            # writes.
            pid = self._from_pid_file(pipe_dir)
            if pid is not None:
                _remember_or_end(pipe_dir, pid, "MPS control daemon")
                return pid
            if time.monotonic() >= deadline:
                raise NodeFault(
                    f"MPS control daemon for GPU {gpu_uuid} did not come up within "
                    f"{self.start_timeout:g}s (no live pid in {pipe_dir}/{NVIDIA_PID_FILE})",
                    hint=f"see {os.path.join(log_dir, 'control.log')}",
                )
            time.sleep(0.05)

    @staticmethod
    def _is_daemon(pid: int, cmd: List[str], pipe_dir: str) -> bool:
        """A control daemon of ours started for ``pipe_dir`` (its environment says so)."""
        return any("nvidia-cuda-mps-control" in part for part in cmd[:2]) and _ours(
            pid, pipe_dir)

    def _from_pid_file(self, pipe_dir: str) -> Optional[int]:
        pid = _read_pid(os.path.join(pipe_dir, NVIDIA_PID_FILE))
        cmd = _live_cmdline(pid) if pid is not None else None
        return pid if pid is not None and cmd and self._is_daemon(pid, cmd, pipe_dir) else None

    def running(self, pipe_dir: str) -> Optional[int]:
        return _running(pipe_dir, self._is_daemon)

    def servers(self, pipe_dir: str) -> List[int]:
        pid = self.running(pipe_dir)
        if pid is None:
            return []
        listed: List[int] = []
        if control_socket_ok(pipe_dir):
            try:
                out = self._command(pipe_dir, "get_server_list", 5.0)
                listed = [int(w) for w in out.split() if w.isdigit()]
            except (OSError, subprocess.TimeoutExpired, NodeFault) as exc:
                log.warning("cannot list MPS servers of %s: %s", pipe_dir, exc)
        return sorted(set(listed) | set(_children(pid)))

    def stop(self, pipe_dir: str, timeout: float) -> None:
        pid = self.running(pipe_dir)
        if pid is None:
            forget(pipe_dir)
            return
        take_back(pipe_dir)
        servers = self.servers(pipe_dir)
        if control_socket_ok(pipe_dir):
            try:
                self._command(pipe_dir, "quit", timeout)
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("'quit' to MPS control daemon pid %d failed: %s", pid, exc)
            if not _wait_gone(pid, timeout):
                _kill_if_alive(pid, "MPS control daemon")
        else:
            log.warning("the control socket in %s is not the daemon's any more; ending MPS "
                        "control daemon pid %d with signals", pipe_dir, pid)
            _kill_if_alive(pid, "MPS control daemon")
        for server in servers:  # a server outliving its daemon holds the GPU for nobody
            cmd = _live_cmdline(server)
            if cmd and any("nvidia-cuda-mps-server" in part for part in cmd[:2]) and (
                _serves(server, pid, pipe_dir)
            ):
                _kill_if_alive(server, "orphaned MPS server")
        if _live_cmdline(pid) is None:
            forget(pipe_dir)


class SimMpsControl:
    """Runs :mod:`slurmiso.isolation.mps_sim` the way ``nvidia-cuda-mps-control -d`` runs."""

    name = "sim"
    _MODULE = "slurmiso.isolation.mps_sim"

    def __init__(
        self, python: str = sys.executable, start_timeout: float = START_TIMEOUT_S
    ) -> None:
        self.python = python
        self.start_timeout = start_timeout

    def protocol(self) -> MpsProtocol:
        from slurmiso.isolation.mps_protocol import read_protocol

        return read_protocol([self.python, "-m", self._MODULE],
                             {"PYTHONPATH": _package_root()})

    def v3(self, pipe_dir: str, argv: List[str]) -> str:
        try:
            rc, out = mps_sim.v3_command(pipe_dir, argv)
        except OSError as exc:
            raise NodeFault(f"simulated MPS daemon of {pipe_dir}: {exc}") from None
        if rc != 0:
            raise NodeFault(f"simulated MPS v3 {' '.join(argv)}: {out.strip()[:300]}")
        return out

    def sm_partition(self, pipe_dir: str, gpu_uuid: str, chunks: int) -> str:
        try:
            answer = mps_sim.send_command(pipe_dir, f"sm_partition add {gpu_uuid} {chunks}")
        except OSError as exc:
            raise NodeFault(f"simulated MPS daemon of {pipe_dir}: {exc}") from None
        return _partition_id(answer)

    def start(self, gpu_uuid: str, pipe_dir: str, log_dir: str, protocol: int = 2,
              multiuser: bool = False, static_sms: int = 0) -> int:
        pipe_dir, log_dir = os.path.abspath(pipe_dir), os.path.abspath(log_dir)
        env = dict(
            CLEAN_ENV,
            PYTHONPATH=_package_root(),
            CUDA_VISIBLE_DEVICES=gpu_uuid,
            CUDA_MPS_PIPE_DIRECTORY=pipe_dir,
            CUDA_MPS_LOG_DIRECTORY=log_dir,
        )
        cmd = [self.python, "-m", self._MODULE, "--pipe-dir", pipe_dir, "--log-dir", log_dir,
               "--gpu-uuid", gpu_uuid, *_protocol_args(protocol, multiuser),
               *(["-S", "--sm-count", str(static_sms)] if static_sms else [])]
        try:
            result = subprocess.run(
                cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                timeout=self.start_timeout, check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise NodeFault(
                f"cannot start simulated MPS daemon for GPU {gpu_uuid}: {exc}"
            ) from None
        pid = self._from_pid_file(pipe_dir)  # still root's directory: see NvidiaMpsControl
        if result.returncode != 0 or pid is None:
            raise NodeFault(
                f"simulated MPS daemon for GPU {gpu_uuid} did not start "
                f"(exit {result.returncode}): {result.stderr.strip()[:300]}",
                hint=f"see {os.path.join(log_dir, mps_sim.LOG_FILE)}",
            )
        _remember_or_end(pipe_dir, pid, "simulated MPS control daemon")
        return pid

    def _is_daemon(self, pid: int, cmd: List[str], pipe_dir: str) -> bool:
        want = os.path.abspath(pipe_dir)
        args = list(zip(cmd, cmd[1:]))
        return (self._MODULE in cmd and ("--pipe-dir", want) in args) and _ours(pid)

    def _from_pid_file(self, pipe_dir: str) -> Optional[int]:
        pid = _read_pid(os.path.join(pipe_dir, mps_sim.PID_FILE))
        cmd = _live_cmdline(pid) if pid is not None else None
        return pid if pid is not None and cmd and self._is_daemon(pid, cmd, pipe_dir) else None

    def running(self, pipe_dir: str) -> Optional[int]:
        return _running(pipe_dir, self._is_daemon)

    def servers(self, pipe_dir: str) -> List[int]:
        if self.running(pipe_dir) is None or not control_socket_ok(pipe_dir, required=True):
            return []
        try:
            out = mps_sim.send_command(pipe_dir, "get_server_list")
        except OSError as exc:
            log.warning("cannot list MPS servers of %s: %s", pipe_dir, exc)
            return []
        return [int(w) for w in out.split() if w.isdigit()]

    def set_limits(self, pipe_dir: str, thread_percentage: int, memory_limit_mb: int) -> None:
        def send(command: str) -> str:
            try:
                answer = mps_sim.send_command(pipe_dir, command, COMMAND_TIMEOUT_S)
            except OSError as exc:
                raise NodeFault(f"'{command}' to the simulated MPS daemon of {pipe_dir} "
                                f"failed: {exc}") from None
            if answer.startswith("error"):
                raise NodeFault(f"simulated MPS daemon of {pipe_dir} refused '{command}': "
                                f"{answer.strip()}")
            return answer

        apply_limits(send, pipe_dir, thread_percentage, memory_limit_mb)

    def stop(self, pipe_dir: str, timeout: float) -> None:
        pid = self.running(pipe_dir)
        if pid is not None:
            quit_sent = False
            take_back(pipe_dir)
            if control_socket_ok(pipe_dir, required=True):
                try:
                    mps_sim.send_command(pipe_dir, "quit", timeout)
                    quit_sent = True
                except OSError as exc:
                    log.warning("'quit' to simulated MPS daemon pid %d failed: %s", pid, exc)
            else:
                log.warning("the control socket in %s is not the daemon's any more; ending "
                            "simulated MPS control daemon pid %d with signals", pipe_dir, pid)
            if not quit_sent or not _wait_gone(pid, timeout):
                _kill_if_alive(pid, "simulated MPS control daemon")
            if _live_cmdline(pid) is not None:
                return  # it survived: keep its record so the caller sees it still running
        forget(pipe_dir)
        # A daemon killed -9 leaves its socket and pid file; they would mislead the next start.
        for name in (mps_sim.SOCKET, mps_sim.PID_FILE):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                os.unlink(os.path.join(pipe_dir, name))
