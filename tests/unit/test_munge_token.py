"""MUNGE credentials through libmunge (slurmiso/munge_token.py), against the real munged
the sandbox runs (``make test`` starts it before the tests; ``make unit`` alone may not)."""

from __future__ import annotations

import os
from typing import Iterator

import pytest

from slurmiso import munge_token as m


def _munged_answers() -> str:
    why = m.available()
    if why:
        return why
    try:
        m.encode(b"probe", 10)
    except m.MungeUnavailable as exc:
        return str(exc)
    return ""


NO_MUNGED = _munged_answers()
needs_munged = pytest.mark.skipif(bool(NO_MUNGED), reason=f"no munged here ({NO_MUNGED}); "
                                  "make test starts the sandbox's")


@needs_munged
def test_a_credential_names_its_maker_and_decodes_once() -> None:
    cred = m.encode(b"slurmiso-heartbeat v1 node=n2", 60)
    assert cred.startswith("MUNGE:") and cred.endswith(":")
    first = m.decode(cred)
    assert first.ok and first.uid == os.getuid() and first.payload == b"slurmiso-heartbeat" \
        b" v1 node=n2"
    again = m.decode(cred)
    assert not again.ok and again.status == m.MungeStatus.CRED_REPLAYED
    assert again.why() == "cred-replayed"


@needs_munged
@pytest.mark.parametrize("cred", ["", "1", "MUNGE:not-a-credential:", "MUNGE:" + "A" * 5000,
                                  "MUNGE:\u00e9:"])
def test_anything_else_is_refused_with_a_status(cred: str) -> None:
    got = m.decode(cred)
    assert not got.ok and got.payload == b"" and got.why()


@pytest.fixture
def no_libmunge(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(m, "_LIB", None)
    monkeypatch.setattr(m.ctypes.util, "find_library",
                        lambda name: "/nonexistent/libmunge-absent.so" if name == "munge"
                        else None)
    yield  # monkeypatch puts the loaded library back


def test_without_libmunge_available_says_why(no_libmunge: None) -> None:
    why = m.available()
    assert why and "libmunge cannot be loaded" in why
    with pytest.raises(m.MungeUnavailable, match="install munge"):
        m.encode(b"x")
