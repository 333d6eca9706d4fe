"""Per-job signals the node agent reports: how an inference job answers, how a training job
steps. The monitor's ladder decides on these (the inference SLO), never on training's own
GPU load. Every figure may be None: unknown, never read as 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

_FIGURES = ("p50_ms", "p95_ms", "p99_ms", "error_rate", "requests", "latency_age_s",
            "step_s", "throughput_vs_solo", "steps_age_s")


@dataclass(frozen=True)
class JobSignals:
    """One job's signals on one node: latency percentiles (ms), error rate (0..1) and
    request count over the agent's window and that window's age; training step time,
    throughput against running alone and their age; ``unknown`` names figures the agent
    could not read (and why, ``"p99_ms:no-samples"``)."""

    job: str
    job_class: str = ""
    node: str = ""
    #: (GPU index, GPU instance id or "") the job holds, as the node's records say.
    gpus: Tuple[Tuple[int, str], ...] = ()
    p50_ms: Optional[float] = None
    p95_ms: Optional[float] = None
    p99_ms: Optional[float] = None
    error_rate: Optional[float] = None
    requests: Optional[float] = None
    latency_age_s: Optional[float] = None
    step_s: Optional[float] = None
    throughput_vs_solo: Optional[float] = None
    steps_age_s: Optional[float] = None
    unknown: Tuple[str, ...] = ()

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"job": self.job, "class": self.job_class, "node": self.node,
                               "gpus": [[g, gi] for g, gi in self.gpus]}
        for name in _FIGURES:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.unknown:
            out["unknown"] = list(self.unknown)
        return out

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> JobSignals:
        figures = {n: (None if d.get(n) is None else float(d[n])) for n in _FIGURES}
        return cls(str(d["job"]), str(d.get("class", "")), str(d.get("node", "")),
                   tuple((int(g[0]), str(g[1]) if len(g) > 1 else "")
                         for g in d.get("gpus", ())),
                   unknown=tuple(str(u) for u in d.get("unknown", ())), **figures)
