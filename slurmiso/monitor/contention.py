"""Where a hot inference job's contention is: the diagnosis rule fed from the snapshot (pure).

    >>> d = diagnose_breach(snap, who, "n1", "101")              # doctest: +SKIP
    >>> d.cause.value, d.text                                    # doctest: +SKIP
    ('host-cpu-pressure', 'host CPU pressure: job 202 (train) uses 15.2 cores')

The rule is :func:`slurmiso.host.diagnosis.diagnose`; this module only gathers its inputs:
the inference job's own PSI and GPUs (memory used of total, SM activity, from the GPU
samples), the node's PSI and NICs, and every other job Slurm shows running on the node, with
its host figures and the GPUs :class:`~slurmiso.monitor.attribution.Attribution` gives it.
A node whose agent exports no host figures gets no diagnosis (None): the journal and the state
then say what they said before. Where the host rung is configured, a host cause moves it
(:mod:`slurmiso.monitor.host_ladder`, :func:`host_suspects`) and keeps the GPU's rung from
climbing past throttle when the heaviest suspect is not on that GPU (:func:`elsewhere`).
"""

from __future__ import annotations

import math
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

from slurmiso.host.cgroup_figures import PressureFigures
from slurmiso.host.diagnosis import (
    Cause,
    Diagnosis,
    DiagnosisInputs,
    GpuState,
    Neighbour,
    NicLoad,
    Suspect,
    Thresholds,
    diagnose,
)
from slurmiso.host.kernel_text import Psi, PsiLine
from slurmiso.monitor.attribution import Attribution
from slurmiso.monitor.host_view import PsiRatios
from slurmiso.monitor.snapshot import Snapshot


def _psi_line(pressure: PsiRatios, resource: str, kind: str) -> Optional[PsiLine]:
    for res, k, ratio in pressure:
        if res == resource and k == kind:
            # the agent exports avg10 only; the rule reads avg10 only (avg60, total: unknown)
            return PsiLine(avg10=100.0 * ratio, avg60=math.nan, total_usec=0)
    return None


def pressure_figures(pressure: PsiRatios) -> PressureFigures:
    """The agent's PSI ratios as the rule's figures; a resource without its ``some`` line
    is unknown (None)."""
    out: Dict[str, Optional[Psi]] = {}
    for res in ("cpu", "memory", "io"):
        some = _psi_line(pressure, res, "some")
        out[res] = None if some is None else Psi(some, _psi_line(pressure, res, "full"))
    return PressureFigures(cpu=out["cpu"], memory=out["memory"], io=out["io"])


def inputs_for(snap: Snapshot, who: Attribution, node: str,
               job: str) -> Optional[DiagnosisInputs]:
    """The rule's inputs for inference job ``job`` on ``node``; None where the node's agent
    exported no host figures."""
    host = snap.host_nodes.get(node)
    info = snap.node(node)
    if host is None or info is None:
        return None
    samples = {g.index: g for g in info.gpus}
    gpus: List[GpuState] = []
    for on, index in who.gpus_of.get(job, ()):
        g = samples.get(index)
        if on != node or g is None:
            continue
        mem = g.memory_pct
        gpus.append(GpuState(str(index), None if mem is None else mem / 100.0,
                             None if g.sm_active_pct is None else g.sm_active_pct / 100.0))
    own = snap.host_jobs.get(job)
    own_pressure = pressure_figures(own.pressure if own is not None and own.node == node
                                    else ())
    return DiagnosisInputs(job, tuple(gpus), own_pressure, pressure_figures(host.pressure),
                           _neighbours(snap, who, node, job),
                           tuple(NicLoad(n.device, n.rx_bytes_per_s, n.tx_bytes_per_s,
                                         n.link_bytes_per_s) for n in host.nics))


