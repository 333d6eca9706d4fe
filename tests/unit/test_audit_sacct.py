"""sacct -P / --json parsing: version differences, steps, ids, and bad input (table-driven)."""

from __future__ import annotations

import io
import json

import pytest

from slurmiso.audit.read import jsonstream
from slurmiso.audit.read.collect import records_from
from slurmiso.audit.read.sacct import (
    AuditInputError,
    ParseStats,
    job_key,
    parse_parsable,
    parse_time,
    parse_tres,
)
from slurmiso.audit.read.sacct_json import _num, json_record, parse_json
from tests.audit_helpers import utc  # noqa: F401

HEADER = "JobID|JobName|QOS|Partition|State|Submit|Start|End|ElapsedRaw|AllocTRES\n"


@pytest.mark.parametrize("tres, want", [
    ("billing=1,cpu=1,gres/gpu=2,mem=250M,node=1", (2.0, 0, 0)),          # 22.05
    ("billing=1,cpu=1,gres/gpu:a100=2,gres/gpu=2,mem=250M", (2.0, 0, 0)),  # 24.11: typed + untyped
    ("cpu=1,gres/gpu:3g.40gb=1,gres/gpu:4g.40gb=1", (2.0, 0, 0)),         # typed only: summed
    ("cpu=1,gres/mps=50,mem=250M", (0.0, 50, 0)),
    ("cpu=1,gres/shard=3", (0.0, 0, 3)),
    ("cpu=4,mem=16G,node=1", (0.0, 0, 0)),
    ("", (0.0, 0, 0)),
    ("gres/gpu=x,gres/gpu:a100=1", (1.0, 0, 0)),                         # garbage value skipped
])
def test_parse_tres(tres, want):
    assert parse_tres(tres) == want


@pytest.mark.parametrize("job_id, want", [
    ("123", ("123", "")), ("123.batch", ("123", "batch")), ("123.extern", ("123", "extern")),
    ("123.0", ("123", "0")), ("123_4", ("123_4", "")), ("123_4.batch", ("123_4", "batch")),
    ("123_[5-9]", ("123_[5-9]", "")), ("123+1", ("123", "")), ("123+1.0", ("123", "0")),
])
def test_job_key(job_id, want):
    assert job_key(job_id) == want


@pytest.mark.parametrize("text, want", [
    ("2024-05-01T08:00:05", 1714550405.0), ("Unknown", None), ("None", None), ("", None),
    ("2024-13-01T08:00:05", None),
])
def test_parse_time_local_is_utc_here(text, want, utc):  # noqa: F811
    assert parse_time(text) == want


@pytest.mark.parametrize("value, want", [
    (5, 5.0), (None, None), ({"set": True, "infinite": False, "number": 7}, 7.0),
    ({"set": False, "infinite": False, "number": 0}, None),
    ({"set": True, "infinite": True, "number": 0}, None), (True, None), ("5", None),
])
def test_json_number_spellings(value, want):
    assert _num(value) == want


def _parse(text: str) -> tuple:
    stats = ParseStats(source="t")
    return list(parse_parsable(io.StringIO(text), stats)), stats


def test_steps_fold_into_their_job_and_requeued_attempts_stay_apart(utc):  # noqa: F811
    text = HEADER + (
        "11|t|train|gpu|REQUEUED|2024-05-01T08:00:00|2024-05-01T08:00:01|2024-05-01T08:00:09|8|"
        "gres/gpu=1\n"
        "11.batch|batch|||CANCELLED|2024-05-01T08:00:01|2024-05-01T08:00:01|"
        "2024-05-01T08:00:09|8|\n"
        "11|t|train|gpu|CANCELLED|2024-05-01T08:00:09|None|2024-05-01T08:01:00|0|billing=1\n"
        "12.batch|batch|||COMPLETED|||||\n")  # a step without its job line
    recs, stats = _parse(text)
    assert [(r.job, r.state, r.steps) for r in recs] == [("11", "REQUEUED", 1),
                                                         ("11", "CANCELLED", 0)]
    assert recs[0].gpus == 1.0 and recs[0].elapsed == 8 and recs[1].start is None
    assert (stats.records, stats.steps, stats.orphan_steps) == (2, 1, 1)


