"""GPU-node checks of any GPU model: the model the node reports against the config, MPS
memory against the memory NVML reports, MIG mode (a change pending, MIG on where it must be
off, and what a change takes), and MPS shared across users (pure functions of a snapshot).

``snap["gpu_node"]`` carries the node's devices (name, model, memory, MIG mode, architecture),
``holders`` (processes with NVIDIA device files open, :mod:`slurmiso.gpu.holders`) and, on an
MPS pool, ``mps_clients`` (GPU -> the jobs registered there and their uids).
"""

from __future__ import annotations

from typing import Any, Dict, List

from slurmiso.config.model import Config
from slurmiso.config.mps_users import FIX, mps_mixes, pool_classes
from slurmiso.doctor import Check, Finding, Snapshot
from slurmiso.gpu.holders import Holder, known_advice
from slurmiso.gpu.profiles import lookup_model
from slurmiso.mig import mode

MIG_MODES = ("mig-static", "mig-dynamic")


def _node(snap: Snapshot, cfg: Config) -> Any:
    gpu = snap.get("gpu_node")
    if not gpu:
        return None, None
    return gpu, cfg.pool(str(gpu.get("pool", "")))


def _loose(name: str) -> str:
    low = name.lower().replace("nvidia", "").replace("geforce", "").replace("tesla", "")
    return "".join(ch for ch in low if ch.isalnum())


def _matches(pool_model: str, dev: Dict[str, Any]) -> bool:
    """Whether a device is the pool's model: by catalogue entry, else by name."""
    known = lookup_model(pool_model)
    if known is not None:
        return known.name in (dev.get("model"), getattr(lookup_model(str(dev.get("name", ""))),
                                                        "name", None))
    return _loose(pool_model) in _loose(str(dev.get("name", "")))


def check_gpu_model(snap: Snapshot, cfg: Config) -> List[Finding]:
    """The node's GPUs are the pool's model (when it names one), and of one model."""
    gpu, pool = _node(snap, cfg)
    if pool is None:
        return []
    node = gpu.get("node", "")
    devices = gpu.get("devices", [])
    names = sorted({str(d.get("name", "")) for d in devices})
    out: List[Finding] = []
    if len(names) > 1:
        out.append(Finding("warning", "gpu-model-mixed",
                           f"node {node} has GPUs of several models ({', '.join(names)}): a "
                           f"pool is one model, its MIG layout and MPS limits assume one",
                           f"move {node} to a pool per model"))
    if not devices:
        return out
    memory = min(int(d.get("memory_total_mb", 0)) for d in devices)
    if not pool.gpu_model:
        out.append(Finding("info", "gpu-model-unset",
                           f"pool {pool.name} names no gpu_model; node {node} has "
                           f"{len(devices)}x {', '.join(names)} ({memory} MiB): memory checks "
                           "use what NVML reports", "optional: set the pool's gpu_model"))
        return out
    wrong = [d for d in devices if not _matches(pool.gpu_model, d)]
    if wrong:
        have = ", ".join(sorted({str(d.get("model") or d.get("name")) for d in wrong}))
        known = lookup_model(pool.gpu_model) is not None
        out.append(Finding(
            "error" if known else "warning", "gpu-model",
            f"pool {pool.name} says gpu_model {pool.gpu_model}, node {node} has {have} "
            f"(GPU {', '.join(str(d.get('index')) for d in wrong)})"
            + ("" if known else f": {pool.gpu_model!r} is not in slurmiso's catalogue, so "
               "this compares names only"),
            f"set gpu_model: {have} on pool {pool.name}, or move {node} to its own pool"))
    return out


