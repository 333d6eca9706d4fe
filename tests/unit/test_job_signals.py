"""The agent's per-job latency signals against real HTTP endpoints on 127.0.0.1: good, hanging,
garbage, 100 MB, redirecting, squatted ports, a job lying about itself (issue 24)."""

from __future__ import annotations

import http.server
import math
import os
import threading
import time
from typing import Any, Callable, Dict, Iterator, List

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from slurmiso.agent import port_owners as ports
from slurmiso.agent.job_signals import JobSignalsCollector, JobSignalsState
from slurmiso.config.model import SignalSettings
from slurmiso.exposition import job_series as sig
from slurmiso.exposition import scrape
from slurmiso.exposition.text import BadData, parse_prometheus_text
from slurmiso.state.record import JobRecord, RecordStatus
from tests.unit.test_endpoint_profiles import cum, vllm

Route = Callable[[http.server.BaseHTTPRequestHandler], None]
#: How long a hanging or trickling route runs at most if the test never releases it: a hang
#: guard, two orders of magnitude above the 1 s fetch timeouts under test.
HANG_CAP_S = 120.0


class Server:
    """A threaded HTTP server on 127.0.0.1 whose answers the test sets per path."""

    def __init__(self) -> None:
        routes: Dict[str, Route] = {}
        self.routes = routes
        self.hits: List[str] = []
        hits = self.hits
        #: Set by close(): the hanging and trickling routes run until then (or HANG_CAP_S), so
        #: "answered while the endpoint still hung" is an order of events, not a time.
        self.release = threading.Event()
        self.hanging = 0  # routes now hanging or trickling

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                hits.append(self.path)
                route = routes.get(self.path)
                if route is None:
                    self.send_error(404)
                    return
                try:
                    route(self)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.slurmiso_test = self  # type: ignore[attr-defined]  # what routes reach
        self.httpd.daemon_threads = True
        self.httpd.block_on_close = False  # type: ignore[attr-defined]
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def text(self, path: str, body: Callable[[], str]) -> None:
        def route(h: http.server.BaseHTTPRequestHandler) -> None:
            data = body().encode()
            h.send_response(200)
            h.send_header("Content-Type", "text/plain; version=0.0.4")
            h.send_header("Content-Length", str(len(data)))
            h.end_headers()
            h.wfile.write(data)
        self.routes[path] = route

    def close(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    s = Server()
    yield s
    s.close()


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def record(job: str, metrics: str = "", cls: str = "infer", uid: int = -2, steps: str = ""
           ) -> JobRecord:
    return JobRecord(job, RecordStatus.READY, uid=os.getuid() if uid == -2 else uid,
                     job_class=cls, metrics=metrics, steps_file=steps)


def state(clock: Clock, **kw: Any) -> JobSignalsState:
    settings = SignalSettings(refresh_s=5, window_s=60, timeout_s=1)
    return JobSignalsState(settings, slo_classes=("infer",), training_classes=("train",),
                           clock=clock, **kw)


def scrape_text(st: JobSignalsState) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobSignalsCollector(st))
    return generate_latest(registry).decode()


def signals_of(text: str, node: str = "") -> Dict[str, sig.JobSignals]:
    """An agent's per-job series as the monitor reads them (AgentSource.read): the answer
    parsed strictly once, then :func:`signals.from_samples`."""
    return sig.from_samples(parse_prometheus_text(text, strict=True), node)


def read(st: JobSignalsState) -> Dict[str, sig.JobSignals]:
    return signals_of(scrape_text(st), "n1")


def test_an_endpoint_read_twice_gives_its_window_quantiles(server: Server) -> None:
    bodies = [vllm(cum(1000, 1000, 1000, 1000), stop=1000),
              vllm(cum(1010, 1050, 1090, 1100), stop=1095, error=5)]
    server.text("/metrics", lambda: bodies[min(len(server.hits), 2) - 1])
    clock = Clock()
    st = state(clock)
    recs = {"41": record("41", f"{server.port}/metrics")}
    st.refresh(recs)
    first = read(st)["41"]
    assert first.p99_ms is None and "latency:first-sample" in first.unknown
    assert first.latency_age_s == math.inf
    clock.t += 5
    st.refresh(recs)
    clock.t += 2  # a scrape 2 s after the reading
    js = read(st)["41"]
    assert (js.p50_ms, js.p95_ms, js.p99_ms) == pytest.approx((500.0, 1000.0, 1000.0))
    assert js.requests == 100 and js.error_rate == pytest.approx(0.05)
    assert js.latency_age_s == pytest.approx(2.0) and js.unknown == ()
    assert js.job_class == "infer" and js.node == "n1"


