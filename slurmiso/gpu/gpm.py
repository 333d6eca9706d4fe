"""SM activity from NVML's GPU Performance Monitoring (GPM), Hopper and newer.

``nvmlDeviceGetUtilizationRates`` is graphics-engine busy time (a kernel of any size running),
not how many SMs are busy: a one-block kernel reads 100 %. GPM measures SM activity between two
samples (at least 100 ms apart): ``NVML_GPM_METRIC_SM_UTIL`` (% of SMs busy) and
``NVML_GPM_METRIC_SM_OCCUPANCY``. Where GPM is missing (older GPUs, older drivers or
``nvidia-ml-py``), the answer is None: unknown, never 0 %.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Callable, Dict, Optional

log = logging.getLogger(__name__)

#: Seconds between the two samples: NVML needs >= 0.1 s for a meaningful figure.
GPM_INTERVAL_S = 0.1


def gpm_supported(nv: Any, handle: Any) -> bool:
    """Whether this GPU, driver and ``pynvml`` offer GPM (never raises)."""
    if not all(hasattr(nv, n) for n in ("nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc",
                                        "nvmlGpmSampleGet", "nvmlGpmMetricsGet",
                                        "c_nvmlGpmMetricsGet_t")):
        return False
    try:
        return bool(nv.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported, FunctionNotFound, ...
        return False


def gpm_sm(
    nv: Any, handle: Any, interval_s: float = GPM_INTERVAL_S,
    sleep: Callable[[float], None] = time.sleep,
) -> Dict[str, Optional[float]]:
    """``{"sm_active": ratio, "sm_occupancy": ratio}`` over ``interval_s`` (None where GPM
    or the metric is not available)."""
    out: Dict[str, Optional[float]] = {"sm_active": None, "sm_occupancy": None}
    if not gpm_supported(nv, handle):
        return out
    wanted = (("sm_active", getattr(nv, "NVML_GPM_METRIC_SM_UTIL", 2)),
              ("sm_occupancy", getattr(nv, "NVML_GPM_METRIC_SM_OCCUPANCY", 3)))
    first = second = None
    try:
        first = nv.nvmlGpmSampleAlloc()
        second = nv.nvmlGpmSampleAlloc()
        nv.nvmlGpmSampleGet(handle, first)
        sleep(interval_s)
        nv.nvmlGpmSampleGet(handle, second)
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = getattr(nv, "NVML_GPM_METRICS_GET_VERSION", 1)
        req.numMetrics = len(wanted)
        req.sample1, req.sample2 = first, second
        for i, (_, metric) in enumerate(wanted):
            req.metrics[i].metricId = metric
        nv.nvmlGpmMetricsGet(req)
        for i, (key, _) in enumerate(wanted):
            m = req.metrics[i]
            value = float(m.value)
            if getattr(m, "nvmlReturn", 0) == 0 and math.isfinite(value) and 0 <= value <= 100:
                out[key] = value / 100.0
    except Exception as exc:  # noqa: BLE001 - any NVML failure: SM stays unknown
        log.debug("GPM read failed: %s", exc)
    finally:
        for sample in (first, second):
            if sample is not None:
                try:
                    nv.nvmlGpmSampleFree(sample)
                except Exception:  # noqa: BLE001
                    pass
    return out
