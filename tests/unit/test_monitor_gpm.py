"""GPM SM activity (slurmiso.gpu.gpm) against values in the shape nvidia-ml-py returns them.

No GPU here: a fake ``pynvml`` serves the fixture's figures through the same calls and
structures (``nvmlGpmQueryDeviceSupport``, ``nvmlGpmSampleAlloc/Get/Free``,
``c_nvmlGpmMetricsGet_t``, ``nvmlGpmMetricsGet``). The hardware check is a separate script.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import pytest

from slurmiso.gpu.gpm import gpm_sm

FIXTURE = os.path.join(os.path.dirname(__file__), "..", "fixtures", "monitor",
                       "gpm-samples.json")
with open(FIXTURE, encoding="utf-8") as _fh:
    CASES = json.load(_fh)["cases"]


class _Metric:
    def __init__(self) -> None:
        self.metricId = 0
        self.value = 0.0
        self.nvmlReturn = 0


class _Get:
    def __init__(self) -> None:
        self.version = 0
        self.numMetrics = 0
        self.sample1: Any = None
        self.sample2: Any = None
        self.metrics = [_Metric() for _ in range(98)]


class FakeNvml:
    NVML_GPM_METRIC_SM_UTIL = 2
    NVML_GPM_METRIC_SM_OCCUPANCY = 3
    NVML_GPM_METRICS_GET_VERSION = 1
    c_nvmlGpmMetricsGet_t = _Get

    def __init__(self, case: Dict[str, Any], fail_get: bool = False) -> None:
        self.case = case
        self.fail_get = fail_get
        self.allocated: List[object] = []
        self.freed: List[object] = []
        self.taken: List[object] = []

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:  # noqa: N802
        return SimpleNamespace(isSupportedDevice=self.case["supported"])

    def nvmlGpmSampleAlloc(self) -> object:  # noqa: N802
        s = object()
        self.allocated.append(s)
        return s

    def nvmlGpmSampleFree(self, sample: object) -> None:  # noqa: N802
        self.freed.append(sample)

    def nvmlGpmSampleGet(self, handle: Any, sample: object) -> None:  # noqa: N802
        if self.fail_get:
            raise RuntimeError("NVML_ERROR_GPU_IS_LOST")
        self.taken.append(sample)

    def nvmlGpmMetricsGet(self, req: _Get) -> _Get:  # noqa: N802
        assert req.version == 1 and req.sample1 is not req.sample2
        for m in req.metrics[:req.numMetrics]:
            value, ret = self.case["metrics"].get(str(m.metricId), [0.0, 3])
            m.value, m.nvmlReturn = float(value), ret
        return req


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_gpm_values(case: Dict[str, Any]) -> None:
    nv = FakeNvml(case)
    slept: List[float] = []
    got = gpm_sm(nv, "handle", sleep=slept.append)
    expect: Dict[str, Optional[float]] = case["expect"]
    assert got == pytest.approx(expect) if expect["sm_active"] is not None else got == expect
    if case["supported"]:
        assert slept == [0.1], "two samples 100 ms apart (NVML's minimum)"
        assert sorted(map(id, nv.freed)) == sorted(map(id, nv.allocated)), "samples freed"


def test_gpm_failure_is_unknown_and_frees_samples() -> None:
    nv = FakeNvml(CASES[0], fail_get=True)
    assert gpm_sm(nv, "h", sleep=lambda s: None) == {"sm_active": None, "sm_occupancy": None}
    assert len(nv.freed) == 2


def test_old_pynvml_without_gpm_is_unknown() -> None:
    assert gpm_sm(SimpleNamespace(), "h") == {"sm_active": None, "sm_occupancy": None}
