"""Partition, GRES, MIG and hook-file checks (pure functions of a snapshot).

``snap["nodes"]``/``snap["partitions"]`` come from ``scontrol show node|partition -o``;
``snap["gpu_node"]`` is the inspected GPU node's devices and MIG instances (absent off a GPU
node); ``snap["gres_conf"]`` the gres.conf text beside slurm.conf; ``snap["hooks"]`` the hook
files as seen on the inspected node.
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

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
        state = str(part.get("State") or "").upper()
        if state and state != "UP":
            out.append(Finding("warning", "partition-state",
                               f"partition {pool.partition} of pool {pool.name} is "
                               f"State={state}: the pool's jobs do not start",
                               f"scontrol update PartitionName={pool.partition} State=UP (and "
                               "State=UP on its slurm.conf line)"))
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


def check_node_state(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Pool nodes Slurm does not know, and INVAL (INVALID_REG) ones: slurmd registered other
    resources than slurm.conf declares."""
    out: List[Finding] = []
    for pool in cfg.pools:
        unknown = [n for n in pool.node_names if n not in snap.get("nodes", {})]
        if unknown and snap.get("nodes"):
            out.append(Finding("error", "node-missing",
                               f"pool {pool.name}: node(s) {','.join(unknown)} unknown to Slurm "
                               "(no NodeName= line): the pool's GPUs there never get a job",
                               f"add NodeName={','.join(unknown)} with its Gres= to slurm.conf,"
                               " or fix the pool's nodes in the config"))
        for node in pool_nodes(pool, snap):
            state = str(snap["nodes"][node].get("State") or "")
            if "INVAL" in state.upper():
                out.append(Finding("error", "node-inval",
                                   f"node {node} is {state}: slurmd registered other resources "
                                   "than its NodeName line (often Gres= against gres.conf), so "
                                   "it runs no jobs", f"compare 'slurmd -C' and gres.conf on "
                                   f"{node} with its NodeName line; fix, restart slurmd"))
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


#: ``Key=Value`` of a gres.conf line: keys are case-insensitive and Slurm's parser allows
#: blanks around ``=`` (``name = gpu``); a value is one word or a quoted string.
_GRES_KV = re.compile(r'([A-Za-z]+)\s*=\s*("[^"]*"|[^\s"]+)')
_GPU_FILE = re.compile(r"nvidia([0-9]+)")


def gres_conf_records(text: str, node: str = "") -> List[Dict[str, str]]:
    """gres.conf lines as Slurm reads them (``#`` starts a comment anywhere), keys lower-case;
    with ``node``, only the lines that apply to it (no ``NodeName=``, or one naming it)."""
    out: List[Dict[str, str]] = []
    for line in (text or "").splitlines():
        kv = {k.lower(): v.strip('"') for k, v in _GRES_KV.findall(line.split("#", 1)[0])}
        if not kv:
            continue
        if node and "nodename" in kv and node not in _expand(kv["nodename"]):
            continue
        out.append(kv)
    return out


def _expand(expr: str) -> List[str]:
    try:
        return expand(expr)
    except ValueError:
        return [expr]


def autodetected(text: str, node: str = "") -> bool:
    """Whether slurmd finds the node's GPUs itself (``AutoDetect=nvml``/``nvidia``)."""
    return any(r.get("autodetect", "").lower() in ("nvml", "nvidia")
               for r in gres_conf_records(text, node))


def gres_conf_types(text: str, node: str) -> List[str]:
    """``Type=`` of the node's ``Name=gpu`` lines in gres.conf, in file order."""
    return [r["type"] for r in gres_conf_records(text, node)
            if r.get("name", "").lower() == "gpu" and r.get("type")]


def _files(rec: Dict[str, str]) -> List[str]:
    """The device files of a line (``File=/dev/nvidia[0-1]`` is two)."""
    value = rec.get("multiplefiles") or rec.get("file") or ""
    return _expand(value) if value else []


