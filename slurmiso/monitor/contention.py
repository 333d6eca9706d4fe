"""Where a hot inference job's contention is: the diagnosis rule fed from the snapshot (pure).

    >>> d = diagnose_breach(snap, who, "n1", "101")              # doctest: +SKIP
    >>> d.cause.value, d.text                                    # doctest: +SKIP
    ('host-cpu-pressure', 'host CPU pressure: job 202 (train) uses 15.2 cores')

The rule is :func:`slurmiso.host.diagnosis.diagnose`; this module only gathers its inputs:
the inference job's own PSI and GPUs (memory used of total, SM activity, from the GPU
samples), the node's PSI and NICs, and every other job Slurm shows running on the node, with
its host figures and the GPUs :class:`~slurmiso.monitor.attribution.Attribution` gives it.
A node whose agent exports no host figures gets no diagnosis (None): the journal and the state
then say what they said before. The diagnosis names a cause; it does not change what the
ladder does.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from slurmiso.host.cgroup_figures import PressureFigures
from slurmiso.host.diagnosis import (
    Diagnosis,
    DiagnosisInputs,
    GpuState,
    Neighbour,
    NicLoad,
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
        out.append(Neighbour(
            jid, info.job_class, "",
            gpus=tuple(str(g) for on, g in who.gpus_of.get(jid, ()) if on == node),
            cpu_cores=fig.cpu_cores if fig is not None else None,
            io_bytes_per_s=fig.io_bytes_per_s if fig is not None else None,
            memory_bytes=None if fig is None or fig.memory_bytes is None
            else int(fig.memory_bytes),
            gpu_memory_by_gpu=gpu_mem))
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
