"""The contention rule: each cause, its suspects, and unknown figures never reading as calm."""

from __future__ import annotations

import dataclasses
from typing import Optional

import pytest

from slurmiso.errors import ConfigError
from slurmiso.host.cgroup_figures import NO_PRESSURE, PressureFigures
from slurmiso.host.diagnosis import (
    Cause,
    DiagnosisInputs,
    GpuState,
    Neighbour,
    NicLoad,
    Thresholds,
    diagnose,
)
from slurmiso.host.kernel_text import Psi, PsiLine

GBIT = 125_000_000.0  # 1 Gbit/s in bytes/s


def psi(some: float, full: Optional[float] = 0.0) -> Psi:
    return Psi(PsiLine(some, some, 1), None if full is None else PsiLine(full, full, 1))


CALM = PressureFigures(cpu=psi(1.0), memory=psi(0.0), io=psi(0.5))
TRAIN = Neighbour("123", "train", "alice", gpus=("1",), cpu_cores=15.2, io_bytes_per_s=8e6,
                  memory_bytes=60 * 2**30)
SMALL = Neighbour("124", "train", "bob", gpus=("0",), cpu_cores=0.5, io_bytes_per_s=9e8,
                  memory_bytes=2**30, sm_by_gpu={"0": 0.2}, gpu_memory_by_gpu={"0": 10})
CALM_INPUTS = DiagnosisInputs(
    job_id="42",
    gpus=(GpuState("0", memory_used_fraction=0.5, sm_active_fraction=0.4),),
    job_pressure=CALM,
    node_pressure=CALM,
    neighbours=(TRAIN, SMALL),
    nics=(NicLoad("eth0", 1e6, 1e6, 10 * GBIT),),
    node_cpus=16,
)


def with_(**changes: object) -> DiagnosisInputs:
    return dataclasses.replace(CALM_INPUTS, **changes)  # type: ignore[arg-type]


def test_all_calm_and_known_is_none_found() -> None:
    d = diagnose(CALM_INPUTS)
    assert d.cause is Cause.NONE_FOUND and d.text == "no co-located cause found"
    assert d.unknown == ()


def test_cpu_pressure_names_the_heaviest_job() -> None:
    d = diagnose(with_(job_pressure=dataclasses.replace(CALM, cpu=psi(34.0))))
    assert d.cause is Cause.HOST_CPU_PRESSURE
    assert [s.job.job_id for s in d.suspects] == ["123", "124"]
    assert d.text == "host CPU pressure: job 123 (train, alice) uses 15.2 of 16 cores"
    assert ("job cpu PSI some avg10 %", 34.0) in d.figures


def test_job_psi_calm_wins_over_busy_node() -> None:
    """The node may be busy while the inference job itself does not stall on CPU."""
    d = diagnose(with_(node_pressure=dataclasses.replace(CALM, cpu=psi(90.0))))
    assert d.cause is Cause.NONE_FOUND


def test_node_psi_stands_in_on_cgroup_v1() -> None:
    d = diagnose(with_(job_pressure=NO_PRESSURE,
                       node_pressure=dataclasses.replace(CALM, cpu=psi(25.0))))
    assert d.cause is Cause.HOST_CPU_PRESSURE
    assert ("node cpu PSI some avg10 %", 25.0) in d.figures


def test_io_pressure_ranks_by_io_bytes() -> None:
    d = diagnose(with_(job_pressure=dataclasses.replace(CALM, io=psi(30.0, full=12.0))))
    assert d.cause is Cause.HOST_IO_PRESSURE
    assert d.suspects[0].job.job_id == "124"
    assert d.text.startswith("host IO pressure: job 124 (train, bob) moves 858.3 MiB/s")


def test_io_some_alone_is_not_io_pressure() -> None:
    d = diagnose(with_(job_pressure=dataclasses.replace(CALM, io=psi(30.0, full=2.0))))
    assert d.cause is Cause.NONE_FOUND


def test_memory_pressure_ranks_by_memory() -> None:
    d = diagnose(with_(job_pressure=dataclasses.replace(CALM, memory=psi(11.0))))
    assert d.cause is Cause.HOST_MEMORY_PRESSURE
    assert d.text == "host memory pressure: job 123 (train, alice) holds 60.0 GiB"


def test_gpu_memory_full_names_jobs_on_that_gpu_only() -> None:
    d = diagnose(with_(gpus=(GpuState("0", 0.97, 0.4),)))
    assert d.cause is Cause.GPU_MEMORY_FULL
    assert [s.job.job_id for s in d.suspects] == ["124"]  # 123 is on GPU 1
    assert d.text == "GPU memory full: GPU 0 at 97% with job 124 (train, bob)"


