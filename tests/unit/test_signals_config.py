"""monitor.signals in slurmiso.yaml, --iso-metrics in the prolog's record, and the agent's
background reader keeping a scrape fast while an endpoint hangs (issue 24)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Dict, List

import pytest
import yaml

from slurmiso.config import parse_config
from slurmiso.config.model import DEFAULT_SERVERS
from slurmiso.errors import ConfigError
from slurmiso.exposition.text import parse_prometheus_text
from slurmiso.hooks.runner import run_hook
from slurmiso.monitor import telemetry as t
from tests.hookctx import Drains, job_env, state, write_config
from tests.unit.test_job_signals import signals_of

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _example(signals: Any) -> Dict[str, Any]:
    with open(os.path.join(REPO, "etc", "slurmiso.yaml")) as fh:
        data = yaml.safe_load(fh)
    data.setdefault("monitor", {})["signals"] = signals
    return data


def test_defaults_and_a_site_profile() -> None:
    cfg = parse_config(_example({}), "x.yaml")
    s = cfg.monitor.signals
    assert (s.refresh_s, s.window_s, s.timeout_s, s.max_body_mb, s.baseline_steps) == (
        5, 60, 1, 1, 20)
    assert [p.name for p in s.servers] == ["vllm", "sglang", "tgi", "triton", "generic"]
    cfg = parse_config(_example({"refresh": "10s", "window": "2m", "max_body": "4M", "servers": [
        {"name": "mine", "latency": "app_latency_ms", "unit": "ms",
         "errors": ['app_requests_total{outcome="fail"}']}]}), "x.yaml")
    s = cfg.monitor.signals
    assert (s.refresh_s, s.window_s, s.max_body_mb) == (10, 120, 4)
    assert s.servers[0].latency == ("app_latency_ms",) and s.servers[0].unit == "ms"


@pytest.mark.parametrize("signals, needle", [
    ({"refresh": "0s"}, "monitor.signals.refresh: 0 is out of range"),
    ({"window": "5s"}, "monitor.signals.window: 5s holds fewer than two readings"),
    ({"timeout": "1m"}, "monitor.signals.timeout: 60 is out of range"),
    ({"max_body": "1G"}, "monitor.signals.max_body: 1024 is out of range"),
    ({"baseline_steps": 1000}, "monitor.signals.baseline_steps: 1000 is out of range"),
    ({"servers": []}, "monitor.signals.servers: an empty list reads no endpoint"),
    ({"servers": [{"name": "x"}]}, "a server needs `latency:`"),
    ({"servers": [{"name": "x", "latency": 'a{b=~"("}'}]}, "monitor.signals.servers[0].latency"),
    ({"servers": [{"name": "x", "latency": "a", "unit": "h"}]}, "'h' is not allowed"),
    ({"servers": [{"name": "x", "latency": "a", "errors_missing": "maybe"}]}, "not allowed"),
    ({"servers": [{"name": "x", "latency": "a", "colour": "red"}]}, "unknown key"),
    ({"refreshh": "5s"}, "monitor.signals.refreshh: unknown key"),
])
def test_check_config_names_what_is_wrong(signals: Any, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(_example(signals), "x.yaml")
    assert any(needle in p for p in err.value.problems), err.value.problems


SIGNAL_KEYS = ("refresh", "window", "timeout", "max_body", "baseline_steps", "step_window",
               "servers")


@pytest.mark.parametrize("key", SIGNAL_KEYS)
@pytest.mark.parametrize("value", [None, True, [1], {"a": 1}, "x", -1, 10**30, [None]])
def test_a_null_or_wrong_typed_key_is_a_config_error_naming_it(key: str, value: Any) -> None:
    """Never a traceback: ``refresh: null`` once reached ``window < 2 * None``."""
    with pytest.raises(ConfigError) as err:
        parse_config(_example({key: value}), "x.yaml")
    mine = [p for p in err.value.problems if f"monitor.signals.{key}" in p]
    assert mine, err.value.problems
    if value is None:
        assert mine == [f"x.yaml: monitor.signals.{key}: expected " + mine[0].split(
            "expected ", 1)[1]] and "got None (leave the key out for the default" in mine[0]


def test_the_shipped_example_states_every_signals_default() -> None:
    """etc/slurmiso.yaml lists each monitor.signals key (servers commented out) at its
    default: uncommenting nothing changes nothing."""
    with open(os.path.join(REPO, "etc", "slurmiso.yaml"), encoding="utf-8") as fh:
        text = fh.read()
    block = text[text.index("\n  signals:"):text.index("\n  slo:")]
    for key in SIGNAL_KEYS:
        assert f"{key}:" in block, key
    shipped = parse_config(yaml.safe_load(text), "etc/slurmiso.yaml").monitor.signals
    default = parse_config(_example({}), "x.yaml").monitor.signals
    for name in ("refresh_s", "window_s", "timeout_s", "max_body_mb", "baseline_steps",
                 "step_window_s", "servers"):
        assert getattr(shipped, name) == getattr(default, name), name


def test_the_shipped_selectors_parse() -> None:
    from slurmiso.config.selector import parse_selector

    for p in DEFAULT_SERVERS:
        for text in (*p.latency, *p.requests, *p.errors):
            parse_selector(text)


def test_the_prolog_records_the_endpoint_normalized(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    for job, value, recorded in (("50", "8000", "8000/metrics"), ("51", "9100/", "9100/"),
                                 ("52", "8000/v1/metrics", "8000/v1/metrics")):
        env = job_env(job=job, qos="debug", gpus="0",
                      SPANK__SLURM_SPANK_OPTION_slurmiso_iso_metrics=value)
        assert run_hook("prolog", env, cfg, Drains()) == 0
        rec = state(tmp).read_job(job)
        assert rec is not None and rec.status == "ready" and rec.metrics == recorded
        assert rec.to_dict()["metrics"] == recorded
        assert run_hook("epilog", env, cfg, Drains()) == 0
    env = job_env(job="53", SPANK_SLURMISO_METRICS="localhost:8000")
    assert run_hook("prolog", env, cfg, Drains()) == 0
    rec = state(tmp).read_job("53")
    assert rec is not None and rec.status == "refused" and "--iso-metrics=" in rec.reason
    assert rec.metrics == ""
    assert run_hook("epilog", env, cfg, Drains()) == 0


def test_a_scrape_stays_fast_while_an_endpoint_hangs(tmp_path: Any) -> None:
    """The background reader waits on the hanging endpoint; every scrape meanwhile renders
    at once (the last reading, ages as of the scrape)."""
    from slurmiso.agent.job_signals import JobSignalsCollector, JobSignalsState, Refresher
    from slurmiso.agent.serve import render
    from slurmiso.config.model import SignalSettings
    from tests.unit.test_job_signals import Server, _hang, record

    server = Server()
    refresher = None
    try:
        server.routes["/metrics"] = _hang
        # the fetch hangs until the server is closed: its timeout never ends it here
        st = JobSignalsState(SignalSettings(refresh_s=1, window_s=60, timeout_s=600),
                             slo_classes=("infer",))
        recs = {"41": record("41", f"{server.port}/metrics")}
        refresher = Refresher(st, lambda: recs, 1).start()
        from prometheus_client import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(JobSignalsCollector(st))
        deadline = time.monotonic() + 60
        while server.hanging == 0:  # a readiness wait: until the fetch is in flight
            assert time.monotonic() < deadline, "the refresher never fetched"
            time.sleep(0.02)
        rendered: List[str] = []
        scrape = threading.Thread(target=lambda: rendered.append(render(registry)), daemon=True)
        scrape.start()
        # guards a hang only: a scrape that waited on the fetch would wait for the server's
        # release; one that does not returns at once, on any machine
        scrape.join(60)
        assert rendered, "a scrape waited on the in-flight fetch"
        assert server.hanging == 1, "rendered while the fetch was still in flight"
        assert "41" not in signals_of(rendered[0]), "nothing read yet: no series, never a calm one"
    finally:
        if refresher is not None:
            refresher.stop.set()
        server.close()


def test_the_gpu_reader_ignores_the_per_job_series() -> None:
    """slurmiso_job_gpu has a gpu label; the monitor's GPU view must not read it as a GPU."""
    text = ('slurmiso_gpu_memory_total_bytes{node="n",gpu="0",gi="",profile="",uuid="",'
            'class=""} 1048576\n'
            'slurmiso_job_gpu{job="",class="foreign",gpu="5",gi=""} 1\n')
    gpus, _ = t.agent_gpus(parse_prometheus_text(text))
    assert [g.index for g in gpus] == [0] and gpus[0].classes == ()
