"""The node agents' host figures as the monitor reads them (issue 36): per job and per node.

    >>> node, jobs = from_samples(parse_prometheus_text(agent_text), "n1", now)  # doctest: +SKIP
    >>> jobs["4242"].pressure_ratio("cpu", "some")                               # doctest: +SKIP
    0.3512

Only instantaneous figures are read as they are (PSI ``avg10`` ratios, memory held, the GPU
memory a job's processes use); rates (CPU cores used, IO and NIC bytes per second) need the
scrape before, which :func:`with_rates` takes where the source kept it. A figure the agent did
not give stays None: unknown is never calm, and the diagnosis says UNKNOWN rather than
"nothing found" (:mod:`slurmiso.host.diagnosis`). Series names: :mod:`slurmiso.exposition`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Dict, Iterable, Optional, Tuple

from slurmiso.exposition import host_series as h
from slurmiso.exposition.job_series import M_JOB_GPU_MEMORY, M_JOB_GPU_SM

#: (resource, kind, avg10 ratio 0..1): the PSI lines the agent exported.
PsiRatios = Tuple[Tuple[str, str, float], ...]


def _ratio(pressure: PsiRatios, resource: str, kind: str) -> Optional[float]:
    for res, k, value in pressure:
        if res == resource and k == kind:
            return value
    return None


@dataclass(frozen=True)
class JobHostFigures:
    """One job's host figures at ``ts`` (None: not given by the agent, or no rate yet)."""

    job: str
    node: str
    ts: float
    cpu_seconds: Optional[float] = None
    memory_bytes: Optional[float] = None
    io_bytes: Optional[float] = None
    pressure: PsiRatios = ()
    #: (GPU index, MIG instance or "", bytes the job's own processes use there).
    gpu_memory: Tuple[Tuple[int, str, float], ...] = ()
    #: (GPU index, MIG instance or "", the share 0..1 of its SM time they used).
    gpu_sm: Tuple[Tuple[int, str, float], ...] = ()
    #: Rates from the scrape before (:func:`with_rates`); None without one.
    cpu_cores: Optional[float] = None
    io_bytes_per_s: Optional[float] = None

    def pressure_ratio(self, resource: str, kind: str) -> Optional[float]:
        return _ratio(self.pressure, resource, kind)

    def to_dict(self) -> Dict[str, Any]:
        out: Dict[str, Any] = {"job": self.job, "node": self.node, "ts": self.ts}
        for name in _JOB_FIGURES:
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        if self.pressure:
            out["pressure"] = [list(p) for p in self.pressure]
        if self.gpu_memory:
            out["gpu_memory"] = [list(g) for g in self.gpu_memory]
        if self.gpu_sm:
            out["gpu_sm"] = [list(g) for g in self.gpu_sm]
        return out

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> JobHostFigures:
        return cls(str(d["job"]), str(d.get("node", "")), float(d.get("ts", 0.0)),
                   pressure=tuple((str(r), str(k), float(v)) for r, k, v in
                                  d.get("pressure", ())),
                   gpu_memory=tuple((int(g), str(gi), float(b)) for g, gi, b in
                                    d.get("gpu_memory", ())),
                   gpu_sm=tuple((int(g), str(gi), float(x)) for g, gi, x in
                                d.get("gpu_sm", ())),
                   **{n: (None if d.get(n) is None else float(d[n])) for n in _JOB_FIGURES})


_JOB_FIGURES = ("cpu_seconds", "memory_bytes", "io_bytes", "cpu_cores", "io_bytes_per_s")


@dataclass(frozen=True)
class NicFigures:
    """One interface: byte counters, link speed, and rates from the scrape before (None)."""

    device: str
    rx_bytes: Optional[float] = None
    tx_bytes: Optional[float] = None
    link_bytes_per_s: Optional[float] = None
    rx_bytes_per_s: Optional[float] = None
    tx_bytes_per_s: Optional[float] = None