def _neighbours(snap: Snapshot, who: Attribution, node: str,
                job: str) -> Tuple[Neighbour, ...]:
    """Every other job Slurm shows live on ``node``, with its figures there (None: unknown)."""
    out = []
    for info in sorted(who.live_on(node), key=lambda j: j.id):
        jid = info.id
        if jid == job:
            continue
        fig = snap.host_jobs.get(jid)
        if fig is not None and fig.node != node:
            fig = None
        gpu_mem: Dict[str, int] = {}
        for gpu, _gi, used in fig.gpu_memory if fig is not None else ():
            gpu_mem[str(gpu)] = gpu_mem.get(str(gpu), 0) + int(used)
        gpu_sm: Dict[str, float] = {}
        for gpu, gi, share in fig.gpu_sm if fig is not None else ():
            if not gi:  # NVML samples whole GPUs only
                gpu_sm[str(gpu)] = gpu_sm.get(str(gpu), 0.0) + share
        out.append(Neighbour(
            jid, info.job_class, "",
            gpus=tuple(str(g) for on, g in who.gpus_of.get(jid, ()) if on == node),
            cpu_cores=fig.cpu_cores if fig is not None else None,
            io_bytes_per_s=fig.io_bytes_per_s if fig is not None else None,
            memory_bytes=None if fig is None or fig.memory_bytes is None
            else int(fig.memory_bytes),
            gpu_memory_by_gpu=gpu_mem, sm_by_gpu=gpu_sm))
    return tuple(out)


def diagnose_breach(snap: Snapshot, who: Attribution, node: str, job: str,
                    thresholds: Optional[Thresholds] = None) -> Optional[Diagnosis]:
    """The diagnosis of inference job ``job``'s breach on ``node``; None without host
    figures there."""
    inputs = inputs_for(snap, who, node, job)
    return None if inputs is None else diagnose(inputs, thresholds)


def record(d: Diagnosis) -> Dict[str, Any]:
    """The journal's ``diagnosis`` field: cause, text, ranked suspects (contribution None:
    not measured), the causes that also hold and the figures that were unknown."""
    out: Dict[str, Any] = {
        "cause": d.cause.value, "text": d.text,
        "suspects": [{"job": s.job.job_id, "class": s.job.class_name,
                      "contribution": s.contribution} for s in d.suspects[:10]],
        "figures": {name: value for name, value in d.figures},
    }
    if d.also:
        out["also"] = [c.value for c in d.also]
    if d.unknown:
        out["unknown"] = list(d.unknown)
    return out


#: The causes the host rung acts on: pressure on the node's CPU, memory or IO.
HOST_CAUSES: FrozenSet[Cause] = frozenset(
    {Cause.HOST_CPU_PRESSURE, Cause.HOST_MEMORY_PRESSURE, Cause.HOST_IO_PRESSURE})
#: A training suspect is limited when it takes at least this share of what the heaviest
#: measured suspect takes (a quiet job beside a burner is left alone).
HEAVY_SHARE = 0.5
#: How a GPU rung held at throttle for the host says so (its ``capped`` text begins so after
#: "<step> waits: ").
ON_THE_HOST = "the diagnosis places the contention on the host, not on this GPU"


def _heaviest(d: Optional[Diagnosis]) -> Optional[Suspect]:
    """The first suspect with a measured contribution of a host cause, else None."""
    if d is None or d.cause not in HOST_CAUSES:
        return None
    return next((s for s in d.suspects if s.contribution), None)


def host_suspects(d: Optional[Diagnosis], train: FrozenSet[str]) -> Tuple[str, ...]:
    """The training jobs a host-caused diagnosis names for the host rung: measured (an
    unmeasured job is never acted on) and at least :data:`HEAVY_SHARE` of the heaviest
    training suspect; () for any other cause or none."""
    if d is None or d.cause not in HOST_CAUSES:
        return ()
    measured = [s for s in d.suspects if s.contribution and s.job.class_name in train]
    if not measured:
        return ()
    top = max(float(s.contribution or 0.0) for s in measured)
    return tuple(s.job.job_id for s in measured if float(s.contribution or 0.0)
                 >= HEAVY_SHARE * top)


def elsewhere(d: Optional[Diagnosis], gpu: int) -> str:
    """Why a GPU's rung stays at throttle: its breach's diagnosis is a host cause and the
    heaviest measured suspect is not on GPU ``gpu`` ("" otherwise: the rung goes on)."""
    top = _heaviest(d)
    if d is None or top is None or str(gpu) in top.job.gpus:
        return ""
    return f"{ON_THE_HOST}: {d.text}"
