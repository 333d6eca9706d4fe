"""Fetch many HTTP URLs at once under one deadline: the monitor's telemetry transport.

Per-socket timeouts do not bound a cycle: a server trickling one byte a second never times
out a ``recv``. Here one ``selectors`` loop drives at most ``max_open`` non-blocking
connections; each URL also has its own limit (``per_url_s``) so a hanging agent frees its slot
early, and at the deadline everything still open is closed and reported. URLs may come in
``groups`` (the agent's: one per user): the next one started is always from the group with
the fewest open, so one user's many hanging endpoints take their share of the slots and no
other user's endpoint waits behind them for the deadline, and with ``group_bytes`` a group's
answers together are cut at that many bytes (``over-budget``). Nothing raises: every
URL gets a body or a short reason (``unreachable``, ``timeout``, ``deadline``, ``not-http``,
``http-status``, ``truncated``, ``too-large``, ``over-budget``), which the caller counts as
stale data.
Plain HTTP/1.0 (the agent and Prometheus speak it); responses must carry a 200 status, and
a ``Content-Length``, when given, must match the body.
"""

from __future__ import annotations

import errno
import selectors
import socket
import time
import urllib.parse
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Callable, Deque, Dict, Hashable, List, Mapping, NamedTuple, Optional, Tuple

MAX_BYTES = 16 * 1024 * 1024


class Fetched(NamedTuple):
    body: Optional[str]
    reason: str = ""  # why body is None; "" when it is not
    detail: str = ""


@dataclass
class _Conn:
    key: str
    sock: socket.socket
    request: bytes
    started: float
    group: Hashable = None
    sent: int = 0
    connected: bool = False
    data: bytearray = field(default_factory=bytearray)


def _target(url: str, headers: Mapping[str, str] = {}) -> Tuple[str, int, bytes]:
    """(host, port, request bytes) of an http:// URL (``headers`` added: names and values
    of printable ASCII, no CR/LF); ValueError otherwise."""
    u = urllib.parse.urlsplit(url)
    if u.scheme != "http" or not u.hostname:
        raise ValueError(f"only http:// URLs are supported, not {url!r}")
    path = (u.path or "/") + (f"?{u.query}" if u.query else "")
    host = u.hostname if u.port is None else f"{u.hostname}:{u.port}"
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items()
                    if (k + v).isprintable() and (k + v).isascii() and ":" not in k)
    req = (f"GET {path} HTTP/1.0\r\nHost: {host}\r\nAccept: text/plain, application/json\r\n"
           f"{extra}Connection: close\r\n\r\n")
    return u.hostname, u.port or 80, req.encode("ascii", "replace")


class _Queue:
    """The URLs not started yet, per group; :meth:`pop` takes the next from the group with
    the fewest open (then the fewest started, then the first listed): max-min fair slots."""

    def __init__(self, urls: Mapping[str, str], groups: Optional[Mapping[str, Hashable]]
                 ) -> None:
        self.waiting: Dict[Hashable, Deque[Tuple[str, str]]] = {}
        for key, url in urls.items():
            self.waiting.setdefault(groups.get(key) if groups else None, deque()).append(
                (key, url))
        self.order = {g: i for i, g in enumerate(self.waiting)}
        self.open: Counter[Hashable] = Counter()
        self.started: Counter[Hashable] = Counter()
        self.received: Counter[Hashable] = Counter()  # bytes, per group

    def __bool__(self) -> bool:
        return bool(self.waiting)

    def pop(self) -> Tuple[str, str, Hashable]:
        g = min(self.waiting, key=lambda g: (self.open[g], self.started[g], self.order[g]))
        key, url = self.waiting[g].popleft()
        if not self.waiting[g]:
            del self.waiting[g]
        self.open[g] += 1
        self.started[g] += 1
        return key, url, g

    def rest(self) -> List[str]:
        return [key for q in self.waiting.values() for key, _ in q]