@dataclass(frozen=True)
class NodeHostFigures:
    """The node's pressure and NICs at ``ts``, as its agent exported them."""

    node: str
    ts: float
    pressure: PsiRatios = ()
    nics: Tuple[NicFigures, ...] = ()

    def pressure_ratio(self, resource: str, kind: str) -> Optional[float]:
        return _ratio(self.pressure, resource, kind)

    def to_dict(self) -> Dict[str, Any]:
        return {"node": self.node, "ts": self.ts, "pressure": [list(p) for p in self.pressure],
                "nics": [{k: v for k, v in vars(n).items() if v is not None}
                         for n in self.nics]}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> NodeHostFigures:
        nics = tuple(NicFigures(str(n["device"]), **{
            k: (None if n.get(k) is None else float(n[k])) for k in _NIC_FIGURES})
            for n in d.get("nics", ()))
        return cls(str(d["node"]), float(d.get("ts", 0.0)),
                   tuple((str(r), str(k), float(v)) for r, k, v in d.get("pressure", ())), nics)


_NIC_FIGURES = ("rx_bytes", "tx_bytes", "link_bytes_per_s", "rx_bytes_per_s", "tx_bytes_per_s")


def _figure(value: float) -> Optional[float]:
    """A finite, non-negative sample; anything else is no figure (never 0)."""
    return value if math.isfinite(value) and value >= 0 else None


class _JobAcc:
    def __init__(self) -> None:
        self.values: Dict[str, float] = {}
        self.io: Dict[str, float] = {}
        self.pressure: Dict[Tuple[str, str], float] = {}
        self.gpu_memory: Dict[Tuple[int, str], float] = {}
        self.gpu_sm: Dict[Tuple[int, str], float] = {}

    def figures(self, job: str, node: str, ts: float) -> JobHostFigures:
        # both directions or no IO figure: half a sum reads calmer than the job is
        io = self.io["read"] + self.io["write"] if set(self.io) == {"read", "write"} else None
        return JobHostFigures(job, node, ts, self.values.get("cpu"), self.values.get("memory"),
                              io, tuple((r, k, v) for (r, k), v in sorted(self.pressure.items())),
                              tuple((g, gi, b) for (g, gi), b in sorted(self.gpu_memory.items())),
                              tuple((g, gi, x) for (g, gi), x in sorted(self.gpu_sm.items())))


def _job_sample(acc: _JobAcc, name: str, labels: Dict[str, str], v: float) -> None:
    if name == h.M_JOB_CPU:
        acc.values["cpu"] = v
    elif name == h.M_JOB_MEM_CURRENT:
        acc.values["memory"] = v
    elif name == h.M_JOB_IO_BYTES and labels.get(h.L_DIRECTION) in ("read", "write"):
        acc.io[labels[h.L_DIRECTION]] = v
    elif name == h.M_JOB_PSI and labels.get(h.L_RESOURCE) in h.RESOURCES \
            and labels.get(h.L_KIND) in ("some", "full") and v <= 1.0:
        acc.pressure[(labels[h.L_RESOURCE], labels[h.L_KIND])] = v
    elif name in (M_JOB_GPU_MEMORY, M_JOB_GPU_SM):
        gpu = labels.get("gpu", "")
        if gpu.isdigit() and len(gpu) <= 4 and (name == M_JOB_GPU_MEMORY or v <= 1.0):
            key = (int(gpu), labels.get("gi", ""))
            (acc.gpu_memory if name == M_JOB_GPU_MEMORY else acc.gpu_sm)[key] = v


_NODE_SERIES = frozenset((h.M_NODE_PSI, h.M_NODE_NET_BYTES, h.M_NODE_NET_SPEED))
_JOB_SERIES = frozenset((h.M_JOB_CPU, h.M_JOB_MEM_CURRENT, h.M_JOB_IO_BYTES, h.M_JOB_PSI,
                         M_JOB_GPU_MEMORY, M_JOB_GPU_SM))


