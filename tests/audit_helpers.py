"""Shared by the audit tests: fixture paths, a UTC clock, and running ``slurmiso audit``
in-process (``slurmiso.cli.main.main``) with captured output."""

from __future__ import annotations

import os
import time
from typing import Iterator, List, Tuple

import pytest

from slurmiso.audit import sacct as sacct_mod

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SACCT = os.path.join(ROOT, "tests", "fixtures", "sacct")
JOURNAL = os.path.join(ROOT, "tests", "fixtures", "audit", "journal.jsonl")
CONFIG = os.path.join(ROOT, "tests", "fixtures", "audit", "slurmiso.yaml")
#: The report's "generated" time in golden files: a fixed clock after the fixtures' jobs.
NOW = 1714608000.0  # 2024-05-02T00:00:00Z
HAND_MADE = ["22.05-parsable.txt", "24.11-parsable.txt", "22.05.json", "24.11.json"]


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """sacct -P times are local: pin the zone to UTC (and the parser's hour cache with it)."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    sacct_mod._hour_cache.clear()
    yield
    monkeypatch.undo()
    time.tzset()
    sacct_mod._hour_cache.clear()


def run_audit(args: List[str], capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
              now: float = NOW, config: str = CONFIG) -> Tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``slurmiso -c CONFIG audit ARGS`` run in this process."""
    from slurmiso.cli import audit as audit_cli
    from slurmiso.cli.main import main

    capsys.readouterr()
    with monkeypatch.context() as m:
        m.setattr(audit_cli.time, "time", lambda: now)
        rc = main(["-c", config, "audit", *args])
    out, err = capsys.readouterr()
    return rc, out, err
