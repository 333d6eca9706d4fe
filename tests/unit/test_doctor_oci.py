"""doctor on a live oci.conf: each missing or contradicting slurmiso line is one error naming it.

The oci.conf texts are written the way sites write them: Slurm's containers guide's crun and
runc examples (doc/html/containers.shtml), slurmiso's own generated file, and each with one
thing wrong.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

import pytest

from slurmiso.cli.main import main
from slurmiso.config import load_config
from slurmiso.doctor import Finding, run_checks
from slurmiso.doctor.containers import check_oci_conf
from slurmiso.slurm.ociconf import parse_oci_conf
from tests.unit.test_doctor import recorded

HERE = os.path.dirname(__file__)
EXAMPLE = os.path.join(HERE, "..", "..", "etc", "slurmiso.yaml")
GENERATED = os.path.join(HERE, "..", "golden", "containers", "oci.conf")
PATH = "/etc/slurm/oci.conf"

GUIDE_CRUN = """\
EnvExclude="^(SLURM_CONF|SLURM_CONF_SERVER)="
RunTimeEnvExclude="^(SLURM_CONF|SLURM_CONF_SERVER)="
RunTimeQuery="crun --rootless=true --root=/run/user/%U/ state %n.%u.%j.%s.%t"
RunTimeKill="crun --rootless=true --root=/run/user/%U/ kill -a %n.%u.%j.%s.%t"
RunTimeDelete="crun --rootless=true --root=/run/user/%U/ delete --force %n.%u.%j.%s.%t"
RunTimeRun="crun --rootless=true --root=/run/user/%U/ run --bundle %b %n.%u.%j.%s.%t"
"""
#: The guide's file with the run command put behind slurmiso's gate, as a site would.
CRUN_RUN = GUIDE_CRUN.replace('RunTimeRun="crun',
                              'RunTimeRun="exec /opt/slurmiso/bin/slurmiso-oci-gate %n %b crun')
RUNC_CREATE_START = """\
# runc, create/start
runtimequery="runc --rootless=true --root=/run/user/%U/ state %n.%u.%j.%s.%t"
RunTimeCreate="runc --rootless=true --root=/run/user/%U/ create %n.%u.%j.%s.%t -b %b"
RunTimeStart="runc --rootless=true --root=/run/user/%U/ start %n.%u.%j.%s.%t"  # the start
RunTimeKill="runc --rootless=true --root=/run/user/%U/ kill -a %n.%u.%j.%s.%t"
RunTimeDelete="runc --rootless=true --root=/run/user/%U/ delete --force %n.%u.%j.%s.%t"
"""


def snap(text: Optional[str], version: str = "24.11.5") -> Dict[str, Any]:
    return {"slurm_version": version, "oci_conf": {"path": PATH, "text": text}}


def findings(text: Optional[str], version: str = "24.11.5") -> List[Finding]:
    return check_oci_conf(snap(text, version), load_config(EXAMPLE))


def errors(text: Optional[str], version: str = "24.11.5") -> List[Finding]:
    return [f for f in findings(text, version) if f.is_problem]


def generated() -> str:
    with open(GENERATED, encoding="utf-8") as fh:
        return fh.read()


@pytest.mark.parametrize("text", [CRUN_RUN, "generated"])
@pytest.mark.parametrize("version", ["23.02.0", "24.11.5", "26.05.5"])
def test_good_files_have_no_problem(text: str, version: str) -> None:
    out = findings(generated() if text == "generated" else text, version)
    assert [f.code for f in out] == ["oci-conf-mounts"]
    assert "/run/slurmiso/mps" in out[0].message and "--config-json" in out[0].fix


@pytest.mark.parametrize("text", [GUIDE_CRUN, RUNC_CREATE_START, CRUN_RUN.replace(" %n %b", ""),
                                  CRUN_RUN.replace('"exec ', '"')],
                         ids=["guide-crun", "runc-create-start", "gate-without-bundle",
                              "gate-without-exec"])
def test_run_line_not_behind_the_gate_is_one_error_naming_it(text: str) -> None:
    """Slurm's guide's own files run the runtime directly: nothing would refuse a bundle
    that cannot reach its MPS pipe directory."""
    (err,) = errors(text)
    assert err.code == "oci-conf-gate" and err.severity == "error"
    assert 'RunTimeRun="exec /usr/bin/slurmiso-oci-gate %n %b ' in err.message
    assert "MPS pipe directory" in err.message


def test_missing_run_line_is_one_error_naming_it() -> None:
    text = "\n".join(ln for ln in CRUN_RUN.splitlines() if not ln.startswith("RunTimeRun"))
    (err,) = errors(text)
    assert err.code == "oci-conf-line" and err.severity == "error"
    assert 'RunTimeRun="exec /usr/bin/slurmiso-oci-gate %n %b crun --rootless=true' in err.message
    assert "slurmiso gen oci-conf" in err.fix and PATH in err.fix


@pytest.mark.parametrize("value", ["true", "Yes", "1"])
def test_ignoring_config_json_drops_mounts_and_env(value: str) -> None:
    (err,) = errors(CRUN_RUN + f"IgnoreFileConfigJson={value}\n")
    assert "IgnoreFileConfigJson=false" in err.message
    assert "task-prolog exports" in err.message


def test_env_exclude_that_drops_slurmiso_variables() -> None:
    text = CRUN_RUN.replace('EnvExclude="^(SLURM_CONF|SLURM_CONF_SERVER)="',
                            'EnvExclude="^(SLURM_CONF|CUDA_)"', 1)
    (err,) = errors(text)
    assert err.code == "oci-conf-env"
    assert "CUDA_VISIBLE_DEVICES" in err.message and "CUDA_MPS_PIPE_DIRECTORY" in err.message
    assert "SLURMISO_CLASS" not in err.message
    assert "MPS pipe directory among them" in err.message
    assert 'EnvExclude="^(SLURM_CONF|SLURM_CONF_SERVER)="' in err.fix


@pytest.mark.parametrize("pattern", ["(SLURM", "^[[:upper:]_]+_CONF="])
def test_env_exclude_that_cannot_be_read_is_not_trusted(pattern: str) -> None:
    (err,) = errors(CRUN_RUN + f'EnvExclude="{pattern}"\n')
    assert err.code == "oci-conf-env" and "not a regular expression" in err.message


@pytest.mark.parametrize("bad, shown", [
    ("RunTimeRun crun run --bundle %b x", "line 7: RunTimeRun crun run"),
    ('RunTimeRun="crun run --bundle %b x', "line 7: RunTimeRun=\"crun run"),
    ("= no key", "line 7: = no key"),
])
def test_malformed_line(bad: str, shown: str) -> None:
    errs = errors(CRUN_RUN + bad + "\n")
    assert [e.code for e in errs] == ["oci-conf-malformed"]
    assert shown in errs[0].message and "Key=Value" in errs[0].fix


def test_unknown_key_fails_the_file() -> None:
    (err,) = errors(CRUN_RUN + "BindMounts=/run/slurmiso/mps\n")
    assert err.code == "oci-conf-unknown-key" and "BindMounts=" in err.message


def test_slurm_22_05_cannot_carry_the_environment() -> None:
    """Without the gate in front of the runtime, nothing on 22.05 refuses a container that
    lacks the job's exports."""
    (err,) = errors(GUIDE_CRUN, "22.05.8")
    assert err.code == "oci-conf-slurm" and "TaskProlog" in err.message


