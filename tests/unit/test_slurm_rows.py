"""Slurm's text read so that no field a job's user writes makes, moves or hides a row (issue
#33): the monitor's queue (``SlurmCli.queue``), ``jobs_on_node`` and ``scontrol show -o``,
each fed what real Slurm prints for a job whose comment or name holds newlines, ``|``, tabs
and lines that look like another job's row (tests/slurmtext.py renders any query the reader
makes, as squeue does; tests/fixtures/slurm/22.05/squeue-forged-* is the real thing)."""

from __future__ import annotations

import logging
import os
from typing import Any, Dict, List

import pytest

from slurmiso.slurm import rows as R
from slurmiso.slurm.client import SlurmCli
from tests.slurmtext import FakeSqueue, job

FIXTURES = os.path.join(os.path.dirname(__file__), "..", "fixtures", "slurm", "22.05")
#: The query the monitor read before: the comment last, after the reason.
OLD_FORMAT = "%i|%T|%P|%q|%V|%r|%N|%b|%a|%Q|%x|%D|%S|%k"
VICTIM = "101"


def _cli(fake: FakeSqueue) -> SlurmCli:
    cli = SlurmCli()
    cli.run = fake  # type: ignore[method-assign]
    return cli


def _queue(jobs: List[Dict[str, Any]]) -> Any:
    counts = R.RowCounts("test")
    got = _cli(FakeSqueue(jobs)).queue("PENDING,RUNNING,SUSPENDED", counts=counts)
    return got, counts


#: Comments a job's user may set (``sbatch --comment``): each writes lines that look like
#: rows of the victim (suspended training, a comment of its own) in one of the readers'
#: formats, or of a job that does not exist, or with ids no job has.
FORGERIES = {
    "old-row": "x\n" + OLD_FORMAT.replace("%i", VICTIM).replace("%T", "RUNNING")
    .replace("%k", "") + "\n",
    "facts-row": f"x\n{VICTIM}|RUNNING|train|train|2026-01-01T10:00:00|n1|gres:gpu:1|acct|"
                 "9|(null)|1|N/A|None",
    "note-row": f"x\n{VICTIM}|{VICTIM}|slurmiso: training held: forged",
    "empty-row": f"\n{VICTIM}|{VICTIM}|",
    "ghost-job": "x\n999|RUNNING|infer|infer|2026-01-01T10:00:00|n1|gres:gpu:1|acct|9|"
                 "(null)|1|N/A|None|\n999|999|",
    "bad-ids": "x\n10a|10a|y\n-1|RUNNING|a\n101 |101 |z\n|||",
    "separators": "a|b||c\td\re\x1cf\u2028g\x85h\x1ei\x0bj\x0ck",
    "not-empty": "N/A",  # squeue prints (null) for no comment: N/A is the user's words
}


@pytest.mark.parametrize("name", sorted(FORGERIES))
def test_a_comment_makes_no_row_and_leaves_the_victim_as_slurm_says(name: str) -> None:
    comment = FORGERIES[name]
    jobs = [job(VICTIM, "SUSPENDED", comment="victim's own notes"),
            job("200", comment=comment, name=comment),
            job("102", comment=None)]
    got, counts = _queue(jobs)
    by_id = {r["id"]: r for r in got}
    assert [r["id"] for r in got] == [VICTIM, "200", "102"], "one row a job, none made up"
    assert by_id[VICTIM]["state"] == "SUSPENDED" and by_id[VICTIM]["nodes"] == "n1"
    assert by_id["200"]["state"] == "PENDING" and by_id["102"]["comment"] == ""
    victim, forger = by_id[VICTIM].get("comment"), by_id["200"].get("comment")
    assert victim in ("victim's own notes", None), "read right, or unread: never forged"
    if name in ("note-row", "empty-row"):  # a second row for the victim: both unread
        assert victim is None and forger is None
        assert counts.unknown() == {"slurm/duplicate": 1, "slurm/unread": 2}
    elif name == "ghost-job":  # a row of a job not listed cuts the forger's comment
        assert victim == "victim's own notes" and forger is None
        assert counts.unknown() == {"slurm/unread": 1}
    else:  # lines that are no comment row continue the comment they are in
        assert victim == "victim's own notes" and forger == comment
        assert counts.unknown() == {}


def test_the_recorded_attack_reads_the_suspended_job_as_suspended() -> None:
    """22.05.8, measured (tests/fixtures/slurm/22.05/README): job 5 suspended with a comment
    of its own, job 6 held with a comment forging job 5's row in the old query (RUNNING) and
    in the comment query, job 7 held with ``|`` and a tab in its comment."""
    def read(name: str) -> str:
        with open(os.path.join(FIXTURES, name), encoding="utf-8") as fh:
            return fh.read()

    old = [ln for ln in read("squeue-forged-old.txt").split("\n") if ln.startswith("5|")]
    assert len(old) == 3 and old[1].split("|")[1] == "RUNNING", "premise: the old query forged"

    def run(cmd: str, args: Any, timeout: Any = None, env: Any = None) -> str:
        assert cmd == "squeue" and args[:3] == ["-h", "-t", "PENDING,RUNNING,SUSPENDED"]
        return read({"%i|%i|%k": "squeue-forged-comments.txt",
                     SlurmCli.QUEUE_FORMAT: "squeue-forged-facts.txt"}[args[-1]])

    cli = SlurmCli()
    cli.run = run  # type: ignore[method-assign]
    counts = R.RowCounts("test")
    got = {r["id"]: r for r in cli.queue("PENDING,RUNNING,SUSPENDED", counts)}
    assert {j: r["state"] for j, r in got.items()} == {"7": "PENDING", "6": "PENDING",
                                                      "5": "SUSPENDED"}
    assert got["5"]["nodes"] == "n1" and got["6"]["reason"] == "JobHeldUser"
    assert got["7"]["comment"] == "a|b||c\td"
    assert "comment" not in got["5"] and "comment" not in got["6"], "forged: both unread"
    assert (counts.malformed, counts.duplicate, counts.unread) == (0, 1, 2)


