"""Which MPS arrangement a node's GPUs run, and why: for ``slurmiso status`` and doctor.

The pool asks (``mps_server``), the driver allows (``-p 3 -h``, read), and each GPU's
directory under the state dir says what actually runs: a shared daemon with its namespaces
(read from the daemon, joined to the job records), or per-class daemons.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from slurmiso.errors import SlurmisoError
from slurmiso.isolation import mps_shared as shared
from slurmiso.isolation.mps_dirs import DAEMON_DIR_RE, mps_root

if TYPE_CHECKING:
    from slurmiso.config.model import Pool
    from slurmiso.isolation.mps_daemon import MpsControl
    from slurmiso.isolation.mps_protocol import MpsProtocol

_GPU_DIR_RE = re.compile(r"gpu([0-9]+)")


def arrangement(pool: Optional[Pool], protocol: MpsProtocol, state_dir: str,
                control: MpsControl, jobs: Dict[str, Any]) -> Dict[str, Any]:
    """The node's arrangement (what the pool asks, what runs per GPU) as plain data."""
    from slurmiso.config.model import MpsServer

    asked = pool.mps_server if pool is not None else MpsServer.PER_CLASS
    if asked is MpsServer.SHARED and protocol.v3:
        name, why = shared.ARRANGEMENT, ("the pool asks for a shared server and the driver "
                                         "has MPS v3: one server per GPU, a namespace per job")
    elif asked is MpsServer.SHARED:
        name, why = "per-class daemons", ("the pool asks for a shared server, but the driver "
                                          "has no MPS v3: one daemon per (GPU, user, limits)")
    else:
        name, why = "per-class daemons", ("the pool runs one MPS control daemon per (GPU, "
                                          "user, class limits) (mps_server: per-class)")
    return {"arrangement": name, "why": why, "asked": asked.value, "v3": protocol.v3,
            "v3_reason": protocol.reason,
            "gpus": gpus_in_force(state_dir, control, jobs)}


def gpus_in_force(state_dir: str, control: MpsControl,
                  jobs: Dict[str, Any]) -> List[Dict[str, Any]]:
    """Per GPU with a daemon directory: what runs there."""
    try:
        names = sorted(os.listdir(mps_root(state_dir)))
    except OSError:
        return []
    out = []
    for name in names:
        m = _GPU_DIR_RE.fullmatch(name)
        if m:
            out.append(_gpu(int(m.group(1)), os.path.join(mps_root(state_dir), name),
                            state_dir, control, jobs))
    return out


def _gpu(gpu: int, where: str, state_dir: str, control: MpsControl,
         jobs: Dict[str, Any]) -> Dict[str, Any]:
    try:
        entries = sorted(os.listdir(where))
    except OSError:
        entries = []
    daemons = [e for e in entries if DAEMON_DIR_RE.fullmatch(e)]
    row: Dict[str, Any] = {"gpu": gpu, "per_class_daemons": daemons}
    paths = shared.shared_paths(state_dir, gpu)
    if "shared" in entries:
        row["shared"] = _shared(control, paths["pipe"], gpu, jobs)
    return row


def _shared(control: MpsControl, pipe: str, gpu: int, jobs: Dict[str, Any]) -> Dict[str, Any]:
    """The shared server of one GPU: its daemon, and each namespace with its job."""
    owners = {}
    for job_id, rec in jobs.items():
        for r in rec.resources:
            name = shared.namespace_of(r.extra) if r.kind == "mps" and r.gpu == gpu else None
            if name:
                owners[name] = (job_id, r.uid, rec.job_class or None)
    out: Dict[str, Any] = {"server": shared.SERVER, "daemon_pid": control.running(pipe),
                           "namespaces": []}
    if out["daemon_pid"] is None:
        out["problem"] = "no live daemon (the next job on this GPU restarts it)"
        return out
    try:
        rows = shared.namespaces(control, pipe)
    except SlurmisoError as exc:
        out["problem"] = f"namespaces not read: {exc}"
        return out
    for row in rows:
        if row.get("name") == "default":
            continue  # the server's own, closed to jobs
        job = owners.get(row.get("name", ""))
        out["namespaces"].append({
            "name": row.get("name", ""), "job": job[0] if job else None,
            "uid": job[1] if job else None, "class": job[2] if job else None,
            "client_priority": row.get("client-priority", "-"),
            "active_thread_percentage": row.get("active-thread-percentage", "-"),
            "pinned_memory_limit": row.get("pinned-memory-limit", "-"),
        })
    return out


def lines(view: Dict[str, Any]) -> List[str]:
    """``slurmiso status``'s text for the arrangement."""
    out = [f"MPS: {view['arrangement']} ({view['why']}); MPS v3 here: "
           f"{'yes' if view['v3'] else 'no'} ({view['v3_reason']})"]
    for g in view["gpus"]:
        s = g.get("shared")
        if s is not None:
            out.append(f"  GPU {g['gpu']}: shared server {s['server']} "
                       f"(daemon pid {s['daemon_pid'] or '-'})"
                       + (f": {s['problem']}" if s.get("problem") else ""))
            for ns in s["namespaces"]:
                who = f"job {ns['job']} ({ns['class']})" if ns["job"] else "no job"
                out.append(f"    {ns['name']}: {who}, priority {ns['client_priority']}, "
                           f"threads {ns['active_thread_percentage']}%, pinned "
                           f"{ns['pinned_memory_limit']}")
        if g["per_class_daemons"]:
            out.append(f"  GPU {g['gpu']}: per-class daemons "
                       f"{', '.join(g['per_class_daemons'])}")
    return out
