"""The host rung on the node: the host-limit token, and the agent applying and undoing it."""

from __future__ import annotations

import os
from typing import Any

import pytest
import yaml

from slurmiso.config.loader import parse_config
from slurmiso.errors import ConfigError
from slurmiso.restraints import Note, OnBound, RestraintStep, parse_squeue, with_note

ETC = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")
NOW = 1_733_460_000.0
HOST = Note(RestraintStep.HOST_LIMIT, NOW - 100, "n1", 0, "4711", 3600, OnBound.RESUME, 1)


# ------------------------------------------------------------------------------ the token
def test_host_limit_token_is_one_word_and_round_trips() -> None:
    text = HOST.text()
    assert text == ("slurmiso-restraint:step=host-limit,since=1733459900,gpu=n1/0,cause=4711,"
                    "max=3600,on=resume,lvl=1")
    assert len(text.split()) == 1
    assert Note.parse(f"site text {text} more") == HOST
    assert Note.parse(with_note("site", HOST)) == HOST


@pytest.mark.parametrize("tail", [
    "step=host-limit,since=1,gpu=n1/0,cause=1,max=60,on=resume",          # no level
    "step=host-limit,since=1,gpu=n1/0,cause=1,max=60,on=requeue,lvl=1",   # requeue
    "step=host-limit,since=1,gpu=n1/0,cause=1,max=60,on=resume,lvl=0",    # level 0
    "step=host-limit,since=1,gpu=n1/0,cause=1,max=60,on=resume,lvl=10",   # level 10
    "step=host-limit,since=1,gpu=n1/0,cause=1,max=60,on=resume,lvl=1x",   # trailing junk
    "step=throttle,since=1,gpu=n1/0,cause=1,max=60,on=resume,lvl=1",      # level elsewhere
    "step=host-limit,since=1,gpu=n1/0,cause=1,max=60,lvl=1,on=resume",    # out of order
])
def test_malformed_host_limit_tokens_are_none_of_ours(tail: str) -> None:
    assert Note.parse("slurmiso-restraint:" + tail) is None


def test_old_tokens_parse_as_before() -> None:
    old = "slurmiso-restraint:step=suspend,since=1733460000,gpu=n3/0,cause=4711,max=1800,on=resume"
    note = Note.parse(old)
    assert note is not None and note.level == 0 and note.text() == old
    assert "level" not in note.to_dict()
    bad = old.replace("step=suspend", "step=throttle") + ",lvl=1"
    # a malformed first token does not hide a whole one after it
    assert Note.parse(f"{bad} {old}") == note


def test_the_book_keeps_the_level() -> None:
    rows = parse_squeue(f"{'41':<40}{'RUNNING':<24}{HOST.text()}\n")
    assert [r.note for r in rows] == [HOST]
    assert rows[0].to_dict(NOW)["level"] == 1


# ------------------------------------------------------------------------------ the config
def _config(host_limit: Any) -> Any:
    with open(ETC, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    data["monitor"].setdefault("ladder", {})["host_limit"] = host_limit
    return parse_config(data)


def test_no_host_limit_levels_by_default() -> None:
    with open(ETC, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    assert parse_config(data).monitor.ladder.host_limit.levels == ()


def test_host_limit_levels_load() -> None:
    cfg = _config({"levels": [{"cpu_cores": 8, "cpu_weight": 50},
                              {"cpu_cores": 2.5, "io_weight": 10, "memory_high": "64G",
                               "io_mbps": {"8:0": "200M"}}]})
    one, two = cfg.monitor.ladder.host_limit.levels
    assert (one.cpu_cores, one.cpu_weight, one.io_weight) == (8.0, 50, None)
    assert (two.memory_high_mb, two.io_mbps) == (64 * 1024, (("8:0", 200),))


@pytest.mark.parametrize("host_limit,key,words", [
    ({"levels": [{}]}, "monitor.ladder.host_limit.levels[0]", "limits nothing"),
    ({"levels": [{"cpu_cores": 0}]}, "monitor.ladder.host_limit.levels[0].cpu_cores",
     "0.01..4096"),
    ({"levels": [{"cpu_weight": 0}]}, "monitor.ladder.host_limit.levels[0].cpu_weight",
     "out of range"),
    ({"levels": [{"memory_max": "1G"}]}, "monitor.ladder.host_limit.levels[0].memory_max",
     "unknown key"),
    ({"levels": [{"io_mbps": {"sda": "1M"}}]},
     "monitor.ladder.host_limit.levels[0].io_mbps.sda", "MAJ:MIN"),
    ({"levels": [{"cpu_cores": 1}] * 10}, "monitor.ladder.host_limit.levels", "at most 9"),
    ({"level": []}, "monitor.ladder.host_limit.level", "unknown key"),
])
def test_host_limit_nonsense_names_the_key(host_limit: Any, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        _config(host_limit)
    lines = [p for p in err.value.problems if f"{key}:" in p]
    assert lines and words in lines[0], err.value.problems
