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