def test_sm_saturated_by_neighbour_needs_a_neighbour_owning_most() -> None:
    busy = with_(gpus=(GpuState("0", 0.5, 0.95),))
    assert diagnose(busy).cause is Cause.NONE_FOUND  # neighbour owns 0.2 of 0.95
    hog = dataclasses.replace(SMALL, sm_by_gpu={"0": 0.7})
    d = diagnose(dataclasses.replace(busy, neighbours=(TRAIN, hog)))
    assert d.cause is Cause.SM_SATURATED_BY_NEIGHBOUR
    assert d.text == "SMs saturated by a neighbour: job 124 (train, bob) takes 70% of GPU 0"


def test_sm_share_unknown_is_unknown_not_calm() -> None:
    blind = dataclasses.replace(SMALL, sm_by_gpu={})
    d = diagnose(with_(gpus=(GpuState("0", 0.5, 0.95),), neighbours=(TRAIN, blind)))
    assert d.cause is Cause.UNKNOWN
    assert "SM share of the jobs on GPU 0" in d.unknown


@pytest.mark.parametrize("changes, missing", [
    ({"job_pressure": NO_PRESSURE, "node_pressure": NO_PRESSURE}, "CPU pressure (some)"),
    ({"gpus": (GpuState("0", None, 0.1),)}, "GPU 0 memory"),
    ({"gpus": (GpuState("0", 0.1, None),)}, "GPU 0 SM activity"),
    ({"job_pressure": dataclasses.replace(CALM, io=psi(1.0, full=None))}, "IO pressure (full)"),
    ({"nics": ()}, "NIC load"),
    ({"nics": (NicLoad("eth0", 1.0, 1.0, None),)}, "NIC eth0 load"),
])
def test_unknown_figures_never_read_as_calm(changes: dict, missing: str) -> None:
    d = diagnose(with_(**changes))
    assert d.cause is Cause.UNKNOWN
    assert missing in d.unknown and missing in d.text


def test_a_found_cause_still_lists_what_was_unknown() -> None:
    d = diagnose(with_(gpus=(GpuState("0", None, 0.1),),
                       job_pressure=dataclasses.replace(CALM, cpu=psi(50.0))))
    assert d.cause is Cause.HOST_CPU_PRESSURE and d.unknown == ("GPU 0 memory",)


def test_network_has_no_suspects() -> None:
    d = diagnose(with_(nics=(NicLoad("lo", 1e12, 1e12, 1.0), NicLoad("eth0", 1e6, 9.5 * GBIT,
                                                                      10 * GBIT))))
    assert d.cause is Cause.NETWORK and d.suspects == ()
    assert "no per-job counter" in d.text


def test_several_causes_first_wins_rest_listed() -> None:
    d = diagnose(with_(gpus=(GpuState("0", 0.99, 0.1),),
                       job_pressure=dataclasses.replace(CALM, cpu=psi(50.0))))
    assert d.cause is Cause.GPU_MEMORY_FULL and d.also == (Cause.HOST_CPU_PRESSURE,)


def test_unmeasured_neighbour_ranks_last_and_text_says_so() -> None:
    ghost = Neighbour("999", "train", "eve")
    d = diagnose(with_(neighbours=(ghost,), job_pressure=dataclasses.replace(CALM, cpu=psi(50))))
    assert d.suspects[0].contribution is None
    assert d.text == "host CPU pressure: job 999 (train, eve) (CPU use not measured)"
    d = diagnose(with_(neighbours=(ghost, TRAIN),
                       job_pressure=dataclasses.replace(CALM, cpu=psi(50))))
    assert [s.job.job_id for s in d.suspects] == ["123", "999"]


def test_inference_job_is_never_its_own_suspect() -> None:
    me = Neighbour("42", "infer", "carol", cpu_cores=64.0)
    d = diagnose(with_(neighbours=(me, TRAIN), job_pressure=dataclasses.replace(CALM, cpu=psi(50))))
    assert [s.job.job_id for s in d.suspects] == ["123"]


def test_thresholds_out_of_range_name_the_key() -> None:
    with pytest.raises(ConfigError) as err:
        Thresholds(cpu_psi_some_avg10=0.0, gpu_memory_fraction=95.0)
    assert "cpu_psi_some_avg10" in str(err.value) and "gpu_memory_fraction" in str(err.value)