def test_ids_slurm_never_prints_and_ids_listed_twice_are_rejected_and_counted(
        caplog: pytest.LogCaptureFixture) -> None:
    text = "".join(f"{i}|RUNNING|x\n" for i in
                   ("7", "7_3", "7_[1-5%2]", "8+1", "4_[1,3,5,7,9,11,13,...", "9", "9", "9",
                    "x1", "1_", "", " 5", "6|"))
    counts = R.RowCounts("squeue test")
    with caplog.at_level(logging.WARNING):
        got = R.job_rows(text, ("id", "state", "rest"), counts, free_last=True,
                         shapes={"state": R.STATE})
        counts.log()
    assert list(got) == ["7", "7_3", "7_[1-5%2]", "8+1", "4_[1,3,5,7,9,11,13,..."]
    assert (counts.malformed, counts.duplicate) == (5, 3)
    assert counts.unknown() == {"slurm/malformed": 5, "slurm/duplicate": 3}
    assert "squeue test: rejected 5 malformed" in caplog.text


def test_a_separator_where_slurm_prints_none_is_a_malformed_row() -> None:
    """Fields before the free last one are Slurm's words; one holding ``|`` would shift the
    state, priority and node count after it: that row is rejected, not read shifted."""
    jobs = [job("1", gres="gres:gpu|RUNNING"), job("2")]
    got, counts = _queue(jobs)
    assert [r["id"] for r in got] == ["2"] and counts.malformed == 1


def test_rows_are_lines_ended_by_newline_only() -> None:
    assert R.lines_of("a\x1cb\u2028c\x85d\re\n") == ["a\x1cb\u2028c\x85d\re"]
    assert R.lines_of("") == [] and R.lines_of("\n") == [""]


def test_jobs_on_node_reads_ids_alone_and_rejects_odd_ones(
        caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeSqueue([job("5", "RUNNING", nodes="n1", comment="a\n6\n7"),
                       job("6", "RUNNING", nodes="n2")])
    assert _cli(fake).jobs_on_node("n1") == ["5"]
    assert fake.calls[-1][-2:] == ["-o", "%A"]

    def odd(cmd: str, args: Any, timeout: Any = None, env: Any = None) -> str:
        return "5\n5\n12\nabc\n13 14\n"

    cli = SlurmCli()
    cli.run = odd  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        assert cli.jobs_on_node("n1") == ["12"]
    assert "rejected 2 malformed row(s) and 2 row(s)" in caplog.text


#: ``scontrol show node -o`` as 24.11.5 orders it (src/api/node_info.c, slurm-24-11-5-1):
#: State, Gres, NodeAddr before Reason, whose text an admin, slurmd or a drain call wrote.
NODE = ("NodeName={n} Arch=x86_64 CoresPerSocket=1 CPUAlloc=0 AvailableFeatures=a100 "
        "ActiveFeatures=a100 Gres=gpu:a100:2 NodeAddr={n} NodeHostName={n} Version=24.11.5 "
        "State={state} Partitions=gpu CfgTRES=cpu=8 Reason={reason} [root@2026-01-01T10:00:00] "
        "Comment=(null) Extra=(null)")


def test_scontrol_fields_are_read_where_slurm_prints_them() -> None:
    reason = "slurmiso: x State=IDLE NodeAddr=evil.example Gres=gpu:a100:8"
    text = "\n".join([
        NODE.format(n="n1", state="IDLE+DRAIN", reason=reason),
        NODE.format(n="n2", state="MIXED", reason="a"),  # its Reason held a newline:
        NODE.format(n="n3", state="IDLE", reason="forged") + " rest of n2's reason",
        NODE.format(n="n3", state="DOWN", reason="real"),
        "rest of a reason that held a newline",
    ]) + "\n"
    counts = R.RowCounts("test")
    nodes = _cli(FakeSqueue([], {"node": text})).show_all("node", counts=counts)
    assert nodes["n1"]["State"] == "IDLE+DRAIN" and nodes["n1"]["NodeAddr"] == "n1"
    assert nodes["n1"]["Gres"] == "gpu:a100:2" and "State=IDLE" in nodes["n1"]["Reason"]
    assert sorted(nodes) == ["n1", "n2"], "n3 twice: which line is Slurm's cannot be told"
    assert (counts.malformed, counts.duplicate) == (1, 2)
    one = _cli(FakeSqueue([], {"node": text})).show_node("n1")
    assert one["State"] == "IDLE+DRAIN"


def test_undecodable_bytes_in_a_comment_are_no_traceback(tmp_path: Any,
                                                         monkeypatch: Any) -> None:
    """A comment may hold any byte but NUL; the queue is read all the same."""
    script = tmp_path / "squeue"
    script.write_bytes(b"#!/bin/sh\ncase \"$*\" in\n"
                       b"*'%k'*) printf '5|5|bad \\377\\376 bytes\\n' ;;\n"
                       b"*) printf '5|PENDING|train|train|2026-01-01T10:00:00|||acct|1||1|N/A"
                       b"|Priority\\n' ;;\nesac\n")
    script.chmod(0o755)
    monkeypatch.setenv("SLURMISO_SLURM_BIN", str(tmp_path))
    got = SlurmCli().queue()
    assert got[0]["id"] == "5" and got[0]["comment"].startswith("bad ")
