"""The recommendation rule against hand-made results: the softest mode that holds the SLO."""

from __future__ import annotations

from typing import Any, Dict, Optional

from slurmiso.probe.recommend import RANK, Target, recommend

SLO = Target("infer", 100.0, 0.01, "test")


def mode(name: str, p99: Optional[float], err: float = 0.0, keeps: float = 0.8,
         solo_p99: float = 10.0, **extra: Any) -> Dict[str, Any]:
    return {"mode": name, "pool": f"pool-{name}", "infer": {"p99_ms": p99, "error_rate": err},
            "infer_solo": {"p99_ms": solo_p99, "error_rate": 0.0},
            "train": {"step_s": 0.2, "throughput_vs_solo": keeps}, **extra}


def test_the_order_is_rate_limit_quotas_partition_dedicate() -> None:
    assert RANK["timeslice"] < RANK["mps"] < RANK["mig-dynamic"] == RANK["mig-static"]
    assert RANK["mig-static"] < RANK["exclusive"] and RANK["mps-priority"] == RANK["mps"]


def test_softest_mode_that_holds_wins_even_when_a_harder_one_keeps_more() -> None:
    modes = [mode("timeslice", 400.0, keeps=0.95), mode("mps", 90.0, keeps=0.6),
             mode("mig-static", 20.0, keeps=0.7), mode("exclusive", 12.0, keeps=1.0)]
    rec = recommend(modes, SLO)
    assert rec["mode"] == "mps" and rec["pool"] == "pool-mps"
    assert "mps holds the SLO" in rec["why"] and "P99 90 ms <= 100 ms" in rec["why"]
    assert "timeslice: P99 400 ms > 100 ms" in rec["why"]
    assert rec["held"] == ["mps", "mig-static", "exclusive"]


def test_error_rate_over_the_slo_fails_a_mode() -> None:
    rec = recommend([mode("timeslice", 50.0, err=0.05), mode("mps", 60.0, err=0.0)], SLO)
    assert rec["mode"] == "mps"
    assert "error rate 5.00% > 1.00%" in rec["missed"]["timeslice"]


def test_a_tie_in_rank_goes_to_the_most_training_throughput() -> None:
    modes = [mode("mig-dynamic", 30.0, keeps=0.5), mode("mig-static", 40.0, keeps=0.7)]
    rec = recommend(modes, SLO)
    assert rec["mode"] == "mig-static" and "keeps the most training throughput" in rec["why"]
    # throughput against a whole GPU, where known, decides over the in-mode ratio
    modes[0]["train"]["throughput_vs_gpu"] = 0.9
    modes[1]["train"]["throughput_vs_gpu"] = 0.4
    assert recommend(modes, SLO)["mode"] == "mig-dynamic"


def test_no_mode_meets_the_slo() -> None:
    modes = [mode("timeslice", 400.0), mode("mps", 250.0), mode("exclusive", 150.0)]
    rec = recommend(modes, SLO)
    assert rec["mode"] == "none" and rec["pool"] is None
    assert rec["why"].startswith("no mode holds the SLO of class infer (P99 <= 100 ms")
    assert "closest: exclusive at P99 150 ms" in rec["why"]


def test_inference_alone_already_missing_the_slo_is_said_so() -> None:
    modes = [mode("timeslice", 400.0, solo_p99=300.0), mode("exclusive", 320.0, solo_p99=310.0)]
    rec = recommend(modes, SLO)
    assert rec["mode"] == "none" and "inference alone already misses it" in rec["why"]


def test_unmeasured_apart_and_missing_modes_are_left_out() -> None:
    modes = [mode("timeslice", 10.0, colocated=False), mode("mps", None),
             mode("mig-static", 10.0, skipped="no MIG instance"),
             mode("exclusive", 20.0, colocated=False)]
    rec = recommend(modes, SLO)
    assert rec["mode"] == "exclusive"  # two GPUs by design: "apart" is what it is
    assert "did not share a GPU" in rec["missed"]["timeslice"]
    assert rec["missed"]["mps"] == "no latency measured"
    assert rec["missed"]["mig-static"] == "not measured: no MIG instance"


def test_no_target_no_recommendation() -> None:
    rec = recommend([mode("timeslice", 1.0)], Target("infer", None))
    assert rec["mode"] == "none" and "--p99-ms" in rec["why"]