def test_pipe_in_job_name_is_glued_back():
    recs, stats = _parse(HEADER + "5|a|b|train|gpu|COMPLETED|||||\n")
    assert recs[0].name == "a|b" and recs[0].qos == "train" and stats.bad == 0


@pytest.mark.parametrize("body, bad, truncated, records", [
    ("1|n|q|p|COMPLETED|||||\n2|n|q|p|COMPL", 1, True, 1),        # cut mid-line
    ("1|n|q|p|COMPLETED|||||\n2|n|q|p|COMPLETED|||||", 0, True, 2),  # last newline missing
    ("1|n|q|p|COMPLETED|||||\n\x00\x01garbage\n3|n|q|p|FAILED|||||\n", 1, False, 2),
    ("1|n|q|p|COMPLETED||||5x|\n", 1, False, 0),                    # ElapsedRaw not a number
])
def test_bad_lines_are_skipped_and_counted(body, bad, truncated, records):
    recs, stats = _parse(HEADER + body)
    assert (stats.bad, stats.truncated, len(recs)) == (bad, truncated, records)


def test_unknown_fields_are_ignored_with_a_note():
    recs, stats = _parse("JobID|State|Frobnicate\n1|COMPLETED|x\n")
    assert stats.unknown_fields == ["Frobnicate"] and recs[0].state == "COMPLETED"


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("hello world\nthis is not sacct\n", "no header"),
    ("JobName|Start\nx|y\n", "no header"),
])
def test_unusable_input_raises(text, message):
    with pytest.raises(AuditInputError, match=message):
        _parse(text)


def test_headerless_output_in_our_field_order_is_accepted():
    from slurmiso.audit.read.sacct import SACCT_FIELDS

    line = "|".join(["7", "n", "u", "a", "p", "train", "COMPLETED"] + [""] * (
        len(SACCT_FIELDS) - 7)) + "\n"
    recs, _ = _parse(line)
    assert recs[0].job == "7" and recs[0].qos == "train"


V38 = {"job_id": 21, "array": {"job_id": 0, "task_id": None}, "het": {"job_id": 0,
       "job_offset": None}, "qos": "train", "partition": "gpu", "nodes": "n1", "user": "root",
       "state": {"current": "PREEMPTED", "reason": "None"},
       "time": {"elapsed": 31, "eligible": 1796284790, "end": 1796284822,
                "start": 1796284791, "submission": 1796284790, "limit": None},
       "tres": {"allocated": [{"type": "gres", "name": "gpu", "id": 1001, "count": 2}]},
       "steps": [{"step": {"id": "21.batch", "name": "batch"}}]}
V42 = {**V38, "state": {"current": ["PREEMPTED"], "reason": "None"},
       "array": {"job_id": 0, "task_id": {"set": False, "infinite": False, "number": 0}},
       "het": {"job_id": 0, "job_offset": {"set": False, "infinite": False, "number": 0}},
       "time": {"elapsed": 31, "eligible": 1796284790, "end": 1796284822, "start": 1796284791,
                "submission": {"set": True, "infinite": False, "number": 1796284790},
                "limit": {"set": True, "infinite": False, "number": 60}},
       "tres": {"allocated": [{"type": "gres", "name": "gpu:a100", "id": 1002, "count": 2},
                              {"type": "gres", "name": "gpu", "id": 1001, "count": 2}]}}


@pytest.mark.parametrize("job", [V38, V42], ids=["v0.0.38", "v0.0.42"])
def test_json_record_reads_every_data_parser_version(job):
    r = json_record(job)
    assert (r.job, r.state, r.gpus, r.submit, r.start, r.elapsed, r.steps) == (
        "21", "PREEMPTED", 2.0, 1796284790.0, 1796284791.0, 31.0, 1)


