"""The agent's own HTTP server against its node's users (issue 33, item 8): a thousand idle
sockets, a trickled request, an answer never read, a flood of scrapes; and the real
``slurmiso agent`` under the descriptor limit a systemd service gets by default."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
from typing import Any, Iterator, List

import pytest

from slurmiso.agent import port_owners as ports
from slurmiso.agent.http_server import (
    M_HTTP_CLOSED,
    AgentServer,
    CloseReason,
    Phase,
    connection_cap,
)
from slurmiso.exposition import scrape
from slurmiso.exposition.text import parse_prometheus_text
from tests.hookctx import write_config
from tests.waiting import wait_for

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: A bound on a wait guards a hang only: two orders of magnitude above the expected time.
HANG_S = 60.0
IDLE = 1000


@pytest.fixture(autouse=True)
def descriptors() -> Iterator[None]:
    """Room for the attack's client sockets in this process (the server's are counted by
    its cap, or by the agent's own limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 4 * IDLE
    if soft != resource.RLIM_INFINITY and soft < want:
        if hard != resource.RLIM_INFINITY and hard < want:
            pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < {want}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    yield
    resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture
def server() -> Iterator[AgentServer]:
    s = AgentServer(lambda: b"slurmiso_agent_up 1\n", "127.0.0.1", 0, cap=64,
                    request_s=0.5, write_s=0.5).start()
    yield s
    s.stop()


def idle_sockets(port: int, n: int) -> List[socket.socket]:
    """``n`` connections that never send a byte (non-blocking connects: a server that stops
    accepting must not hang the test)."""
    out = []
    for _ in range(n):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        out.append(s)
    return out


def test_a_thousand_idle_connections_do_not_keep_a_scrape_out(server: AgentServer) -> None:
    idle = idle_sockets(server.port, IDLE)
    try:
        wait_for(lambda: server.stats.accepted >= IDLE, "the server took every idle connection")
        assert server.stats.open <= server.cap
        body = scrape.get(f"http://127.0.0.1:{server.port}/metrics", 10.0)
        assert body == "slurmiso_agent_up 1\n"
        assert server.stats.closed[CloseReason.EVICTED] >= IDLE - server.cap
    finally:
        for s in idle:
            s.close()


def test_a_request_trickled_a_byte_at_a_time_is_closed_at_its_deadline(
        server: AgentServer) -> None:
    """The deadline is the request's, in all: a byte every 50 ms never lets a per-recv
    timeout of 0.5 s fire, and the server closes it all the same, while it still trickles."""
    c = socket.create_connection(("127.0.0.1", server.port), timeout=HANG_S)
    stop = threading.Event()
    sent: List[int] = []

    def trickle() -> None:
        try:
            while not stop.wait(0.05):
                c.send(b"X")
                sent.append(1)
        except OSError:
            pass

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        wait_for(lambda: server.stats.closed[
            CloseReason.REQUEST_TIMEOUT] == 1, "the trickler closed")
        assert t.is_alive() or sent, "premise: it was still sending"
        assert scrape.get(f"http://127.0.0.1:{server.port}/", 10.0) == "slurmiso_agent_up 1\n"
    finally:
        stop.set()
        t.join()
        c.close()


def test_an_answer_never_read_is_closed_at_its_write_deadline() -> None:
    big = b"# " + b"x" * (16 << 20) + b"\n"
    s = AgentServer(lambda: big, "127.0.0.1", 0, cap=64, request_s=5, write_s=0.3).start()
    c = socket.create_connection(("127.0.0.1", s.port), timeout=HANG_S)
    c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    try:
        c.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        wait_for(lambda: s.stats.closed[CloseReason.WRITE_TIMEOUT] == 1, "the unread answer closed")
        assert s.stats.answered == 0
    finally:
        c.close()
        s.stop()


def test_concurrent_scrapes_share_one_render_at_a_time() -> None:
    """A flood of requests costs one render at a time: those that arrive while one runs get
    the next one, never an answer older than their request."""
    release = threading.Event()
    n = [0]

    def render() -> bytes:
        n[0] += 1
        if n[0] == 1:
            release.wait(HANG_S)
        return f"render {n[0]}\n".encode()

    s = AgentServer(render, "127.0.0.1", 0, cap=64).start()
    out: List[str] = []
    try:
        first = threading.Thread(target=lambda: out.append(
            scrape.get(f"http://127.0.0.1:{s.port}/metrics", HANG_S)))
        first.start()
        wait_for(lambda: n[0] == 1, "the first render runs")
        rest = [threading.Thread(target=lambda: out.append(
            scrape.get(f"http://127.0.0.1:{s.port}/metrics", HANG_S))) for _ in range(20)]
        for t in rest:
            t.start()
        # (the first one too: it waits in the render)
        wait_for(lambda: len(s._conns[Phase.WAITING]) == 21, "21 scrapes wait")
        release.set()
        for t in [first, *rest]:
            t.join()
        assert sorted(out) == ["render 1\n"] + ["render 2\n"] * 20
        assert s.stats.renders == 2
    finally:
        release.set()
        s.stop()


