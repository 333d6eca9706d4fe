"""``slurmiso signals check URL`` against a local server that exports vLLM's exact series
(issue 32 item 7): the verdict the samples imply, and the warning that names the bucket."""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import sys
import threading
from typing import Any, Dict, Iterator, List

import pytest
import yaml

from slurmiso.cli.signals import check
from slurmiso.config import parse_config
from tests.fixtures import servers as fx

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "etc", "slurmiso.yaml")


class Endpoint:
    """A vLLM-shaped server on 127.0.0.1 that serves ``per_read`` requests before each
    answer, so two readings a window apart see exactly those requests."""

    def __init__(self, per_read: List[fx.Request], layout: str = "B") -> None:
        self.server = fx.Vllm(layout)
        for r in [fx.Request(0.05, 0.02, 0.01)] * 3:
            self.server.serve(r)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                for r in per_read:
                    outer.server.serve(r)
                body = outer.server.text().encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def endpoint() -> Iterator[Any]:
    made: List[Endpoint] = []

    def make(per_read: List[fx.Request], layout: str = "B") -> Endpoint:
        made.append(Endpoint(per_read, layout))
        return made[-1]

    yield make
    for e in made:
        e.close()


def config(slo: Dict[str, Any]) -> Any:
    with open(EXAMPLE) as fh:
        data = yaml.safe_load(fh)
    data["monitor"]["slo"] = [dict({"class": "infer"}, **slo)]
    return parse_config(data, "x.yaml")


def run(cfg: Any, url: str) -> Dict[str, Any]:
    return check(cfg, url, "", "", 1.0, sleep=lambda s: None)


def test_fast_vllm_under_a_250ms_e2e_slo_is_unknown_with_the_bucket(endpoint: Any) -> None:
    e = endpoint([fx.Request(v) for v in fx.spread(100, 0.02, 0.2)])
    r = run(config({"p99_ms": 250}), e.url)
    (c,) = r["classes"]
    assert r["profile"] == "vllm" and r["requests"] == 100
    assert c["verdict"] == "unknown" and c["over"] == {"llama": [0.0, 1.0]}
    assert any("(0 ms, 300 ms]" in w for w in r["warnings"]) and not r["ok"]
    assert r["quantiles_ms"]["e2e/llama"]["0.99"] == pytest.approx(297.0)


def test_ttft_slo_gives_the_verdict_the_samples_imply(endpoint: Any) -> None:
    calm = endpoint([fx.Request(1.0, ttft=0.1)] * 100)
    r = run(config({"signal": "ttft", "p99_ms": 500}), calm.url)
    assert r["classes"][0]["verdict"] == "calm" and r["ok"] and r["warnings"] == []
    hot = endpoint([fx.Request(1.0, ttft=0.1)] * 95 + [fx.Request(2.0, ttft=0.8)] * 5)
    r = run(config({"signal": "ttft", "p99_ms": 500}), hot.url)
    (c,) = r["classes"]
    assert c["verdict"] == "hot" and c["over"]["llama"] == pytest.approx([0.05, 0.05])


def test_failures_the_api_server_answers_are_errors(endpoint: Any) -> None:
    e = endpoint([fx.Request(0.1, 0.05)] * 69 + [fx.Request(0.01, outcome=fx.SERVER_ERROR)] * 31)
    r = run(config({"max_error_rate": 0.01}), e.url)
    assert r["error_ratio"] == pytest.approx(0.31)
    assert r["classes"][0]["verdict"] == "hot"


def test_the_command_line_json(endpoint: Any, tmp_path: Any) -> None:
    e = endpoint([fx.Request(1.0, ttft=0.1)] * 95 + [fx.Request(2.0, ttft=0.8)] * 5)
    with open(EXAMPLE) as fh:
        data = yaml.safe_load(fh)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    p = subprocess.run([sys.executable, "-m", "slurmiso", "-c", str(path), "signals", "check",
                        e.url, "--window", "0.2", "--json"], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["classes"][0]["verdict"] == "hot" and out["profile"] == "vllm"


def test_no_known_series_and_bad_urls_say_why(endpoint: Any, tmp_path: Any) -> None:
    cfg = config({"p99_ms": 300})
    r = check(cfg, "http://x/metrics", "", "", 1.0, fetch=lambda *a: "<html></html>",
              sleep=lambda s: None)
    assert r["profile"] is None and r["reason"] == "no-known-series" and not r["ok"]
    p = subprocess.run([sys.executable, "-m", "slurmiso", "-c", EXAMPLE, "signals", "check",
                        "ftp://x"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 2 and "not an http(s) URL" in p.stderr
    assert "Traceback" not in p.stderr
