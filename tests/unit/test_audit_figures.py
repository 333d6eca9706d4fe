"""Issue 16's list, one test per defect: each of these failed on the audit before the fix.

Records are written as ``sacct -P`` text (the header the audit asks for) and run through the
real CLI in-process, so parsing, aggregation, findings and rendering are all exercised.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import pytest

from slurmiso.audit.read.sacct import SACCT_FIELDS
from tests.audit_helpers import CONFIG, ROOT, run_audit, utc  # noqa: F401

DAY = "2024-05-01"


def row(job: str, *, qos: str = "train", part: str = "train", account: str = "research",
        user: str = "alice", state: str = "COMPLETED", submit: str = "00:00:00",
        start: str = "00:00:00", end: str = "01:00:00", elapsed: Optional[int] = None,
        tres: str = "gres/gpu=1", nodes: str = "gpu033", ave: str = "", tot: str = "",
        restarts: int = 0, day: str = DAY, end_day: Optional[str] = None) -> str:
    def t(day_: str, hms: str) -> str:
        return f"{day_}T{hms}" if hms not in ("Unknown", "None") else hms

    if elapsed is None:  # same day
        h1, m1, s1 = (int(x) for x in start.split(":"))
        h2, m2, s2 = (int(x) for x in end.split(":"))
        elapsed = (h2 * 3600 + m2 * 60 + s2) - (h1 * 3600 + m1 * 60 + s1)
    values = {
        "JobID": job, "JobName": "j", "User": user, "Account": account, "Partition": part,
        "QOS": qos, "State": state, "Submit": t(day, submit), "Eligible": t(day, submit),
        "Start": t(day, start), "End": t(end_day or day, end), "ElapsedRaw": str(elapsed),
        "TimelimitRaw": "1440", "AllocTRES": f"billing=1,cpu=1,{tres},node=1",
        "NodeList": nodes, "TRESUsageInAve": ave, "TRESUsageInTot": tot,
        "Restarts": str(restarts),
    }
    return "|".join(values[f] for f in SACCT_FIELDS)


def sacct(tmp_path: Any, rows: List[str], name: str = "s.txt", bom: bool = False) -> str:
    path = os.path.join(str(tmp_path), name)
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(("\ufeff" if bom else "") + "|".join(SACCT_FIELDS) + "\n")
        fh.write("".join(r + "\n" for r in rows))
    return path


def journal(tmp_path: Any, lines: List[Dict[str, Any]], name: str = "j.jsonl") -> str:
    path = os.path.join(str(tmp_path), name)
    with open(path, "w") as fh:
        fh.write("".join(json.dumps(x) + "\n" for x in lines))
    return path


def audit(tmp_path: Any, capsys: Any, monkeypatch: Any, rows: List[str],
          events: Optional[List[Dict[str, Any]]] = None, fmt: str = "json",
          extra: Optional[List[str]] = None, bom: bool = False) -> Any:
    args = ["--sacct-file", sacct(tmp_path, rows, bom=bom),
            "--journal", journal(tmp_path, events or []), "--format", fmt, *(extra or [])]
    rc, out, err = run_audit(args, capsys, monkeypatch)
    return rc, (json.loads(out) if fmt == "json" and out else out), err


def codes(report: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    return {f["code"]: f for f in report["findings"]}


# -- windows and durations ------------------------------------------------------------------

def test_gpu_hours_are_clipped_to_the_window_like_sreport(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    # 8 GPUs from 20:00 on the 30th to 04:00 on the 1st: 4 of its 8 hours lie in the 1st
    rows = [row("1", tres="gres/gpu=8", day="2024-04-30", start="20:00:00", end="04:00:00",
                end_day=DAY, submit="19:00:00", elapsed=8 * 3600),
            row("2", tres="gres/gpu=1", start="10:00:00", end="12:00:00")]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows,
                    extra=["--since", f"{DAY}T00:00:00Z", "--until", "2024-05-02T00:00:00Z"])
    assert r["overall"]["gpu_hours"] == pytest.approx(8 * 4 + 2)
    assert r["pools"]["bulk"]["gpu_hours"] == pytest.approx(34)
    hourly = sum(p["gpu_hours"] for p in r["series"]["points"])
    assert hourly == pytest.approx(34)  # the series spreads the same hours by time


@pytest.mark.parametrize("bad, why", [
    (row("9", elapsed=-4700000), "negative ElapsedRaw"),
    (row("9", start="05:00:00", end="04:00:00", elapsed=0), "End before Start"),
    (row("9", submit="06:00:00", start="05:00:00", end="07:00:00"), "negative wait"),
    (row("9", start="1:00", end="02:00:00", elapsed=60), "bad Start time"),
])
def test_a_bad_duration_is_a_bad_row_left_out_of_every_sum(bad, why, tmp_path, utc, capsys,  # noqa: F811
                                                           monkeypatch):
    _, r, err = audit(tmp_path, capsys, monkeypatch, [row("1"), bad])
    sacct_in = r["inputs"]["sacct"]
    assert sacct_in["bad"] == 1 and why in sacct_in["bad_samples"][0]
    assert r["overall"]["attempts"] == 1 and r["overall"]["gpu_hours"] == pytest.approx(1.0)
    assert r["overall"]["wait_max_s"] == 0.0
    assert "sacct-bad-records" in codes(r) and "job 9" in codes(r)["sacct-bad-records"]["message"]


def test_lost_work_is_bounded_and_comes_from_checkpoints(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    rows = [row("1", state="PREEMPTED", tres="gres/gpu=4", start="01:00:00", end="03:00:00"),
            row("2", state="PREEMPTED", tres="gres/gpu=2", start="01:00:00", end="02:00:00")]
    events = [
        # a checkpoint of job 1 at 02:30: 30 min lost on 4 GPUs, measured
        {"ts": f"{DAY}T02:30:00.000Z", "event": "checkpoint-end", "job": "1", "ok": True,
         "source": "job", "requested": False},
        # a checkpoint from *before* the attempt must not stretch the loss beyond it
        {"ts": f"{DAY}T00:10:00.000Z", "event": "checkpoint-end", "job": "1", "ok": True,
         "source": "job"},
    ]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows, events,
                    extra=["--since", f"{DAY}T00:00:00Z", "--until", f"{DAY}T02:45:00Z"])
    train = r["classes"]["train"]
    # clipped at 02:45: job 1 lost 02:30-02:45 (0.25 h x 4), job 2 estimated, 1 h x 2
    assert train["lost_gpu_hours"] == pytest.approx(1.0)
    assert train["lost_gpu_hours_estimated"] == pytest.approx(2.0)
    assert train["lost_gpu_hours"] + train["lost_gpu_hours_estimated"] <= train["gpu_hours"]


def test_time_to_checkpoint_counts_only_requested_ones(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    events = []
    for i, (secs, requested) in enumerate([(20, False)] * 8 + [(57, True), (125, True)]):
        job = str(100 + i)
        events += [{"ts": f"{DAY}T0{i}:00:00.000Z", "event": "prolog", "job": job,
                    "class": "train"}]
        if requested:
            events.append({"ts": f"{DAY}T0{i}:00:01.000Z", "event": "checkpoint-start",
                           "job": job, "grace_s": 120, "source": "job"})
        events.append({"ts": f"{DAY}T0{i}:02:10.000Z", "event": "checkpoint-end", "job": job,
                       "ok": True, "duration_s": secs, "requested": requested, "source": "job"})
    _, r, _ = audit(tmp_path, capsys, monkeypatch, [row("1")], events)
    ck = r["checkpoints"]["train"]
    assert (ck["checkpoints"], ck["periodic"], ck["p95_s"], ck["over_grace"]) == (2, 8, 125, 1)
    assert codes(r)["checkpoint-over-grace"]["subjects"] == ["109"]
    _, text, _ = audit(tmp_path, capsys, monkeypatch, [row("1")], events, fmt="text")
    line = next(x for x in text.splitlines() if x.startswith("train ") and "2m05s" in x)
    assert "2m00s" in line  # the grace, told apart from the 125 s checkpoint


def test_missing_duplicates_is_detected_from_restarts(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    rows = [row(str(i), restarts=2, start="02:00:00", end="03:00:00") for i in range(1, 4)]
    rc, r, _ = audit(tmp_path, capsys, monkeypatch, rows)
    assert "sacct-without-duplicates" in codes(r) and rc == 1
    assert r["overall"]["preemptions"] is None and r["overall"]["requeues"] is None
    # with -D the earlier attempts are there: no finding, figures known
    rows += [row(str(i), state="PREEMPTED", start="01:00:00", end="01:30:00")
             for i in range(1, 4)]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows)
    assert "sacct-without-duplicates" not in codes(r) and r["overall"]["preemptions"] == 3


# -- findings --------------------------------------------------------------------------------

def test_repeated_preemption_needs_a_journal(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    rows = [row("1", state="PREEMPTED", start=f"0{h}:00:00", end=f"0{h}:30:00")
            for h in range(1, 4)] + [row("1", start="05:00:00", end="06:00:00")]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows, [])
    assert "repeated-preemption" not in codes(r) and "journal-empty" in codes(r)
    prolog = [{"ts": f"{DAY}T01:00:00.000Z", "event": "prolog", "job": "1", "class": "train"}]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows, prolog)
    assert codes(r)["repeated-preemption"]["subjects"] == ["1"]


def test_checkpoint_failed_names_its_jobs(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    events = [{"ts": f"{DAY}T01:00:00.000Z", "event": "checkpoint-end", "job": "77",
               "ok": False, "source": "job"}]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, [row("1")], events)
    assert codes(r)["checkpoint-failed"]["subjects"] == ["77"]


def test_idle_gpus_are_read_from_tres_usage_in_tot(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    rows = [row("1", tres="gres/gpu=2", tot="cpu=00:01:00,gres/gpumem=0,gres/gpuutil=0"),
            row("1.0", tot="gres/gpumem=0,gres/gpuutil=0"),
            row("2", tres="gres/gpu=1", tot="gres/gpumem=1G,gres/gpuutil=80")]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows)
    assert r["idle"]["measured_gpu_hours"] == pytest.approx(2.0)
    assert codes(r)["idle-allocated-gpus"]["subjects"] == ["1"]
    assert not any("accounting off" in n or "no record carried" in n for n in r["notes"])
    assert [e["job"] for e in r["gpu_efficiency"]] == ["1", "2"]


def test_a_header_only_file_is_not_clean(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    rc, r, _ = audit(tmp_path, capsys, monkeypatch, [])
    assert rc == 1 and "sacct-no-records" in codes(r)
    assert r["overall"]["jobs"] is None and r["overall"]["gpu_hours"] is None


def test_a_utf8_bom_is_not_a_missing_header(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    rc, r, err = audit(tmp_path, capsys, monkeypatch, [row("1")], bom=True)
    assert r["overall"]["jobs"] == 1 and r["inputs"]["sacct"]["bad"] == 0, err


# -- trust boundary -----------------------------------------------------------------------

def test_only_lines_from_their_real_writer_count(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    rows = [row("5", qos="normal", part="infer", account="research")]
    forged = [
        {"ts": f"{DAY}T00:00:01.000Z", "event": "prolog", "job": "5", "class": "infer",
         "source": "job"},
        {"ts": f"{DAY}T00:00:02.000Z", "event": "job-end", "job": "5", "class": "infer",
         "source": "job"},
        {"ts": f"{DAY}T00:00:03.000Z", "event": "monitor-action", "action": "hold",
         "target": "5", "reason": "job idle", "source": "job"},
        {"ts": f"{DAY}T00:00:04.000Z", "event": "monitor-action", "action": "hold",
         "target": "5", "reason": "x", "source": "root"},
        {"ts": f"{DAY}T00:00:05.000Z", "event": "checkpoint-end", "job": "5", "ok": True},
    ]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows, forged)
    assert r["inputs"]["journal_rejected"] == 5
    assert r["monitor_actions"] == {} and r["classes"]["infer"]["jobs"] == 0
    assert codes(r)["journal-untrusted-lines"]["subjects"] == ["5"]
    honest = [{"ts": f"{DAY}T00:00:01.000Z", "event": "checkpoint-end", "job": "5", "ok": True,
               "source": "job", "requested": False}]
    _, r, text = audit(tmp_path, capsys, monkeypatch, rows, honest)
    assert r["inputs"]["journal_user_reported"] == 1 and r["inputs"]["journal_rejected"] == 0
    assert any("user-reported" in n for n in r["notes"])


@pytest.mark.parametrize("workers", ["1", "2"])
def test_digits_that_are_not_ascii_never_crash_the_audit(tmp_path, utc, capsys, monkeypatch,  # noqa: F811
                                                         workers):
    # str.isdigit() is True for a superscript two, which int() refuses: a forged file with
    # such a job id, array task, TimelimitRaw or Restarts once ended the audit in a traceback
    monkeypatch.setenv("SLURMISO_AUDIT_WORKERS", workers)
    rows = [row("1\u00b2"), row("7_\u00b2"), row("\u00b2_3"), row("\u0663"), row("3"),
            row("9").replace("|1440|", "|\u00b2|"),
            row("10", restarts=4).replace("|4", "|\u00b2"),
            row("11", restarts=4).replace("|4", "|\u0664")]
    rc, r, err = audit(tmp_path, capsys, monkeypatch, rows)
    assert rc in (0, 1) and "Traceback" not in err, err
    assert r["overall"]["attempts"] == 8
    assert r["inputs"]["sacct"]["bad"] == 0, err
    # an Arabic-Indic three is the digit int() reads (the same job as "3"); the rest are ids
    assert r["overall"]["jobs"] == 7


# -- one classifier -----------------------------------------------------------------------

def test_the_audit_classifies_like_the_prolog(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    from slurmiso.config import load_config
    from slurmiso.config.classify import classify

    cfg = load_config(CONFIG)
    want, _ = classify(cfg, "normal", "infer", "research")
    rows = [row("5", qos="normal", part="infer", account="research")]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows)
    assert want is not None and r["classes"][want.name]["jobs"] == 1 == r["overall"]["jobs"]
    assert want.name == "train"  # infer is bound to its QoS: a partition cannot reach it
    # where the prolog saw more (its journal line), the journal's class wins
    prolog = [{"ts": f"{DAY}T00:00:01.000Z", "event": "prolog", "job": "5", "class": "debug"}]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows, prolog)
    assert r["classes"]["debug"]["jobs"] == 1


def test_the_audit_has_no_classifier_of_its_own():
    import slurmiso.audit.figures.aggregate as analyze

    assert not hasattr(analyze, "_class_resolver")
    with open(analyze.__file__) as fh:
        text = fh.read()
    # the one classifier is the config's (the hooks and the monitor use it too)
    assert "from slurmiso.config.classify import classify" in text


# -- who used what ----------------------------------------------------------------------

def test_rankings_by_user_and_account(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    rows = [row("1", user="alice", account="a", tres="gres/gpu=4"),
            row("2", user="bob", account="b", tres="gres/gpu=1", state="PREEMPTED",
                ave="gres/gpuutil=0"),
            row("3", user="bob", account="a", tres="gres/gpu=2", start="02:00:00",
                end="03:00:00")]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows)
    users = {u["user"]: u for u in r["who"]["users"]}
    assert [u["user"] for u in r["who"]["users"]] == ["alice", "bob"]
    assert users["bob"]["gpu_hours"] == pytest.approx(3.0) and users["bob"]["preemptions"] == 1
    assert users["bob"]["idle_gpu_hours"] == pytest.approx(1.0)
    assert users["bob"]["lost_gpu_hours"] == pytest.approx(1.0)
    accounts = {a["account"]: a for a in r["who"]["accounts"]}
    assert accounts["a"]["gpu_hours"] == pytest.approx(6.0) and accounts["a"]["jobs"] == 2


def test_pool_use_as_a_share_of_capacity(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    # bulk is gpu[033-064] x 8 = 256 GPUs; 128 GPUs for the whole day = 50%
    rows = [row("1", tres="gres/gpu=128", start="00:00:00", end="23:59:59", submit="00:00:00")]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows,
                    extra=["--since", f"{DAY}T00:00:00Z", "--until", "2024-05-02T00:00:00Z"])
    assert r["pools"]["bulk"]["capacity_gpus"] == 256
    assert r["pools"]["bulk"]["use_share"] == pytest.approx(0.5, abs=1e-3)
    shares = [p["use_share"] for p in r["series"]["pools"] if p["pool"] == "bulk"]
    assert shares and all(s == pytest.approx(0.5, abs=1e-3) for s in shares[:-1])


def test_capacity_from_scontrol_show_nodes(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    nodes = os.path.join(str(tmp_path), "nodes.txt")
    with open(nodes, "w") as fh:
        fh.write("NodeName=gpu033 Arch=x86_64 Gres=gpu:a100:4(S:0-1) State=IDLE\n\n"
                 "NodeName=gpu034 Gres=gpu:a100:4 State=MIXED\n")
    _, r, _ = audit(tmp_path, capsys, monkeypatch, [row("1")], extra=["--nodes-file", nodes])
    assert r["pools"]["bulk"]["capacity_gpus"] == 8


# -- definitions --------------------------------------------------------------------------

def test_every_figure_has_a_definition_and_a_doc_section(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    _, r, _ = audit(tmp_path, capsys, monkeypatch, [row("1")])
    defs = r["definitions"]
    for key in r["overall"]:
        assert key in defs, key
    for ck in ("checkpoints", "ok", "failed", "over_grace", "periodic", "p95_s", "grace_s"):
        assert ck in defs
    with open(os.path.join(ROOT, "docs", "audit.md")) as fh:
        doc = fh.read()
    for key, d in defs.items():
        assert d["doc"].endswith("#" + key.replace("_", "-"))
        assert f"### {key}" in doc, f"docs/audit.md lacks a section for {key}"


# -- cron ----------------------------------------------------------------------------------

def _cron_command() -> List[str]:
    import shlex

    with open(os.path.join(ROOT, "etc", "cron.d", "slurmiso-audit")) as fh:
        jobs = [x for x in fh if x.strip() and not x.startswith("#") and "=" not in x.split()[0]]
    assert len(jobs) == 1, jobs
    return shlex.split(jobs[0])[6:]


def test_cron_runs_one_sacct_query_for_every_format_and_hides_no_error():
    argv = _cron_command()
    assert argv.count("slurmiso") == 1 and ";" not in argv and "&&" not in argv
    assert not any(a.startswith(("2>", ">/dev/null", "/dev/null")) for a in argv)
    assert "||" not in argv and any(a.startswith("html=") for a in argv)


def test_cron_formats_come_from_one_pass_and_errors_reach_stderr(tmp_path, utc, capsys,  # noqa: F811
                                                                 monkeypatch):
    html = os.path.join(str(tmp_path), "a.html")
    rc, text, err = audit(tmp_path, capsys, monkeypatch, [row("1")], fmt="text",
                          extra=["--also", f"html={html}", "--also", "json=/nonexistent/x.json"])
    assert text.startswith("slurmiso audit") and os.path.exists(html)
    assert rc == 2 and "json report" in err and "/nonexistent/x.json" in err


def test_sacct_down_exits_2_as_documented(tmp_path, capsys, monkeypatch):
    """The help and the cron comment say 2 for unusable input; a dropped database is one."""
    import stat

    fake = os.path.join(str(tmp_path), "sacct")
    with open(fake, "w") as fh:
        fh.write("#!/bin/sh\necho 'sacct: error: Problem talking to the database: "
                 "Connection refused' >&2\nexit 1\n")
    os.chmod(fake, stat.S_IRWXU)
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    rc, _, err = run_audit(["--journal", journal(tmp_path, [])], capsys, monkeypatch)
    assert rc == 2 and "sacct failed" in err
    with open(os.path.join(ROOT, "etc", "cron.d", "slurmiso-audit")) as fh:
        assert "2 unusable input (sacct or\n# slurmdbd down" in fh.read()


def test_shipped_journal_path_reads_every_node_on_a_sacct_host(tmp_path, monkeypatch):
    """The shipped config's journal has %n, so a host with the shared directory reads each
    node's file instead of warning that 'journal.jsonl' is missing every day."""
    from slurmiso.audit.read.collect import journal_paths
    from slurmiso.config import load_config
    from slurmiso.values import replace

    cfg = load_config(os.path.join(ROOT, "etc", "slurmiso.yaml"))
    assert "%n" in cfg.paths.journal
    shared = str(tmp_path)
    for node in ("gpu001", "gpu033"):
        open(os.path.join(shared, f"{node}.jsonl"), "w").close()
    local = replace(cfg.paths, journal=cfg.paths.journal.replace(
        os.path.dirname(cfg.paths.journal), shared))
    found = journal_paths(replace(cfg, paths=local), [])
    assert sorted(os.path.basename(j["path"]) for j in found) == ["gpu001.jsonl", "gpu033.jsonl"]
    assert not any(j["missing"] for j in found)


