"""The built-in workloads: an inference request loop and a training loop, printing the probe's
output contract (:mod:`slurmiso.probe.contract`).

``python -m slurmiso.probe.workloads infer|train``. With PyTorch and a CUDA device they run on
the GPU (a small MLP answering requests; a larger one taking optimizer steps), which is what the
isolation modes act on. Without them they run a CPU stand-in of the same shape and say so
(``{"info": {"workload": "cpu-stand-in"}}``): the figures then show that the probe, its jobs
and its daemons work, not how a GPU shares. Standard library only apart from ``torch``.

On a simulated node (``SLURMISO_PROBE_SIM_MPS=1`` with an MPS pipe directory) the stand-in
connects to slurmiso's simulated MPS daemon as a CUDA client would, reports what it was granted,
and works only that share of the time: the daemon's limits then visibly shape the figures.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any, Callable, Dict, Optional

_stop = False


def _on_term(_signum: int, _frame: Any) -> None:
    global _stop
    _stop = True


def _env_float(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "") or default)
    except ValueError:
        return default


def _emit(obj: Any) -> None:
    print(obj if isinstance(obj, str) else json.dumps(obj), flush=True)


def _torch() -> Optional[Any]:
    """torch with a usable CUDA device, or None (then the CPU stand-in runs)."""
    if os.environ.get("SLURMISO_PROBE_FORCE_CPU") == "1":
        return None
    try:
        import torch  # type: ignore[import-not-found,unused-ignore]
    except Exception:  # not installed, or broken: the stand-in still measures something
        return None
    try:
        return torch if torch.cuda.is_available() else None
    except Exception:
        return None


def _sim_share() -> float:
    """The thread share (0..1] the simulated MPS daemon grants this client; 1 without one."""
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
    if os.environ.get("SLURMISO_PROBE_SIM_MPS") != "1" or not pipe:
        return 1.0
    from slurmiso.isolation import mps_sim

    try:
        granted = mps_sim.connect(dict(os.environ))
    except (OSError, ConnectionError) as exc:
        _emit({"info": {"mps": f"no MPS daemon reached: {exc}"}})
        return 1.0
    _emit({"info": {"mps_granted": granted}})
    try:
        pct = float(granted.get("active_thread_percentage", 100))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        pct = 100.0
    return max(0.01, min(1.0, pct / 100.0))


def _cpu_work(units: int) -> None:
    acc = 0
    for i in range(units):
        acc += i * i % 7
    if acc < 0:  # never true; keeps the loop from being optimised into nothing
        print(acc)


def _throttled(work: Callable[[], None], share: float) -> Callable[[], None]:
    """``work`` slowed to ``share`` of the time, as fewer SMs would (the stand-in's MPS)."""
    if share >= 1.0:
        return work

    def run() -> None:
        t0 = time.perf_counter()
        work()
        time.sleep((time.perf_counter() - t0) * (1.0 / share - 1.0))
    return run


def _mem_peak(torch: Optional[Any]) -> None:
    if torch is not None:
        _emit({"gpu_mem_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1)})


def _info(torch: Optional[Any], role: str) -> Dict[str, Any]:
    if torch is None:
        return {"workload": "cpu-stand-in", "role": role,
                "why": "torch with a CUDA device is not importable here"}
    return {"workload": "torch", "role": role, "device": torch.cuda.get_device_name(0),
            "torch": torch.__version__}


def infer() -> int:
    """Send SLURMISO_PROBE_REQUESTS requests at SLURMISO_PROBE_RATE per second."""
    torch = _torch()
    _emit({"info": _info(torch, "infer")})
    requests = int(_env_float("SLURMISO_PROBE_REQUESTS", 200))
    rate = _env_float("SLURMISO_PROBE_RATE", 20.0)
    share = _sim_share() if torch is None else 1.0
    if torch is not None:
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(4096, 4096),
                                                          torch.nn.ReLU()) for _ in range(4)])
        model = model.cuda().eval()
        x = torch.randn(32, 4096, device="cuda")

        def request() -> None:
            with torch.no_grad():
                model(x)
            torch.cuda.synchronize()
    else:
        request = _throttled(lambda: _cpu_work(20_000), share)
    for _ in range(5):  # warm-up (kernels, caches) is not a request anyone waits for
        request()
    gap = 1.0 / rate if rate > 0 else 0.0
    next_at = time.perf_counter()
    for _ in range(requests):
        if _stop:
            break
        now = time.perf_counter()
        if next_at > now:
            time.sleep(next_at - now)
        t0 = time.perf_counter()
        try:
            request()
            _emit(f"{(time.perf_counter() - t0) * 1000.0:.3f}")
        except Exception as exc:  # a failed request is a data point, not the end of the run
            _emit({"latency_ms": round((time.perf_counter() - t0) * 1000.0, 3), "ok": False,
                   "error": str(exc)[:200]})
        next_at = max(next_at + gap, t0)
    _mem_peak(torch)
    return 0


def train() -> int:
    """Take steps until SIGTERM, the stop file, or SLURMISO_PROBE_TRAIN_SECONDS."""
    torch = _torch()
    _emit({"info": _info(torch, "train")})
    seconds = _env_float("SLURMISO_PROBE_TRAIN_SECONDS", 0.0)
    stop_file = os.environ.get("SLURMISO_PROBE_STOP_FILE", "")
    share = _sim_share() if torch is None else 1.0
    if torch is not None:
        model = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8192, 8192),
                                                          torch.nn.ReLU()) for _ in range(8)])
        model = model.cuda().train()
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        x = torch.randn(1024, 8192, device="cuda")

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            model(x).square().mean().backward()
            opt.step()
            torch.cuda.synchronize()
    else:
        step = _throttled(lambda: _cpu_work(300_000), share)
    step()  # warm-up
    started = time.perf_counter()
    while not _stop:
        if seconds and time.perf_counter() - started >= seconds:
            break
        if stop_file and os.path.exists(stop_file):
            break
        t0 = time.perf_counter()
        step()
        _emit(f"{time.perf_counter() - t0:.6f}")
    _mem_peak(torch)
    return 0


def main(argv: Optional[list] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    if argv[:1] == ["infer"]:
        return infer()
    if argv[:1] == ["train"]:
        return train()
    print("usage: python -m slurmiso.probe.workloads infer|train", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
