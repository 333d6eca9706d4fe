"""GPU memory a run's processes really held, sampled through slurmiso's GPU backend.

A workload's own ``{"gpu_mem_peak_mb": N}`` is what it chose to print (PyTorch's allocator
peak, say), not what the GPU gave it: the CUDA context, other libraries' pools, every process of
the job. Where the node has a GPU backend (NVML on a real node, the simulated node in tests),
the runner (:mod:`slurmiso.probe.jobrun`) samples the backend's compute processes and keeps the
ones of its command: the processes in the command's session (the runner starts it as a session
leader, so every descendant that does not ``setsid`` itself belongs). Per process the largest
figure seen, and the job's peak as the largest sum of one sample.

Unknown stays unknown: without a backend, or when no process of the job was ever seen holding
memory (a CPU run, or pids NVML reports from another pid namespace), the peak is None with the
reason, never 0 (a zero would read as "fits anywhere").

When samples are taken: on the command's first output line of the contract (a step or a
latency), before the runner writes its ``ready`` file, so a pair never starts before one sample
of a running workload exists; then every ``interval_s`` while it runs. A spec names the backend
(``{"backend": "nvml"}``, ``{"backend": "sim", "sim_state": PATH}``, or ``{"backend": "config",
"kind": ..., "sim_state": ...}`` for the node's own configured backend, ``%n`` expanded there).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

#: How often a running workload is sampled, unless the spec says otherwise.
INTERVAL_S = 0.5
#: How much of the training peak must stay free under the class's limit (DESIGN: 20-30%).
HEADROOM_MIN_PCT = 20.0


class Sampler:
    """Samples ``backend.processes()`` for the processes of one session (``sid``)."""

    def __init__(self, backend: Any, source: str, interval_s: float = INTERVAL_S,
                 sid_of: Callable[[int], int] = os.getsid) -> None:
        self.backend = backend
        self.source = source
        self.interval_s = interval_s
        self.sid_of = sid_of
        self.sid = 0
        self.samples = 0
        self.errors = 0
        self.last_error = ""
        self.per_process: Dict[int, int] = {}
        self.peak_mb: Optional[int] = None
        self._last = 0.0
        self._lock = threading.Lock()

    def track(self, sid: int) -> None:
        """Sample the processes of session ``sid`` (the command's, once started)."""
        self.sid = sid

    def _of_job(self, pid: int) -> bool:
        try:
            return self.sid_of(pid) == self.sid
        except OSError:  # gone, or not in this pid namespace: not provably the job's
            return False

    def sample(self, force: bool = False) -> None:
        """One sample now (``force``) or when ``interval_s`` has passed since the last one."""
        if not self.sid:
            return
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last < self.interval_s:
                return
            self._last = now
            try:
                procs = self.backend.processes()
            except Exception as exc:  # a backend hiccup costs one sample, never the run
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:200]
                return
            self.samples += 1
            total, seen = 0, False
            for p in procs:
                if not self._of_job(int(p.pid)):
                    continue
                seen = True
                mb = int(p.used_memory_mb)
                total += mb
                self.per_process[int(p.pid)] = max(mb, self.per_process.get(int(p.pid), 0))
            if seen:
                self.peak_mb = max(total, self.peak_mb or 0)

    def result(self) -> Dict[str, Any]:
        """What ``result.json`` keeps under ``gpu_mem``."""
        out: Dict[str, Any] = {"source": self.source, "peak_mb": self.peak_mb,
                               "per_process_mb": {str(k): v for k, v in
                                                  sorted(self.per_process.items())},
                               "samples": self.samples, "errors": self.errors}
        if self.peak_mb is None:
            out["why"] = (f"no process of the run held GPU memory in {self.samples} samples "
                          f"(a CPU run, or pids from another pid namespace)"
                          + (f"; last error: {self.last_error}" if self.last_error else ""))
        return out


def unmeasured(why: str) -> Dict[str, Any]:
    """``gpu_mem`` of a run that could not be sampled: source None, the reason."""
    return {"source": None, "peak_mb": None, "per_process_mb": {}, "samples": 0, "why": why}


