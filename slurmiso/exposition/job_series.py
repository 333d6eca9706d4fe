"""The per-job signals contract: what ``slurmiso agent`` exports about each job, and the
monitor's reader of it (:func:`from_samples`).

The agent (:mod:`slurmiso.agent.job_signals`) writes these series; the monitor's SLO ladder
reads them back through :func:`from_samples` into one :class:`JobSignals` per job. Both sides
use the names below and nothing else, so a rename is one edit here.

=====================================  ==================================  ===================
series                                 labels                              value
=====================================  ==================================  ===================
``slurmiso_job_gpu``                   job, class, gpu, gi                 1 per job and GPU
                                                                           or MIG instance
                                                                           (gi "" = whole GPU)
``slurmiso_job_gpu_memory_used_bytes`` job, class, gpu, gi                 GPU memory the
                                                                           job's processes
                                                                           use there
``slurmiso_job_latency_seconds``       job, class, signal (e2e, ttft,      latency percentile
                                       itl), model, percentile (50, 95,    over the window,
                                       99)                                 interpolated
``slurmiso_job_window_latency_seconds  job, class, signal, model, le       requests at or
_bucket`` (a gauge histogram)                                              under each edge
                                                                           over the window
``slurmiso_job_error_ratio``           job, class                          failed / all
                                                                           requests, window
``slurmiso_job_requests``              job, class                          requests finished
                                                                           in the window
``slurmiso_job_signal_age_seconds``    job, class, signal (latency,        seconds since the
                                       steps)                              last fresh sample;
                                                                           +Inf: never
``slurmiso_job_signal_unknown``        job, class, signal, reason          1 while the signal
                                                                           cannot be read
``slurmiso_job_step_seconds``          job, class                          recent mean
                                                                           training step time
``slurmiso_job_steps_total``           job, class                          steps reported
                                                                           (this attempt)
``slurmiso_job_throughput_vs_solo``    job, class                          baseline step time
                                                                           / recent step time
=====================================  ==================================  ===================

Attribution (``slurmiso_job_gpu``) comes from the hooks' records and from the GPU's processes
mapped to jobs through their cgroup; a process of no job is ``job="" class="foreign"``, one of
a job without a record here ``class="unrecorded"``. MIG instances are listed per instance
(``gi="?"``: a process on a MIG device the driver did not list).

Unknown is never good: a signal that cannot be read has no value series, an age that keeps
growing (``+Inf`` if it was never read) and a ``slurmiso_job_signal_unknown`` line with the
reason. An inference server that served nothing in the window has ``requests 0``, a fresh age
and no latency series (idle, not unknown). Everything here is what the job itself serves or
writes: a job can lie about its own figures, never about another job's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterable, Optional, Set, Tuple

M_JOB_GPU = "slurmiso_job_gpu"
#: Per job and GPU or MIG instance: the memory its processes use there (NVML per process,
#: summed through their cgroups); absent where the driver would not say. :func:`from_samples`
#: passes it over: no :class:`JobSignals` field holds it yet.
M_JOB_GPU_MEMORY = "slurmiso_job_gpu_memory_used_bytes"
#: The job's processes' share of a whole GPU's SM time (NVML per-process samples), 0..1.
M_JOB_GPU_SM = "slurmiso_job_gpu_sm_util_ratio"
M_LATENCY = "slurmiso_job_latency_seconds"
M_ERROR_RATIO = "slurmiso_job_error_ratio"
M_REQUESTS = "slurmiso_job_requests"
M_SIGNAL_AGE = "slurmiso_job_signal_age_seconds"
M_SIGNAL_UNKNOWN = "slurmiso_job_signal_unknown"
M_STEP_SECONDS = "slurmiso_job_step_seconds"
M_STEPS_TOTAL = "slurmiso_job_steps_total"
M_THROUGHPUT_VS_SOLO = "slurmiso_job_throughput_vs_solo"
M_WINDOW = "slurmiso_job_window_latency_seconds"
M_WINDOW_BUCKET = M_WINDOW + "_bucket"

#: Every per-job series, in the order the agent writes them.
SERIES: Tuple[str, ...] = (
    M_JOB_GPU, M_JOB_GPU_MEMORY, M_JOB_GPU_SM, M_LATENCY, M_ERROR_RATIO, M_REQUESTS, M_SIGNAL_AGE,
    M_SIGNAL_UNKNOWN, M_STEP_SECONDS, M_STEPS_TOTAL, M_THROUGHPUT_VS_SOLO, M_WINDOW_BUCKET,
)

L_JOB, L_CLASS, L_GPU, L_GI = "job", "class", "gpu", "gi"
L_QUANTILE, L_SIGNAL, L_REASON = "quantile", "signal", "reason"
#: ``signal`` of a latency series (e2e, ttft, itl); the model it is about ("" if none).
L_LATENCY_SIGNAL, L_MODEL, L_PERCENTILE = "signal", "model", "percentile"

#: The latency quantiles, as the ``quantile`` label writes them.
QUANTILES: Tuple[str, ...] = ("0.5", "0.95", "0.99")
#: A quantile as the ``percentile`` label writes it (no ``quantile`` label outside a summary).
PERCENTILE: Dict[str, str] = {"0.5": "50", "0.95": "95", "0.99": "99"}
SIGNAL_LATENCY = "latency"
SIGNAL_STEPS = "steps"
SIGNALS: Tuple[str, ...] = (SIGNAL_LATENCY, SIGNAL_STEPS)

#: ``class`` of a GPU process that belongs to no Slurm job.
CLASS_FOREIGN = "foreign"
#: ``class`` of a GPU process of a job that has no slurmiso record on this node.
CLASS_UNRECORDED = "unrecorded"

#: Why a signal is unknown (the ``reason`` label). Transport reasons are the scraper's
#: (:mod:`slurmiso.exposition.scrape`): unreachable, timeout, deadline, not-http, http-status,
#: truncated, too-large.
R_UNREACHABLE = "unreachable"  # nothing listens on the port (the scrape's own reason too)
R_NO_ENDPOINT = "no-endpoint"  # an SLO class's job that declared no --iso-metrics
R_PORT_NOT_OWNED = "port-not-owned"  # the port's listener is not the job's user
R_NO_SERIES = "no-known-series"  # the answer has none of the configured latency series
R_NO_QUANTILES = "no-quantiles"  # latency only as totals (e.g. Triton without summaries)
R_FIRST_SAMPLE = "first-sample"  # one reading so far: no window yet
R_PARSE = "parse"  # the answer is not Prometheus text
R_STALE = "stale"  # the agent's background reader fell behind
R_NO_REPORT = "no-report"  # a training job that reported no step (slurmiso.checkpoint)
R_NO_RECENT = "no-recent-steps"  # steps reported, none within the step window
R_REFUSED = "refused"  # step file not a regular file of the job's user (or a symlink)
R_BAD_FILE = "bad-file"  # step file unreadable as the wrapper writes it
R_NO_ERRORS = "no-error-series"  # latency known, failures not
#: The answer cost the agent more than its budget (lines, series, CPU; the job's or its
#: user's per refresh): unknown, and read again only after a backoff.
R_OVER_BUDGET = "over-budget"
#: Nothing listens on the node's loopback and the job has processes in another network
#: namespace (a container with its own network): its endpoint is out of the agent's reach.
R_OTHER_NETNS = "other-netns"


#: One window histogram: (signal, model, ((edge in seconds, requests at or under it), ...)).
Window = Tuple[str, str, Tuple[Tuple[float, float], ...]]
#: Window histograms one job may carry (signals x models): more is a hostile answer's.
MAX_WINDOWS = 3 * 32
MAX_EDGES = 64


@dataclass(frozen=True)
class JobSignals:
    """One job's signals as one agent exported them; None where the agent had no figure.

    ``unknown`` holds ``"signal:reason"`` items (``"latency:timeout"``). ``latency_age_s``
    and ``steps_age_s`` are ``inf`` when the signal was never read, None when the agent
    exported no age for it (the job is not expected to have that signal).
    """

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
    #: The window's histograms: (signal, model, ((edge s, requests at or under it), ...)).
    windows: Tuple[Window, ...] = ()

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"job": self.job, "class": self.job_class, "node": self.node,
                               "gpus": [[g, gi] for g, gi in self.gpus]}
        for name in _FIGURES:
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        if self.unknown:
            out["unknown"] = list(self.unknown)
        if self.windows:
            out["windows"] = [[signal, model, [[_edge_text(e), c] for e, c in hist]]
                              for signal, model, hist in self.windows]
        return out

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> JobSignals:
        figures = {n: (None if d.get(n) is None else float(d[n])) for n in _FIGURES}
        windows = tuple((str(w[0]), str(w[1]), tuple((float(e), float(c)) for e, c in w[2]))
                        for w in d.get("windows", ()))
        return cls(str(d["job"]), str(d.get("class", "")), str(d.get("node", "")),
                   tuple((int(g[0]), str(g[1]) if len(g) > 1 else "")
                         for g in d.get("gpus", ())),
                   unknown=tuple(str(u) for u in d.get("unknown", ())), windows=windows,
                   **figures)

    def window(self, signal: str) -> Dict[str, Tuple[Tuple[float, float], ...]]:
        """The window histograms of ``signal``, model -> buckets."""
        return {model: hist for sg, model, hist in self.windows if sg == signal}


def _edge_text(edge: float) -> Any:
    return "+Inf" if edge == math.inf else edge


_LATENCY_FIGURES = ("p50_ms", "p95_ms", "p99_ms")
#: The figures an unknown signal (``"signal:reason"``) leaves unknown: a reason that names
#: one figure (latency known, failures not) only that one; any other, all the signal's.
_UNKNOWN_BY_REASON: Dict[str, Tuple[str, ...]] = {
    f"{SIGNAL_LATENCY}:{R_NO_ERRORS}": ("error_rate",),
    f"{SIGNAL_LATENCY}:{R_NO_QUANTILES}": _LATENCY_FIGURES,
}
_UNKNOWN_BY_SIGNAL: Dict[str, Tuple[str, ...]] = {
    SIGNAL_LATENCY: _LATENCY_FIGURES + ("error_rate",),
    SIGNAL_STEPS: ("step_s", "throughput_vs_solo"),
}
_NONE: FrozenSet[str] = frozenset()


def unknown_fields(unknown: Tuple[str, ...]) -> FrozenSet[str]:
    """The :class:`JobSignals` fields the agent named unknown (``unknown`` holds
    ``"signal:reason"`` items): a figure exported beside them is not to be trusted."""
    if not unknown:
        return _NONE
    out: Set[str] = set()
    for item in unknown:
        named = _UNKNOWN_BY_REASON.get(item)
        out.update(named if named is not None else
                   _UNKNOWN_BY_SIGNAL.get(item.split(":", 1)[0], ()))
    return frozenset(out)


#: The figures of a :class:`JobSignals`, as snapshots store them (None: left out).
_FIGURES = ("p50_ms", "p95_ms", "p99_ms", "error_rate", "requests", "latency_age_s",
            "step_s", "throughput_vs_solo", "steps_age_s")


def from_samples(samples: Iterable[Any], node: str = "") -> Dict[str, JobSignals]:
    """One agent's answer, parsed once with its GPU series (``telemetry.Sample``: name,
    labels, value), as job id -> :class:`JobSignals`.

    Only the series of this module are read, and a figure the job's own answer made absurd
    (NaN, negative) is no figure. Foreign GPU processes (``job=""``) are not a job and are
    left out (the agent exports them for people and dashboards)."""
    acc: Dict[str, _Acc] = {}
    for s in samples:
        job = s.labels.get(L_JOB, "")
        if not job or s.name not in SERIES:
            continue
        a = acc.get(job)
        if a is None:
            a = acc[job] = _Acc()
        a.fold(s.name, s.labels, s.value)
    return {job: a.signals(job, node) for job, a in acc.items()}


def _finite(value: float) -> Optional[float]:
    return value if math.isfinite(value) else None


_QUANTILE_FIELD = {"0.5": "p50_ms", "0.95": "p95_ms", "0.99": "p99_ms"}
_PERCENTILE_FIELD = {"50": "p50_ms", "95": "p95_ms", "99": "p99_ms"}
_AGE_FIELD = {SIGNAL_LATENCY: "latency_age_s", SIGNAL_STEPS: "steps_age_s"}


class _Acc:
    """One job's series while :func:`from_samples` reads them."""

    def __init__(self) -> None:
        self.job_class = ""
        self.gpus: Set[Tuple[int, str]] = set()
        self.unknown: Set[str] = set()
        self.values: Dict[str, Optional[float]] = {}
        self.windows: Dict[Tuple[str, str], Dict[float, float]] = {}

    def fold(self, name: str, labels: Dict[str, str], value: float) -> None:
        self.job_class = self.job_class or labels.get(L_CLASS, "")
        if name == M_JOB_GPU:
            self._gpu(labels, value)
            return
        if name == M_SIGNAL_UNKNOWN:
            if value >= 1:
                self.unknown.add(f"{labels.get(L_SIGNAL, '')}:{labels.get(L_REASON, '')}")
            return
        if name == M_SIGNAL_AGE:
            key = _AGE_FIELD.get(labels.get(L_SIGNAL, ""), "")
            if key and not math.isnan(value):
                self.values[key] = max(0.0, value)  # +Inf kept: never read
            return
        v = _finite(value)
        if v is None or v < 0:
            return  # a figure the job's own answer made absurd is no figure
        if name == M_WINDOW_BUCKET:
            self._bucket(labels, v)
            return
        key, v = self._figure(name, labels, v)
        if key:
            self.values[key] = v

    def _gpu(self, labels: Dict[str, str], value: float) -> None:
        gpu = labels.get(L_GPU, "")
        if value >= 1 and gpu.isdigit() and len(gpu) <= 4:
            self.gpus.add((int(gpu), labels.get(L_GI, "")))

    def _figure(self, name: str, labels: Dict[str, str], v: float) -> Tuple[str, float]:
        """(the :class:`JobSignals` field, its value) a finite non-negative sample sets; no
        field ("") for a series that sets none."""
        key = ""
        if name == M_LATENCY:
            if labels.get(L_LATENCY_SIGNAL, "e2e") != "e2e":
                return "", v
            key = _QUANTILE_FIELD.get(labels.get(L_QUANTILE, ""), "") or \
                _PERCENTILE_FIELD.get(labels.get(L_PERCENTILE, ""), "")
            v *= 1000.0
            if key and self.values.get(key) is not None:
                v = max(v, self.values[key] or 0.0)  # the worst model's
        elif name == M_ERROR_RATIO:
            key, v = "error_rate", min(1.0, v)
        elif name == M_REQUESTS:
            key = "requests"
        elif name in (M_STEP_SECONDS, M_THROUGHPUT_VS_SOLO) and v > 0:
            key = "step_s" if name == M_STEP_SECONDS else "throughput_vs_solo"
        return key, v

    def _bucket(self, labels: Dict[str, str], count: float) -> None:
        try:
            edge = float(labels.get("le", ""))
        except ValueError:
            return
        if not edge >= 0:
            return  # NaN, negative: no latency is that
        key = (labels.get(L_LATENCY_SIGNAL, ""), labels.get(L_MODEL, ""))
        hist = self.windows.get(key)
        if hist is None:
            if len(self.windows) >= MAX_WINDOWS:
                return
            hist = self.windows[key] = {}
        if len(hist) < MAX_EDGES or edge in hist or edge == math.inf:
            hist[edge] = count  # (+Inf always: without it no share can be read)

    def signals(self, job: str, node: str) -> JobSignals:
        windows = tuple((sg, model, tuple(sorted(h.items())))
                        for (sg, model), h in sorted(self.windows.items()))
        return JobSignals(job, self.job_class, node, tuple(sorted(self.gpus)),
                          unknown=tuple(sorted(self.unknown)), windows=windows, **self.values)