@pytest.mark.parametrize("array, het, want", [
    ({"job_id": 100, "task_id": 3}, {}, ("100_3", 0)),
    ({"job_id": 100, "task_id": {"set": True, "number": 4}}, {}, ("100_4", 0)),
    ({"job_id": 100, "task_id": None, "task": "5-9"}, {}, ("100_[5-9]", 0)),
    ({}, {"job_id": 200, "job_offset": 1}, ("200", 1)),
])
def test_json_array_and_het_ids(array, het, want):
    r = json_record({"job_id": 201, "array": array, "het": het, "state": {"current": "PENDING"}})
    assert (r.job, r.component) == want


def _json_stats(text: str) -> tuple:
    stats = ParseStats(source="t")
    return list(parse_json(io.StringIO(text), stats)), stats


def test_json_streams_across_small_chunks(monkeypatch):
    monkeypatch.setattr(jsonstream, "CHUNK", 7)
    doc = {"meta": {"Slurm": {"release": "22.05.8"}}, "errors": [], "jobs": [V38, V42, V38]}
    recs, stats = _json_stats(json.dumps(doc))
    assert len(recs) == 3 and stats.slurm_version == "22.05.8" and stats.bad == 0


def test_json_truncated_keeps_complete_jobs():
    text = json.dumps({"jobs": [V38, V42], "meta": {}})
    recs, stats = _json_stats(text[: text.index('"state"', 600)])
    assert len(recs) == 1 and stats.truncated


@pytest.mark.parametrize("text", ["{not json", '{"jobs": 5}', "{}"])
def test_json_without_jobs(text):
    if text == "{not json":
        with pytest.raises(AuditInputError):
            _json_stats(text)
    else:
        assert _json_stats(text)[0] == []


def test_format_is_detected_from_the_first_byte(utc):  # noqa: F811
    stats = ParseStats()
    recs = list(records_from(io.StringIO("  " + json.dumps({"jobs": [V38]})), stats))
    assert stats.format == "json" and len(recs) == 1
    stats = ParseStats()
    recs = list(records_from(io.StringIO(HEADER + "1|n|q|p|COMPLETED|||||\n"), stats))
    assert stats.format == "parsable" and len(recs) == 1


def test_a_job_name_forges_rows_only_where_the_file_holds_it(capsys, monkeypatch):
    """22.05.8, measured: job 8 named $'j\\n<a row of job 999999, another user's, 8 GPUs for
    10 h>\\nk'. The file saved with JobName holds that row as sacct printed it; the live
    query's fields (no field a user writes) read job 8 alone, and a saved file that holds
    JobName and lines that are no row is flagged as forgeable."""
    import json
    import os

    from tests.audit_helpers import CONFIG, SACCT, run_audit

    def read(name):
        stats = ParseStats()
        with open(os.path.join(SACCT, name), encoding="utf-8") as fh:
            return [r.job for r in parse_parsable(fh, stats)], stats

    jobs, stats = read("22.05-live-fields.txt")
    assert jobs == ["8"] and stats.bad == 0
    jobs, stats = read("22.05-jobname-forged.txt")
    # premise: the name made a row sacct never had, and job 8's own row is two bad lines
    assert jobs == ["999999"] and stats.bad == 2

    found = {}
    for name in ("22.05-live-fields.txt", "22.05-jobname-forged.txt"):
        rc, out, _ = run_audit(["--sacct-file", os.path.join(SACCT, name), "--format", "json",
                                "--journal", os.devnull], capsys, monkeypatch, config=CONFIG)
        found[name] = {f["code"] for f in json.loads(out)["findings"]}
    assert "sacct-forgeable-rows" not in found["22.05-live-fields.txt"]
    assert "sacct-forgeable-rows" in found["22.05-jobname-forged.txt"]
