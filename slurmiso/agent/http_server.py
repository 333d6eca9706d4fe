"""The agent's own HTTP server: one scrape answered whatever the node's users do to its port.

    server = AgentServer(lambda: render(registry), "127.0.0.1", 9810).start()

Every local user can connect to the agent. A thread per connection without timeouts (the
Prometheus client's server) lets about a thousand idle sockets exhaust its descriptors, and
then no scrape is answered: the node is unknown, and whoever did it keeps other users'
training held. Here one ``selectors`` loop holds the connections, so an idle one costs a
descriptor and no thread, and:

- at most ``cap`` are open (:func:`connection_cap`: below the descriptor limit, with room
  for the refresher); a new one over the cap closes the *oldest* (one still sending its
  request first, then one not taking its answer), so a flood of idle sockets cannot keep a
  fresh scrape out;
- a request must arrive whole within ``request_s`` and its answer leave within ``write_s``,
  in all, not per ``recv`` (a client trickling a byte a second is closed all the same);
- one request per connection (``Connection: close``), at most :data:`MAX_REQUEST` bytes;
- one render at a time, in its own thread: the requests that arrived while one ran get the
  next (never an older answer than their request), so a flood of requests costs one render
  at a time, not one each.

Each connection closed for any of these is counted by :class:`CloseReason`
(:class:`HttpStatsCollector` exports the counts).
"""

from __future__ import annotations

import enum
import errno
import logging
import resource
import selectors
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

log = logging.getLogger(__name__)

#: Descriptors kept for the rest of the agent: the refresher's endpoint sockets (64 at
#: most), step files, NVML, the state directory, logs.
RESERVED_FDS = 256
#: Never more open connections than this, whatever the limit (the monitor needs one).
MAX_CAP = 16384
MAX_REQUEST = 8192
REQUEST_S = 5.0
WRITE_S = 10.0
ACCEPTS_PER_TURN = 512

M_HTTP_OPEN = "slurmiso_agent_http_connections"
M_HTTP_CLOSED = "slurmiso_agent_http_closed"  # a counter: _total


class CloseReason(enum.Enum):
    """Why the server closed a connection before or instead of answering it."""

    EVICTED = "evicted"  # over the cap: the oldest made room for a new one
    REQUEST_TIMEOUT = "request-timeout"  # no whole request within request_s
    WRITE_TIMEOUT = "write-timeout"  # the answer not taken within write_s
    TOO_LARGE = "too-large"  # a request over MAX_REQUEST bytes
    ACCEPT_FAILED = "accept-failed"  # accept() refused (descriptors, memory)


class Phase(enum.Enum):
    READING = "reading"
    WAITING = "waiting"  # a whole request, waiting for the next render
    WRITING = "writing"


def connection_cap(nofile: Optional[int] = None) -> int:
    """How many connections the server holds open: its descriptor limit (``nofile``, else
    this process's soft RLIMIT_NOFILE) less :data:`RESERVED_FDS`, at most :data:`MAX_CAP`."""
    if nofile is None:
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        nofile = MAX_CAP + RESERVED_FDS if soft == resource.RLIM_INFINITY else soft
    return max(16, min(MAX_CAP, nofile - RESERVED_FDS))


@dataclass(eq=False)
class _Conn:
    sock: socket.socket
    opened: float
    phase: Phase = Phase.READING
    data: bytearray = field(default_factory=bytearray)
    head: bool = False  # a HEAD request: the headers only
    out: bytes = b""
    sent: int = 0
    deadline: float = 0.0
    closed: bool = False


@dataclass
class HttpStats:
    """What the server did; read by the stats collector and by tests (loop thread writes)."""

    accepted: int = 0
    answered: int = 0
    renders: int = 0
    open: int = 0
    closed: Counter[CloseReason] = field(default_factory=Counter)


def _response(status: str, body: bytes, head: bool = False,
              ctype: str = "text/plain; version=0.0.4; charset=utf-8") -> bytes:
    hdr = (f"HTTP/1.0 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
           "Connection: close\r\n\r\n").encode("ascii")
    return hdr if head else hdr + body


