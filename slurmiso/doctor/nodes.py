"""Partition, GRES, MIG and hook-file checks (pure functions of a snapshot).

``snap["nodes"]``/``snap["partitions"]`` come from ``scontrol show node|partition -o``;
``snap["gpu_node"]`` is the inspected GPU node's devices and MIG instances (absent off a GPU
node); ``snap["gres_conf"]`` the gres.conf text beside slurm.conf; ``snap["hooks"]`` the hook
files as seen on the inspected node.
"""

from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence, Tuple

from slurmiso.config.model import Config, Pool
from slurmiso.doctor import Check, Finding, Snapshot
from slurmiso.hostlist import expand
from slurmiso.slurm import slurmconf
from slurmiso.slurm.gres import GresItem, parse_gres

MIXED_WHY = (
    "measured on Slurm 22.05.8 with an explicit MultipleFiles gres.conf: slurmctld records the "
    "second MIG type under the first with count 0, so a job asking for it gets no device "
    "('scontrol show node' lists the second type with count 0); also seen with one type per GPU "
    "(3g.40gb on GPU 0, 4g.40gb on GPU 1): it is the node that must not mix types")


def _node_gres(value: str) -> List[GresItem]:
    """``Gres=`` as compared with the config: only GPU types matter (scontrol shows
    ``mps:h100:200`` for a configured ``mps:200``)."""
    return [GresItem(n, t if n == "gpu" else "", c) for n, t, c in parse_gres(value)]


def _show(items: Sequence[GresItem]) -> str:
    return ",".join(f"{n}:{t}:{c}" if t else f"{n}:{c}" for n, t, c in items) or "(none)"


def pool_nodes(pool: Pool, snap: Snapshot) -> List[str]:
    """The pool's nodes as Slurm knows them (by name, or by feature for feature pools)."""
    nodes = snap.get("nodes", {})
    if pool.node_names:
        return [n for n in pool.node_names if n in nodes]
    return sorted(n for n, f in nodes.items()
                  if pool.feature in str(f.get("AvailableFeatures", "")).split(","))


def check_partitions(snap: Snapshot, cfg: Config) -> List[Finding]:
    out: List[Finding] = []
    parts = snap.get("partitions", {})
    for pool in cfg.pools:
        part = parts.get(pool.partition)
        want = slurmconf.partition_line(pool)
        if part is None:
            out.append(Finding("error", "partition-missing",
                               f"pool {pool.name}: partition {pool.partition} does not exist",
                               f"add to slurm.conf: {want}"))
            continue
        if not pool.node_names:
            continue  # feature pools: Slurm's NodeSet decides
        have = set(expand(str(part.get("Nodes", ""))) if part.get("Nodes") not in
                   (None, "", "(null)") else [])
        if have != set(pool.node_names):
            out.append(Finding("error", "partition-nodes",
                               f"partition {pool.partition} has nodes "
                               f"{part.get('Nodes') or '(none)'}, pool {pool.name} has "
                               f"{pool.nodes}: jobs of the pool land on other GPUs",
                               f"set Nodes={pool.nodes} on PartitionName={pool.partition}"))
    return out


