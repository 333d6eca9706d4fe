"""``slurmiso gen oci-conf|enroot-mounts|apptainer-binds``: golden files, and what each says.

Only the generated text is tested here; what Slurm, enroot and Apptainer do with it was read
from their source and documentation (docs/admin-guide.md, "Containers").
"""

from __future__ import annotations

import json
import os
from typing import Any, List

import pytest

from slurmiso.cli.main import main
from slurmiso.slurm.ociconf import parse_oci_conf, problems
from tests.goldens import check_golden

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "etc", "slurmiso.yaml")
GOLDEN = os.path.join(os.path.dirname(os.path.dirname(__file__)), "golden", "containers")
ROOTS = ["--ckpt-root", "/scratch"]


def gen(capsys: Any, args: List[str], rc: int = 0) -> str:
    assert main(["-c", "etc/slurmiso.yaml", "gen"] + args) == rc
    return str(capsys.readouterr().out)


@pytest.fixture(autouse=True)
def _from_repo_root(monkeypatch: Any) -> None:
    """The header names the config as given: run from the repo root so goldens are stable."""
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))


@pytest.mark.parametrize("name, args", [
    ("oci.conf", ["oci-conf", "--slurm-version", "24.11.5"] + ROOTS),
    ("oci-runc.conf", ["oci-conf", "--slurm-version", "26.05.5", "--runtime", "runc"]),
    ("config-mounts.json", ["oci-conf", "--config-json"] + ROOTS),
    ("enroot-slurmiso.fstab", ["enroot-mounts"] + ROOTS),
    ("apptainer-binds.conf", ["apptainer-binds"] + ROOTS),
])
def test_golden(capsys: Any, name: str, args: List[str]) -> None:
    check_golden(os.path.join(GOLDEN, name), gen(capsys, args))


def test_generated_oci_conf_passes_doctor(capsys: Any) -> None:
    for version in ("23.02.0", "24.11.5", "26.05.5"):
        text = gen(capsys, ["oci-conf", "--slurm-version", version] + ROOTS)
        conf = parse_oci_conf(text)
        assert not conf.malformed
        assert problems(conf, tuple(map(int, version.split("."))), needs_mps=True) == []


def test_oci_conf_refused_on_22_05(capsys: Any) -> None:
    assert main(["-c", "etc/slurmiso.yaml", "gen", "oci-conf", "--slurm-version",
                 "22.05.8"]) == 2
    err = capsys.readouterr().err
    assert "22.05.8" in err and "TaskProlog" in err and "23.02" in err


def test_config_json_binds_the_mps_root_at_the_same_path(capsys: Any) -> None:
    mounts = json.loads(gen(capsys, ["oci-conf", "--config-json"]))["mounts"]
    assert mounts == [{"destination": "/run/slurmiso/mps", "type": "bind",
                       "source": "/run/slurmiso/mps", "options": ["rbind", "rw", "nosuid",
                                                                  "nodev"]}]


def test_enroot_lines_are_fstab_fields(capsys: Any) -> None:
    lines = [ln for ln in gen(capsys, ["enroot-mounts"] + ROOTS).splitlines()
             if ln and not ln.startswith("#")]
    assert [ln.split()[:3] for ln in lines] == [
        ["/run/slurmiso/mps", "/run/slurmiso/mps", "none"], ["/scratch", "/scratch", "none"]]
    assert all("nofail" not in ln and len(ln.split()) == 6 for ln in lines)


def test_apptainer_env_equivalent(capsys: Any) -> None:
    out = gen(capsys, ["apptainer-binds"] + ROOTS + ["--ckpt-root", "/home"])
    assert "# export APPTAINER_BIND=/run/slurmiso/mps,/scratch,/home" in out.splitlines()
    assert out.count("bind path = ") == 3


def test_without_ckpt_root_the_default_is_explained(capsys: Any) -> None:
    for target in ("enroot-mounts", "apptainer-binds"):
        assert "No --ckpt-root given" in gen(capsys, [target])


@pytest.mark.parametrize("bad", ["scratch", "/a b", "/x,y", "/x:y", "/x/../y"])
def test_ckpt_root_must_be_plain(capsys: Any, bad: str) -> None:
    assert main(["-c", "etc/slurmiso.yaml", "gen", "enroot-mounts", "--ckpt-root", bad]) == 2
    assert "plain absolute path" in capsys.readouterr().err


def test_no_mps_pool_no_mps_bind(capsys: Any, tmp_path: Any) -> None:
    with open(EXAMPLE, encoding="utf-8") as fh:
        text = fh.read()
    cfg = tmp_path / "slurmiso.yaml"
    cfg.write_text(text.replace("mode: mps", "mode: exclusive"))
    assert main(["-c", str(cfg), "gen", "enroot-mounts"]) == 0
    out = capsys.readouterr().out
    assert "/run/slurmiso/mps" not in out and "nothing to bind" in out
