#!/usr/bin/env python3
"""A stand-in inference server: serves requests at a latency the demo sets, and exports them
on 127.0.0.1 (what ``--iso-metrics=PORT`` names for the agent) exactly as vLLM's V1 engine and
its OpenAI API server do: the real ``prometheus_client``, vLLM's names, labels
(``model_name``, ``engine``, ``finished_reason``) and bucket layout (vllm/v1/metrics/
loggers.py; tests/fixtures/servers.py cites the source), and the API server's
prometheus-fastapi-instrumentator counter ``http_requests_total{handler,method,status}``.

It answers one simulated request every ``--interval`` seconds. Each request's time to first
token is the number of milliseconds in ``--control`` (re-read every request; ``50`` if the
file is absent or does not parse); its end-to-end latency is that plus 200 ms of decoding, so
the demo drives the job's TTFT (the SLO signal the sandbox judges, as the example config does
for vLLM) over and back under the SLO by writing one number. No latency is slept: only the
figures matter, and the request count keeps rising while the job runs, so a test can tell that
the job was never stopped. ``--log`` gets ``served=N`` lines (every 50 requests) and
``# listening port=P``.

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
from typing import Any

#: vLLM V1's layouts (after vLLM PR #15202; vllm/v1/metrics/buckets.py keeps the same values).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
MODEL = "standin"
DECODE_S = 0.2


class Metrics:
    """vLLM's series for one model on engine 0, in a registry of their own."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        r = self.registry
        self.e2e = Histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request "
                             "latency in seconds.", labels, buckets=E2E_BUCKETS, registry=r)
        self.ttft = Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first "
                              "token in seconds.", labels, buckets=TTFT_BUCKETS, registry=r)
        self.itl = Histogram("vllm:inter_token_latency_seconds", "Histogram of inter-token "
                             "latency in seconds.", labels, buckets=ITL_BUCKETS, registry=r)
        self.success = Counter("vllm:request_success", "Count of successfully processed "
                               "requests.", labels + ["finished_reason"], registry=r)
        for reason in ("stop", "length", "abort", "error"):
            self.success.labels(MODEL, "0", reason)
        self.http = Counter("http_requests", "Total number of requests by method, status and "
                            "handler.", ["method", "status", "handler"], registry=r)

    def observe(self, ttft_s: float) -> None:
        self.ttft.labels(MODEL, "0").observe(ttft_s)
        self.itl.labels(MODEL, "0").observe(0.02)
        self.e2e.labels(MODEL, "0").observe(ttft_s + DECODE_S)
        self.success.labels(MODEL, "0", "stop").inc()
        self.http.labels("POST", "2xx", "/v1/completions").inc()

    def render(self) -> Any:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


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
    hist = Metrics()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            garbage = read_control(args.control).startswith("garbage")
            body = GARBAGE if garbage else hist.render()
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