def test_a_job_that_started_before_the_window_keeps_its_journal_class(tmp_path, utc, capsys,  # noqa: F811
                                                                      monkeypatch):
    events = [{"ts": "2024-04-30T20:00:00.000Z", "event": "prolog", "job": "5", "class": "debug"},
              {"ts": "2024-04-30T21:00:00.000Z", "event": "checkpoint-end", "job": "5",
               "ok": False, "source": "job"},  # before the window: not counted
              {"ts": f"{DAY}T01:00:00.000Z", "event": "checkpoint-end", "job": "5", "ok": False,
               "source": "job"}]
    rows = [row("5", day="2024-04-30", submit="20:00:00", start="20:00:00", end="02:00:00",
                end_day=DAY, elapsed=6 * 3600)]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows, events,
                    extra=["--since", f"{DAY}T00:00:00Z", "--until", "2024-05-02T00:00:00Z"])
    assert r["classes"]["debug"]["jobs"] == 1 and r["checkpoints"]["debug"]["failed"] == 1
    assert r["inputs"]["journal_records"] == 1


def test_user_reported_preemptions_add_up_overall(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    """A REQUEUED attempt whose wrapper saw a preemption signal counts as user-reported in its
    class and overall (the overall merge once skipped the figure: always 0)."""
    rows = [row("1", state="REQUEUED", start="01:00:00", end="02:00:00"),
            row("1", state="COMPLETED", start="02:05:00", end="03:00:00"),
            row("2", qos="infer", part="infer", state="REQUEUED", start="01:00:00",
                end="01:30:00"),
            row("2", qos="infer", part="infer", start="01:35:00", end="02:00:00")]
    events = [{"ts": f"{DAY}T01:59:50.000Z", "event": "preempt-signal", "job": "1",
               "cause": "preempted", "source": "job"},
              {"ts": f"{DAY}T01:29:00.000Z", "event": "preempt-signal", "job": "2",
               "cause": "preempted", "source": "job"}]
    _, r, _ = audit(tmp_path, capsys, monkeypatch, rows, events)
    by_class = {n: c["preemptions_user_reported"] for n, c in r["classes"].items()}
    assert sum(by_class.values()) == 2 and by_class["train"] == 1, by_class
    assert r["overall"]["preemptions_user_reported"] == 2
