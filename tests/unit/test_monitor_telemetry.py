"""Telemetry: the Prometheus text parser, recorded agent output, DCGM API JSON, and the
HTTP sources against a loopback server (never anything but 127.0.0.1)."""

from __future__ import annotations

import copy
import http.server
import os
import threading
import urllib.parse
from typing import Any, Dict, Iterator, Optional, Tuple

import pytest

from slurmiso.exposition import gpu_series as gs
from slurmiso.exposition.text import parse_prometheus_text
from slurmiso.monitor import telemetry as t

FIX = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "monitor")
NOW = 1796287000.123


def fixture(name: str) -> str:
    with open(os.path.join(FIX, name), encoding="utf-8") as fh:
        return fh.read()


PARSE = [
    ('up 1', ("up", {}, 1.0, None)),
    ('m{a="x",b="y"} 2.5 1700000000000', ("m", {"a": "x", "b": "y"}, 2.5, 1700000000.0)),
    ('m{a="q\\"uo\\\\te\\n"} 3', ("m", {"a": 'q"uo\\te\n'}, 3.0, None)),
    ('m{a="sp ace",} +Inf', ("m", {"a": "sp ace"}, float("inf"), None)),
    ('m{} 1e+10', ("m", {}, 1e10, None)),
]


@pytest.mark.parametrize("line,expected", PARSE)
def test_parse_line(line: str, expected: Tuple[str, Dict[str, str], float, float]) -> None:
    assert tuple(parse_prometheus_text(line)[0]) == expected


def test_parse_skips_comments_and_garbage() -> None:
    text = "# HELP x y\n# TYPE x gauge\nx 1\nnot a metric line {\n\nm{a=\"1\"} nan-ish\ny 2\n"
    assert [s.name for s in parse_prometheus_text(text)] == ["x", "y"]


def test_recorded_agent_output() -> None:
    gpus, collected = t.agent_gpus(parse_prometheus_text(fixture("agent-n3.prom")))
    assert collected and collected > 1.7e9
    assert [g.index for g in gpus] == [0, 1]
    assert gpus[0].memory_used_mb == 61440 and gpus[0].memory_total_mb == 81559
    assert gpus[0].mig_profiles == ("3g.40gb", "3g.40gb")
    assert gpus[1].mig_profiles == ("3g.40gb", "4g.40gb")
    assert gpus[0].sm_active_pct == 0.0


COLLECTED = 'slurmiso_agent_collected_timestamp_seconds{node="n3"} 1.7962876269728253e+09\n'


def _agent_file(folder: str, collected: Optional[float], mtime: float) -> None:
    text = fixture("agent-n3.prom")
    assert COLLECTED in text
    stamp = "" if collected is None else COLLECTED.replace("1.7962876269728253e+09", repr(collected))
    path = os.path.join(folder, "n3.prom")
    with open(path, "w") as fh:
        fh.write(text.replace(COLLECTED, stamp))
    os.utime(path, (mtime, mtime))


@pytest.mark.parametrize("collected, mtime, age", [
    (NOW - 30.0, NOW - 500.0, 30.0),  # the agent's own timestamp wins over the file's mtime
    (None, NOW - 42.0, 42.0),  # no timestamp: the file's age
    (NOW + 5.0, NOW - 500.0, 0.0),  # a clock ahead reads as fresh (0.0 is measured, not unset)
])
def test_file_source_ages(tmp_path: os.PathLike[str], collected: Optional[float], mtime: float,
                          age: float) -> None:
    _agent_file(str(tmp_path), collected, mtime)
    r = t.FileSource(str(tmp_path)).read({"n3": "", "n9": ""}, NOW)
    assert set(r.gpus) == {"n3"} and len(r.errors) == 1 and "n9.prom" in r.errors[0]
    assert r.ages["n3"] == pytest.approx(age)


def test_agent_without_a_timestamp_has_no_age() -> None:
    """Not measured is None: an answer without its collection time must not read as fresh."""
    text = fixture("agent-n3.prom").replace(COLLECTED, "")
    gpus, age = t.agent_view(text, NOW)
    assert gpus and age is None


def test_dcgm_folding() -> None:
    series = {gs.DCGM_USED: t.parse_query_result(_json("dcgm-fb-used.json")),
              gs.DCGM_FREE: t.parse_query_result(_json("dcgm-fb-free.json")),
              gs.DCGM_SM: t.parse_query_result(_json("dcgm-sm-active.json")),
              gs.DCGM_GR: t.parse_query_result(_json("dcgm-gr-active.json")),
              f"timestamp({gs.DCGM_USED})": t.parse_query_result(_json("dcgm-timestamp.json"))}
    r = t.Reading()
    t.dcgm_gpus(series, {"gpu017": "10.0.0.17", "gpu018": ""}, NOW, r)
    g17 = r.gpus["gpu017"][0]
    assert (g17.memory_used_mb, g17.memory_total_mb) == (50000, 80000), "MIG instances add up"
    assert g17.sm_active_pct == pytest.approx(91.0), "busiest instance"
    assert g17.mig_profiles == ("3g.40gb", "3g.40gb")
    assert r.gpus["gpu018"][0].index == 1, "FQDN Hostname maps to the short node name"
    assert r.ages["gpu017"] == pytest.approx(NOW - 1796286980)
    assert r.ages["gpu018"] == pytest.approx(NOW - 1796286700)


