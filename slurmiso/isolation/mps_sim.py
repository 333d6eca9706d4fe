"""A stand-in for ``nvidia-cuda-mps-control -d`` that runs anywhere: a real, detached daemon.

It imitates what slurmiso relies on, including what makes MPS limits hold, so lifecycle and
enforcement are tested against a real process instead of a mock:

* ``python -m slurmiso.isolation.mps_sim --pipe-dir D --log-dir L --gpu-uuid U`` detaches
  (fork, ``setsid``, fork) and returns once the daemon listens, like ``-d``;
* the daemon writes ``D/control.pid``, listens on the unix socket ``D/control`` and logs to
  ``L/control.log``; it opens the log once, before slurmiso hands the directories to the job's
  user, so it never reopens a path that user controls;
* one command per connection, one line each, with the words of NVIDIA's control shell:
  ``quit``, ``get_server_list``, ``start_server -uid N``, ``get_client_list PID``,
  ``set_default_active_thread_percentage P`` / ``get_...``, ``set_default_device_pinned_mem_limit
  DEV VALUE`` / ``get_... DEV`` (affect only servers started afterwards, as NVIDIA documents),
  and the per-server ``set_active_thread_percentage PID P`` / ``set_device_pinned_mem_limit PID
  DEV VALUE`` with their ``get_`` forms;
* a *client* (``python -m slurmiso.isolation.mps_sim client``, standing for what libcuda does at
  ``cuInit``) connects with its ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` and
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``; the daemon learns its uid from the kernel
  (``SO_PEERCRED``), not from anything the client says, starts or reuses that uid's server, and
  answers the limits the client gets: the server's setting, narrowed by the client's variables
  where they are lower. A variable can never raise a limit; garbage narrows nothing;
* it exits cleanly (socket and pid file removed) on ``quit``, SIGTERM or SIGINT;
* with ``-p 3`` (and ``-m``, multi-user) it speaks MPS v3 instead
  (:mod:`slurmiso.isolation.mps_sim_v3`): ``python -m slurmiso.isolation.mps_sim <module>
  <verb> ...`` sends a verb to the daemon of ``$CUDA_MPS_PIPE_DIRECTORY``, each server and
  namespace gets its directory and socket (``<server>/control``, ``<server>/<ns>/control``),
  and a client's route is the socket it reaches; ``-p 3 -h`` lists the v3 modules.

Who may talk to it is decided by the file system alone, as for the real daemon: a client that
cannot search the pipe directory gets ``PermissionError`` at ``connect``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import select
import signal
import socket
import struct
import sys
from typing import Dict, Iterator, List, Optional, Tuple

from slurmiso.atomic import write_atomic
from slurmiso.isolation.mps_sim_control import Controller
from slurmiso.isolation.mps_sim_partitions import SmPartitions
from slurmiso.isolation.mps_sim_v3 import V3Controller, apply_config

PID_FILE = "control.pid"
SOCKET = "control"
LOG_FILE = "control.log"
#: NVIDIA's default when the variable is unset (the client tries ``/tmp/nvidia-mps``).
DEFAULT_PIPE_DIR = "/tmp/nvidia-mps"
#: sun_path holds 108 bytes; longer paths are reached through the directory's fd instead.
_MAX_SUN_PATH = 100
_READY_TIMEOUT_S = 10.0

log = logging.getLogger("slurmiso.mps_sim")


# -- sockets ----------------------------------------------------------------------------------


@contextlib.contextmanager
def socket_path(pipe_dir: str) -> Iterator[str]:
    """A path to ``pipe_dir/control`` short enough for ``bind``/``connect``.

    Deep state dirs (and pytest's tmp dirs) exceed ``sun_path``; ``/proc/self/fd/N/control``
    names the same file through an open directory descriptor. Opening that descriptor needs
    search permission on ``pipe_dir``, like a plain ``connect`` does.
    """
    path = os.path.join(pipe_dir, SOCKET)
    if len(path.encode()) < _MAX_SUN_PATH:
        yield path
        return
    fd = os.open(pipe_dir, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{SOCKET}"
    finally:
        os.close(fd)


def send_command(pipe_dir: str, command: str, timeout: float = 5.0) -> str:
    """Send one command line to the daemon of ``pipe_dir``; return its whole answer.

    Raises OSError (ConnectionRefusedError, FileNotFoundError, PermissionError) when the
    daemon cannot be reached.
    """
    with socket_path(pipe_dir) as path, socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(path)
        s.sendall(command.strip().encode() + b"\n")
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while True:
            data = s.recv(4096)
            if not data:
                break
            chunks.append(data)
    return b"".join(chunks).decode("utf-8", "replace")


def _peer(conn: socket.socket) -> Tuple[int, int]:
    """(pid, uid) of the connected process, from the kernel."""
    pid, uid, _gid = struct.unpack("3i", conn.getsockopt(
        socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i")))
    return pid, uid


class _Daemon:
    def __init__(self, pipe_dir: str, log_dir: str, gpu_uuid: str, static_sms: int = 0) -> None:
        self.pipe_dir = pipe_dir
        self.log_dir = log_dir
        self.gpu_uuid = gpu_uuid
        self.stopping = False
        self.controller = Controller(
            devices=len(gpu_uuid.split(",")),
            partitions=SmPartitions(gpu_uuid, static_sms) if static_sms else None)
        self.sock: Optional[socket.socket] = None

    def prepare(self) -> None:
        """Log, listen and write the pid file: after this the daemon is reachable."""
        handler = logging.FileHandler(os.path.join(self.log_dir, LOG_FILE))
        handler.setFormatter(logging.Formatter("[%(asctime)s %(process)d] %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with socket_path(self.pipe_dir) as path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            self.sock.bind(path)
        # The socket is open to all, as the real daemon's is: the pipe directory is the door.
        os.chmod(os.path.join(self.pipe_dir, SOCKET), 0o777)
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        write_atomic(os.path.join(self.pipe_dir, PID_FILE), f"{os.getpid()}\n")
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)
        log.info("sim MPS control daemon started for %s, pipe dir %s", self.gpu_uuid, self.pipe_dir)

    def _on_signal(self, signum: int, _frame: object) -> None:
        log.info("signal %d received, exiting", signum)
        self.stopping = True

    def serve(self) -> None:
        assert self.sock is not None
        try:
            while not (self.stopping or self.controller.quitting):
                try:
                    conn, _ = self.sock.accept()
                except (socket.timeout, InterruptedError):
                    continue
                with conn:
                    self._handle(conn)
        finally:
            self._cleanup()

    def _handle(self, conn: socket.socket) -> None:
        line = _read_line(conn)
        pid, uid = _peer(conn)
        log.info("command: %s (uid %d, pid %d)", line, uid, pid)
        words = line.split()
        if words[:1] == ["client_connect"]:
            answer = self.controller.connect_client(uid, pid, words[1:])
        else:
            answer = self.controller.command(line)
        with contextlib.suppress(OSError):
            conn.sendall(answer.encode())

    def _cleanup(self) -> None:
        if self.sock is not None:
            self.sock.close()
        pid_path = os.path.join(self.pipe_dir, PID_FILE)
        with contextlib.suppress(OSError):
            with open(pid_path, encoding="ascii") as fh:
                mine = fh.read().strip() == str(os.getpid())
            if mine:
                os.unlink(pid_path)
                os.unlink(os.path.join(self.pipe_dir, SOCKET))
        log.info("sim MPS control daemon exiting")


class _V3Daemon(_Daemon):
    """Protocol 3 (``-p 3``): v3 verbs on the top-level socket, and a listening socket per
    server (its ``default`` namespace) and per namespace, made and removed as the verbs
    make and delete them (:mod:`slurmiso.isolation.mps_sim_v3`); a client's route is the
    socket it connected to, the top-level one routing by uid."""

    def __init__(self, pipe_dir: str, log_dir: str, gpu_uuid: str, multiuser: bool) -> None:
        super().__init__(pipe_dir, log_dir, gpu_uuid)
        self.v3 = V3Controller(devices=len(gpu_uuid.split(",")), multiuser=multiuser)
        self.routes: Dict[socket.socket, Tuple[str, str]] = {}

    def prepare(self) -> None:
        super().prepare()
        assert self.sock is not None
        self.routes[self.sock] = ("", "")
        self._sync()  # the servers and namespaces a configuration file (-a) made

    def serve(self) -> None:
        try:
            while not (self.stopping or self.controller.quitting):
                ready, _, _ = select.select(list(self.routes), [], [], 0.2)
                for sock in ready:
                    with contextlib.suppress(OSError):
                        conn, _ = sock.accept()
                        with conn:
                            self._answer(conn, self.routes[sock])
        finally:
            for sock in list(self.routes)[1:]:
                self._close(sock)
            self._cleanup()

    def _answer(self, conn: socket.socket, route: Tuple[str, str]) -> None:
        line = _read_line(conn)
        pid, uid = _peer(conn)
        log.info("v3 %s: %s (uid %d, pid %d)", "/".join(route) or "control", line, uid, pid)
        words = line.split()
        if words[:1] == ["client_connect"]:
            env = {_CLIENT_VARS[k]: v for k, _, v in (w.partition("=") for w in words[1:])
                   if k in _CLIENT_VARS}
            answer = json.dumps(self.v3.connect(uid, pid, route, env)) + "\n"
        elif route != ("", ""):
            answer = "1\nerror: commands go to the top-level control socket\n"
        elif words == ["quit"]:
            self.stopping = True
            answer = "0\n"
        else:
            rc, out = self.v3.command(words[1:] if words[:1] == ["v3"] else words, uid)
            self._sync()
            answer = f"{rc}\n{out}"
        with contextlib.suppress(OSError):
            conn.sendall(answer.encode())

    def _sync(self) -> None:
        """A listening socket for every server and namespace there is, and none else."""
        want = {(s.name, ns) for s in self.v3.servers.values() for ns in s.namespaces}
        want |= {(name, "") for name, _ in want}
        have = {route: sock for sock, route in self.routes.items() if route != ("", "")}
        for route in sorted(set(have) - want, reverse=True):
            self._close(have[route])
        for route in sorted(want - set(have)):
            self._listen(route)

    def _dir(self, route: Tuple[str, str]) -> str:
        return os.path.join(self.pipe_dir, *[part for part in route if part])

    def _listen(self, route: Tuple[str, str]) -> None:
        folder = self._dir(route)
        os.makedirs(folder, mode=0o755, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        with socket_path(folder) as path:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            sock.bind(path)
        os.chmod(os.path.join(folder, SOCKET), 0o777)  # the directories are the doors
        sock.listen(16)
        self.routes[sock] = route

    def _close(self, sock: socket.socket) -> None:
        route = self.routes.pop(sock)
        sock.close()
        folder = self._dir(route)
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(folder, SOCKET))
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # a server's folder goes once its namespaces' have


#: A client's words on the wire -> the variable each stands for.
_CLIENT_VARS = {"thread": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                "mem": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "prio": "CUDA_MPS_CLIENT_PRIORITY",
                "part": "CUDA_MPS_SM_PARTITION"}


def _read_line(conn: socket.socket) -> str:
    conn.settimeout(2.0)
    data = b""
    with contextlib.suppress(OSError):
        while b"\n" not in data and len(data) < 4096:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
    return data.decode("utf-8", "replace").strip()


def v3_command(pipe_dir: str, argv: List[str]) -> Tuple[int, str]:
    """One v3 verb to the daemon of ``pipe_dir``: (exit status, output), as
    ``nvidia-cuda-mps-control <module> <verb> ...`` gives them."""
    answer = send_command(pipe_dir, " ".join(["v3", *argv]))
    status, _, out = answer.partition("\n")
    return (int(status) if status.isdigit() else 1), out


def _detach(daemon: _Daemon) -> int:
    """Double fork; the first process returns once the daemon listens (0) or failed (1)."""
    read_fd, write_fd = os.pipe()
    child = os.fork()
    if child:
        os.close(write_fd)
        answer = b""
        while True:
            ready, _, _ = select.select([read_fd], [], [], _READY_TIMEOUT_S)
            if not ready:
                break
            chunk = os.read(read_fd, 4096)
            if not chunk:
                break
            answer += chunk
        os.close(read_fd)
        os.waitpid(child, 0)
        if answer.startswith(b"ok"):
            return 0
        sys.stderr.write(answer.decode("utf-8", "replace") or "sim MPS daemon did not start\n")
        return 1
    os.close(read_fd)
    os.setsid()
    if os.fork():
        os._exit(0)
    os.chdir("/")
    os.umask(0o022)
    try:
        daemon.prepare()
    except Exception as exc:  # any failure is reported to the starter, then we exit
        os.write(write_fd, f"sim MPS daemon failed: {exc}\n".encode())
        os._exit(1)
    os.write(write_fd, b"ok\n")
    os.close(write_fd)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    daemon.serve()
    os._exit(0)


def connect(env: Dict[str, str]) -> Dict[str, object]:
    """What a CUDA client with environment ``env`` gets from MPS, as the daemon answers it.

    Raises OSError when the daemon cannot be reached (PermissionError for a pipe directory
    this uid may not search).
    """
    pipe_dir = env.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR
    words = ["client_connect"]
    for key, name in _CLIENT_VARS.items():
        value = "".join(env.get(name, "").split())[:200]  # one word on the wire
        if value:
            words.append(f"{key}={value}")
    answer = send_command(pipe_dir, " ".join(words))
    try:
        granted = json.loads(answer)
    except ValueError:
        granted = None
    if not isinstance(granted, dict):
        raise ConnectionError(f"MPS daemon of {pipe_dir} answered {answer[:200]!r}")
    return granted


def client(env: Optional[Dict[str, str]] = None) -> int:
    """Act as a CUDA client starting up: print (JSON) what MPS grants this process.

    Exit 0 when the daemon answered. Exit 3 when it could not be reached: real CUDA would then
    run without MPS, which is what the device fence, not MPS, must stop.
    """
    try:
        granted = connect(dict(os.environ if env is None else env))
    except OSError as exc:
        print(json.dumps({"mps": False, "error": f"{type(exc).__name__}: {exc}"}))
        return 3
    print(json.dumps(granted))
    return 0


#: What ``-p 3 -h`` prints: the stand-in speaks protocol 3's control logic
#: (:mod:`slurmiso.isolation.mps_sim_v3`), so it names the modules NVIDIA's does.
V3_HELP = """usage: nvidia-cuda-mps-control -p 3 <module> <verb> [args] [--key=value]
Modules: server namespace client (the slurmiso MPS stand-in)
"""


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["client"]:  # a CUDA client starting (``client list``: the v3 verb below)
        return client()
    if argv == ["-p", "3", "-h"]:
        sys.stdout.write(V3_HELP)
        return 0
    if argv[:1] in (["server"], ["namespace"], ["client"]):  # a v3 verb, to the daemon
        pipe_dir = os.environ.get("CUDA_MPS_PIPE_DIRECTORY") or DEFAULT_PIPE_DIR
        try:
            rc, out = v3_command(pipe_dir, argv)
        except OSError as exc:
            sys.stderr.write(f"cannot reach the MPS control daemon of {pipe_dir}: {exc}\n")
            return 1
        (sys.stdout if rc == 0 else sys.stderr).write(out)
        return rc
    parser = argparse.ArgumentParser(prog="python -m slurmiso.isolation.mps_sim")
    parser.add_argument("--pipe-dir", required=True)
    parser.add_argument("--log-dir", required=True)
    parser.add_argument("--gpu-uuid", required=True)
    parser.add_argument("--foreground", action="store_true", help="do not detach (debugging)")
    parser.add_argument("-p", "--protocol", type=int, choices=(2, 3), default=2)
    parser.add_argument("-m", "--multiuser", action="store_true")
    parser.add_argument("-a", "--apply", metavar="FILE",
                        help="-p 3: an MPS v3 configuration file (TOML), applied once at start")
    parser.add_argument("-S", "--static-partitioning", action="store_true",
                        help="static SM partitions (legacy MPS; clients must name one)")
    parser.add_argument("--sm-count", type=int, default=132,
                        help="-S: the simulated GPU's SMs (default: an H100 SXM's 132)")
    args = parser.parse_args(argv)
    where = (os.path.abspath(args.pipe_dir), os.path.abspath(args.log_dir), args.gpu_uuid)
    if args.protocol != 3:
        if args.apply:
            parser.error("-a needs -p 3 (configuration files are MPS v3's)")
        daemon: _Daemon = _Daemon(*where, static_sms=args.sm_count
                                  if args.static_partitioning else 0)
    elif args.static_partitioning:
        parser.error("-S is legacy MPS's: MPS v3 makes SM partitions with its verbs")
    else:
        daemon = _V3Daemon(*where, multiuser=args.multiuser)
        if args.apply:
            try:
                with open(args.apply, encoding="utf-8") as fh:
                    apply_config(daemon.v3, fh.read())
            except (OSError, ValueError) as exc:
                sys.stderr.write(f"{args.apply}: {exc}\n")
                return 1
    if args.foreground:
        daemon.prepare()
        daemon.serve()
        return 0
    return _detach(daemon)


if __name__ == "__main__":
    sys.exit(main())
