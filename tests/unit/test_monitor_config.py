"""The monitor's config keys (issue 15) go through the strict loader into the policy."""

from __future__ import annotations

import os
from typing import Any, Dict

import pytest
import yaml

from slurmiso.config.loader import parse_config
from slurmiso.errors import ConfigError
from slurmiso.monitor.policy import policy_from_config

ETC = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")


def _with(monitor: Dict[str, Any]) -> Any:
    with open(ETC, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data["monitor"].update(monitor)
    return parse_config(data)


def test_new_keys_reach_the_policy() -> None:
    cfg = _with({"admission": "nodes", "unknown_admits": True,
                 "stagger": {"max_starts": 8, "interval": "1m", "backlog_drain": "2h"},
                 "limits": {"partition_updates_per_hour": 3, "relayouts_per_hour": 1,
                            "gate_opens_per_hour": 4},
                 "telemetry": {"source": "agents", "agent_port": 9810,
                               "agent_addr": "10.0.0.5", "job_labels": True,
                               "deadline": "8s"}})
    pol = policy_from_config(cfg)
    assert (pol.admission, pol.unknown_admits, pol.backlog_drain_s) == ("nodes", True, 7200)
    assert (pol.partition_updates_per_hour, pol.relayouts_per_hour,
            pol.gate_opens_per_hour) == (3, 1, 4)
    tel = cfg.monitor.telemetry
    assert (tel.agent_addr, tel.job_labels, tel.deadline_s) == ("10.0.0.5", True, 8)


def test_defaults_are_safe() -> None:
    with open(ETC, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data["monitor"].pop("admission", None)
    cfg = parse_config(data)
    assert cfg.monitor.admission == "nodes" and cfg.monitor.unknown_admits is False
    assert cfg.monitor.telemetry.agent_addr == "127.0.0.1"
    assert cfg.monitor.telemetry.job_labels is False


@pytest.mark.parametrize("monitor,key", [
    ({"admission": "per-node"}, "monitor.admission"),
    ({"limits": {"relayouts_per_hour": -1}}, "monitor.limits.relayouts_per_hour"),
    ({"limits": {"flaps": 1}}, "monitor.limits.flaps"),
    ({"unknown_admits": "sometimes"}, "monitor.unknown_admits"),
])
def test_bad_values_name_the_key(monitor: Dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        _with(monitor)


# ------------------------------------------------------------------ monitor.ladder (issue 24)
def test_ladder_keys_reach_the_policy() -> None:
    cfg = _with({"ladder": {"steps": ["hold", "throttle", "requeue"], "hysteresis": 20,
                            "throttle": {"after": "30s", "release_after": "2m", "per_job": 2,
                                         "per_hour": 9},
                            "requeue": {"after": "15m", "per_job": 1, "per_hour": 3}}})
    lad = policy_from_config(cfg).ladder
    assert lad.names() == ("hold", "throttle", "requeue") and lad.hysteresis_pct == 20
    th = lad.step("throttle")
    assert th is not None and (th.after_s, th.release_after_s, th.per_job, th.per_hour) == (
        30, 120, 2, 9)
    assert (lad.throttle_signal, lad.unthrottle_signal) == ("URG", "WINCH")
    slo = policy_from_config(cfg).slo[0]
    assert slo.p99_latency_ms == 500 and slo.max_error_rate == 0.01 and slo.signal == "ttft"
    assert not slo.class_latency, "class-wide latency only with a query"


def test_ladder_defaults_are_the_whole_ladder() -> None:
    with open(ETC, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data["monitor"].pop("ladder")
    assert policy_from_config(parse_config(data)).ladder.names() == (
        "hold", "throttle", "suspend", "requeue")


@pytest.mark.parametrize("ladder,key,words", [
    ({"steps": ["hold", "pause"]}, "monitor.ladder.steps", "unknown step 'pause'"),
    ({"steps": ["hold", "suspend", "throttle"]}, "monitor.ladder.steps", "soft to hard"),
    ({"steps": ["throttle"]}, "monitor.ladder.steps", "hold must be the first step"),
    ({"steps": ["hold", "hold"]}, "monitor.ladder.steps", "listed twice"),
    ({"steps": "hold"}, "monitor.ladder.steps", "expected a list"),
    ({"throttle": {"after": -30}}, "monitor.ladder.throttle.after", "negative"),
    ({"suspend": {"release_after": "-5m"}}, "monitor.ladder.suspend.release_after",
     "not a valid duration"),
    ({"requeue": {"per_hour": 0}}, "monitor.ladder.requeue.per_hour", "never let"),
    ({"throttle": {"per_job": 0}}, "monitor.ladder.throttle.per_job", "never let"),
    ({"hold": {"per_hour": 3}}, "monitor.ladder.hold.per_hour", "unknown key"),
    ({"throttle_signal": "USR1"}, "monitor.ladder.throttle_signal", "not allowed"),
    ({"unthrottle_signal": "URG"}, "monitor.ladder.unthrottle_signal", "also the throttle"),
    ({"hysteresis": 95}, "monitor.ladder.hysteresis", "out of range"),
    ({"pause": {}}, "monitor.ladder.pause", "unknown key"),
])
def test_ladder_nonsense_is_a_check_config_error(ladder: Dict[str, Any], key: str,
                                                 words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _with({"ladder": ladder})
    lines = [p for p in err.value.problems if key in p]
    assert lines and words in lines[0], err.value.problems


def test_a_throttle_signal_that_is_a_checkpoint_signal_is_refused() -> None:
    with open(ETC, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    for c in data["classes"]:
        if c.get("checkpoint"):
            c["checkpoint"]["signal"] = "URG"
    # the example's fast ladder has no throttle, so no signal to clash: put it in
    data["monitor"]["ladder"]["steps"] = ["hold", "throttle", "park", "suspend", "requeue"]
    with pytest.raises(ConfigError, match="checkpoint signal"):
        parse_config(data)
    data["monitor"]["ladder"]["steps"] = ["hold", "park", "suspend", "requeue"]
    parse_config(data)  # without the throttle, its signal clashes with nothing


def test_error_rate_is_a_fraction() -> None:
    with open(ETC, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data["monitor"]["slo"][0]["max_error_rate"] = 5
    with pytest.raises(ConfigError, match=r"max_error_rate: expected a fraction"):
        parse_config(data)
