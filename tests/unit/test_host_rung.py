"""The host rung on the node: the host-limit token, and the agent applying and undoing it."""

from __future__ import annotations

import pytest

from slurmiso.restraints import Note, OnBound, RestraintStep, parse_squeue, with_note

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
