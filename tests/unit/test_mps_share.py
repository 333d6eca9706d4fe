"""MPS memory limits as a share of the GPU's memory (issue 35, item 1: ``memory_limit: 45%``),
so one class fits pools of different GPU models: config, check-config, prolog and doctor."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from slurmiso.config import load_config
from slurmiso.config.model import MpsShare
from slurmiso.errors import ConfigError
from slurmiso.gpu.profiles import lookup_model
from slurmiso.isolation.mps import HANDLER
from slurmiso.values import replace
from tests.hookctx import make_context, write_config


def _config(tmp: str, limit: Any, model: str = "H100-80GB", headroom: int = 0) -> str:
    """``model`` "": the pool names no GPU model (any GPU: the node's NVML says)."""
    path = write_config(tmp, "mps", model=model or "H100-80GB")
    with open(path) as fh:
        data = yaml.safe_load(fh)
    if not model:
        del data["pools"][0]["gpu_model"]
    data["classes"][0]["mps"] = {"thread_percentage": 80, "memory_limit": limit}
    data["classes"][0]["memory_headroom"] = headroom
    with open(path, "w") as fh:
        yaml.safe_dump(data, fh)
    return path


def test_a_share_is_a_share_and_a_size_is_a_size(tmp_path: Any) -> None:
    infer = load_config(_config(str(tmp_path), "45%")).job_class("infer")
    assert infer is not None
    assert (infer.mps.thread_percentage, infer.mps.memory_limit_mb,
            infer.mps.memory_limit_pct) == (80, 0, 45)
    assert infer.mps.limit_mb(81920) == 36864 and infer.mps.limit_mb(40960) == 18432
    assert infer.mps.limit_mb(None) == 0, "no GPU memory known: no figure made up"
    sized = load_config(_config(str(tmp_path), "20G")).job_class("infer")
    assert sized is not None and sized.mps.limit_mb(81920) == sized.mps.limit_mb(40960) == 20480


@pytest.mark.parametrize("limit", ["0%", "101%", "4.5%", "%", "half%"])
def test_a_share_that_is_not_one_is_refused_with_the_fix(tmp_path: Any, limit: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_config(str(tmp_path), limit))
    assert "classes[0].mps.memory_limit" in str(err.value)
    assert "a whole percentage from 1% to 100%, e.g. 45%" in str(err.value)


def test_check_config_weighs_the_share_with_the_headroom_per_model(tmp_path: Any) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_config(str(tmp_path), "95%", headroom=10))
    total = lookup_model("H100-80GB").memory_mb  # type: ignore[union-attr]
    assert (f"95% ({total * 95 // 100} MiB) plus the class's 10% headroom ({total // 10} MiB)"
            f" is more than a H100-80GB has ({total} MiB") in str(err.value)


@pytest.mark.parametrize("model", ["H100-80GB", "A100-40GB"])
def test_the_prolog_turns_the_share_into_the_gpus_mib(tmp_path: Any, model: str) -> None:
    ctx = make_context(str(tmp_path), "mps", job_id="7", cls="infer", model=model)
    assert ctx.job_class is not None
    ctx.job_class = replace(ctx.job_class, mps=MpsShare(100, 0, 45))
    ctx.save()
    HANDLER.setup(ctx)
    total = ctx.backend.device(0).memory_total_mb
    want = total * 45 // 100
    known = lookup_model(model)
    assert known is not None and total == known.memory_mb
    assert ctx.record.env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == f"0={want}M"
    (entry,) = [r for r in ctx.record.resources if r.kind == "mps"]
    assert entry.memory_limit_mb == want
    HANDLER.teardown(ctx)


def test_doctor_weighs_the_share_against_what_the_node_reports(tmp_path: Any) -> None:
    from slurmiso.doctor.gpus import check_mps_memory

    cfg = load_config(_config(str(tmp_path), "92%", model="", headroom=10))
    snap = {"gpu_node": {"node": "node1", "pool": "p",
                         "devices": [{"index": 0, "memory_total_mb": 24576}]}}
    (found,) = [f for f in check_mps_memory(snap, cfg) if "infer" in f.message]
    assert "MPS memory limit 22609 MiB plus 10% headroom (2457 MiB)" in found.message