def test_slurm_22_05_behind_the_gate_is_said_not_an_error() -> None:
    """The gate refuses a 22.05 container without its job's exports (measured on the
    sandbox): an oci.conf behind it fails closed, so it is no problem there, but said."""
    gated = ('RunTimeQuery="crun state %n.%u.%j.%s.%t"\n'
             'RunTimeRun="exec /usr/bin/slurmiso-oci-gate %n %b crun run --bundle %b '
             '%n.%u.%j.%s.%t"\n')
    assert errors(gated, "22.05.8") == []
    (info,) = findings(gated, "22.05.8")
    assert info.severity == "info" and info.code == "oci-conf-slurm"
    assert "slurmiso-oci-gate refuses" in info.message


def test_absent_file_is_info_only() -> None:
    (info,) = findings(None)
    assert info.severity == "info" and info.code == "oci-conf"
    assert f"slurmiso gen oci-conf -o {PATH}" in info.fix


def test_old_snapshot_without_the_key_says_nothing() -> None:
    assert check_oci_conf({"slurm_version": "24.11.5"}, load_config(EXAMPLE)) == []


def test_hash_ends_the_line_even_inside_quotes_as_in_slurm() -> None:
    """parse_config.c cuts at the first unescaped '#', quotes or not; '\\#' is a '#'."""
    cut = CRUN_RUN.replace('"^(SLURM_CONF|SLURM_CONF_SERVER)="', '"^(SLURM_CONF|#X)="', 1)
    assert [f.code for f in errors(cut)] == ["oci-conf-malformed"]
    escaped = CRUN_RUN.replace('"^(SLURM_CONF|SLURM_CONF_SERVER)="', '"^(SLURM_CONF|\\#X)="', 1)
    assert errors(escaped) == []


def test_continued_line_is_one_line() -> None:
    text = CRUN_RUN.replace(" run --bundle %b", " run \\\n    --bundle %b", 1)
    assert text.count("\n") == CRUN_RUN.count("\n") + 1
    assert errors(text) == []
    assert parse_oci_conf(text).get("RunTimeRun").split()[-3:] == [
        "--bundle", "%b", "%n.%u.%j.%s.%t"]


def test_the_recorded_sandbox_snapshot_with_an_oci_conf(tmp_path: Any, capsys: Any) -> None:
    """End to end through 'doctor --snapshot': the finding reaches the report and exit code."""
    import json

    data = recorded()
    assert data["slurm_version"].startswith("22.05")  # recorded on the sandbox's 22.05
    data["slurm_version"] = "24.11.5"
    data["oci_conf"] = {"path": PATH, "text": CRUN_RUN.replace("RunTimeRun", "#RunTimeRun")}
    path = tmp_path / "snap.json"
    path.write_text(json.dumps(data))
    assert main(["-c", EXAMPLE, "doctor", "--snapshot", str(path), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    codes = [f["code"] for f in out["findings"]]
    assert codes.count("oci-conf-line") == 1
    assert "oci-conf-line" in {f.code for f in run_checks(data, load_config(EXAMPLE))}
