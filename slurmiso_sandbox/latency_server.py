#!/usr/bin/env python3
"""A stand-in inference server: serves requests at a latency the demo sets, and exports them
as a Prometheus histogram on 127.0.0.1 (what ``--iso-metrics=PORT`` names for the agent).

It answers one simulated request every ``--interval`` seconds. Each request's latency is the
number of milliseconds in ``--control`` (re-read every request; ``50`` if the file is absent
or does not parse), so the demo drives the job's P99 over and back under the SLO by writing
one number. The series follow the generic profile slurmiso ships
(``*_request_duration_seconds`` histogram, ``*_requests_total{status}``), as a
prometheus_client server would name them. No latency is slept: only the figures matter, and
the request count keeps rising while the job runs, so a test can tell that the job was never
stopped. ``--log`` gets ``served=N`` lines (every 50 requests) and ``# listening port=P``.

For the ladder's tests: ``garbage MS`` in ``--control`` makes ``/metrics`` answer an HTML page
(no series: what a broken or hostile endpoint serves) while requests go on at MS ms,
and every signal the server can catch is logged as ``# signal NAME`` before its default
effect (TERM, INT, HUP end it), so a test can tell it was never signalled. SIGSTOP cannot be
caught, but the SIGCONT that ends any suspend can.
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import sys
import threading
import time
from typing import List

BOUNDS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
NAME = "standin_request_duration_seconds"


class Histogram:
    """Cumulative bucket counts, the sum and the count, under a lock (the HTTP thread reads
    while the request loop writes)."""

    def __init__(self) -> None:
        self.counts: List[int] = [0] * (len(BOUNDS) + 1)
        self.total = 0.0
        self.n = 0
        self.lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        with self.lock:
            for i, bound in enumerate(BOUNDS):
                if seconds <= bound:
                    self.counts[i] += 1
            self.counts[-1] += 1
            self.total += seconds
            self.n += 1

    def render(self) -> str:
        with self.lock:
            lines = [f"# HELP {NAME} Request latency (stand-in).", f"# TYPE {NAME} histogram"]
            for bound, count in zip(BOUNDS, self.counts):
                lines.append(f'{NAME}_bucket{{le="{bound}"}} {count}')
            lines.append(f'{NAME}_bucket{{le="+Inf"}} {self.counts[-1]}')
            lines.append(f"{NAME}_sum {self.total:.6f}")
            lines.append(f"{NAME}_count {self.n}")
            lines.append("# TYPE standin_requests_total counter")
            lines.append(f'standin_requests_total{{status="200"}} {self.n}')
            return "\n".join(lines) + "\n"


GARBAGE = b"<html><body><h1>It works!</h1></body></html>\n"
CAUGHT = ("SIGURG", "SIGWINCH", "SIGUSR1", "SIGUSR2", "SIGCONT", "SIGTSTP", "SIGTTIN",
          "SIGTTOU", "SIGALRM", "SIGTERM", "SIGINT", "SIGHUP")
ENDING = ("SIGTERM", "SIGINT", "SIGHUP")


def read_control(control: str) -> str:
    try:
        with open(control, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def latency_ms(text: str, last: float = 50.0) -> float:
    """The latency the control text asks for (``MS`` or ``garbage MS``); ``last`` where it
    names none."""
    try:
        return max(0.0, float(text.split()[-1]))
    except (ValueError, IndexError):
        return last


def log_signals(path: str) -> None:
    """Log each catchable signal; those that end a process by default still end it."""
    def handler(signum: int, _frame: object) -> None:
        name = signal.Signals(signum).name
        log_line(path, f"# signal {name[3:]} at={time.time():.3f}")
        if name in ENDING:
            os._exit(128 + signum)

    for name in CAUGHT:
        signal.signal(getattr(signal, name), handler)


def log_line(path: str, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text + "\n")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--control", required=True, help="file holding the latency in ms")
    p.add_argument("--log", required=True)
    p.add_argument("--interval", type=float, default=0.02)
    args = p.parse_args()
    hist = Histogram()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            garbage = read_control(args.control).startswith("garbage")
            body = GARBAGE if garbage else hist.render().encode()
            self.send_response(200)
            self.send_header("Content-Type",
                             "text/html" if garbage else "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    log_signals(args.log)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    log_line(args.log, f"# listening port={args.port} pid={os.getpid()}")
    served = 0
    last = 50.0
    while True:
        last = latency_ms(read_control(args.control), last)
        hist.observe(last / 1000.0)
        served += 1
        if served % 50 == 0:
            log_line(args.log, f"served={served} at={time.time():.3f}")
        time.sleep(args.interval)


if __name__ == "__main__":
    sys.exit(main())
