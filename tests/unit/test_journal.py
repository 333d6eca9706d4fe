"""Journal: record format, concurrent appenders, torn lines, filters and merging."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Dict, List

import pytest

from slurmiso.state import Journal, read_journals
from slurmiso.state.journal import format_ts, now_ts, parse_ts

REPO = str(Path(__file__).resolve().parents[2])
TS_RE = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _line(ts: str, event: str, **fields: Any) -> str:
    return json.dumps({"ts": ts, "host": "n1", "event": event, **fields}) + "\n"


def test_append_writes_one_json_line(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / "journal.jsonl"  # parent dirs are created
    journal = Journal(str(path))
    rec = journal.append("prolog.start", job="12", gpus=[0, 1], where=Path("/x"))
    assert TS_RE.fullmatch(rec["ts"])
    assert rec["host"] and "." not in rec["host"]
    assert rec["event"] == "prolog.start" and rec["job"] == "12"
    lines = path.read_text().splitlines()
    assert len(lines) == 1
    assert json.loads(lines[0]) == dict(rec, where="/x")  # unencodable values become str
    assert os.stat(path).st_mode & 0o777 == 0o644
    journal.append("note", text="two\nlines")
    assert [r["event"] for r in journal.read()] == ["prolog.start", "note"]


def test_reserved_fields_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="ts"):
        Journal(str(tmp_path / "j")).append("x", ts="forged")


def test_missing_file_reads_empty(tmp_path: Path) -> None:
    assert list(Journal(str(tmp_path / "none.jsonl")).read()) == []


def test_ts_round_trip() -> None:
    when = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=timezone.utc)
    assert format_ts(when) == "2024-05-01T12:00:00.123Z"
    assert parse_ts("2024-05-01T12:00:00.123Z") == when.replace(microsecond=123000)


@pytest.mark.parametrize(
    "epoch", [0.0, 1.0005, 1.9999996, 59.9999994, 1733270400.123456, 1733270400.999999,
              1764806400.0004995, 4102444799.9995])
def test_now_ts_matches_format_ts(epoch: float) -> None:
    """The hooks stamp records without datetime; the text must be what format_ts writes."""
    assert now_ts(epoch) == format_ts(datetime.fromtimestamp(epoch, timezone.utc))


def test_concurrent_appenders_never_interleave(tmp_path: Path) -> None:
    path = str(tmp_path / "journal.jsonl")
    code = textwrap.dedent(
        f"""
        import sys
        from slurmiso.state import Journal
        j = Journal({path!r})
        w = int(sys.argv[1])
        for i in range(500):
            j.append("load", writer=w, seq=i, pad="x" * (100 + 37 * (i % 50)))
        """
    )
    env = dict(os.environ, PYTHONPATH=REPO)
    procs = [subprocess.Popen([sys.executable, "-c", code, str(w)], env=env) for w in range(4)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0, 0]
    raw = Path(path).read_text().splitlines()
    assert len(raw) == 2000
    records = [json.loads(line) for line in raw]  # every line parses on its own
    assert {(r["writer"], r["seq"]) for r in records} == {
        (w, i) for w in range(4) for i in range(500)
    }


def test_torn_last_line_skipped_with_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.jsonl"
    good = [_line(f"2024-05-01T12:00:0{i}.000Z", "e", n=i) for i in range(3)]
    path.write_text("".join(good) + '{"ts":"2024-05-01T12:00:09.000Z","host":"n1","ev')
    with caplog.at_level(logging.WARNING, logger="slurmiso.state.journal"):
        records = list(Journal(str(path)).read())
    assert [r["n"] for r in records] == [0, 1, 2]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "skipped 1 " in warnings[0].getMessage()


def test_garbage_in_the_middle_skipped_and_glued_record_recovered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "journal.jsonl"
    torn = '{"ts":"2024-05-01T12:00:01.000Z","host":"n1","eve'  # a writer died here
    path.write_bytes(
        (
            _line("2024-05-01T12:00:00.000Z", "a")
            + "\x00\x00\x00 not json\n"
            + "[1, 2]\n"
            + '{"no": "ts"}\n'
            + "\n"
            + torn
            + _line("2024-05-01T12:00:02.000Z", "b")
        ).encode()
        + b"\xff\xfe\n"
    )
    with caplog.at_level(logging.WARNING, logger="slurmiso.state.journal"):
        events = [r["event"] for r in Journal(str(path)).read()]
    assert events == ["a", "b"]
    assert "skipped 5 " in caplog.text


def test_filters(tmp_path: Path) -> None:
    path = tmp_path / "journal.jsonl"
    path.write_text(
        "".join(
            _line(f"2024-05-01T12:00:0{i}.000Z", "start" if i % 2 else "end", n=i) for i in range(6)
        )
    )
    journal = Journal(str(path))
    t = datetime(2024, 5, 1, 12, 0, 0, tzinfo=timezone.utc)
    got = [r["n"] for r in journal.read(since=t + timedelta(seconds=1), until=t.replace(second=4))]
    assert got == [1, 2, 3]  # since inclusive, until exclusive
    assert [r["n"] for r in journal.read(events={"start"})] == [1, 3, 5]
    naive = datetime(2024, 5, 1, 12, 0, 4)  # naive means UTC
    assert [r["n"] for r in journal.read(since=naive, events={"end"})] == [4]


def test_read_journals_merges_by_ts(tmp_path: Path) -> None:
    def write(name: str, seconds: List[int]) -> str:
        path = tmp_path / name
        path.write_text(
            "".join(_line(f"2024-05-01T12:00:{s:02d}.000Z", "e", src=name) for s in seconds)
        )
        return str(path)

    paths = [write("n1", [0, 3, 5]), write("n2", [1, 2, 9]), str(tmp_path / "missing")]
    merged: List[Dict[str, Any]] = list(read_journals(paths))
    assert [r["ts"][17:19] for r in merged] == ["00", "01", "02", "03", "05", "09"]
    since = datetime(2024, 5, 1, 12, 0, 2, tzinfo=timezone.utc)
    assert [r["src"] for r in read_journals(paths, since=since)] == ["n2", "n1", "n1", "n2"]


def test_import_is_light() -> None:
    """Hooks import the journal on every job: it must not pull in filelock or heavy deps."""
    code = (
        "import sys, slurmiso.state; "
        "bad = [m for m in ('filelock', 'yaml', 'psutil', 'pynvml') if m in sys.modules]; "
        "print(bad)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=dict(os.environ, PYTHONPATH=REPO),
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]"
