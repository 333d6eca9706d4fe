"""The job's events file is opaque user data: it lives with the job, is read under limits and
can never drain a node or forge a hook's journal event (issue 13, "User data never drains")."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import pytest

from slurmiso.hooks import events
from slurmiso.hooks.runner import run_hook
from slurmiso.state import Journal
from slurmiso.state.journal import JOB_SOURCE
from tests.hookctx import Drains, job_env, journal, state, write_config


def _prolog(tmp: str, work: str) -> str:
    cfg = write_config(tmp, "exclusive")
    os.makedirs(work, exist_ok=True)
    assert run_hook("prolog", job_env(SLURM_JOB_WORK_DIR=work), cfg, Drains()) == 0
    return cfg


def _events_path(tmp: str) -> str:
    rec = state(tmp).read_job("42")
    assert rec is not None
    path: str = rec.env["SLURMISO_EVENTS_FILE"]
    return path


def _epilog(tmp: str, cfg: str, work: str) -> Drains:
    drains = Drains()
    assert run_hook("epilog", job_env(SLURM_JOB_WORK_DIR=work), cfg, drains) == 0
    assert drains.calls == []
    return drains


def test_events_file_lives_in_the_jobs_work_dir_not_roots_state_dir(tmp_path: Any) -> None:
    tmp, work = str(tmp_path), str(tmp_path / "home" / "job")
    cfg = _prolog(tmp, work)
    path = _events_path(tmp)
    assert os.path.dirname(path) == work and not path.startswith(f"{tmp}/state")
    assert not os.path.exists(path)  # created by the job's wrapper, as the job's user
    Journal(path).append("checkpoint-end", ok=True, seconds=1.5)  # as the wrapper writes
    with open(path, "a") as fh:
        fh.write('{"ts": "2026-01-01T00:00:00.000Z", "event": "resume", "host": "x"}\n')
        fh.write('{"event": "requeue", "reason": "time-limit", "job": "999"}\n')
    _epilog(tmp, cfg, work)
    assert not os.path.exists(path)
    folded = [e for e in journal(tmp) if e.get("source") == JOB_SOURCE]
    assert [e["event"] for e in folded] == ["checkpoint-end", "resume", "requeue"]
    assert all(e["job"] == "42" for e in folded)  # the job cannot speak for another job
    assert folded[0]["seconds"] == 1.5 and folded[1]["host"] != "x"
    assert folded[1]["job_ts"] == "2026-01-01T00:00:00.000Z"


def test_the_audit_accepts_what_the_epilog_folds_as_the_jobs_report(tmp_path: Any) -> None:
    """Producer and consumer agree on the writer: every line the epilog folds is read by the
    audit as the job's own report, none rejected (they once disagreed: "user" vs "job")."""
    from slurmiso.audit.read.digest import WRITER, JournalDigest

    tmp, work = str(tmp_path), str(tmp_path / "home" / "job")
    cfg = _prolog(tmp, work)
    path = _events_path(tmp)
    for event in sorted(events.USER_EVENTS):
        Journal(path).append(event, ok=True)
    _epilog(tmp, cfg, work)
    digest = JournalDigest()
    for rec in journal(tmp):
        digest.add(rec)
    assert digest.rejected == 0, digest.rejected_samples
    assert digest.user_reported == len(events.USER_EVENTS)
    assert {WRITER[e] for e in events.USER_EVENTS} == {JOB_SOURCE}


