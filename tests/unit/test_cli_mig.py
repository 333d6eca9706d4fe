"""'slurmiso mig' and 'slurmiso gen gres-conf' through main(), on a simulated node."""

from __future__ import annotations

import json
import os
from typing import Any, List, Tuple

import pytest
import yaml

from slurmiso.cli.main import main
from slurmiso.gpu.sim import SimBackend, init_state
from slurmiso.state.record import JobRecord, RecordStatus


@pytest.fixture
def node(tmp_path: Any, monkeypatch: Any) -> SimBackend:
    """Config with a mig-static pool (node1) and an exclusive pool (node2); sim node1."""
    def pool(name: str, node: str, mode: str, **kw: Any) -> Any:
        return dict(name=name, nodes=node, partition=name, gpu_model="H100-80GB",
                    gpus_per_node=2, mode=mode, **kw)

    data = {
        "version": 1,
        "paths": {"state_dir": str(tmp_path / "state"), "journal": str(tmp_path / "j.jsonl")},
        "gpu": {"backend": "sim", "sim_state": str(tmp_path / "%n.json")},
        "classes": [{"name": "train", "match": {"qos": ["train"]}, "isolation": "mig",
                     "mig_profile": "1g.10gb"}],
        "default_class": "train",
        "pools": [pool("mixed", "node1", "mig-static", mig_layout="mixed"),
                  pool("plain", "node2", "exclusive")],
        "mig_layouts": {"version": "v1", "mig-configs": {
            "mixed": [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
                      {"devices": [1], "mig-enabled": True,
                       "mig-devices": {"4g.40gb": 1, "3g.40gb": 1}}],
            "sevens": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
        }},
    }
    cfg = tmp_path / "slurmiso.yaml"
    cfg.write_text(yaml.safe_dump(data))
    monkeypatch.setenv("SLURMISO_CONFIG", str(cfg))
    monkeypatch.setenv("SLURMD_NODENAME", "node1")
    for var in ("SLURMISO_GPU_BACKEND", "SLURMISO_SIM_STATE"):
        monkeypatch.delenv(var, raising=False)
    init_state(str(tmp_path / "node1.json"), "H100-80GB", 2, mig=True, node="node1")
    return SimBackend(str(tmp_path / "node1.json"))


def run(capsys: Any, *argv: str) -> Tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def layout_of(sim: SimBackend) -> List[Tuple[int, str, int]]:
    return sorted((i.gpu_index, i.profile, i.placement_start) for i in sim.instances())


def test_assert_apply_assert(node: SimBackend, capsys: Any, tmp_path: Any) -> None:
    code, out, _ = run(capsys, "mig", "assert")
    assert code == 1 and "GPU 0: missing 3g.40gb at slice 0" in out
    code, out, _ = run(capsys, "mig", "apply", "--dry-run")
    assert code == 0 and "would" in out and "create 4g.40gb at slice 0" in out
    assert node.instances() == []
    code, out, _ = run(capsys, "mig", "apply")
    assert code == 0 and out.count("create") == 4
    assert layout_of(node) == [(0, "3g.40gb", 0), (0, "3g.40gb", 4), (1, "3g.40gb", 4),
                               (1, "4g.40gb", 0)]
    assert os.path.exists(tmp_path / "state" / "mig-gres.json")
    code, out, _ = run(capsys, "mig", "apply")
    assert code == 0 and "nothing to do" in out
    assert run(capsys, "mig", "assert")[0] == 0
    events = [json.loads(x)["event"] for x in (tmp_path / "j.jsonl").read_text().splitlines()]
    assert events.count("mig.create") == 4


def test_apply_json_and_other_layout(node: SimBackend, capsys: Any) -> None:
    code, out, _ = run(capsys, "mig", "apply", "--layout", "sevens", "--json")
    data = json.loads(out)
    assert code == 0 and data["layout"] == "sevens" and len(data["done"]) == 14
    code, out, _ = run(capsys, "mig", "apply", "--layout", "sevens", "--json")
    assert json.loads(out)["noop"] is True and json.loads(out)["done"] == []


def test_show_json_names_claiming_job(node: SimBackend, capsys: Any, tmp_path: Any) -> None:
    run(capsys, "mig", "apply")
    from slurmiso.state import NodeState

    state = NodeState(str(tmp_path / "state"))
    gi = node.instances(1)[0].gi_id
    state.write_job("55", JobRecord("55", RecordStatus.READY))
    state.set_allocations({f"mig/1/gi{gi}": "55"})
    code, out, _ = run(capsys, "mig", "show", "--json")
    data = json.loads(out)
    assert code == 0 and len(data["instances"]) == 4
    assert [r["job"] for r in data["instances"] if r["gpu_index"] == 1 and r["gi_id"] == gi] == ["55"]
    code, out, _ = run(capsys, "mig", "show")
    assert "55" in out and "3g.40gb" in out
    # the claimed instance stops a layout change that needs it gone
    code, _, err = run(capsys, "mig", "apply", "--layout", "sevens")
    assert code == 1 and "job 55" in err and "Traceback" not in err
    assert len(node.instances()) == 4


def test_mig_disabled_needs_enable_mig(node: SimBackend, capsys: Any) -> None:
    node.set_mig_mode(1, False)
    code, _, err = run(capsys, "mig", "apply")
    assert code == 1 and "--enable-mig" in err and "GPU(s) 1" in err
    assert node.instances() == []
    code, out, _ = run(capsys, "mig", "apply", "--enable-mig")
    assert code == 0 and "enable MIG mode" in out
    assert node.mig_mode(1) == (True, True) and len(node.instances()) == 4


@pytest.mark.parametrize("argv,code,text", [
    (["mig", "apply", "--layout", "nope"], 2, "no MIG layout 'nope'"),
    (["mig", "apply", "--node", "node2"], 2, "has no mig_layout"),
    (["mig", "assert", "--node", "ghost"], 2, "in no pool"),
])
def test_usage_errors(node: SimBackend, capsys: Any, argv: List[str], code: int, text: str) -> None:
    got, _, err = run(capsys, *argv)
    assert got == code and text in err


def test_gen_gres_conf_live_and_layout(node: SimBackend, capsys: Any, tmp_path: Any) -> None:
    run(capsys, "mig", "apply")
    code, live, _ = run(capsys, "gen", "gres-conf", "--dev-root", "/sb/dev",
                        "--proc-root", str(tmp_path))
    assert code == 0
    lines = [x for x in live.splitlines() if not x.startswith("#")]
    assert lines[0] == ("Name=gpu Type=3g.40gb MultipleFiles=/sb/dev/nvidia0,"
                        "/sb/dev/nvidia-caps/nvidia-cap12,/sb/dev/nvidia-caps/nvidia-cap13")
    assert [x.split()[1] for x in lines] == ["Type=3g.40gb", "Type=3g.40gb", "Type=3g.40gb",
                                             "Type=4g.40gb"]
    assert "Gres=gpu:3g.40gb:3,gpu:4g.40gb:1" in live
    assert "generated by 'slurmiso gen gres-conf'" in live
    _, planned, _ = run(capsys, "gen", "gres-conf", "--dev-root", "/sb/dev", "--from-layout",
                        "--proc-root", str(tmp_path))
    assert [x for x in planned.splitlines() if not x.startswith("#")] == lines
    out_file = tmp_path / "gres.conf"
    assert run(capsys, "gen", "gres-conf", "--node", "node2", "-o", str(out_file))[0] == 0
    assert "Name=gpu Type=h100 File=/dev/nvidia[0-1]" in out_file.read_text()