def _count(rec: Dict[str, str]) -> int:
    """A line's count: ``Count=`` (K/M/G suffixes as Slurm reads them), else one per
    ``File=`` device (a ``MultipleFiles=`` line is one device), else 1."""
    raw = rec.get("count", "").strip().lower()
    mult = {"k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}.get(raw[-1:], 1) if raw else 1
    digits = raw[:-1] if mult > 1 else raw
    if digits.isdigit():
        return int(digits) * mult
    if rec.get("file") and not rec.get("multiplefiles"):
        return len(_files(rec))
    return 1


def _conf_counts(records: Sequence[Dict[str, str]]) -> List[GresItem]:
    counts: Dict[Tuple[str, str], int] = {}
    for r in records:
        name = r.get("name", "").lower()
        if name in ("gpu", "mps", "shard"):
            key = (name, r.get("type", "") if name == "gpu" else "")
            counts[key] = counts.get(key, 0) + _count(r)
    return sorted(GresItem(n, t, c) for (n, t), c in counts.items())


def check_gres_conf_nodes(snap: Snapshot, cfg: Config) -> List[Finding]:
    """Each pool node's gres.conf lines against its ``Gres=`` and, on the inspected GPU node,
    its GPUs: Slurm's device constraint denies only the device files gres.conf names."""
    gres = snap.get("gres_conf") or {}
    text = gres.get("text")
    gpu = snap.get("gpu_node") or {}
    if text is None:
        if not cfg.pools or "gres_conf" not in snap:
            return []
        return [Finding("error" if gpu else "info", "gres-conf-missing",
                        f"{gres.get('path') or 'gres.conf'} could not be read"
                        + (f" on {gpu.get('node')}" if gpu else "") + ": slurmd then has no "
                        "GPU device files, so the node's Gres= does not register and no GPU "
                        "is fenced", "write it with 'slurmiso gen gres-conf' on each GPU node "
                        "(or AutoDetect=nvml), then restart slurmd")]
    out: List[Finding] = []
    nodes = snap.get("nodes", {})
    for pool in cfg.pools:
        for node in pool_nodes(pool, snap):
            if autodetected(text, node):
                continue
            records = gres_conf_records(text, node)
            have = _conf_counts(records)
            want = sorted(i for i in _node_gres(str(nodes[node].get("Gres", "")))
                          if i.name in ("gpu", "mps", "shard"))
            if have != want:
                out.append(Finding(
                    "error", "gres-conf-count",
                    f"node {node}: gres.conf gives {_show(have)}, Gres= says {_show(want)}: "
                    "slurmd registers what gres.conf gives, and the node goes INVAL or jobs "
                    "get devices gres.conf does not name",
                    f"make gres.conf give {_show(want)} on {node} ('slurmiso gen gres-conf "
                    f"--node {node}'), restart slurmd"))
            gpus = [r for r in records if r.get("name", "").lower() == "gpu"]
            live = gpu if gpu.get("node") == node else None
            out += _device_findings(node, pool, gpus, live)
    return out


def _device_findings(node: str, pool: Pool, gpus: List[Dict[str, str]],
                     live: Optional[Dict[str, Any]]) -> List[Finding]:
    """What of a node's GPUs gres.conf leaves unfenced: lines without device files, a file
    named twice, a live GPU it does not name, MIG lines without their capability files."""
    from slurmiso.mig.gres import gpu_type_name

    whole = gpu_type_name(pool.gpu_model)
    regen = f"'slurmiso gen gres-conf --node {node}', restart slurmd"
    out: List[Finding] = []
    why: List[str] = []
    if any(not _files(r) for r in gpus):
        why.append("a Name=gpu line has no File=, so Slurm has no device file to deny")
    plain = [f for r in gpus if not r.get("multiplefiles")
             and (pool.mode != "mig-static" or r.get("type", "") == whole) for f in _files(r)]
    twice = sorted({f for f in plain if plain.count(f) > 1})
    if twice:
        why.append(f"{', '.join(twice)} is named twice, so another GPU is named by none")
    named = {int(m.group(1)) for r in gpus for f in _files(r)
             for m in [_GPU_FILE.fullmatch(os.path.basename(f))] if m}
    if live is not None:
        used = {int(i.get("gpu_index", -1)) for i in live.get("instances", [])}
        unnamed = [int(d["minor"]) for d in live.get("devices", [])
                   if int(d["minor"]) not in named
                   and (not d.get("mig_enabled") or int(d["index"]) in used)]
        if unnamed:
            why.append("no line names /dev/nvidia" + ",".join(map(str, unnamed)) + ", so any "
                       "job on the node can open it")
    if why:
        out.append(Finding("error", "gres-conf-devices", f"node {node}: {'; '.join(why)}",
                           f"one Name=gpu line per device with its File= ({regen})"))
    if pool.mode != "mig-static":
        return out
    mig = [r for r in gpus if r.get("type", "") != whole]
    caps = [[f for f in _files(r) if os.path.basename(f).startswith("nvidia-cap")]
            if r.get("multiplefiles") else [] for r in mig]
    short = sum(1 for c in caps if len(set(c)) < 2)
    flat = [f for c in caps for f in set(c)]
    shared = sorted({f for f in flat if flat.count(f) > 1})
    if short or shared:
        what = (f"{short} MIG line(s) without MultipleFiles= naming the GPU-instance and "
                "compute-instance caps (nvidia-caps/nvidia-capN)" if short else "")
        what += ("; " if short and shared else "") + (
            f"MIG lines share {', '.join(os.path.basename(f) for f in shared)}" if shared else "")
        out.append(Finding("error", "gres-conf-mig-caps",
                           f"node {node}: {what}: those MIG instances stay open to every job "
                           "on the node", f"MultipleFiles=/dev/nvidiaN,<GI cap>,<CI cap> on "
                           f"each MIG line ({regen})"))
    return out


def _runs(types: Sequence[str]) -> List[str]:
    return [t for i, t in enumerate(types) if i == 0 or types[i - 1] != t]


def check_gres_conf_order(snap: Snapshot, cfg: Config) -> List[Finding]:
    """gres.conf lists each MIG type together, in the order of the node's ``Gres=``."""
    text = (snap.get("gres_conf") or {}).get("text")
    if not text:
        return []
    out: List[Finding] = []
    for pool in cfg.pools:
        if pool.mode != "mig-static":
            continue
        for node in pool_nodes(pool, snap):
            if autodetected(text, node):
                continue
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

    if autodetected(str((snap.get("gres_conf") or {}).get("text") or "")):
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
        value = str((snap.get("config") or {}).get(key, path)).strip()
        if value not in ("", "(null)", path):  # an edited snapshot: its files are path's
            out.append(Finding("warning", "hook-unchecked",
                               f"{key}={value} in slurm.conf, but the hook files recorded are "
                               f"{path}'s: whether {value} exists on {node} was not checked",
                               f"run 'slurmiso doctor' on {node} again"))
            continue
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
    check_partitions, check_node_state, check_node_gres, check_gres_conf_nodes,
    check_gres_conf_order, check_mig_live, check_mig_mixed, check_hook_files,
]
