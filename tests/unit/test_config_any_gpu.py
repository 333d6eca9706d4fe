"""Pools of any NVIDIA GPU (issue 26): the model is optional outside MIG, a MIG pool needs a
model with a MIG table and is told what to add, and MPS pools shared across accounts warn."""

from __future__ import annotations

import os
from typing import Any, Dict, List

import pytest
import yaml

from slurmiso.cli.main import main
from slurmiso.config import parse_config
from slurmiso.config.mps_users import mps_mixes
from slurmiso.errors import ConfigError


def _cfg(pool: Dict[str, Any], classes: List[Dict[str, Any]] = ()) -> Dict[str, Any]:  # type: ignore[assignment]
    return {
        "version": 1,
        "classes": list(classes) or [
            {"name": "infer", "match": {"qos": ["infer"]}, "isolation": "mps",
             "mps": {"memory_limit": "8G"}, "mig_profile": "1g.10gb"},
        ],
        "default_class": "",
        "pools": [dict({"name": "p", "nodes": "g[1-2]", "partition": "p", "gpus_per_node": 4},
                       **pool)],
    }


def _problems(data: Dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "t.yaml")
    return str(info.value)


@pytest.mark.parametrize("mode", ["exclusive", "mps", "timeslice"])
@pytest.mark.parametrize("model", ["L4", "L40S", "RTX-4090", "Some Future GPU", None])
def test_non_mig_pools_take_any_gpu_or_none(mode: str, model: Any) -> None:
    pool: Dict[str, Any] = {"mode": mode}
    if model is not None:
        pool["gpu_model"] = model
    cfg = parse_config(_cfg(pool))
    assert cfg.pools[0].gpu_model == (model or "")


def test_known_model_is_canonicalised() -> None:
    cfg = parse_config(_cfg({"mode": "mps", "gpu_model": "nvidia l4"}))
    assert cfg.pools[0].gpu_model == "L4"


@pytest.mark.parametrize("mode", ["mig-static", "mig-dynamic"])
def test_mig_pool_of_l4s_is_refused_clearly(mode: str) -> None:
    msg = _problems(_cfg({"mode": mode, "gpu_model": "L4", "mig_layout": ""}))
    assert "pools[0].mode" in msg and "L4 (NVIDIA L4) does not support MIG" in msg
    assert "H100-80GB" in msg and "use mode exclusive, mps or timeslice" in msg


def test_mig_pool_needs_a_model() -> None:
    msg = _problems(_cfg({"mode": "mig-dynamic"}))
    assert "pools[0].gpu_model: required when mode is mig-dynamic" in msg
    assert "B200-180GB" in msg


def test_mig_pool_of_an_unknown_model_says_what_to_add() -> None:
    msg = _problems(_cfg({"mode": "mig-dynamic", "gpu_model": "X300"}))
    assert "'X300' has no MIG profile table" in msg
    assert "slurmiso mig show --profiles" in msg and "slurmiso/gpu/catalogue.py" in msg


def test_mig_pool_of_a_new_table_model_loads() -> None:
    data = _cfg({"mode": "mig-dynamic", "gpu_model": "B200"})
    data["classes"][0]["mig_profile"] = {"B200-180GB": "1g.23gb"}
    cfg = parse_config(data)
    assert cfg.pools[0].gpu_model == "B200-180GB"


def test_mps_limit_checked_against_a_known_model_with_headroom() -> None:
    data = _cfg({"mode": "mps", "gpu_model": "L4"})
    data["classes"][0]["mps"]["memory_limit"] = "20G"
    data["classes"][0]["memory_headroom"] = 20
    msg = _problems(data)
    assert "classes[0].mps.memory_limit" in msg and "20% headroom" in msg and "L4" in msg
    data["classes"][0]["mps"]["memory_limit"] = "30G"
    assert "30720 MiB is more than a L4 has (23034 MiB" in _problems(data)


def test_mps_limit_of_an_unnamed_gpu_is_left_to_the_node() -> None:
    data = _cfg({"mode": "mps"})
    data["classes"][0]["mps"]["memory_limit"] = "500G"
    assert parse_config(data).pools[0].gpu_model == ""


def _two_classes(infer_accounts: List[str], train_accounts: List[str]) -> List[Dict[str, Any]]:
    return [
        {"name": "infer", "match": {"qos": ["infer"], "accounts": infer_accounts},
         "isolation": "mps"},
        {"name": "train", "match": {"qos": ["train"]}, "isolation": "mps",
         "qos": {"accounts": train_accounts}},
        {"name": "debug", "match": {"qos": ["debug"]}, "isolation": "exclusive"},
    ]


@pytest.mark.parametrize(
    "infer,train,warned",
    [
        ([], [], True),  # any account
        (["llm"], ["research"], True),
        (["llm"], [], True),
        (["svc-pool"], ["svc-pool"], False),  # one service account for the pool
    ],
)
def test_mps_pool_across_accounts_warns(infer: List[str], train: List[str], warned: bool
                                        ) -> None:
    cfg = parse_config(_cfg({"mode": "mps"}, _two_classes(infer, train)))
    mixes = mps_mixes(cfg)
    assert bool(mixes) is warned
    assert bool(cfg.warnings) is warned
    if warned:
        assert mixes[0].classes == ("infer", "train")  # debug cannot land on an MPS pool
        assert "time-sliced, not concurrent" in cfg.warnings[0] and "MIG" in cfg.warnings[0]


def test_one_class_alone_on_mps_does_not_warn() -> None:
    classes = _two_classes([], [])
    classes[1]["match"]["partitions"] = ["other"]
    assert mps_mixes(parse_config(_cfg({"mode": "mps"}, classes))) == []


def test_check_config_cli(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """check-config accepts a pool of L4s in mps mode and refuses a MIG pool of them with
    exit 2 and the reason, no traceback."""
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(_cfg({"mode": "mps", "gpu_model": "L4"})))
    assert main(["check-config", str(good)]) == 0
    assert "OK" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_cfg({"mode": "mig-dynamic", "gpu_model": "L4"})))
    assert main(["check-config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "does not support MIG" in err and "Traceback" not in err
    assert os.path.exists(bad)


@pytest.mark.parametrize("model,gres,line", [
    (None, "gpu:4,mps:400", "Name=gpu File=/dev/nvidia[0-3]"),
    ("L4", "gpu:l4:4,mps:400", "Name=gpu Type=l4 File=/dev/nvidia[0-3]"),
    ("RTX-4090", "gpu:rtx4090:4,mps:400", "Name=gpu Type=rtx4090 File=/dev/nvidia[0-3]"),
])
def test_gres_of_any_gpu(model: Any, gres: str, line: str) -> None:
    """A pool naming no model declares untyped GPUs; a named one its family as the type."""
    from slurmiso.mig.gres import render_gres_conf
    from slurmiso.slurm.slurmconf import pool_gres

    pool: Dict[str, Any] = {"mode": "mps"}
    if model:
        pool["gpu_model"] = model
    cfg = parse_config(_cfg(pool))
    assert pool_gres(cfg, cfg.pools[0]) == gres
    assert line in render_gres_conf(cfg.pools[0], "g1").splitlines()