def test_query_result_errors() -> None:
    with pytest.raises(ValueError):
        t.parse_query_result({"status": "error", "error": "parse error"})
    with pytest.raises(ValueError):
        t.parse_query_result({"status": "success", "data": {"resultType": "matrix"}})


def _json(name: str) -> object:
    import json

    return json.loads(fixture(name))


# ----------------------------------------------------------------------- loopback HTTP
ROUTES = {
    "/metrics": ("text/plain", "agent-n3.prom"),
    gs.DCGM_USED: ("application/json", "dcgm-fb-used.json"),
    gs.DCGM_FREE: ("application/json", "dcgm-fb-free.json"),
    gs.DCGM_SM: ("application/json", "dcgm-sm-active.json"),
    gs.DCGM_GR: ("application/json", "dcgm-gr-active.json"),
    f"timestamp({gs.DCGM_USED})": ("application/json", "dcgm-timestamp.json"),
    gs.DCGM_UTIL: ("application/json", "dcgm-gpu-util.json"),
    "p99_infer": ("application/json", "latency-infer.json"),
    "timestamp(p99_infer)": ("application/json", "latency-infer-timestamp.json"),
}


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urllib.parse.urlparse(self.path)
        key = urllib.parse.parse_qs(url.query).get("query", [url.path])[0]
        if key not in ROUTES:
            self.send_response(404)
            self.end_headers()
            return
        ctype, name = ROUTES[key]
        body = fixture(name).encode()
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_agent_source_over_http(server: str) -> None:
    src = t.AgentSource(9, {"n3": f"{server}/metrics", "n4": f"{server}/nope"}, timeout=2)
    r = src.read({"n3": "127.0.0.1", "n4": "127.0.0.1", "n5": "127.0.0.1"}, NOW)
    assert [g.index for g in r.gpus["n3"]] == [0, 1]
    assert "n4" not in r.gpus and len(r.errors) == 1, "n5 has no URL: not scraped"


def test_prometheus_source_over_http(server: str) -> None:
    src = t.PrometheusSource(server, {"infer": "p99_infer"}, timeout=2)
    r = src.read({"gpu017": "", "gpu018": ""}, NOW)
    assert r.errors == []
    assert r.gpus["gpu017"][0].memory_used_mb == 50000
    assert r.latency_p99_ms == {"infer": 312.25}, "the worst series of the class"
    assert r.latency_age_s == pytest.approx(NOW - 1796286850), \
        "latency age comes from the oldest sample's own time, not the query's"


def test_prometheus_down_is_an_error_line_not_an_exception() -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = t.PrometheusSource(f"http://127.0.0.1:{port}", {"infer": "x"}, timeout=1).read(
        {"gpu017": ""}, NOW)
    assert r.gpus == {} and len(r.errors) == 2


def _relabel(doc: Dict[str, Any], drop: str, add: Optional[str], value: Any = None) -> Any:
    """A query result whose series carry ``add`` (``value(old labels)``) instead of ``drop``,
    as DCGM exporter's newer source (``hostname``) or ``--no-hostname`` write them."""
    out = copy.deepcopy(doc)
    for item in out["data"]["result"]:
        m = item["metric"]
        old = m.pop(drop, None)
        if add is not None:
            m[add] = value(old) if value else old
    return out


@pytest.mark.parametrize("label,value", [
    ("hostname", None),  # DCGM exporter's source after d5e5f51 (2026-05-12)
    ("instance", lambda host: f"{host}:9400"),  # --no-hostname: Prometheus's target
])
def test_dcgm_node_from_hostname_or_instance(label: str, value: Any) -> None:
    series = {n: t.parse_query_result(_relabel(_json(f), "Hostname", label, value))
              for n, f in ((gs.DCGM_USED, "dcgm-fb-used.json"), (gs.DCGM_FREE, "dcgm-fb-free.json"),
                           (f"timestamp({gs.DCGM_USED})", "dcgm-timestamp.json"))}
    r = t.Reading()
    t.dcgm_gpus(series, {"gpu017": "10.0.0.17", "gpu018": ""}, NOW, r)
    assert sorted(r.gpus) == ["gpu017", "gpu018"] and "prometheus/unmapped" not in r.unknown


def test_dcgm_series_of_no_node_are_counted_not_dropped(caplog: Any) -> None:
    series = {gs.DCGM_USED: t.parse_query_result(_relabel(_json("dcgm-fb-used.json"),
                                                         "Hostname", None))}
    r = t.Reading()
    with caplog.at_level("WARNING"):
        t.dcgm_gpus(series, {"gpu017": "10.0.0.17", "gpu018": ""}, NOW, r)
    assert r.gpus == {} and r.unknown["prometheus/unmapped"] == len(series[gs.DCGM_USED])
    assert "--no-hostname" in caplog.text