def test_other_methods_and_paths_are_refused_at_once(server: AgentServer) -> None:
    for req, status in ((b"POST /metrics HTTP/1.0\r\n\r\n", b"405"),
                        (b"GET /x HTTP/1.0\r\n\r\n", b"404")):
        with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_S) as c:
            c.sendall(req)
            answer = b"".join(iter(lambda: c.recv(4096), b""))
        assert answer.split()[1] == status
    with socket.create_connection(("127.0.0.1", server.port), timeout=HANG_S) as c:
        c.sendall(b"GET /" + b"a" * 9000)
        assert c.recv(10) == b""
    assert server.stats.closed[CloseReason.TOO_LARGE] == 1


def held_sockets(port: int, n: int) -> List[socket.socket]:
    """Up to ``n`` connections made one after the other, as an attacker holds them: each
    connect waits for the handshake (the server's accept queue has room); three in a row
    that cannot get in end the attack (the port is full, which is the attack's success)."""
    out: List[socket.socket] = []
    failed = 0
    while len(out) < n and failed < 3:
        try:
            out.append(socket.create_connection(("127.0.0.1", port), timeout=2.0))
            failed = 0
        except OSError:
            failed += 1
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def test_the_real_agent_answers_a_scrape_beside_more_idle_sockets_than_its_fd_limit(
        tmp_path: Any) -> None:
    """``slurmiso agent`` with a service's default soft limit (1024 descriptors) and 1,500
    connections held on its port: the monitor's scrape is answered, and the evictions are
    counted in it. (The Prometheus client's server it used before ran out of descriptors,
    and the scrape waited in the accept queue until the monitor gave up.)"""
    cfg = write_config(str(tmp_path), "timeslice")
    port = _free_port()
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1024, 1024))

    agent = subprocess.Popen(
        [sys.executable, "-m", "slurmiso", "--config", cfg, "agent", "--node", "node1",
         "--port", str(port), "--addr", "127.0.0.1"], env=env, preexec_fn=limit,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    idle: List[socket.socket] = []
    try:
        wait_for(lambda: agent.poll() is None and port in (
            ports.loopback_listeners() or {}) or agent.poll() is not None, "the agent listens")
        assert agent.poll() is None, agent.stderr.read() if agent.stderr else ""
        idle = held_sockets(port, 1500)
        body = scrape.get(f"http://127.0.0.1:{port}/metrics", 20.0)
        samples = parse_prometheus_text(body)
        assert any(x.name == "slurmiso_agent_up" and x.value == 1.0 for x in samples)
        evicted = [x.value for x in samples if x.name == M_HTTP_CLOSED + "_total"
                   and x.labels.get("reason") == "evicted"]
        assert evicted and evicted[0] > 0, "premise: the idle sockets filled its cap"
        held = _fds(agent.pid)
        assert 700 <= held <= connection_cap(1024) + 64, "it holds the rest, under its limit"
    finally:
        for s in idle:
            s.close()
        agent.terminate()
        agent.wait(timeout=HANG_S)
        if agent.stderr:
            agent.stderr.close()


def test_answers_never_taken_are_evicted_before_a_scrape_waiting_for_its_render() -> None:
    """Over the cap, a client that asked and never reads its answer goes before a scrape
    that waits for the render: the cap is filled with unread answers, then one scrape waits
    (the render is held) while more connections arrive."""
    big = b"# " + b"x" * (4 << 20) + b"\n"
    armed, hold = threading.Event(), threading.Event()

    def render() -> bytes:
        if armed.is_set():  # the scraper's render: held until the test says
            hold.wait(HANG_S)
        return big

    s = AgentServer(render, "127.0.0.1", 0, cap=16, request_s=60, write_s=60).start()
    unread: List[socket.socket] = []
    out: List[str] = []
    try:
        for _ in range(16):
            c = socket.create_connection(("127.0.0.1", s.port), timeout=HANG_S)
            c.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            unread.append(c)
        wait_for(lambda: len(s._conns[Phase.WRITING]) == 16, "16 answers not taken")
        armed.set()
        scraper = threading.Thread(target=lambda: out.append(
            scrape.get(f"http://127.0.0.1:{s.port}/metrics", HANG_S)))
        scraper.start()
        wait_for(lambda: len(s._conns[Phase.WAITING]) == 1, "the scrape waits for its render")
        unread += idle_sockets(s.port, 4)
        wait_for(lambda: s.stats.accepted == 21, "the 4 new ones taken")
        assert len(s._conns[Phase.WAITING]) == 1, "the scrape still waits"
        hold.set()
        scraper.join()
        assert out == [big.decode()]
        # the scraper's own connection made room too: 5 unread answers went, no scrape
        assert s.stats.closed[CloseReason.EVICTED] == 5
    finally:
        hold.set()
        for c in unread:
            c.close()
        s.stop()