def test_the_audit_places_folded_events_at_the_wrappers_time(tmp_path: Any) -> None:
    """The epilog folds a job's report after the job's end; a checkpoint or a preemption
    signal still belongs to the attempt it happened in (its ``job_ts``), so lost work is
    measured from it (it once fell after every attempt: all of it counted as lost)."""
    from slurmiso.audit.read.digest import JournalDigest
    from slurmiso.state.journal import parse_ts

    tmp, work = str(tmp_path), str(tmp_path / "home" / "job")
    cfg = _prolog(tmp, work)
    with open(_events_path(tmp), "w") as fh:
        fh.write('{"ts": "2026-01-01T00:00:30.000Z", "event": "preempt-signal", '
                 '"cause": "preempted"}\n')
        fh.write('{"ts": "2026-01-01T00:00:40.000Z", "event": "checkpoint-end", "ok": true}\n')
    _epilog(tmp, cfg, work)
    digest = JournalDigest()
    for rec in journal(tmp):
        digest.add(rec)
    t0 = parse_ts("2026-01-01T00:00:00.000Z").timestamp()
    assert digest.preempted_within("42", t0, t0 + 60)
    assert digest.last_checkpoint("42", t0, t0 + 60) == t0 + 40
    digest = JournalDigest()  # a wrapper time after the fold is not believed
    for rec in journal(tmp):
        digest.add(dict(rec, job_ts="2099-01-01T00:00:00.000Z") if rec.get("job_ts") else rec)
    assert digest.last_checkpoint("42", t0, t0 + 60) is None