def check_mps_memory(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Each class's MPS memory limit plus headroom fits the GPU memory the node reports."""
    gpu, pool = _node(snap, cfg)
    if pool is None or pool.mode != "mps" or not gpu.get("devices"):
        return []
    total = min(int(d.get("memory_total_mb", 0)) for d in gpu["devices"])
    out: List[Finding] = []
    for c in pool_classes(cfg, pool):
        limit = c.mps.limit_mb(total)
        headroom = total * c.memory_headroom_pct // 100
        if limit and limit + headroom > total:
            out.append(Finding(
                "error", "mps-memory",
                f"class {c.name}: MPS memory limit {limit} MiB plus {c.memory_headroom_pct}% "
                f"headroom ({headroom} MiB) is more than the {total} MiB the GPUs of node "
                f"{gpu.get('node')} report (pool {pool.name}): the prolog refuses its jobs",
                f"lower classes.{c.name}.mps.memory_limit or memory_headroom"))
    return out


def _holder_text(gpu: Dict[str, Any], minor: int) -> str:
    held = [Holder(int(h["pid"]), str(h.get("name", "")), tuple(h.get("devices", ())),
                   tuple(h.get("gpus", ())), known_advice(str(h.get("name", ""))))
            for h in gpu.get("holders") or [] if minor in h.get("gpus", ()) or not h.get("gpus")]
    return "; ".join(h.describe() for h in held)


def check_mig_mode(snap: Snapshot, cfg: Config) -> List[Finding]:
    """MIG mode as the pool needs it, and what changing it takes on this node: a reset on
    Ampere, none on Hopper and later; the processes holding the GPU are named."""
    gpu, pool = _node(snap, cfg)
    if pool is None:
        return []
    node = gpu.get("node", "")
    out: List[Finding] = []
    for d in gpu.get("devices", []):
        index, arch = int(d.get("index", 0)), str(d.get("architecture", ""))
        held = _holder_text(gpu, int(d.get("minor", index)))
        tail = f"; holding GPU {index} now: {held}" if held else ""
        if bool(d.get("mig_pending")) != bool(d.get("mig_enabled")):
            want = bool(d.get("mig_pending"))
            out.append(Finding(
                "warning", "mig-mode-pending",
                f"node {node}: GPU {index} has a MIG mode change pending "
                f"({'on' if want else 'off'} after the next reset)"
                + (": Ampere applies it only at a GPU reset" if mode.needs_reset(arch) else ""),
                mode.how(index, arch, want) + tail))
        elif d.get("mig_enabled") and pool.mode not in MIG_MODES:
            out.append(Finding(
                "error", "mig-mode-plain",
                f"node {node}: GPU {index} has MIG mode on in {pool.mode} pool {pool.name}: "
                "without MIG instances CUDA sees no device there",
                mode.how(index, arch, enable=False) + tail))
        elif not d.get("mig_enabled") and pool.mode in MIG_MODES and held:
            out.append(Finding(
                "info", "mig-mode-holders",
                f"node {node}: GPU {index} has MIG off; to turn it on: "
                + mode.how(index, arch).split(": ", 1)[1], "before that" + tail))
    return out


def check_mps_users(snap: Snapshot, cfg: Config) -> List[Finding]:
    """MPS pools meant for jobs of different accounts (from the config), and GPUs whose MPS
    clients belong to more than one user right now (on the inspected node)."""
    out = [Finding("info", "mps-cross-user", mix.describe(), FIX) for mix in mps_mixes(cfg)]
    gpu, pool = _node(snap, cfg)
    if pool is None or pool.mode != "mps":
        return out
    for index, everyone in sorted((gpu.get("mps_clients") or {}).items()):
        # a shared (MPS v3 multi-user) server runs every user's clients together
        clients = [c for c in everyone if not c.get("shared")]
        uids = sorted({int(c["uid"]) for c in clients})
        if len(uids) > 1:
            jobs = ", ".join(f"{c['job']} (uid {c['uid']})" for c in clients)
            out.append(Finding(
                "warning", "mps-users-now",
                f"node {gpu.get('node')}: MPS GPU {index} serves jobs of {len(uids)} users "
                f"now: {jobs}; their work is time-sliced, not concurrent", FIX,
                subjects=tuple(str(c["job"]) for c in clients)))
    return out


def check_timeslice(snap: Snapshot, cfg: Config) -> List[Finding]:
    """A timeslice pool's configured time slice is what the prolog set on each GPU of the
    inspected node this boot (NVML cannot read it back: the hooks' record is the evidence)."""
    from slurmiso.gpu.timeslice import Timeslice, stale

    gpu, pool = _node(snap, cfg)
    if pool is None or not pool.timeslice or "timeslice" not in gpu:
        return []
    uuids = {int(d["index"]): str(d.get("uuid", "")) for d in gpu.get("devices", [])}
    want = Timeslice.parse(pool.timeslice)
    off = stale(gpu["timeslice"]["record"], uuids, want, gpu["timeslice"]["boot"])
    if not off:
        return []
    where = "; ".join(f"GPU {i}: {why}" for i, why in off.items())
    return [Finding("info", "timeslice", f"node {gpu.get('node')}: pool {pool.name} wants "
                    f"the {want.value} time slice, not set by slurmiso this boot ({where})",
                    "the next job's prolog on each of those GPUs sets it (once a boot: NVML "
                    "cannot read it back, so the hooks' record is what doctor checks)",
                    subjects=(str(gpu.get("node", "")),))]


def check_mps_protocol(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Which MPS arrangement an MPS pool's GPUs run, and what the driver would allow: read
    from the control binary (``-p 3 -h``), never assumed (docs/mps-v3.md)."""
    gpu, pool = _node(snap, cfg)
    got = gpu.get("mps_protocol") if pool is not None and pool.mode == "mps" else None
    if not isinstance(got, dict):
        return []
    node = str(gpu.get("node", ""))
    from slurmiso.config.model import MpsServer

    if pool.mps_server is MpsServer.SHARED and got.get("v3"):
        return [Finding("info", "mps-arrangement",
                        f"node {node}, pool {pool.name}: one shared MPS v3 server per GPU, a "
                        f"namespace per job ordered by client priority: {got.get('reason')}",
                        "nothing to do: slurmiso status shows each GPU's namespaces",
                        subjects=(node,))]
    if pool.mps_server is MpsServer.SHARED:
        return [Finding("warning", "mps-arrangement",
                        f"node {node}, pool {pool.name} asks for a shared MPS server, but this "
                        f"driver has no MPS v3 ({got.get('reason', '?')}): its GPUs run one "
                        "daemon per class, which time-slice against each other",
                        "install driver r615 or later on the node, or set mps_server: "
                        "per-class on the pool", subjects=(node,))]
    offer = ("MPS v3 is there: mps_server: shared on the pool would use it"
             if got.get("v3") else "no MPS v3 here")
    return [Finding("info", "mps-arrangement",
                    f"node {node}, pool {pool.name}: one MPS control daemon per class on each "
                    f"GPU (the classes time-slice against each other; no client priority "
                    f"orders them); {offer}: {got.get('reason', '?')}",
                    "nothing to do: docs/mps-v3.md says what a shared server gives and costs",
                    subjects=(node,))]


CHECKS: List[Check] = [check_gpu_model, check_mps_memory, check_mig_mode, check_mps_users,
                       check_timeslice, check_mps_protocol]
