"""QoS desired/live/diff (table-driven), the applier's sacctmgr calls, ``qos`` CLI in-process,
and ``gen slurm-conf`` (golden file: compared; UPDATE_GOLDEN=1 rewrites it)."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional, Sequence

import pytest
import yaml

from slurmiso.cli.main import main
from slurmiso.config import parse_config
from slurmiso.config.model import Config
from slurmiso.doctor.cluster import check_qos
from slurmiso.slurm import qos as Q
from slurmiso.slurm import slurmconf
from slurmiso.units import parse_slurm_time
from tests.goldens import check_golden as _check

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
GOLDEN = os.path.join(os.path.dirname(HERE), "golden", "slurmconf")
EXAMPLE = os.path.join(REPO, "etc", "slurmiso.yaml")


def example(**qos_accounts: Sequence[str]) -> Config:
    with open(EXAMPLE, encoding="utf-8") as fh:
        data = yaml.safe_load(fh)
    for c in data["classes"]:
        if c["name"] in qos_accounts:
            c.setdefault("qos", {})["accounts"] = list(qos_accounts[c["name"]])
    return parse_config(data, "etc/slurmiso.yaml")


# A live table that matches the example config exactly (sacctmgr -P -n, QOS_FORMAT order).
IN_SYNC = """normal|0||cluster|00:00:00|||
infer|1000|train|cluster|00:00:00|1-00:00:00|gres/gpu=8|
train|100||requeue|00:02:00|7-00:00:00||
debug|500||cluster|00:00:00|02:00:00|gres/gpu=1|
"""


def _edit(qos: str, col: int, value: str) -> str:
    lines = []
    for ln in IN_SYNC.splitlines():
        cols = ln.split("|")
        if cols[0] == qos:
            cols[col] = value
        lines.append("|".join(cols))
    return "\n".join(lines) + "\n"


def test_desired_from_the_example() -> None:
    want = {q.name: q for q in Q.desired_qos(example())}
    assert want["infer"].preempt == ("train",) and want["infer"].preempt_mode == "cluster"
    assert want["infer"].grace_s is None  # not preemptible: not managed
    assert want["train"].preempt_mode == "requeue" and want["train"].grace_s == 120
    assert want["debug"].value("MaxWall") == "02:00:00"
    assert want["debug"].value("MaxTRESPerJob") == "gres/gpu=1"
    assert want["train"].value("MaxTRESPerJob") is None


@pytest.mark.parametrize("live,changes", [
    (IN_SYNC, []),
    (_edit("infer", 2, ""), ["~ qos infer: Preempt (unset) -> train"]),
    (_edit("infer", 2, "debug,train"), ["~ qos infer: Preempt debug,train -> train"]),
    (_edit("train", 4, "00:00:05"), ["~ qos train: GraceTime 5 -> 120"]),
    (_edit("train", 3, "cancel"), ["~ qos train: PreemptMode cancel -> requeue"]),
    (_edit("infer", 3, "requeue"), ["~ qos infer: PreemptMode requeue -> cluster"]),
    (_edit("debug", 1, "7"), ["~ qos debug: Priority 7 -> 500"]),
    (_edit("debug", 5, ""), ["~ qos debug: MaxWall (unset) -> 02:00:00"]),
    (_edit("infer", 6, "cpu=64,gres/gpu=4"), ["~ qos infer: MaxTRESPerJob gres/gpu=4 -> gres/gpu=8"]),
    (_edit("infer", 6, "cpu=64,gres/gpu=8"), []),  # other TRES limits are the site's
    (_edit("train", 5, ""), ["~ qos train: MaxWall (unset) -> 7-00:00:00"]),
    (_edit("train", 6, "gres/gpu=2"), []),  # not in the config: not managed
    (_edit("debug", 4, "00:10:00"), []),  # GraceTime of a non-preemptible class: not managed
    (_edit("infer", 7, "DenyOnLimit"), []),  # flags are not managed
    ("\n".join(ln for ln in IN_SYNC.splitlines() if not ln.startswith("debug")),
     ["+ qos debug: create", "~ qos debug: Priority 0 -> 500",
      "~ qos debug: MaxWall (unset) -> 02:00:00", "~ qos debug: MaxTRESPerJob (unset) -> gres/gpu=1"]),
])
def test_diff(live: str, changes: List[str]) -> None:
    got = Q.diff(Q.desired_qos(example()), Q.parse_qos_rows(live))
    assert [c.describe() for c in got] == changes


@pytest.mark.parametrize("text,seconds", [
    ("00:00:30", 30), ("1-00:00:00", 86400), ("02:00:00", 7200),
    ("7-12:30:05", 7 * 86400 + 12 * 3600 + 1805),
])
def test_slurm_duration_round_trips_through_the_one_parser(text: str, seconds: int) -> None:
    assert parse_slurm_time(text) == seconds
    assert Q.slurm_duration(seconds) == text


def test_parse_qos_rows_reads_day_hour_times() -> None:
    """sacctmgr prints MaxWall 1.5 days as "1-12:00:00"; "1-12" is the same time (was 86412)."""
    rows = Q.parse_qos_rows("train|10||requeue|00:05:00|1-12|gres/gpu=4|\n")
    assert rows["train"].max_wall_s == 129600 and rows["train"].grace_s == 300


def test_grants_and_unknown_accounts() -> None:
    desired = Q.desired_qos(example(infer=["research", "ops"], train=["research", "nope"]))
    have = Q.parse_account_qos("research||normal,train\nresearch|alice|normal\nops||normal\n")
    assert have == {"research": ("normal", "train"), "ops": ("normal",)}
    grants, unknown = Q.grant_changes(desired, have)
    assert [(g.account, g.qos) for g in grants] == [("research", "infer"), ("ops", "infer")]
    assert unknown == ["nope"]


class FakeSacctmgr:
    """A slurmdbd QoS table behind the SlurmCli.run interface (what sacctmgr does to it)."""

    def __init__(self, live: str, accounts: Optional[Dict[str, List[str]]] = None) -> None:
        self.rows = {ln.split("|")[0]: ln.split("|") for ln in live.splitlines() if ln.strip()}
        self.accounts = accounts or {}
        self.calls: List[List[str]] = []

    def run(self, cmd: str, args: Sequence[str], timeout: Optional[float] = None) -> str:
        assert cmd == "sacctmgr"
        a = list(args)
        if a[:4] == ["-P", "-n", "show", "qos"]:
            return "\n".join("|".join(r) for r in self.rows.values()) + "\n"
        if a[:4] == ["-P", "-n", "show", "assoc"]:
            # sacctmgr takes "where" as its own word ("where account=x" in one is refused)
            assert a[4] == "where" and a[5].startswith("account="), a
            return "".join(f"{n}||{','.join(q)}\n" for n, q in self.accounts.items())
        self.calls.append(a)
        if a[1:3] == ["add", "qos"]:
            self.rows[a[3]] = [a[3], "0", "", "cluster", "00:00:00", "", "", ""]
        elif a[1:3] == ["modify", "qos"]:
            row = self.rows[a[4].split("=", 1)[1]]
            cols = {"Priority": 1, "Preempt": 2, "PreemptMode": 3, "GraceTime": 4,
                    "MaxWall": 5, "MaxTRESPerJob": 6}
            for item in a[6:]:
                key, _, value = item.partition("=")
                row[cols[key]] = Q.slurm_duration(int(value)) if key == "GraceTime" else value
        elif a[1:3] == ["modify", "account"]:
            self.accounts[a[4].split("=", 1)[1]].append(a[6].split("+=", 1)[1])
        return ""


def test_apply_order_and_second_run_changes_nothing() -> None:
    fake = FakeSacctmgr("normal|0||cluster|00:00:00|||\ntrain|100||cancel|00:00:05|||\n",
                        {"research": ["normal"]})
    cfg = example(infer=["research"])
    plan = Q.plan(cfg, fake)
    Q.apply_changes(fake, plan.changes)
    assert fake.calls[0][:3] == ["-i", "add", "qos"]  # creates first: Preempt names them
    assert ["-i", "modify", "account", "where", "name=research", "set", "qos+=infer"] in fake.calls
    train = next(c for c in fake.calls if "name=train" in c)
    assert "PreemptMode=requeue" in train and "GraceTime=120" in train
    assert Q.plan(cfg, fake).changes == []


def _patch_cli(monkeypatch: Any, fake: FakeSacctmgr) -> None:
    monkeypatch.setattr("slurmiso.slurm.client.SlurmCli.run",
                        lambda self, cmd, args, timeout=None: fake.run(cmd, args, timeout))


def test_cli_apply_dry_run_apply_again_and_show(monkeypatch: Any, capsys: Any) -> None:
    fake = FakeSacctmgr(_edit("train", 4, "00:00:05"))
    _patch_cli(monkeypatch, fake)
    assert main(["-c", EXAMPLE, "qos", "show"]) == 1
    assert "DIFFERS" in capsys.readouterr().out
    assert main(["-c", EXAMPLE, "qos", "apply", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "~ qos train: GraceTime 5 -> 120" in out and "dry run: 1 change(s)" in out
    assert fake.calls == []
    assert main(["-c", EXAMPLE, "qos", "apply"]) == 0
    assert "applied 1 change(s)" in capsys.readouterr().out
    assert main(["-c", EXAMPLE, "qos", "apply", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["changes"] == [] and data["grants_managed"] is False
    assert main(["-c", EXAMPLE, "qos", "apply"]) == 0
    out = capsys.readouterr().out
    assert "nothing to change" in out and "grants to accounts are left alone" in out
    assert main(["-c", EXAMPLE, "qos", "show", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["in_sync"] is True


def test_cli_unknown_account_refuses_before_changing(monkeypatch: Any, tmp_path: Any,
                                                     capsys: Any) -> None:
    with open(EXAMPLE) as fh:
        data = yaml.safe_load(fh)
    data["classes"][0]["qos"]["accounts"] = ["ghost"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    fake = FakeSacctmgr(_edit("debug", 1, "7"))
    _patch_cli(monkeypatch, fake)
    assert main(["-c", str(path), "qos", "apply"]) == 1
    assert "ghost" in capsys.readouterr().err and fake.calls == []


def test_cli_slurmdbd_unreachable_exits_5(monkeypatch: Any, tmp_path: Any, capsys: Any) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    fake = bindir / "sacctmgr"
    fake.write_text("#!/bin/sh\necho 'sacctmgr: error: Problem talking to the database: "
                    "Connection refused' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("SLURMISO_SLURM_BIN", str(bindir))
    assert main(["-c", EXAMPLE, "qos", "apply"]) == 5
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "slurmdbd" in err and "Connection refused" in err


def test_doctor_qos_grant_and_account_findings() -> None:
    cfg = example(infer=["research", "ghost"])
    snap = {"qos": [dict(zip(Q.QOS_FORMAT.split(","), ln.split("|")))
                    for ln in IN_SYNC.splitlines()],
            "account_qos": {"research": ["normal"]}}
    assert {f.code for f in check_qos(snap, cfg)} == {"qos-grant", "qos-account"}
    assert [f.code for f in check_qos({}, cfg)] == ["qos-unread"]


# ------------------------------------------------------------------- gen slurm-conf
def golden(name: str, text: str) -> None:
    _check(os.path.join(GOLDEN, name), text)


def test_gen_slurm_conf_golden() -> None:
    golden("example.conf", slurmconf.render(example(), source="etc/slurmiso.yaml"))


def test_gen_slurm_conf_cli_prefix_and_mig_order(capsys: Any) -> None:
    assert main(["-c", EXAMPLE, "gen", "slurm-conf", "--prefix", "/opt/si/bin",
                 "--slurm-version", "23.11.4"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert "Prolog=/opt/si/bin/slurmiso-prolog" in lines
    assert "TaskProlog=/opt/si/bin/slurmiso-task-prolog" in lines
    assert "PreemptMode=REQUEUE" in lines and "JobAcctGatherParams=DisableGPUAcct" in lines
    # every setting line has its reason on the line before
    for i, ln in enumerate(lines):
        if ln and not ln.startswith("#") and not ln.startswith(("PartitionName", "NodeSet")):
            assert lines[i - 1].startswith("# "), ln
    # mig-static Gres= types in the gres.conf order (type, GPU, start)
    assert "Gres=gpu:1g.10gb:12,gpu:3g.40gb:8,gpu:4g.40gb:4" in out


def test_gen_slurm_conf_without_mig_or_mps_pools(tmp_path: Any) -> None:
    with open(EXAMPLE) as fh:
        data = yaml.safe_load(fh)
    data["pools"] = [p for p in data["pools"] if p["mode"] == "exclusive"]
    cfg = parse_config(data, "x")
    keys = {s.key: s.value for s in slurmconf.required_settings(cfg)}
    assert keys["GresTypes"] == "gpu" and keys["AccountingStorageTRES"] == "gres/gpu"
    assert "JobAcctGatherParams" not in keys