def from_samples(samples: Iterable[Any], node: str, ts: float
                 ) -> Tuple[Optional[NodeHostFigures], Dict[str, JobHostFigures]]:
    """One agent's answer (``telemetry.Sample``: name, labels, value) as the node's figures
    and job id -> its figures. (None, {}) where the agent exported no host figures
    (``slurmiso_agent_host_up`` absent: an older agent) or could not read them (``0``)."""
    up: Optional[float] = None
    jobs: Dict[str, _JobAcc] = {}
    psi: Dict[Tuple[str, str], float] = {}
    nics: Dict[str, Dict[str, float]] = {}
    for s in samples:
        if s.name == h.M_HOST_UP:
            up = s.value
            continue
        v = _figure(s.value)
        if v is None:
            continue
        if s.name in _JOB_SERIES:
            job = s.labels.get(h.L_JOB, "")
            if job:
                _job_sample(jobs.setdefault(job, _JobAcc()), s.name, s.labels, v)
        elif s.name in _NODE_SERIES:
            _node_sample(psi, nics, s.name, s.labels, v)
    if up is None or up < 1:
        return None, {}
    node_figs = NodeHostFigures(node, ts, tuple((r, k, v) for (r, k), v in sorted(psi.items())),
                                tuple(NicFigures(dev, n.get("receive"), n.get("transmit"),
                                                 n.get("speed"))
                                      for dev, n in sorted(nics.items())))
    return node_figs, {job: a.figures(job, node, ts) for job, a in jobs.items()}


def _node_sample(psi: Dict[Tuple[str, str], float], nics: Dict[str, Dict[str, float]],
                 name: str, labels: Dict[str, str], v: float) -> None:
    if name == h.M_NODE_PSI:
        if labels.get(h.L_RESOURCE) in h.RESOURCES and labels.get(h.L_KIND) in ("some", "full") \
                and v <= 1.0:
            psi[(labels[h.L_RESOURCE], labels[h.L_KIND])] = v
        return
    dev = labels.get(h.L_DEVICE, "")
    if not dev:
        return
    if name == h.M_NODE_NET_SPEED:
        nics.setdefault(dev, {})["speed"] = v
    elif labels.get(h.L_DIRECTION) in ("receive", "transmit"):
        nics.setdefault(dev, {})[labels[h.L_DIRECTION]] = v


def _rate(now: Optional[float], before: Optional[float], dt: float) -> Optional[float]:
    """Per second between two counter readings; None where either is unknown, the clock did
    not move, or the counter went down (a requeued job's fresh cgroup): never negative."""
    if now is None or before is None or dt <= 0 or now < before:
        return None
    return (now - before) / dt


def with_rates(job: JobHostFigures, before: Optional[JobHostFigures]) -> JobHostFigures:
    """``job`` with CPU cores used and IO bytes/s since ``before`` (the same job's scrape
    before, on the same node); unchanged where there is none."""
    if before is None or before.node != job.node:
        return job
    dt = job.ts - before.ts
    return replace(job, cpu_cores=_rate(job.cpu_seconds, before.cpu_seconds, dt),
                   io_bytes_per_s=_rate(job.io_bytes, before.io_bytes, dt))


def node_with_rates(node: NodeHostFigures, before: Optional[NodeHostFigures]
                    ) -> NodeHostFigures:
    """``node`` with each NIC's bytes/s since ``before``; unchanged where there is none."""
    if before is None:
        return node
    dt = node.ts - before.ts
    old = {n.device: n for n in before.nics}
    nics = tuple(replace(n, rx_bytes_per_s=_rate(n.rx_bytes, old[n.device].rx_bytes, dt),
                         tx_bytes_per_s=_rate(n.tx_bytes, old[n.device].tx_bytes, dt))
                 if n.device in old else n for n in node.nics)
    return replace(node, nics=nics)
