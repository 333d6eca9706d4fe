"""Which uid's listener a connection to 127.0.0.1:PORT reaches (issue 33, item 8): another
user's socket the kernel allows beside a job's (IPv6-only) must not spoil the job's reading;
one that really takes the connection (a dual-stack [::]) is its owner."""

from __future__ import annotations

import os
import socket
from contextlib import contextmanager
from typing import Iterator, Tuple

import pytest

from slurmiso.agent import port_owners as ports

NOBODY = 65534
HEADER = ("  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  "
          "timeout inode\n")
HEADER6 = ("  sl  local_address                         remote_address                        "
           "st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n")


def _line(n: int, addr: str, port: int, uid: int, state: str = "0A") -> str:
    remote = "0" * len(addr) + ":0000"
    return (f"   {n}: {addr}:{port:04X} {remote} {state} 00000000:00000000 00:00000000 "
            f"00000000 {uid:5d}        0 {1000 + n} 1 0000000000000000 100 0 0 10 0\n")


def _proc(tmp: str, v4: Tuple[Tuple[str, int, int], ...],
          v6: Tuple[Tuple[str, int, int], ...]) -> str:
    os.makedirs(os.path.join(tmp, "net"), exist_ok=True)
    with open(os.path.join(tmp, "net", "tcp"), "w") as fh:
        fh.write(HEADER + "".join(_line(i, *row) for i, row in enumerate(v4)))
    with open(os.path.join(tmp, "net", "tcp6"), "w") as fh:
        fh.write(HEADER6 + "".join(_line(i, *row) for i, row in enumerate(v6)))
    return tmp


LOOP4, ANY4 = "0100007F", "00000000"
ANY6, LOOP6 = "0" * 32, "0" * 24 + "01000000"
MAPPED_LOOP = "0000000000000000FFFF00000100007F"


@pytest.mark.parametrize("v4, v6, owners", [
    # the victim's IPv4 listener, another user's IPv6-only sockets beside it
    (((LOOP4, 8000, 1000),), ((ANY6, 8000, 2000),), {1000}),
    (((ANY4, 8000, 1000),), ((ANY6, 8000, 2000), (LOOP6, 8000, 3000)), {1000}),
    # a mapped IPv4 bind on an IPv6 socket is an IPv4 listener
    ((), ((MAPPED_LOOP, 8000, 1000), (ANY6, 8000, 2000)), {1000}),
    # no IPv4 listener: a [::] one may be dual-stack, and then it takes the connection
    ((), ((ANY6, 8000, 2000),), {2000}),
    # [::1] never takes an IPv4 connection: nothing does
    ((), ((LOOP6, 8000, 2000),), None),
    # the specific address first (two of one uid's SO_REUSEPORT sockets may hold both)
    (((ANY4, 8000, 1000), (LOOP4, 8000, 1000)), (), {1000}),
])
def test_recorded_tables_name_the_listener_that_takes_the_connection(
        tmp_path: os.PathLike[str], v4: Tuple[Tuple[str, int, int], ...],
        v6: Tuple[Tuple[str, int, int], ...], owners: object) -> None:
    got = ports.loopback_listeners(_proc(str(tmp_path), v4, v6))
    assert got is not None and got.get(8000) == owners


def test_reading_stops_at_the_first_socket_not_listening(tmp_path: os.PathLike[str]) -> None:
    proc = _proc(str(tmp_path), ((LOOP4, 8000, 1000), (LOOP4, 8001, 1000, "01"),
                                 (LOOP4, 8002, 1000)), ())
    assert ports.loopback_listeners(proc) == {8000: {1000}}


def test_a_flood_of_another_users_listeners_does_not_hide_a_jobs(
        tmp_path: os.PathLike[str]) -> None:
    """70,000 listening sockets of uid 2000 listed before the job's (the kernel lists them by
    hash bucket, not by port): the job's listener is still found, its owner still the job."""
    flood = tuple((LOOP6, 10_000 + i % 50_000, 2000) for i in range(70_000))
    proc = _proc(str(tmp_path), ((LOOP4, 8000, 1000),), flood + ((ANY6, 9000, 1000),))
    got = ports.loopback_listeners(proc)
    assert got is not None and got.get(9000) == {1000}


@contextmanager
def _child_listener(host: str, port: int, v6only: bool) -> Iterator[int]:
    """A listener of uid ``nobody`` (a forked child that drops root) on [host]:port; yields
    the child's pid once it listens."""
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            os.close(ready_r)
            os.close(done_w)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1 if v6only else 0)
            s.bind((host, port))
            s.listen(4)
            os.write(ready_w, b"1")
            os.read(done_r, 1)  # until the test is done
            code = 0
        except BaseException:  # noqa: BLE001 - a failed child says so by its exit status
            os.write(ready_w, b"0")
        finally:
            os._exit(code)
    os.close(ready_w)
    os.close(done_r)
    try:
        assert os.read(ready_r, 1) == b"1", f"the child could not listen on [{host}]:{port}"
        yield pid
    finally:
        os.close(done_w)
        os.waitpid(pid, 0)
        os.close(ready_r)


@pytest.fixture
def v4_listener() -> Iterator[socket.socket]:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(4)
    yield s
    s.close()


def _reaches(port: int, listener: socket.socket) -> bool:
    """Whether a connection to 127.0.0.1:port lands on ``listener`` (it is accepted there)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as c:
        listener.settimeout(5)
        peer, _ = listener.accept()
        ok = peer.getpeername()[1] == c.getsockname()[1]
        peer.close()
        return ok


@pytest.mark.needs_root(reason="a second uid's listener needs setuid in a forked child")
@pytest.mark.parametrize("host", ["::", "::1"])
def test_another_users_ipv6_only_socket_beside_a_jobs_listener_spoils_nothing(
        v4_listener: socket.socket, host: str) -> None:
    port = v4_listener.getsockname()[1]
    with _child_listener(host, port, v6only=True):
        assert _reaches(port, v4_listener), "premise: the job's own socket takes it"
        got = ports.loopback_listeners()
        assert got is not None and got.get(port) == {os.getuid()}


@pytest.mark.needs_root(reason="a second uid's listener needs setuid in a forked child")
def test_another_users_dual_stack_socket_is_the_owner() -> None:
    """Nothing on IPv4: a dual-stack [::] socket of nobody takes 127.0.0.1:port, and the
    listeners say so (the job's uid is not it: port-not-owned)."""
    probe = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    probe.bind(("::", 0))
    port = probe.getsockname()[1]
    probe.close()
    with _child_listener("::", port, v6only=False):
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # premise: the dual-stack socket receives it
        got = ports.loopback_listeners()
        assert got is not None and got.get(port) == {NOBODY}
