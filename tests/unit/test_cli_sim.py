"""``slurmiso sim`` run in-process: output and exit codes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Dict, List, Tuple

import pytest

from slurmiso.cli.main import main


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A 2 x H100 MIG node, addressed through $SLURMISO_SIM_STATE as jobs would."""
    path = str(tmp_path / "n1.json")
    monkeypatch.setenv("SLURMISO_SIM_STATE", path)
    assert (
        main(["sim", "init", "--model", "H100-80GB", "--gpus", "2", "--mig", "--node", "n1"]) == 0
    )
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> Tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def show_json(capsys: pytest.CaptureFixture[str]) -> Dict[str, Any]:
    code, out, _ = run(capsys, "sim", "show", "--json")
    assert code == 0
    data: Dict[str, Any] = json.loads(out)
    return data


def test_init_and_show(state: str, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    code, out, _ = run(capsys, "sim", "show")
    assert code == 0
    assert out.splitlines()[0] == "node n1"
    assert "H100-80GB" in out and "no MIG instances" in out and "no GPU processes" in out
    assert Path(state).exists()


def test_init_with_node_pattern(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "sim",
        "init",
        "--model",
        "A30",
        "--gpus",
        "1",
        "--node",
        "gpu3",
        "--state",
        str(tmp_path / "%n.json"),
    )
    assert code == 0 and "gpu3" in out
    assert (tmp_path / "gpu3.json").exists()


@pytest.mark.parametrize(
    "argv,code,fragment",
    [
        (["sim", "init", "--model", "H100-80GB"], 2, "already exists"),
        (["sim", "init", "--model", "V100", "--force"], 2, "known models: A100-40GB"),
        (
            ["sim", "create", "--gpu", "0", "--profile", "3g.40gb", "--placement", "2"],
            4,
            "legal starts: 0, 4",
        ),
        (["sim", "create", "--gpu", "0", "--profile", "5g.50gb"], 4, "allowed profiles"),
        (["sim", "create", "--gpu", "7", "--profile", "1g.10gb"], 4, "no GPU 7"),
        (["sim", "destroy", "--gpu", "0", "--gi", "1"], 4, "no GPU instance 1"),
        (["sim", "load", "--util", "50"], 2, "--gpu"),
        (["sim", "load", "--gpu", "0"], 2, "nothing to load"),
        (["sim", "mig-mode", "--gpu", "zero", "off"], 2, "index or 'all'"),
    ],
)
def test_errors_exit_codes(
    state: str, capsys: pytest.CaptureFixture[str], argv: List[str], code: int, fragment: str
) -> None:
    got, out, err = run(capsys, *argv)
    assert got == code
    assert err.startswith("slurmiso: error:") and fragment in err
    assert "Traceback" not in err


def test_impossible_placement_names_free_ones(
    state: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run(capsys, "sim", "create", "--gpu", "0", "--profile", "4g.40gb")[0] == 0
    code, _, err = run(
        capsys, "sim", "create", "--gpu", "0", "--profile", "3g.40gb", "--placement", "0"
    )
    assert code == 4 and "free placements: 4" in err
    code, out, _ = run(
        capsys, "sim", "create", "--gpu", "0", "--profile", "3g.40gb", "--placement", "4"
    )
    assert code == 0 and "at 4:4 MIG-" in out


def test_create_show_destroy(state: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "sim", "create", "--gpu", "1", "--profile", "2g.20gb")
    assert code == 0
    uuid = out.split()[-1]
    assert uuid.startswith("MIG-")
    code, out, _ = run(capsys, "sim", "show")
    assert uuid in out and "2g.20gb" in out and "0:2" in out
    (inst,) = show_json(capsys)["gpus"][1]["instances"]
    assert (inst["gi_id"], inst["ci_id"], inst["uuid"]) == (1, 0, uuid)
    code, out, _ = run(capsys, "sim", "destroy", "--gpu", "1", "--gi", "1")
    assert code == 0 and "destroyed 2g.20gb" in out
    assert show_json(capsys)["gpus"][1]["instances"] == []


def test_load_registers_parent_pid(state: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "sim",
        "load",
        "--gpu",
        "0",
        "--util",
        "80",
        "--sm",
        "60",
        "--mem",
        "20G",
        "--name",
        "train",
    )
    assert code == 0 and f"pid {os.getppid()} holds 20480 MiB" in out
    data = show_json(capsys)
    assert data["gpus"][0]["load"]["util"] == 80 and data["gpus"][0]["load"]["sm"] == 60
    assert [(p["pid"], p["used_memory_mb"], p["name"]) for p in data["processes"]] == [
        (os.getppid(), 20480, "train")
    ]
    assert run(capsys, "sim", "load", "--clear")[0] == 0
    data = show_json(capsys)
    assert data["processes"] == [] and data["gpus"][0]["load"]["util"] == 0


def test_load_on_mig_device(state: str, capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "sim", "create", "--gpu", "0", "--profile", "3g.40gb")
    uuid = out.split()[-1]
    code, out, _ = run(
        capsys, "sim", "load", "--gpu", "0", "--mem", "512M", "--pid", "1", "--mig-uuid", uuid
    )
    assert code == 0 and f"on {uuid}" in out
    code, _, err = run(capsys, "sim", "destroy", "--gpu", "0", "--gi", "1")
    assert code == 4 and "in use by pid(s) 1" in err


def test_bad_size_is_a_usage_error(state: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["sim", "load", "--gpu", "0", "--mem", "20X"])
    assert info.value.code == 2
    assert "invalid size '20X'" in capsys.readouterr().err


def test_mig_mode_all(state: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "sim", "mig-mode", "--gpu", "all", "off")
    assert code == 0 and out.splitlines() == ["GPU 0: MIG off", "GPU 1: MIG off"]
    code, _, err = run(capsys, "sim", "create", "--gpu", "0", "--profile", "1g.10gb")
    assert code == 4 and "MIG mode is disabled" in err
    assert run(capsys, "sim", "mig-mode", "--gpu", "0", "on")[0] == 0
    assert [g["mig_enabled"] for g in show_json(capsys)["gpus"]] == [True, False]


def test_fault_lost_and_ok(state: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "sim", "fault", "--gpu", "1", "lost")[0] == 0
    code, out, _ = run(capsys, "sim", "show")
    assert code == 0 and "LOST" in out
    code, _, err = run(capsys, "sim", "create", "--gpu", "1", "--profile", "1g.10gb")
    assert code == 4 and "GPU 1 has fallen off the bus" in err
    assert run(capsys, "sim", "fault", "--gpu", "1", "ok")[0] == 0
    assert run(capsys, "sim", "create", "--gpu", "1", "--profile", "1g.10gb")[0] == 0


def test_no_state_file_given(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("SLURMISO_SIM_STATE", raising=False)
    code, _, err = run(capsys, "sim", "show")
    assert code == 2 and "--state PATH" in err


def test_missing_state_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "sim", "show", "--state", str(tmp_path / "none.json"))
    assert code == 4 and "sim init" in err


@pytest.mark.parametrize(
    "argv,fragment",
    [
        (["sim", "--help"], "examples:"),
        (["sim", "load", "--help"], "PARENT"),
        (["sim", "init", "--help"], "H200-141GB"),
    ],
)
def test_help_teaches(capsys: pytest.CaptureFixture[str], argv: List[str], fragment: str) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 0 and fragment in capsys.readouterr().out