def _until_released(h: http.server.BaseHTTPRequestHandler, every_s: float,
                    step: Callable[[], None]) -> None:
    """Run ``step`` every ``every_s`` until the server is closed (or HANG_CAP_S passed)."""
    server: Server = h.server.slurmiso_test  # type: ignore[attr-defined]
    server.hanging += 1
    try:
        end = time.monotonic() + HANG_CAP_S
        while not server.release.wait(every_s) and time.monotonic() < end:
            step()
    finally:
        server.hanging -= 1


def _hang(h: http.server.BaseHTTPRequestHandler) -> None:
    _until_released(h, 1.0, lambda: None)


def _garbage(h: http.server.BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.end_headers()
    h.wfile.write(os.urandom(5000))


def _huge(h: http.server.BaseHTTPRequestHandler) -> None:
    """100 MB of a valid-looking answer, as fast as the agent takes it."""
    h.send_response(200)
    h.send_header("Content-Length", str(100 * 1024 * 1024))
    h.end_headers()
    chunk = b"vllm:request_success_total 1\n" * 36000
    for _ in range(100):
        h.wfile.write(chunk)


def _redirect(h: http.server.BaseHTTPRequestHandler) -> None:
    h.send_response(302)
    h.send_header("Location", "http://10.1.2.3:9100/metrics")
    h.send_header("Content-Length", "0")
    h.end_headers()


def _trickle(h: http.server.BaseHTTPRequestHandler) -> None:
    h.send_response(200)
    h.end_headers()

    def one_byte() -> None:
        h.wfile.write(b"#")
        h.wfile.flush()

    _until_released(h, 0.1, one_byte)


@pytest.mark.parametrize("route, reason", [
    (_hang, "timeout"), (_garbage, sig.R_NO_SERIES), (_huge, "too-large"),
    (_redirect, "http-status"), (_trickle, "timeout"),
])
def test_bad_endpoints_are_unknown_with_a_reason_within_the_timeout(
        server: Server, route: Route, reason: str) -> None:
    server.routes["/metrics"] = route
    server.text("/ok", lambda: vllm(cum(1, 2, 3, 4), stop=4))
    clock = Clock()
    st = state(clock)
    recs = {"41": record("41", f"{server.port}/metrics"), "42": record("42", f"{server.port}/ok")}
    st.refresh(recs)
    if route in (_hang, _trickle):
        # bounded by the 1 s timeout, never by the endpoint: it is still hanging (it ends only
        # when the test closes the server), whatever this machine's speed
        assert server.hanging == 1, "the refresh waited for the endpoint, not its timeout"
    got = read(st)
    assert got["41"].unknown == (f"latency:{reason}",)
    assert got["41"].p99_ms is None and got["41"].requests is None
    assert got["41"].latency_age_s == math.inf
    assert got["42"].unknown == ("latency:first-sample",), "the other job is read as usual"
    assert len(server.hits) <= 2 and "http://10.1.2.3" not in "".join(server.hits)


def test_a_failing_endpoint_keeps_no_old_figures_and_its_age_grows(server: Server) -> None:
    answers = [vllm(cum(0, 0, 0, 0)), vllm(cum(10, 50, 90, 100), stop=100)]
    server.text("/metrics", lambda: answers[len(server.hits) - 1])
    clock = Clock()
    st = state(clock)
    recs = {"41": record("41", f"{server.port}/metrics")}
    st.refresh(recs)
    clock.t += 5
    st.refresh(recs)
    assert read(st)["41"].p99_ms == pytest.approx(1000.0)
    server.routes["/metrics"] = _redirect
    clock.t += 5
    st.refresh(recs)
    clock.t += 1
    js = read(st)["41"]
    assert js.p99_ms is None and js.unknown == ("latency:http-status",)
    assert js.latency_age_s == pytest.approx(6.0)


def test_a_job_lying_about_latency_moves_only_its_own_series(server: Server) -> None:
    """Job 66 serves terrible figures and forged slurmiso series naming job 41; job 41's
    figures are its own endpoint's, whatever 66 answers."""
    liar = [vllm(cum(0, 0, 0, 0)),
            vllm(cum(0, 0, 0, 1000), error=1000) +
            'slurmiso_job_latency_seconds{job="41",class="infer",quantile="0.99"} 99\n'
            'slurmiso_job_signal_unknown{job="41",class="infer",signal="latency",'
            'reason="timeout"} 1\n']
    honest = [vllm(cum(0, 0, 0, 0)), vllm(cum(90, 100, 100, 100), stop=100)]
    server.text("/liar", lambda: liar[sum(1 for h in server.hits if h == "/liar") - 1])
    server.text("/honest", lambda: honest[sum(1 for h in server.hits if h == "/honest") - 1])
    clock = Clock()
    st = state(clock)
    recs = {"41": record("41", f"{server.port}/honest"), "66": record("66", f"{server.port}/liar")}
    st.refresh(recs)
    clock.t += 5
    st.refresh(recs)
    got = read(st)
    assert got["66"].p99_ms == pytest.approx(1000.0) and got["66"].error_rate == 1.0
    # 41's window: 90 requests up to 0.1 s, 10 up to 0.5 s: P99 rank 99 is 0.1 + 0.4 * 9/10
    assert got["41"].p99_ms == pytest.approx(460.0)
    assert got["41"].p50_ms == pytest.approx(100.0 * 50 / 90)
    assert got["41"].error_rate == 0.0 and got["41"].unknown == ()


def test_a_port_another_user_listens_on_is_never_read(server: Server) -> None:
    """The listener on the job's port is not the job's user: nothing is fetched."""
    server.text("/metrics", lambda: vllm(cum(1, 2, 3, 4)))
    fetched: List[Dict[str, str]] = []

    def fetch(urls: Dict[str, str], *a: Any) -> Dict[str, scrape.Fetched]:
        fetched.append(dict(urls))
        return scrape.fetch_all(urls, *a)

    st = state(Clock(), fetch=fetch, listeners=lambda: {server.port: {54321}})
    st.refresh({"41": record("41", f"{server.port}/metrics")})
    assert read(st)["41"].unknown == ("latency:port-not-owned",)
    assert fetched == [] and server.hits == []
    st = state(Clock(), fetch=fetch, listeners=lambda: {})
    st.refresh({"41": record("41", f"{server.port}/metrics")})
    assert read(st)["41"].unknown == ("latency:unreachable",) and server.hits == []


def test_nothing_listening_and_a_process_in_another_network_namespace_says_so() -> None:
    """A container with its own network listens where the node's loopback cannot reach: the
    reason names that (asked only for the jobs nothing listens for), latency stays unknown."""
    asked: List[List[str]] = []

    def elsewhere(jobs: List[str], records: Any) -> set:
        asked.append(list(jobs))
        assert set(records) == {"41", "42", "43"}  # the refresh's own records
        return {"41"}

    st = state(Clock(), listeners=lambda: {}, elsewhere=elsewhere)
    st.refresh({"41": record("41", "8000/metrics"), "42": record("42", "8001/metrics"),
                "43": record("43", "", cls="debug")})
    got = read(st)
    assert got["41"].unknown == ("latency:other-netns",)
    assert got["42"].unknown == ("latency:unreachable",)
    assert asked == [["41", "42"]]


def test_a_failing_namespace_lookup_leaves_the_reason_unreachable() -> None:
    def elsewhere(jobs: List[str], records: Any) -> set:
        raise PermissionError("state dir")

    st = state(Clock(), listeners=lambda: {}, elsewhere=elsewhere)
    st.refresh({"41": record("41", "8000/metrics")})
    assert read(st)["41"].unknown == ("latency:unreachable",)


def test_the_kernel_names_the_test_servers_uid(server: Server) -> None:
    owners = ports.loopback_listeners()
    assert owners is not None and owners.get(server.port) == {os.getuid()}


def test_only_127_0_0_1_is_ever_connected_to() -> None:
    """The URL is built from the record's port and path; a record holding anything else (a
    host, a scheme, a CRLF) is not a URL at all."""
    seen: List[str] = []

    def fetch(urls: Dict[str, str], *a: Any) -> Dict[str, scrape.Fetched]:
        seen.extend(urls.values())
        return {k: scrape.Fetched(None, "unreachable") for k in urls}

    st = state(Clock(), fetch=fetch, listeners=lambda: None)
    recs = {"1": record("1", "8000/metrics"), "2": record("2", "10.0.0.5:8000/metrics"),
            "3": record("3", "8000/x\r\nHost: evil"), "4": record("4", "http://evil/8000")}
    st.refresh(recs)
    assert seen == ["http://127.0.0.1:8000/metrics"]
    got = read(st)
    assert {j: got[j].unknown for j in ("2", "3", "4")} == {
        j: ("latency:parse",) for j in ("2", "3", "4")}


def test_totals_without_quantiles_are_no_fresh_latency(server: Server) -> None:
    """Triton without summaries: requests and errors, but the latency age stays +Inf."""
    n = [10]
    server.text("/metrics", lambda: f'nv_inference_request_success{{model="m"}} {n[0]}\n'
                                    'nv_inference_request_failure{model="m"} 0\n')
    clock = Clock()
    st = state(clock)
    recs = {"41": record("41", f"{server.port}/metrics")}
    st.refresh(recs)
    n[0] = 30
    clock.t += 5
    st.refresh(recs)
    js = read(st)["41"]
    assert js.requests == 20 and js.error_rate == 0.0 and js.p99_ms is None
    assert js.unknown == ("latency:no-quantiles",) and js.latency_age_s == math.inf


def test_jobs_expected_to_serve_latency_but_without_an_endpoint_are_unknown() -> None:
    st = state(Clock())
    st.refresh({"41": record("41", ""), "50": record("50", "", cls="debug")})
    got = read(st)
    assert got["41"].unknown == ("latency:no-endpoint",) and got["41"].latency_age_s == math.inf
    assert "50" not in got, "a job of a class without an SLO exports nothing"


def test_a_refresher_that_fell_behind_makes_everything_stale(server: Server) -> None:
    server.text("/metrics", lambda: vllm(cum(1, 2, 3, 4), stop=4))
    clock = Clock()
    st = state(clock)
    recs = {"41": record("41", f"{server.port}/metrics")}
    st.refresh(recs)
    clock.t += 5
    st.refresh(recs)
    clock.t += 60  # no refresh for 12 intervals
    js = read(st)["41"]
    assert js.unknown == ("latency:stale",) and js.p99_ms is None and js.requests is None
    assert js.latency_age_s == pytest.approx(60.0)


def test_jobs_that_ended_are_forgotten(server: Server) -> None:
    server.text("/metrics", lambda: vllm(cum(1, 2, 3, 4)))
    st = state(Clock())
    st.refresh({"41": record("41", f"{server.port}/metrics")})
    st.refresh({})
    assert st.jobs == {} and read(st) == {}
    refused = record("43", f"{server.port}/metrics")
    refused.status = RecordStatus.REFUSED
    st.refresh({"43": refused})
    assert read(st) == {} and len(server.hits) == 1


def test_only_the_contract_series_are_read_and_absurd_figures_are_none() -> None:
    text = "\n".join([
        'slurmiso_job_gpu{job="7",class="train",gpu="0",gi="3"} 1',
        'slurmiso_job_gpu{job="7",class="train",gpu="x",gi=""} 1',
        'slurmiso_job_gpu{job="",class="foreign",gpu="1",gi=""} 1',
        'slurmiso_job_latency_seconds{job="7",class="train",quantile="0.99"} NaN',
        'slurmiso_job_latency_seconds{job="7",class="train",quantile="0.5"} -3',
        'slurmiso_job_error_ratio{job="7",class="train"} 7',
        'slurmiso_job_signal_age_seconds{job="7",class="train",signal="steps"} +Inf',
        'slurmiso_job_step_seconds{job="7",class="train"} 0.25',
        'slurmiso_job_throughput_vs_solo{job="7",class="train"} 0.8',
        'slurmiso_gpu_memory_used_bytes{gpu="0",job="7"} 5',
    ]) + "\n"
    got = signals_of(text, "n2")
    assert set(got) == {"7"}, "a foreign process (job \"\") is not a job"
    js = got["7"]
    assert js.gpus == ((0, "3"),) and js.p99_ms is None and js.p50_ms is None
    assert js.error_rate == 1.0 and js.steps_age_s == math.inf and js.latency_age_s is None
    assert js.step_s == 0.25 and js.throughput_vs_solo == 0.8
    with pytest.raises(BadData):  # a garbled answer is the node's unknown, not half-read
        signals_of(text + "this line { is not prometheus\n", "n2")


def test_one_parse_of_a_full_node_is_cheap() -> None:
    """1,000 jobs' series parse in well under a second (the monitor reads every node)."""
    lines: List[str] = []
    for j in range(1000):
        who = f'job="{j}",class="infer"'
        lines += [f'slurmiso_job_gpu{{{who},gpu="{j % 8}",gi=""}} 1',
                  *(f'slurmiso_job_latency_seconds{{{who},quantile="{q}"}} 0.1'
                    for q in sig.QUANTILES),
                  f'slurmiso_job_requests{{{who}}} 10',
                  f'slurmiso_job_signal_age_seconds{{{who},signal="latency"}} 3']
    got = signals_of("\n".join(lines))  # its speed is bench_monitor's business, not a test's
    assert len(got) == 1000 and got["999"].p95_ms == pytest.approx(100.0)


def test_the_monitor_reads_each_jobs_signals_from_the_agents_answer(monkeypatch: Any) -> None:
    """The agent's per-job series reach the snapshot the ladder decides on (telemetry's
    AgentSource), parsed once with the GPU series."""
    import slurmiso.exposition.scrape as scrape
    from slurmiso.monitor.telemetry import AgentSource

    body = (
        "slurmiso_agent_up 1\n"
        'slurmiso_gpu_memory_used_bytes{gpu="0"} 1e9\n'
        'slurmiso_gpu_memory_total_bytes{gpu="0"} 8e10\n'
        'slurmiso_job_gpu{job="7",class="infer",gpu="0",gi=""} 1\n'
        'slurmiso_job_latency_seconds{job="7",class="infer",quantile="0.99"} 0.4\n'
        'slurmiso_job_requests{job="7",class="infer"} 30\n'
        'slurmiso_job_signal_age_seconds{job="7",class="infer",signal="latency"} 2\n'
    )

    class Fetched:
        def __init__(self, text: str) -> None:
            self.body, self.reason, self.detail = text, "", ""

    monkeypatch.setattr(scrape, "fetch_all", lambda urls, *a, **k: {n: Fetched(body) for n in urls})
    reading = AgentSource(9810, {"n1": "http://127.0.0.1:9/metrics"}).read({"n1": ""}, 0.0)
    assert reading.gpus["n1"][0].memory_total_mb > 0
    got = reading.job_signals["7"]
    assert got.p99_ms == 400.0 and got.gpus == ((0, ""),) and got.node == "n1"
    assert got.requests == 30 and got.latency_age_s == 2


def test_one_agents_bad_job_series_is_that_nodes_unknown_not_the_cycles(
        monkeypatch: Any) -> None:
    """A gpu label that passes isdigit() but not int() ("²") in one agent's per-job series
    made the whole gather fail: every node unknown. Now only that node is."""
    import slurmiso.exposition.scrape as scrape
    from slurmiso.monitor.telemetry import AgentSource

    good = ("slurmiso_agent_up 1\n"
            'slurmiso_gpu_memory_used_bytes{gpu="0"} 1e9\n'
            'slurmiso_gpu_memory_total_bytes{gpu="0"} 8e10\n')
    bad = good + 'slurmiso_job_gpu{job="7",class="infer",gpu="\u00b2",gi=""} 1\n'

    class Fetched:
        def __init__(self, text: str) -> None:
            self.body, self.reason, self.detail = text, "", ""

    bodies = {"n1": good, "n2": bad}
    monkeypatch.setattr(scrape, "fetch_all",
                        lambda urls, *a, **k: {n: Fetched(bodies[n]) for n in urls})
    urls = {n: f"http://127.0.0.1:9/{n}" for n in bodies}
    reading = AgentSource(9810, urls).read({"n1": "", "n2": ""}, 0.0)
    assert "n1" in reading.gpus and "n2" not in reading.gpus
    assert reading.unknown == {"agents/bad-job-series": 1}
    assert any("/n2" in line for line in reading.errors)