def check_node_gres(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Each pool node's ``Gres=`` as the config implies (MIG types in gres.conf order)."""
    out: List[Finding] = []
    nodes = snap.get("nodes", {})
    for pool in cfg.pools:
        want = _node_gres(slurmconf.pool_gres(cfg, pool))
        if not want:
            continue
        for node in pool_nodes(pool, snap):
            have = _node_gres(str(nodes[node].get("Gres", "")))
            if have == want:
                continue
            same_set = sorted(have) == sorted(want)
            if same_set and pool.mode != "mig-static":
                continue
            code = "gres-order" if same_set else "gres-layout"
            why = ("MIG types listed in another order than gres.conf: SLURM_JOB_GPUS then "
                   "names the wrong instance" if same_set else
                   "does not match the pool" + (f"'s MIG layout {pool.mig_layout}"
                                                 if pool.mode == "mig-static" else ""))
            out.append(Finding("error", code, f"node {node}: Gres={_show(have)} {why}",
                               f"set Gres={_show(want)} on NodeName={node}, restart slurmd"))
    return out


def gres_conf_types(text: str, node: str) -> List[str]:
    """``Type=`` of the node's ``Name=gpu`` lines in gres.conf, in file order."""
    out: List[str] = []
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        kv = dict(t.split("=", 1) for t in line.split() if "=" in t)
        if kv.get("Name") != "gpu" or not kv.get("Type"):
            continue
        if "NodeName" in kv and node not in expand(kv["NodeName"]):
            continue
        out.append(kv["Type"])
    return out


def _runs(types: Sequence[str]) -> List[str]:
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


def check_gres_conf_order(snap: Snapshot, cfg: Config) -> List[Finding]:
    """gres.conf lists each MIG type together, in the order of the node's ``Gres=``."""
    text = (snap.get("gres_conf") or {}).get("text")
    if not text or "autodetect=nvml" in text.lower():
        return []
    out: List[Finding] = []
    for pool in cfg.pools:
        if pool.mode != "mig-static":
            continue
        for node in pool_nodes(pool, snap):
            runs = _runs(gres_conf_types(text, node))
            node_types = [t for n, t, _ in parse_gres(snap["nodes"][node].get("Gres", ""))
                          if n == "gpu"]
            if runs and runs != node_types:
                out.append(Finding(
                    "error", "gres-conf-order",
                    f"node {node}: gres.conf lists MIG types {','.join(runs)}, Gres= lists "
                    f"{','.join(node_types)}: slurmctld numbers GRES type by type in Gres= "
                    "order, so SLURM_JOB_GPUS names the wrong instance",
                    f"regenerate with 'slurmiso gen gres-conf --node {node}' and use the "
                    "Gres= it states"))
    return out


def _live_types(gpu: Dict[str, object], pool: Pool) -> Optional[List[Tuple[str, int]]]:
    from slurmiso.gpu.backend import DeviceInfo, MigInstance
    from slurmiso.mig.gres import gpu_type_name, live_entries, type_counts

    devices = [DeviceInfo(**d) for d in gpu.get("devices", [])]  # type: ignore[attr-defined]
    insts = [MigInstance(**i) for i in gpu.get("instances", [])]  # type: ignore[attr-defined]
    if not devices:
        return None
    return type_counts(live_entries(devices, insts), gpu_type_name(pool.gpu_model))


def check_mig_live(snap: Snapshot, cfg: Config) -> List[Finding]:
    """On a GPU node: Slurm's Gres= types match the live MIG instances; MIG where needed."""
    gpu = snap.get("gpu_node")
    if not gpu:
        return []
    pool = cfg.pool(str(gpu.get("pool", "")))
    node = str(gpu.get("node", ""))
    if pool is None:
        return []
    out: List[Finding] = []
    if pool.mode in slurmconf.MIG_RECONFIGURED:
        off = [d for d in gpu.get("devices", []) if not d.get("mig_enabled")]
        if off and pool.mode == "mig-dynamic":
            from slurmiso.mig.mode import how

            out.append(Finding("error", "mig-mode",
                               f"node {node}: MIG is off on GPU "
                               f"{','.join(str(d['index']) for d in off)} of a "
                               "mig-dynamic pool: the prolog cannot create instances",
                               "; ".join(how(int(d["index"]), str(d.get("architecture", "")))
                                         for d in off)))
    if pool.mode != "mig-static" or node not in snap.get("nodes", {}):
        return out
    live = _live_types(gpu, pool)
    have = [(t, c) for n, t, c in parse_gres(snap["nodes"][node].get("Gres", "")) if n == "gpu"]
    if live is not None and have != live:
        same = sorted(have) == sorted(live)
        show = ",".join(f"gpu:{t}:{c}" for t, c in live)
        out.append(Finding(
            "error", "gres-mig-order" if same else "gres-mig-live",
            f"node {node}: Gres={','.join(f'gpu:{t}:{c}' for t, c in have)} but the GPUs hold "
            f"{show}" + (" (other order)" if same else "") + ": jobs get the wrong or no "
            "MIG device", f"drain {node}; 'slurmiso mig apply' or set Gres={show}; "
            "'slurmiso gen gres-conf'; restart slurmd"))
    return out


def check_mig_mixed(snap: Snapshot, cfg: Config) -> List[Finding]:
    """A mig-static node holding two MIG types, on one GPU or across GPUs (:data:`MIXED_WHY`)."""
    from slurmiso.slurm import versions
    from slurmiso.slurm.client import parse_version

    text = str((snap.get("gres_conf") or {}).get("text") or "").lower()
    if "autodetect=nvml" in text:
        return []
    if versions.has("mig_mixed_types", parse_version(str(snap.get("slurm_version") or ""))):
        return []  # measured: 24.11.5 and 26.05.5 schedule every type of a mixed node
    out: List[Finding] = []
    gpu = snap.get("gpu_node") or {}
    for pool in cfg.pools:
        if pool.mode != "mig-static":
            continue
        per_gpu: Dict[int, set] = {}
        if gpu.get("pool") == pool.name:
            where = f"node {gpu.get('node')}"
            for i in gpu.get("instances", []):
                per_gpu.setdefault(int(i["gpu_index"]), set()).add(i["profile"])
        else:
            layout = cfg.mig_layout(pool.mig_layout)
            where = f"pool {pool.name} (layout {pool.mig_layout})"
            for idx in range(pool.gpus_per_node):
                group = layout.for_device(idx) if layout else None
                if group and group.mig_enabled:
                    per_gpu[idx] = {p for p, n in group.mig_devices if n > 0}
        types = sorted(set().union(*per_gpu.values())) if per_gpu else []
        if len(types) > 1:
            out.append(Finding(
                "warning", "mig-mixed-gpu",
                f"{where}: mixes MIG types {', '.join(types)}; {MIXED_WHY}",
                "one MIG profile per node in the layout (per mig-static pool), or "
                "AutoDetect=nvml in gres.conf on real GPUs"))
    return out


def check_hook_files(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Hook scripts exist and are executable where jobs run (checked on a GPU node only)."""
    hooks = snap.get("hooks") or {}
    if not snap.get("gpu_node"):
        return [Finding("info", "hooks-unchecked",
                        "not on a GPU node of the config: GPU, MIG and hook-file checks skipped",
                        "run 'slurmiso doctor' on a GPU node (or pass --node NAME there)")]
    out: List[Finding] = []
    node = snap["gpu_node"].get("node", "")
    for key, _name in slurmconf.HOOKS:
        h = hooks.get(key) or {}
        path = h.get("path")
        if not path:
            continue  # check_hooks_set reports it
        if not h.get("exists"):
            what = "matches no file" if h.get("glob") else "does not exist"
            out.append(Finding("error", "hook-missing",
                               f"{key}={path} {what} on {node}: slurmd fails the job "
                               "and drains the node", f"install the slurmiso package on {node} "
                               "(docs/admin-guide.md) or fix the path in slurm.conf"))
            continue
        files = h.get("files") or [h]
        for f in files:
            if f.get("exists") and not f.get("executable"):
                out.append(Finding("error", "hook-not-executable",
                                   f"{key}={path}: {f.get('path')} is not executable on "
                                   f"{node}", f"chmod 755 {f.get('path')}"))
        if h.get("glob") and not any(
                os.path.basename(str(f.get("path", ""))).startswith(f"slurmiso-{key.lower()}")
                or "slurmiso" in os.path.realpath(str(f.get("path", ""))) for f in files):
            out.append(Finding("warning", "hook-not-slurmiso",
                               f"{key}={path} runs {len(files)} file(s) on {node}, none of them "
                               "slurmiso's: per-job GPU isolation never runs",
                               f"link slurmiso's hook into {os.path.dirname(path)}"))
    return out


CHECKS: List[Check] = [
    check_partitions, check_node_gres, check_gres_conf_order, check_mig_live, check_mig_mixed,
    check_hook_files,
]