def open_sampler(spec: Optional[Dict[str, Any]], node: str) -> Tuple[Optional[Sampler], str]:
    """(a sampler, "") for the runner's spec, or (None, why not)."""
    spec = spec or {}
    kind = str(spec.get("backend") or "none")
    interval = float(spec.get("interval_s") or INTERVAL_S)
    try:
        if kind == "none":
            return None, "no GPU backend named for sampling"
        if kind == "sim":
            from slurmiso.gpu.sim import SimBackend

            backend: Any = SimBackend(str(spec["sim_state"]))
        elif kind == "nvml":
            from slurmiso.gpu.nvml import NvmlBackend

            backend = NvmlBackend()
            backend.connect()
        elif kind == "config":
            from slurmiso.gpu import open_backend

            backend = open_backend(str(spec.get("kind") or "auto"),
                                   str(spec.get("sim_state") or ""), node)
        else:
            return None, f"unknown GPU backend {kind!r} for sampling"
        backend.processes()  # reachable now, or not at all
    except Exception as exc:  # no driver, no pynvml, no sim state: not measured, said why
        return None, f"no GPU backend here ({type(exc).__name__}: {exc})"[:300]
    return Sampler(backend, str(backend.name), interval), ""


def close(sampler: Optional[Sampler]) -> None:
    if sampler is not None:
        try:
            sampler.backend.close()
        except Exception:  # closing a backend never fails a run
            pass


def peaks(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The largest sampled peak of several runs' ``gpu_mem``, with its source, per-process
    maxima and, when none was measured, why."""
    measured = [r for r in results if isinstance(r, dict) and r.get("peak_mb") is not None]
    if not measured:
        whys = [str(r.get("why")) for r in results if isinstance(r, dict) and r.get("why")]
        return {"peak_mb": None, "source": None, "per_process_mb": {},
                "why": whys[0] if whys else "not sampled"}
    best = max(measured, key=lambda r: r["peak_mb"])
    return {"peak_mb": best["peak_mb"], "source": best.get("source"),
            "per_process_mb": dict(best.get("per_process_mb") or {})}


def figures(printed: Mapping[str, Sequence[Optional[float]]],
            sampled: Mapping[str, Sequence[Optional[Dict[str, Any]]]],
            limit_mb: Optional[int]) -> Dict[str, Any]:
    """A mode's ``memory`` figures from its runs, per role (``infer``, ``train``): the peak
    the workload printed and the one sampled (with its source; None = not measured, with why),
    the peak the headroom is judged on (the larger, and which it was), and the training peak
    against its class's limit in the mode: below :data:`HEADROOM_MIN_PCT` free is flagged."""
    out: Dict[str, Any] = {}
    for role in ("infer", "train"):
        top = max(filter(None, printed.get(role, ())), default=None)
        got = peaks([r or unmeasured("the runner recorded no sample")
                     for r in sampled.get(role, ())])
        peak, source = None, None
        for value, where in ((top, "printed"), (got["peak_mb"], got["source"])):
            if value is not None and (peak is None or value > peak):
                peak, source = float(value), where
        out[f"{role}_peak_mb"] = peak
        out[f"{role}_peak_source"] = source
        out[f"{role}_printed_mb"] = top
        out[f"{role}_sampled_mb"] = got["peak_mb"]
        out[f"{role}_sampled_source"] = got["source"]
        out[f"{role}_sampled_per_process_mb"] = got["per_process_mb"]
        if got["peak_mb"] is None:
            out[f"{role}_sampled_why"] = got["why"]
    out.update(train_limit_mb=limit_mb, train_headroom_pct=None, headroom_ok=None)
    if out["train_peak_mb"] is not None and limit_mb:
        room = round(100.0 * (limit_mb - out["train_peak_mb"]) / limit_mb, 1)
        out.update(train_headroom_pct=room, headroom_ok=room >= HEADROOM_MIN_PCT)
    return out
