"""Strict config loading: every shipped example loads, every kind of mistake is named."""

from __future__ import annotations

import copy
import glob
import os
from typing import Any, Callable, Dict

import pytest
import yaml

from slurmiso.cli.main import main
from slurmiso.config import load_config, parse_config
from slurmiso.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "etc", "slurmiso.yaml")


def _base() -> Dict[str, Any]:
    with open(EXAMPLE) as fh:
        return yaml.safe_load(fh)


def _problems(data: Dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config(data, "test.yaml")
    return str(info.value)


@pytest.mark.parametrize(
    "path", sorted(glob.glob(os.path.join(ROOT, "etc", "**", "*.yaml"), recursive=True))
)
def test_every_shipped_yaml_loads(path: str) -> None:
    with open(path) as fh:
        head = fh.read(4000)
    if "mig-configs" in head and "classes:" not in head:
        pytest.skip("a mig-parted layout file, checked by test_mig_layout_files")
    cfg = load_config(path)
    assert cfg.classes, path


def test_example_content() -> None:
    cfg = load_config(EXAMPLE)
    assert [c.name for c in cfg.classes] == ["infer", "train", "debug"]
    train = cfg.job_class("train")
    assert train is not None and train.preemptible
    assert train.checkpoint is not None and train.checkpoint.grace_s == 120
    assert train.checkpoint.signal == "USR2"
    assert train.mps.memory_limit_mb == 24 * 1024
    assert cfg.pool_for_node("gpu020").name == "mixed"  # type: ignore[union-attr]
    assert cfg.pool_for_node("nodeX", ("migdyn",)).mode == "mig-dynamic"  # type: ignore[union-attr]
    half = cfg.mig_layout("half-half")
    assert half is not None and half.for_device(5).counts() == {"4g.40gb": 1, "1g.10gb": 3}  # type: ignore[union-attr]
    # infer beside train on the MPS pool, any account: true, and said (docs/security.md)
    slo, warning = cfg.warnings
    assert "pools[0]" in warning and "'serve'" in warning and "time-sliced" in warning
    # the example's TTFT bound is an edge of vLLM's and Triton's buckets, not SGLang's
    assert "monitor.slo[0]" in slo and "sglang cannot resolve ttft 500 ms" in slo
    assert "(400 ms, 600 ms]" in slo and "vllm" not in slo


def _set(path: str, value: Any) -> Callable[[Dict[str, Any]], None]:
    """Mutation setting a dotted path (list indices as numbers) to value."""

    def mutate(d: Dict[str, Any]) -> None:
        keys = path.split(".")
        cur: Any = d
        for k in keys[:-1]:
            cur = cur[int(k)] if isinstance(cur, list) else cur[k]
        last = keys[-1]
        if isinstance(cur, list):
            cur[int(last)] = value
        else:
            cur[last] = value

    return mutate


def _dup_class(d: Dict[str, Any]) -> None:
    d["classes"].append(copy.deepcopy(d["classes"][0]))


def _dup_node(d: Dict[str, Any]) -> None:
    d["pools"][1]["nodes"] = "gpu[010-020]"


# (name, mutation, substrings that must all appear in the message)
BAD = [
    ("unknown top key", _set("monitr", {}), ["test.yaml", "monitr: unknown key", "allowed here"]),
    (
        "unknown nested key",
        _set("classes.0.mps.threads", 50),
        ["classes[0].mps.threads: unknown key", "thread_percentage"],
    ),
    (
        "wrong type",
        _set("classes.1.preemptible", "yes"),
        ["classes[1].preemptible", "expected true or false", "'yes'"],
    ),
    (
        "mps percentage above 100",
        _set("classes.0.mps.thread_percentage", 150),
        ["classes[0].mps.thread_percentage", "150", "1..100"],
    ),
    (
        "mps percentage zero",
        _set("classes.1.mps.thread_percentage", 0),
        ["thread_percentage", "0 is out of range"],
    ),
    (
        "memory limit larger than GPU",
        _set("classes.0.mps.memory_limit", "100G"),
        ["classes[0].mps.memory_limit", "102400 MiB", "H100-80GB"],
    ),
    (
        "bad memory size",
        _set("classes.0.mps.memory_limit", "lots"),
        ["memory_limit", "'lots'", "20G"],
    ),
    (
        "unknown MIG profile for pool model",
        _set("classes.0.mig_profile", "3g.20gb"),
        ["classes[0].mig_profile", "'3g.20gb'", "H100-80GB", "3g.40gb"],
    ),
    (
        "layout profile not of the model",
        _set("mig_layouts.mig-configs.half-half.0.mig-devices", {"3g.71gb": 2}),
        ["half-half[0].mig-devices", "3g.71gb", "H100-80GB"],
    ),
    (
        "layout that does not fit",
        _set("mig_layouts.mig-configs.half-half.1.mig-devices", {"4g.40gb": 2}),
        ["half-half[1].mig-devices", "2x 4g.40gb", "does not fit"],
    ),
    ("duplicate class", _dup_class, ["duplicate class name 'infer'"]),
    (
        "unknown isolation",
        _set("classes.2.isolation", "vgpu"),
        ["classes[2].isolation", "'vgpu'", "exclusive, mig, mps, timeslice"],
    ),
    ("unknown pool mode", _set("pools.0.mode", "mig"), ["pools[0].mode", "'mig'", "mig-static"]),
    (
        "MIG pool of a model without a MIG table",
        _set("pools.1.gpu_model", "V100"),
        ["pools[1].gpu_model", "'V100'", "no MIG profile table", "H100-80GB",
         "slurmiso mig show --profiles", "slurmiso/gpu/catalogue.py"],
    ),
    (
        "missing layout",
        _set("pools.1.mig_layout", "nope"),
        ["pools[1].mig_layout", "'nope'", "half-half"],
    ),
    ("bad version", _set("version", 2), ["version", "2 is not supported", "allowed: 1"]),
    (
        "bad signal",
        _set("classes.1.checkpoint.signal", "KILL"),
        ["checkpoint.signal", "'KILL'", "USR2"],
    ),
    (
        "bad duration",
        _set("classes.1.checkpoint.grace", "soon"),
        ["checkpoint.grace", "'soon'", "90s"],
    ),
    (
        "preempt a non-preemptible class",
        _set("classes.0.qos.preempt", ["debug"]),
        ["classes[0].qos.preempt", "'debug' is not preemptible"],
    ),
    (
        "unknown default class",
        _set("default_class", "batch"),
        ["default_class", "'batch'", "infer, train, debug"],
    ),
    (
        "node in two pools",
        _dup_node,
        ["pools[1].nodes: gpu[010-016] already in pool 'serve'", "one GPU mode"],
    ),
    ("bad hostlist", _set("pools.0.nodes", "gpu[1-"), ["pools[0].nodes", "unbalanced"]),
    (
        "relative state dir",
        _set("paths.state_dir", "run/slurmiso"),
        ["paths.state_dir", "absolute path"],
    ),
    (
        "SLO for unknown class",
        _set("monitor.slo.0.class", "serve"),
        ["monitor.slo[0].class", "'serve'"],
    ),
    ("headroom out of range", _set("classes.0.memory_headroom", 95), ["memory_headroom", "0..90"]),
]


@pytest.mark.parametrize("name,mutate,expect", BAD, ids=[b[0] for b in BAD])
def test_bad_config_is_named(
    name: str, mutate: Callable[[Dict[str, Any]], None], expect: list
) -> None:
    data = _base()
    mutate(data)
    msg = _problems(data)
    for piece in expect:
        assert piece in msg, f"{piece!r} missing from:\n{msg}"


def test_all_problems_reported_at_once() -> None:
    data = _base()
    data["classes"][0]["mps"]["thread_percentage"] = 150
    data["pools"][1]["gpu_model"] = "V100"
    data["typo"] = 1
    with pytest.raises(ConfigError) as info:
        parse_config(data, "x.yaml")
    assert len(info.value.problems) == 3


def test_usr1_is_a_warning_not_an_error() -> None:
    data = _base()
    data["classes"][1]["checkpoint"]["signal"] = "USR1"
    cfg = parse_config(data, "w.yaml")
    assert any("NCCL" in w for w in cfg.warnings)


def test_per_model_mig_profile() -> None:
    data = _base()
    data["classes"][0]["mig_profile"] = {"H100-80GB": "3g.40gb", "A100-40GB": "3g.20gb"}
    cfg = parse_config(data)
    infer = cfg.job_class("infer")
    assert infer is not None
    assert infer.mig_profile_for("A100-40GB") == "3g.20gb"
    assert infer.mig_profile_for("H100-80GB") == "3g.40gb"
    assert infer.mig_profile_for("A30-24GB") == ""


def test_yaml_syntax_error_names_line(tmp_path: Any) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nclasses:\n  - name: [unclosed\n")
    with pytest.raises(ConfigError) as info:
        load_config(str(bad))
    assert "line" in str(info.value) and "not valid YAML" in str(info.value)


def test_missing_file_says_how_to_fix(tmp_path: Any) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(str(tmp_path / "none.yaml"))
    assert "does not exist" in str(info.value) and "SLURMISO_CONFIG" in str(info.value)


def test_env_selects_config(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("SLURMISO_CONFIG", EXAMPLE)
    assert load_config().source == EXAMPLE


def test_check_config_cli_ok(capsys: Any) -> None:
    assert main(["check-config", EXAMPLE]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "infer, train, debug" in out


def test_check_config_cli_bad_exits_2_without_traceback(tmp_path: Any, capsys: Any) -> None:
    data = _base()
    data["classes"][0]["mps"]["thread_percentage"] = 150
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["check-config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "thread_percentage: 150 is out of range" in err
    assert "Traceback" not in err


def test_check_config_cli_json(tmp_path: Any, capsys: Any) -> None:
    import json

    path = tmp_path / "c.yaml"
    path.write_text("version: 1\nclasses: []\nbogus: 1\n")
    assert main(["check-config", "--json", str(path)]) == 2
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and any("bogus" in p for p in out["problems"])