def test_no_work_dir_means_no_events_file_and_a_warning(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    cfg = write_config(tmp, "exclusive")
    for bad in ("", "relative/dir", "/x\n/y"):
        assert run_hook("prolog", job_env(SLURM_JOB_WORK_DIR=bad), cfg, Drains()) == 0
        rec = state(tmp).read_job("42")
        assert rec is not None and rec.status == "ready"
        assert "SLURMISO_EVENTS_FILE" not in rec.env
        assert any("no events file" in w for w in rec.warnings)
        assert run_hook("epilog", job_env(), cfg, Drains()) == 0


HOSTILE_LINES: List[str] = [
    '{"event":"x","self":1}',
    '{"event":"checkpoint-end","self":1,"event_":2}',  # 'self' is fine as data, kept as data
    '{"event":"job-end","outcome":"released"}',
    '{"event":"monitor-action","action":"hold"}',
    '{"event":"prolog","outcome":"ready"}',
    '{"a":' + "[" * 100_000 + "]" * 100_000 + "}",
    '{"event":"resume","deep":' + "[" * 100_000 + "}",
    '{"event":"resume","n":' + "9" * 5000 + "}",
    '{"event":"resume","n":1e999}',
    '{"event":"resume","nested":{"a":1}}',
    '{"event":"resume","list":[1,2]}',
    '{"event":"resume","Bad-Key":1}',
    '{"event":"resume","source":"slurmiso","job":"7","uid":0}',  # reserved: stripped
    '{"event":"resume","long":"' + "x" * 300 + '"}',
    '{"event":"resume","pad":"' + "y" * 5000 + '"}',
    "[1,2,3]",
    '"just a string"',
    "\x00\x01\x02",
    "garbage",
    '{"event":' + "1" * 400 + "}",
]


def test_hostile_lines_are_dropped_with_a_count_and_never_drain(tmp_path: Any) -> None:
    tmp, work = str(tmp_path), str(tmp_path / "w")
    cfg = _prolog(tmp, work)
    path = _events_path(tmp)
    with open(path, "w") as fh:
        fh.write("\n".join(HOSTILE_LINES) + "\n")
        fh.write('{"event":"resume","attempt":2}\n')
    _epilog(tmp, cfg, work)
    recs = journal(tmp)
    names = [e["event"] for e in recs]
    assert names.count("job-end") == 1 and names.count("prolog") == 1
    assert "monitor-action" not in names and "x" not in names
    user = [e for e in recs if e.get("source") == JOB_SOURCE]
    assert [(e["event"], e.get("attempt"), e.get("self")) for e in user] == [
        ("checkpoint-end", None, 1), ("resume", None, None), ("resume", 2, None)
    ]
    assert user[1]["job"] == "42" and "uid" not in user[1]  # reserved fields are the epilog's
    end = [e for e in recs if e["event"] == "job-end"][0]
    dropped = len(HOSTILE_LINES) - 2
    assert any(f"dropped {dropped} line(s)" in w for w in end["warnings"]), end["warnings"]


def test_parse_line_never_raises_on_deep_nesting() -> None:
    assert events.parse_line(b"[" * 100_000) is None
    assert events.parse_line(b'{"event":"resume","s":"[[[[[[[[[["}') is not None  # in a string


def test_oversized_file_is_read_only_up_to_the_cap(tmp_path: Any) -> None:
    tmp, work = str(tmp_path), str(tmp_path / "w")
    cfg = _prolog(tmp, work)
    path = _events_path(tmp)
    line = json.dumps({"event": "resume", "pad": "z" * 200}) + "\n"
    with open(path, "w") as fh:
        fh.write(line * (3 * events.MAX_BYTES // len(line)))
    _epilog(tmp, cfg, work)
    user = [e for e in journal(tmp) if e.get("source") == JOB_SOURCE]
    assert len(user) == events.MAX_RECORDS
    assert not os.path.exists(path)


@pytest.mark.parametrize("shape", ["one-huge-line", "valid-lines", "empty-lines", "sparse"])
def test_a_huge_events_file_is_never_dropped_silently(tmp_path: Any, shape: str) -> None:
    """Issue 22: a 100 MB events file was dropped with no warning. Whatever its shape, the
    record's warnings (slurmd's log) and a journal line say how much was not read."""
    tmp, work = str(tmp_path), str(tmp_path / "w")
    cfg = _prolog(tmp, work)
    path = _events_path(tmp)
    size = 100 * 1000 * 1000
    with open(path, "wb") as fh:
        if shape == "one-huge-line":
            fh.write(b"x" * size)
        elif shape == "valid-lines":
            line = b'{"event": "checkpoint-end", "ok": true}\n'
            fh.write(line * (size // len(line)))
        elif shape == "empty-lines":
            fh.write(b"\n" * size)
        else:
            fh.truncate(size)  # a sparse file of NUL bytes
    _epilog(tmp, cfg, work)
    (line,) = [e for e in journal(tmp) if e["event"] == "events-dropped"]
    assert line["job"] == "42" and line["path"] == path
    assert line["unread_bytes"] >= size - events.MAX_BYTES and line["lines"] >= 1
    (end,) = [e for e in journal(tmp) if e["event"] == "job-end"]
    assert any(f"{line['unread_bytes']} unread bytes" in w for w in end["warnings"])
    assert not os.path.exists(path)


@pytest.mark.parametrize("kind", ["symlink", "fifo", "other-uid", "directory"])
def test_events_file_that_is_not_the_jobs_regular_file_is_refused(tmp_path: Any, kind: str) -> None:
    tmp, work = str(tmp_path), str(tmp_path / "w")
    cfg = _prolog(tmp, work)
    path = _events_path(tmp)
    secret = tmp_path / "secret"
    secret.write_text('{"event": "resume", "stolen": true}\n')
    if kind == "symlink":
        os.symlink(str(secret), path)
    elif kind == "fifo":
        os.mkfifo(path)  # a blocking open would hang the epilog until slurmd kills it
    elif kind == "other-uid":
        with open(path, "w") as fh:
            fh.write('{"event": "resume", "stolen": true}\n')
        os.chown(path, 65534, 65534)  # tests run as root (see conftest); job uid is ours
    else:
        os.mkdir(path)
    drains = _epilog(tmp, cfg, work)
    assert drains.calls == []
    assert not [e for e in journal(tmp) if e.get("stolen")]
    assert secret.read_text() == '{"event": "resume", "stolen": true}\n'
    end = [e for e in journal(tmp) if e["event"] == "job-end"][0]
    assert any("events file" in w and "refused" in w or "not a regular file" in w
               for w in end["warnings"]), end["warnings"]


def test_job_fields_can_be_called_anything_without_breaking_the_journal(tmp_path: Any) -> None:
    """The old fold passed user keys as **kwargs: {"self": 1} was a TypeError -> drain."""
    j = Journal(str(tmp_path / "j.jsonl"))
    fields: Dict[str, Any] = {"self": 1, "event_name": "x"}
    rec = j.append_fields("resume", fields)
    assert rec["self"] == 1 and list(j.read())[0]["self"] == 1


def test_a_file_of_tiny_garbage_lines_is_examined_only_up_to_the_line_cap(tmp_path: Any) -> None:
    path = tmp_path / ".slurmiso-events.42.jsonl"
    path.write_bytes(b"1\n" * (events.MAX_BYTES // 2))
    folded = events.fold(str(path), os.getuid())
    assert folded.records == [] and folded.dropped == events.MAX_BYTES // 2
    assert "lines" in folded.why and not path.exists()


# -- the requeue a preempted job's wrapper leaves to the epilog (issue 14) -----------------


def _fake_scontrol(tmp: str, monkeypatch: Any, fail: bool = False) -> str:
    """A scontrol that records its arguments (and fails like a refused requeue if asked)."""
    bin_dir = os.path.join(tmp, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    calls = os.path.join(tmp, "scontrol-calls")
    script = os.path.join(bin_dir, "scontrol")
    with open(script, "w") as fh:
        fh.write(f'#!/bin/sh\necho "$@" >> {calls}\n')
        if fail:
            fh.write('echo "scontrol: error: Requested operation is presently disabled" >&2\n'
                     "exit 1\n")
    os.chmod(script, 0o755)
    monkeypatch.setenv("SLURMISO_SLURM_BIN", bin_dir)
    return calls


def _calls(path: str) -> List[str]:
    try:
        with open(path) as fh:
            return fh.read().splitlines()
    except FileNotFoundError:
        return []


def test_prolog_declares_that_its_epilog_requeues(tmp_path: Any) -> None:
    tmp = str(tmp_path)
    _prolog(tmp, str(tmp_path / "w"))
    rec = state(tmp).read_job("42")
    assert rec is not None and rec.env["SLURMISO_EPILOG_REQUEUE"] == "1"


def test_epilog_requeues_the_job_its_wrapper_asked_for(tmp_path: Any, monkeypatch: Any) -> None:
    tmp, work = str(tmp_path), str(tmp_path / "w")
    calls = _fake_scontrol(tmp, monkeypatch)
    cfg = _prolog(tmp, work)
    # as the wrapper writes it (restart count 0 -> the next run is count 1); "job" is the
    # file's claim and is ignored: the epilog requeues Slurm's job id only
    Journal(_events_path(tmp)).append("requeue", job="999", reason="preempted", count=1,
                                      by="epilog")
    _epilog(tmp, cfg, work)
    assert _calls(calls) == ["requeue 42"]
    (end,) = [e for e in journal(tmp) if e["event"] == "job-end"]
    assert end["requeue"] == "done" and end["warnings"] == []


@pytest.mark.parametrize(
    "line",
    [
        '{"event": "requeue", "reason": "preempted", "count": 1, "by": "slurmiso"}',  # done
        '{"event": "requeue", "reason": "preempted", "count": 3, "by": "epilog"}',  # stale
        '{"event": "requeue", "reason": "preempted", "count": "1", "by": "epilog"}',
        '{"event": "requeue", "reason": "preempted", "count": true, "by": "epilog"}',
        '{"event": "requeue-declined", "count": 1, "by": "epilog"}',
    ],
)
def test_epilog_requeues_only_on_this_attempts_request(
    tmp_path: Any, monkeypatch: Any, line: str
) -> None:
    tmp, work = str(tmp_path), str(tmp_path / "w")
    calls = _fake_scontrol(tmp, monkeypatch)
    cfg = _prolog(tmp, work)
    with open(_events_path(tmp), "w") as fh:
        fh.write(line + "\n")
    _epilog(tmp, cfg, work)
    assert _calls(calls) == []
    (end,) = [e for e in journal(tmp) if e["event"] == "job-end"]
    assert "requeue" not in end


def test_a_failed_epilog_requeue_is_a_warning_never_a_drain(
    tmp_path: Any, monkeypatch: Any
) -> None:
    tmp, work = str(tmp_path), str(tmp_path / "w")
    calls = _fake_scontrol(tmp, monkeypatch, fail=True)
    cfg = _prolog(tmp, work)
    Journal(_events_path(tmp)).append("requeue", reason="preempted", count=1, by="epilog")
    _epilog(tmp, cfg, work)  # asserts exit 0 and no drain
    assert _calls(calls) == ["requeue 42"]
    (end,) = [e for e in journal(tmp) if e["event"] == "job-end"]
    assert end["requeue"] == "failed"
    assert any("presently disabled" in w for w in end["warnings"])
    assert state(tmp).read_job("42") is None  # the teardown still ran to the end