class AgentServer:
    """Serves ``render()`` (Prometheus text as bytes) on GET ``/metrics`` or ``/``."""

    def __init__(self, render: Callable[[], bytes], addr: str, port: int,
                 cap: Optional[int] = None, request_s: float = REQUEST_S,
                 write_s: float = WRITE_S, clock: Callable[[], float] = time.monotonic,
                 on_scrape: Optional[Callable[[bytes], None]] = None) -> None:
        self.render = render
        #: Called with each scrape's request head (the monitor's heartbeat header).
        self.on_scrape = on_scrape
        self.cap = cap if cap is not None else connection_cap()
        self.request_s = request_s
        self.write_s = write_s
        self.clock = clock
        self.stats = HttpStats()
        family, _, _, _, where = socket.getaddrinfo(
            addr or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        self.listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self.listener.bind(where)
            self.listener.listen(4096)  # the kernel caps it at net.core.somaxconn
        except OSError:
            self.listener.close()
            raise
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._sel = selectors.DefaultSelector()
        #: Open connections by phase, each in the order it entered it (deadline order).
        self._conns: Dict[Phase, Dict[_Conn, None]] = {p: {} for p in Phase}
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._pending: List[_Conn] = []  # loop -> renderer, under _cond
        self._done: List[Tuple[List[_Conn], str, bytes]] = []  # renderer -> loop, under _cond
        self._threads = [threading.Thread(target=self._loop, name="slurmiso-agent-http",
                                          daemon=True),
                         threading.Thread(target=self._renderer, name="slurmiso-agent-render",
                                          daemon=True)]

    # -- life ------------------------------------------------------------------------------

    def start(self) -> AgentServer:
        self._sel.register(self.listener, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._wake()
        for t in self._threads:
            t.join(timeout=10)
        for group in self._conns.values():
            for c in list(group):
                self._close(c)
        self._sel.close()
        for s in (self.listener, self._wake_r, self._wake_w):
            s.close()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"x")
        except OSError:  # full: a wake-up is already pending
            pass

    # -- the loop --------------------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._turn()
            except Exception:  # noqa: BLE001 - the server outlives any one connection's bug
                log.exception("agent http: one turn failed; serving on")

    def _turn(self) -> None:
        for key, events in self._sel.select(timeout=self._next_timeout()):
            if key.data == "listen":
                self._accept()
            elif key.data == "wake":
                self._deliver()
            elif events & selectors.EVENT_READ:
                self._read(key.data)
            elif events & selectors.EVENT_WRITE:
                self._write(key.data)
        self._expire()

    def _next_timeout(self) -> float:
        firsts = [next(iter(self._conns[p]), None) for p in (Phase.READING, Phase.WRITING)]
        ends = [c.deadline for c in firsts if c is not None]
        return max(0.0, min([self.clock() + 0.5, *ends]) - self.clock())

    def _accept(self) -> None:
        # at most a quarter of the cap per turn: a connection accepted in one turn is not
        # evicted by the next turn's before its request could be read
        for _ in range(max(1, min(ACCEPTS_PER_TURN, self.cap // 4))):
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM) \
                        and self._evict():
                    self.stats.closed[CloseReason.ACCEPT_FAILED] += 1
                    continue
                log.warning("agent http: accept failed: %s", exc)
                self._stop.wait(0.05)  # nothing to free: do not spin on the listener
                return
            if self.stats.open >= self.cap:
                self._evict()
            sock.setblocking(False)
            now = self.clock()
            c = _Conn(sock, now, deadline=now + self.request_s)
            self._conns[Phase.READING][c] = None
            self.stats.accepted += 1
            self.stats.open += 1
            self._sel.register(sock, selectors.EVENT_READ, c)
            self._read(c)  # a scraper's request is often there already: it leaves READING

    def _evict(self) -> bool:
        """Close the oldest connection: one still sending its request first, then one whose
        answer is not taken yet; one waiting for a render (milliseconds) last."""
        for phase in (Phase.READING, Phase.WRITING, Phase.WAITING):
            c = next(iter(self._conns[phase]), None)
            if c is not None:
                self._close(c, CloseReason.EVICTED)
                return True
        return False

    def _close(self, c: _Conn, why: Optional[CloseReason] = None) -> None:
        if c.closed:
            return
        c.closed = True
        self._conns[c.phase].pop(c, None)
        if why is not None:
            self.stats.closed[why] += 1
        try:
            self._sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
        self.stats.open -= 1

    def _expire(self) -> None:
        now = self.clock()
        for phase, why in ((Phase.READING, CloseReason.REQUEST_TIMEOUT),
                           (Phase.WRITING, CloseReason.WRITE_TIMEOUT)):
            group = self._conns[phase]
            while group:
                c = next(iter(group))
                if c.deadline > now:
                    break
                self._close(c, why)

    def _read(self, c: _Conn) -> None:
        try:
            chunk = c.sock.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(c)  # the client left
            return
        c.data += chunk
        end = c.data.find(b"\r\n\r\n")
        if end < 0:
            end = c.data.find(b"\n\n")
        if end < 0:
            if len(c.data) > MAX_REQUEST:
                self._close(c, CloseReason.TOO_LARGE)
            return
        self._request(c, bytes(c.data[:end]))

    def _request(self, c: _Conn, head: bytes) -> None:
        """Route one whole request: a scrape waits for the next render, anything else is
        answered at once."""
        line = head.split(b"\n", 1)[0].decode("latin-1").split()
        method = line[0] if line else ""
        path = line[1].split("?", 1)[0] if len(line) > 1 else ""
        c.head = method == "HEAD"
        if method not in ("GET", "HEAD"):
            self._answer(c, _response("405 Method Not Allowed", b"GET only\n"))
        elif path not in ("/metrics", "/"):
            self._answer(c, _response("404 Not Found", b"/metrics only\n", c.head))
        else:
            if self.on_scrape is not None:
                try:
                    self.on_scrape(head)
                except Exception:  # noqa: BLE001 - a stamp that fails never fails the scrape
                    log.exception("agent http: the scrape hook failed")
            self._move(c, Phase.WAITING)
            self._sel.unregister(c.sock)
            with self._cond:
                self._pending.append(c)
                self._cond.notify()

    def _move(self, c: _Conn, phase: Phase) -> None:
        self._conns[c.phase].pop(c, None)
        c.phase = phase
        self._conns[phase][c] = None

    def _answer(self, c: _Conn, out: bytes) -> None:
        waiting = c.phase is Phase.WAITING
        self._move(c, Phase.WRITING)
        c.out, c.deadline = out, self.clock() + self.write_s
        if waiting:
            self._sel.register(c.sock, selectors.EVENT_WRITE, c)
        else:
            self._sel.modify(c.sock, selectors.EVENT_WRITE, c)
        self._write(c)

    def _write(self, c: _Conn) -> None:
        try:
            c.sent += c.sock.send(c.out[c.sent:])
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(c)
            return
        if c.sent >= len(c.out):
            self.stats.answered += 1
            try:  # the answer first, then the end: never a reset over unread request bytes
                c.sock.shutdown(socket.SHUT_WR)
                while c.sock.recv(4096):
                    pass
            except OSError:
                pass
            self._close(c)

    def _deliver(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        with self._cond:
            done, self._done = self._done, []
        for batch, status, body in done:
            for c in batch:
                if not c.closed:
                    self._answer(c, _response(status, body, c.head))

    # -- the renderer ----------------------------------------------------------------------

    def _renderer(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._stop.is_set():
                    self._cond.wait()
                if self._stop.is_set():
                    return
                batch, self._pending = self._pending, []
            try:
                status, body = "200 OK", self.render()
            except Exception:  # noqa: BLE001 - a failed render is a 500, the server lives on
                log.exception("agent http: rendering the metrics failed")
                status, body = "500 Internal Server Error", b"render failed\n"
            self.stats.renders += 1
            with self._cond:
                self._done.append((batch, status, body))
            self._wake()


class HttpStatsCollector:
    """client_python custom collector: the server's open connections and what it closed."""

    def __init__(self, server: AgentServer) -> None:
        self.server = server

    def describe(self) -> List[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        st = self.server.stats
        yield GaugeMetricFamily(M_HTTP_OPEN, "Connections open on the agent's port",
                                value=float(st.open))
        closed = CounterMetricFamily(M_HTTP_CLOSED, "Connections the agent closed unanswered, "
                                     "by why", labels=["reason"])
        for why in CloseReason:
            closed.add_metric([why.value], float(st.closed[why]))
        yield closed
