"""``slurmiso audit`` in-process: exit codes, bad input, outputs, and --live degradation."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import pytest

from slurmiso.audit.read.live import live_findings
from slurmiso.audit.read.sacct import LIVE_FIELDS, SACCT_FIELDS, USER_FIELDS
from slurmiso.cli.main import main
from slurmiso.config import load_config
from slurmiso.errors import SlurmUnavailable
from tests.audit_helpers import CONFIG, JOURNAL, SACCT, run_audit, utc  # noqa: F401

GOOD = os.path.join(SACCT, "22.05-parsable.txt")
CLEAN = "JobID|QOS|Partition|State|Submit|Start|End|ElapsedRaw|AllocTRES\n" \
        "1|infer|infer|COMPLETED|2024-05-01T08:00:00|2024-05-01T08:00:02|" \
        "2024-05-01T08:10:00|598|gres/mps=50\n"


def _write(tmp_path: Any, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_help_names_the_sacct_fields(capsys):
    with pytest.raises(SystemExit):
        main(["audit", "--help"])
    out = capsys.readouterr().out
    assert "--format=" + ",".join(LIVE_FIELDS) in out
    # none a job's user writes: sacct -P prints them raw, a newline in one makes rows
    assert "JobName" not in out and set(LIVE_FIELDS) == set(SACCT_FIELDS) - USER_FIELDS


def test_clean_input_exits_0(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    rc, out, err = run_audit(["--sacct-file", _write(tmp_path, "s.txt", CLEAN),
                              "--journal", _write(tmp_path, "j.jsonl", "")], capsys, monkeypatch)
    assert rc == 0, out
    assert "infer" in out and "FINDINGS" in out


def test_findings_at_threshold_exit_1(utc, capsys, monkeypatch):  # noqa: F811
    rc, out, _ = run_audit(["--sacct-file", GOOD, "--journal", JOURNAL], capsys, monkeypatch)
    assert rc == 1 and "training-not-requeued" in out


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("\x89PNG\r\n\x1a\n garbage garbage\n", "no header"),
    ("{\"jobs\": [ {\"job_id\": 1, \"state\": ", "no usable sacct record"),
    ("JobID|State\n1|COMPLETED|extra|fields\n", "no usable sacct record"),
])
def test_unusable_input_exits_2_with_a_message(tmp_path, text, message, capsys, monkeypatch):
    rc, out, err = run_audit(["--sacct-file", _write(tmp_path, "bad", text)], capsys,
                             monkeypatch)
    assert rc == 2 and out == ""
    assert message in err and "Traceback" not in err


def test_missing_sacct_file_exits_2(capsys, monkeypatch):
    rc, _, err = run_audit(["--sacct-file", "/nonexistent/sacct.txt"], capsys, monkeypatch)
    assert rc == 2 and "cannot read sacct file" in err


def test_truncated_input_gives_a_partial_report(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    with open(GOOD) as fh:
        text = fh.read()
    cut = _write(tmp_path, "cut.txt", text[: text.index("1020|")] + "1020|batch-em")
    rc, out, err = run_audit(["--sacct-file", cut, "--journal", JOURNAL, "--format", "json"],
                             capsys, monkeypatch)
    report = json.loads(out)
    assert rc == 1 and "truncated" in err
    assert report["inputs"]["sacct"]["truncated"] and report["overall"]["attempts"] == 12
    assert "sacct-truncated" in {f["code"] for f in report["findings"]}


def test_missing_journal_is_reported_not_fatal(tmp_path, utc, capsys, monkeypatch):  # noqa: F811
    missing = str(tmp_path / "nope.jsonl")
    rc, out, err = run_audit(["--sacct-file", _write(tmp_path, "s.txt", CLEAN), "--journal",
                              missing, "--format", "json"], capsys, monkeypatch)
    report = json.loads(out)
    assert rc == 1 and "not found" in err
    assert [f["code"] for f in report["findings"]] == ["journal-missing"]


@pytest.mark.parametrize("fmt, marker", [("text", "BY CLASS"), ("md", "## By class"),
                                         ("html", "<svg"), ("json", '"overall"'),
                                         ("csv", "section,name,metric,value")])
def test_output_file_in_each_format(tmp_path, fmt, marker, utc, capsys, monkeypatch):  # noqa: F811
    out_path = tmp_path / f"report.{fmt}"
    rc, out, _ = run_audit(["--sacct-file", GOOD, "--journal", JOURNAL, "--format", fmt, "-o",
                            str(out_path)], capsys, monkeypatch)
    assert rc == 1 and out == ""
    text = out_path.read_text()
    assert marker in text
    if fmt == "html":
        assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert "<script" not in text and "https://" not in text


@pytest.mark.parametrize("since, until, attempts", [
    # 18 attempts in all (het component 1010+1 is part of 1010's); pending and running
    # attempts overlap any window that starts before "now", as with sacct -S
    ("2024-05-01T08:00:00Z", "", 18), ("2024-05-01T11:00:00Z", "", 5),
    ("", "2024-05-01T08:05:00Z", 4), ("1h", "", 3),
])
def test_window_filters_a_saved_file(since, until, attempts, utc, capsys, monkeypatch):  # noqa: F811
    args = ["--sacct-file", GOOD, "--journal", JOURNAL, "--format", "json"]
    args += (["--since", since] if since else []) + (["--until", until] if until else [])
    rc, out, err = run_audit(args, capsys, monkeypatch)
    assert json.loads(out)["overall"]["attempts"] == attempts, err


def test_bad_window_is_a_usage_error(capsys, monkeypatch):
    rc, _, err = run_audit(["--sacct-file", GOOD, "--since", "yesterday-ish"], capsys,
                           monkeypatch)
    assert rc == 2 and "invalid time" in err


class FakeSlurm:
    """SlurmCli stand-in for the calls doctor's collector and the live node checks make:
    canned ``scontrol show config`` and ``sacctmgr show qos`` text, or unreachable."""

    def __init__(self, config: str = "", qos: str = "", down: bool = False) -> None:
        self.config, self.qos, self.down = config, qos, down

    def run(self, cmd: str, args: List[str], timeout: Any = None) -> str:
        if self.down:
            raise SlurmUnavailable(f"{cmd} failed: Unable to contact slurm controller")
        if cmd == "sacctmgr" and "qos" in args:
            return self.qos
        return self.config if args == ["show", "config"] else ""

    def show_config(self, timeout: Any = None) -> Dict[str, str]:
        text = self.run("scontrol", ["show", "config"])
        return {k.strip(): v.strip() for k, _, v in (ln.partition("=") for ln in
                                                     text.splitlines()) if k.strip()}

    def show_all(self, kind: str, timeout: Any = None) -> Dict[str, Dict[str, str]]:
        self.run("scontrol", ["show", kind])
        return {}

    def jobs_on_node(self, node: str) -> List[str]:
        self.run("squeue", [])
        return []


#: sacctmgr -P -n show qos format=Name,Priority,Preempt,PreemptMode,GraceTime,MaxWall,...
QOS = ("infer|1000|train|cluster|00:00:00|1-00:00:00||\n"
       "train|50||requeue|00:00:30|7-00:00:00||\n")
CLEAN_QOS = ("infer|1000|train|cluster|00:00:00|1-00:00:00|gres/gpu=8|\n"
             "train|100||requeue|00:02:00|7-00:00:00||\n"
             "debug|500||cluster|00:00:00|02:00:00|gres/gpu=1|\n")
HOOKS_OK = "\n".join(f"{h} = /usr/local/bin/slurmiso-{name}"
                      for h, name in (("Prolog", "prolog"), ("Epilog", "epilog"),
                                      ("TaskProlog", "task-prolog")))


def test_live_degrades_when_slurm_is_unreachable():
    findings = live_findings(load_config(CONFIG), "login1", FakeSlurm(down=True))
    codes = [f.code for f in findings]
    assert codes == ["slurm-unreachable", "live-node-not-in-pool"]
    assert "Unable to contact" in findings[0].message


def test_live_reports_qos_drift_and_missing_hooks_with_doctors_codes():
    cfg = load_config(CONFIG)
    slurm = FakeSlurm("Prolog = /usr/local/bin/slurmiso-prolog\nEpilog = (null)\n", QOS)
    found = {}
    for f in live_findings(cfg, "login1", slurm):
        found.setdefault(f.code, []).append(f.message)
    assert {"qos-missing", "qos-differs", "qos-grace", "hook-unset",
            "live-node-not-in-pool"} <= set(found)
    assert found["qos-missing"] == ["QoS debug does not exist in slurmdbd"]
    assert any("Priority=50" in m for m in found["qos-differs"])
    assert any("GraceTime=30" in m for m in found["qos-grace"])
    assert sorted(m.split()[0] for m in found["hook-unset"]) == ["Epilog", "TaskProlog"]


def test_live_runs_exactly_doctors_checks_on_a_snapshot_taken_now():
    """No second copy of a check: the cluster findings of --live are doctor's, code for code."""
    from slurmiso.doctor import run_checks
    from slurmiso.doctor.collect import collect

    cfg = load_config(CONFIG)
    slurm = FakeSlurm(HOOKS_OK, CLEAN_QOS)
    live = [f for f in live_findings(cfg, "login1", slurm) if not f.code.startswith("live-")]
    doctor = run_checks(collect(cfg, "login1", slurm), cfg)
    assert live == doctor
    assert not [f.code for f in live if f.code.startswith(("qos-", "hook-"))]


def test_sacct_query_asks_only_for_fields_this_sacct_knows() -> None:
    """22.05's sacct refuses the whole query for one unknown field (Restarts, measured)."""
    from slurmiso.audit.read.collect import known_fields, sacct_argv
    help_2205 = " ".join(f for f in SACCT_FIELDS if f != "Restarts") + " Reason ExitCode"
    fields = known_fields(help_2205)
    assert "Restarts" not in fields and fields == [f for f in LIVE_FIELDS if f != "Restarts"]
    assert known_fields(help_2205 + " Restarts") == list(LIVE_FIELDS)
    assert known_fields("") == list(LIVE_FIELDS)  # no answer: ask for all, sacct says why
    assert not USER_FIELDS & set(known_fields(help_2205 + " Restarts Comment WorkDir"))
    argv = sacct_argv(0, None, fields=fields)
    assert argv[-1] == "--format=" + ",".join(fields) and "-D" in argv
