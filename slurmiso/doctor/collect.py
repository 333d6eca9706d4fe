"""Gather the live snapshot ``slurmiso doctor`` checks: Slurm through SlurmCli, files, GPUs.

The snapshot is plain JSON (``doctor --save-snapshot``), so a recorded one can be edited and
fed back (``doctor --snapshot``) to test each check on a real cluster's data.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, Optional

from slurmiso.config.model import Config
from slurmiso.doctor import SNAPSHOT_VERSION, Snapshot
from slurmiso.errors import UsageError
from slurmiso.hostlist import node_name
from slurmiso.slurm import qos as Q
from slurmiso.slurm import slurmconf
from slurmiso.slurm.client import SlurmCli

_PART_KEYS = ("Nodes", "PreemptMode", "State")
_NODE_KEYS = ("Gres", "State", "Partitions", "AvailableFeatures")


def _read_text(path: str) -> Optional[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return None


def _conf_dir(config: Dict[str, str]) -> str:
    return os.path.dirname(config.get("SLURM_CONF") or "/etc/slurm/slurm.conf")


def hook_files(path: str) -> Dict[str, Any]:
    """What a Prolog=/Epilog= value names on this host.

    slurm.conf allows a glob (``Prolog=/etc/slurm/prolog.d/*``): slurmd runs every match in
    order. ``files`` lists each match with its state; ``exists`` means at least one matched.
    """
    import glob

    paths = sorted(glob.glob(path)) if glob.has_magic(path) else [path]
    files = [{"path": p, "exists": os.path.isfile(p), "executable": os.access(p, os.X_OK),
              "realpath": os.path.realpath(p)}
             for p in paths if os.path.isfile(p) or not glob.has_magic(path)]
    return {"path": path, "glob": glob.has_magic(path), "files": files,
            "exists": any(f["exists"] for f in files),
            "executable": bool(files) and all(f["executable"] for f in files)}


def plugstack_facts(path: str, plugin_dir: str) -> Dict[str, Any]:
    """plugstack.conf, the files its includes match, and whether each plugin they name is on
    this host (a required plugin missing fails every step; doctor/plugstack.py reads them)."""
    from slurmiso.doctor import plugstack as P

    text = _read_text(path)
    includes = P.read_includes(text or "", path)
    lines, _unread = P.stack({"path": path, "text": text or "", "includes": includes})
    plugins = {}
    for ln in lines:
        if ln.kind in ("required", "optional") and ln.path not in plugins:
            where = P.resolve_plugin(ln.path, plugin_dir)
            plugins[ln.path] = {"resolved": where, "exists": os.path.isfile(where)}
    return {"path": path, "exists": text is not None, "text": text or "",
            "includes": includes, "plugins": plugins}


def _hooks(config: Dict[str, str]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, _name in slurmconf.HOOKS:
        path = config.get(key, "")
        out[key] = {"path": ""} if path in ("", "(null)") else hook_files(path)
    return out


def _gpu_node(cfg: Config, node: str) -> Optional[Dict[str, Any]]:
    """This node's GPUs and MIG instances when it is in a pool, else None."""
    pool = cfg.pool_for_node(node)
    if pool is None:
        return None
    from slurmiso.gpu import holders, open_backend

    with open_backend(cfg.gpu.backend, cfg.gpu.sim_state, node) as backend:
        out: Dict[str, Any] = {"node": node, "pool": pool.name,
               "devices": [d.to_dict() for d in backend.devices()],
               "instances": [i.to_dict() for i in backend.instances()]}
        if pool.mode == "mps":
            from slurmiso.isolation.mps_daemon import mps_control_for

            protocol = mps_control_for(backend).protocol()
            out["mps_protocol"] = {"v3": protocol.v3, "reason": protocol.reason}
    found = holders.scan(dev_root=cfg.paths.dev_root_for(node), exclude=(os.getpid(),))
    out["holders"] = [h.to_dict() for h in found.holders]
    out["holders_unreadable"] = found.unreadable
    if pool.mode == "mps":
        out["mps_clients"] = _mps_clients(cfg, node)
    if pool.timeslice:
        from slurmiso.gpu.timeslice import boot_id, read_record

        out["timeslice"] = {"record": read_record(cfg.paths.state_dir_for(node)),
                            "boot": boot_id()}
    return out


def _mps_clients(cfg: Config, node: str) -> Dict[str, Any]:
    """GPU index -> the jobs registered on its MPS daemons, with their uids ({} unreadable)."""
    from slurmiso.errors import SlurmisoError
    from slurmiso.isolation.mps import live_clients, registered
    from slurmiso.state import NodeState

    state = NodeState(cfg.paths.state_dir_for(node))
    try:
        return {str(gpu): [{"job": c.job_id, "uid": c.uid, "shared": bool(c.namespace)}
                           for c in live_clients(state, gpu)]
                for gpu in registered(state)}
    except (SlurmisoError, OSError):
        return {}


def collect(cfg: Config, node: str = "", cli: Optional[SlurmCli] = None) -> Snapshot:
    """Read the live cluster (and, on a GPU node, its GPUs); Slurm unreachable raises."""
    cli = cli or SlurmCli(timeout=30)
    config = cli.show_config()
    snap: Snapshot = {
        "version": SNAPSHOT_VERSION,
        "collected_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "slurm_version": config.get("SLURM_VERSION", ""),
        "config": config,
        "partitions": {n: {k: f.get(k, "") for k in _PART_KEYS}
                       for n, f in cli.show_all("partition").items()},
        "nodes": {n: {k: f.get(k, "") for k in _NODE_KEYS}
                  for n, f in cli.show_all("node").items()},
    }
    cols = Q.QOS_FORMAT.split(",")
    out = cli.run("sacctmgr", ["-P", "-n", "show", "qos", f"format={Q.QOS_FORMAT}"])
    snap["qos"] = [dict(zip(cols, (ln.split("|") + [""] * len(cols))[:len(cols)]))
                   for ln in out.splitlines() if ln.strip()]
    accounts = Q.accounts_of(Q.desired_qos(cfg))
    snap["account_qos"] = {a: list(q) for a, q in Q.read_account_qos(cli, accounts).items()}
    plug = config.get("PlugStackConfig", "")
    plug = os.path.join(_conf_dir(config), "plugstack.conf") if plug in ("", "(null)") else plug
    snap["plugstack"] = plugstack_facts(plug, config.get("PluginDir", ""))
    gres_path = os.path.join(_conf_dir(config), "gres.conf")
    snap["gres_conf"] = {"path": gres_path, "text": _read_text(gres_path)}
    oci_path = os.path.join(_conf_dir(config), "oci.conf")  # beside slurm.conf: oci.conf(5)
    snap["oci_conf"] = {"path": oci_path, "text": _read_text(oci_path)}
    snap["hooks"] = _hooks(config)
    snap["gpu_node"] = _gpu_node(cfg, node_name(node))
    snap["restraints"] = _restraints(cfg, node_name(node), cli) if snap["gpu_node"] else None
    snap["monitor"] = monitor_view(cfg, node_name(node))
    snap["fence_kernel"] = _fence_kernel() if snap["gpu_node"] else None
    snap["cgroup_v2"] = (_cgroup_v2(cfg, node_name(node))
                         if snap["gpu_node"] and config.get("CgroupPlugin", "").lower()
                         == "cgroup/v2" else None)
    return snap


def _restraints(cfg: Config, node: str, cli: SlurmCli) -> Dict[str, Any]:
    """The ladder's restraints on this node and the monitor's heartbeat (doctor/restraints)."""
    from slurmiso.restraints import node_view

    return node_view(cfg.paths.state_dir_for(node), node, cfg.monitor.interval_s,
                     time.time(), cli)


def monitor_view(cfg: Config, host: str) -> Optional[Dict[str, Any]]:
    """What the monitor of this host could not read last cycle, from its state file
    (doctor/telemetry.py); None where no monitor runs here."""
    path = os.path.join(cfg.paths.state_dir_for(host), "monitor", "state.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        return {"path": path, "error": str(exc)[:200]}
    memory = data.get("memory") if isinstance(data, dict) else None
    raw = memory.get("unknown_signals") if isinstance(memory, dict) else None
    signals = {str(k)[:80]: int(v) for k, v in (raw or {}).items()
               if isinstance(v, int) and not isinstance(v, bool)} if isinstance(raw, dict) else {}
    return {"path": path, "unknown_signals": signals}


def _fence_kernel() -> Dict[str, Any]:
    """Can this node's kernel take slurmiso_fence.so's cgroup v2 fence (doctor/fences.py)?"""
    from slurmiso.isolation.bpf_probe import bpf_device_support, cgroup2_mount

    ok, detail = bpf_device_support()
    return {"cgroup2": cgroup2_mount(), "bpf_device": ok, "detail": detail}


def _cgroup_v2(cfg: Config, node: str) -> Dict[str, Any]:
    """The cgroup v2 fences as they are on this node now (doctor/fences.py): as root only,
    since reading device programs needs CAP_SYS_ADMIN."""
    if os.geteuid() != 0:
        return {"error": "not root: the device programs of job cgroups are root's to read"}
    from slurmiso.isolation.bpf_probe import v2_node_facts

    return v2_node_facts(node, cfg.paths.state_dir_for(node))


def load_snapshot(path: str) -> Snapshot:
    """A snapshot saved by ``doctor --save-snapshot`` (possibly edited)."""
    try:
        with open(path, encoding="utf-8") as fh:
            snap = json.load(fh)
    except OSError as exc:
        raise UsageError(f"cannot read snapshot {path}: {exc.strerror}") from None
    except ValueError as exc:
        raise UsageError(f"snapshot {path} is not valid JSON: {exc}",
                         hint="record one with 'slurmiso doctor --save-snapshot FILE'") from None
    if not isinstance(snap, dict) or snap.get("version") != SNAPSHOT_VERSION:
        raise UsageError(f"snapshot {path} is not a version {SNAPSHOT_VERSION} doctor snapshot",
                         hint="record one with 'slurmiso doctor --save-snapshot FILE'")
    return snap


def save_snapshot(snap: Snapshot, path: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(snap, fh, indent=2, sort_keys=True)
            fh.write("\n")
    except OSError as exc:
        raise UsageError(f"cannot write snapshot {path}: {exc.strerror}") from None