def parse_response(raw: bytes) -> Fetched:
    """An HTTP/1.x response into its body, or the reason it is not one we accept."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    if not sep:
        head, sep, body = raw.partition(b"\n\n")
    lines = head.decode("latin-1").splitlines()
    if not lines or not lines[0].startswith("HTTP/1."):
        return Fetched(None, "not-http", repr(raw[:40]))
    parts = lines[0].split()
    if len(parts) < 2 or not parts[1].isdigit():
        return Fetched(None, "not-http", lines[0][:60])
    if not sep:
        return Fetched(None, "truncated", "no end of headers")
    if parts[1] != "200":
        return Fetched(None, "http-status", lines[0][:60])
    headers = {}
    for line in lines[1:]:
        k, colon, v = line.partition(":")
        if colon:
            headers[k.strip().lower()] = v.strip()
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return Fetched(None, "not-http", "chunked answer to an HTTP/1.0 request")
    length = headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            return Fetched(None, "not-http", f"Content-Length {length[:20]!r}")
        if len(body) != int(length):
            return Fetched(None, "truncated", f"{len(body)} of {length} bytes")
    return Fetched(body.decode("utf-8", "replace"))


def fetch_all(
    urls: Mapping[str, str], deadline_s: float, max_open: int = 256,
    per_url_s: Optional[float] = None, max_bytes: int = MAX_BYTES,
    groups: Optional[Mapping[str, Hashable]] = None, group_bytes: Optional[int] = None,
    clock: Callable[[], float] = time.monotonic, headers: Mapping[str, str] = {},
    key_headers: Mapping[str, Mapping[str, str]] = {},
) -> Dict[str, Fetched]:
    """GET every URL (key -> URL) concurrently, each with ``headers`` and its key's
    ``key_headers``; returns within about
    ``deadline_s``. ``groups``: key -> group whose URLs share the slots fairly with the other
    groups'; ``group_bytes``: what one group's answers may hold in all (memory: each is kept
    whole)."""
    start = clock()
    end = start + max(0.0, deadline_s)
    limit = per_url_s if per_url_s is not None else deadline_s
    f = _Fetch(_Queue(urls, groups), max_bytes, group_bytes, headers, key_headers)
    try:
        while f.queue or f.conns:
            now = clock()
            if now >= end:
                break
            while f.queue and len(f.conns) < max_open and clock() < end:
                # (name resolution blocks: a slow resolver costs this loop, so it checks the
                # deadline per URL; node addresses from Slurm are usually IPs already)
                f.start(now)
            wait = max(0.0, min(end, min((c.started + limit for c in f.conns.values()),
                                         default=end)) - clock())
            for skey, events in f.sel.select(timeout=min(wait, 0.25)):
                f.on_event(skey.data, events)
            f.expire(clock(), limit)
    finally:
        f.close(deadline_s)
    return f.out


class _Fetch:
    """The connections of one :func:`fetch_all` call, and what each URL came to."""

    def __init__(self, queue: _Queue, max_bytes: int, group_bytes: Optional[int],
                 headers: Mapping[str, str], key_headers: Mapping[str, Mapping[str, str]]
                 ) -> None:
        self.queue = queue
        self.max_bytes = max_bytes
        self.group_bytes = group_bytes
        self.headers = headers
        self.key_headers = key_headers
        self.out: Dict[str, Fetched] = {}
        self.sel = selectors.DefaultSelector()
        self.conns: Dict[int, _Conn] = {}
        self.addr_cache: Dict[Tuple[str, int], Tuple[int, Tuple[object, ...]]] = {}

    def finish(self, c: _Conn, result: Fetched) -> None:
        self.out[c.key] = result
        try:
            self.sel.unregister(c.sock)
        except (KeyError, ValueError):
            pass
        c.sock.close()
        if self.conns.pop(id(c), None) is not None:
            self.queue.open[c.group] -= 1

    def start(self, now: float) -> None:
        """Open the next URL of the queue (an error is its answer)."""
        key, url, group = self.queue.pop()
        try:
            host, port, req = _target(url, {**self.headers, **self.key_headers.get(key, {})})
            sock, err = self._connect(host, port)
        except (OSError, ValueError, UnicodeError) as exc:
            self._refused(key, group, str(exc)[:120])
            return
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            sock.close()
            self._refused(key, group, f"connect: errno {err}")
            return
        c = _Conn(key, sock, req, now, group)
        self.conns[id(c)] = c
        self.sel.register(sock, selectors.EVENT_WRITE, c)

    def _connect(self, host: str, port: int) -> Tuple[socket.socket, int]:
        """A non-blocking socket connecting to ``host:port`` (resolved once per call), and
        ``connect_ex``'s errno."""
        if (host, port) not in self.addr_cache:
            info = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            self.addr_cache[(host, port)] = (info[0], info[4])
        family, addr = self.addr_cache[(host, port)]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setblocking(False)
        return sock, sock.connect_ex(addr)

    def _refused(self, key: str, group: Hashable, detail: str) -> None:
        self.out[key] = Fetched(None, "unreachable", detail)
        self.queue.open[group] -= 1

    def on_event(self, c: _Conn, events: int) -> None:
        try:
            if events & selectors.EVENT_WRITE:
                self._send(c)
            elif events & selectors.EVENT_READ:
                self._receive(c)
        except OSError as exc:
            self.finish(c, Fetched(None, "unreachable", str(exc)[:120]))

    def _send(self, c: _Conn) -> None:
        if not c.connected:
            err = c.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
            if err:
                self.finish(c, Fetched(None, "unreachable", f"errno {err}"))
                return
            c.connected = True
        c.sent += c.sock.send(c.request[c.sent:])
        if c.sent >= len(c.request):
            self.sel.modify(c.sock, selectors.EVENT_READ, c)

    def _receive(self, c: _Conn) -> None:
        chunk = c.sock.recv(65536)
        if not chunk:
            self.finish(c, parse_response(bytes(c.data)))
            return
        c.data += chunk
        self.queue.received[c.group] += len(chunk)
        if len(c.data) > self.max_bytes:
            self.finish(c, Fetched(None, "too-large", f"> {self.max_bytes} bytes"))
        elif self.group_bytes is not None and self.queue.received[c.group] > self.group_bytes:
            self.finish(c, Fetched(None, "over-budget", "its group's answers "
                                   f"passed {self.group_bytes} bytes"))

    def expire(self, now: float, limit: float) -> None:
        """End the connections open for ``limit`` seconds or more."""
        for c in [c for c in self.conns.values() if now - c.started >= limit]:
            self.finish(c, Fetched(None, "timeout", f"no full answer within {limit:g}s"))

    def close(self, deadline_s: float) -> None:
        """The deadline passed (or the call is over): whatever is left has its answer."""
        for c in list(self.conns.values()):
            self.finish(c, Fetched(None, "deadline",
                                   f"cycle deadline {deadline_s:g}s passed mid-answer"))
        for key in self.queue.rest():
            self.out[key] = Fetched(None, "deadline", f"cycle deadline {deadline_s:g}s passed")
        self.sel.close()


def get(url: str, timeout: float) -> str:
    """One GET bounded by ``timeout`` in all (not per socket operation); OSError otherwise."""
    res = fetch_all({"": url}, timeout)[""]
    if res.body is None:
        raise OSError(f"{url}: {res.reason} ({res.detail})")
    return res.body
