"""``slurmiso mig``: lay out, check and show a node's static MIG layout (mig-parted style).

``apply`` asserts first and acts only on differences, so running it twice changes nothing;
``assert`` is the same plan without acting (exit 1 with the differences); ``show`` lists the
instances and which job holds each.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict, List, Tuple

_EPILOG = """\
examples:
  slurmiso mig assert                      # does this node match its pool's layout?
  slurmiso mig apply --dry-run             # what would change
  slurmiso mig apply                       # make it so (instances in use are never touched)
  slurmiso mig apply --layout all-3g.40gb --enable-mig   # simulated GPUs only
  slurmiso mig show --json
  slurmiso mig show --profiles             # the MIG profiles the driver reports (any GPU)

After a layout change, regenerate gres.conf ('slurmiso gen gres-conf') and restart slurmd
on the drained node: Slurm's MIG GRES must match the instances.
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "mig", help="apply, assert or show the node's MIG layout",
        description=__doc__.splitlines()[0].split(": ", 1)[1], epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--node", default="", help="node name (default: $SLURMD_NODENAME or host)")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    sub = parser.add_subparsers(dest="mig_command", metavar="ACTION", required=True)

    p = sub.add_parser("apply", parents=[common], help="lay out the MIG layout (idempotent)")
    p.add_argument("--layout", default="", help="layout name (default: the pool's mig_layout)")
    p.add_argument("--dry-run", action="store_true", help="print the plan, change nothing")
    p.add_argument("--enable-mig", action="store_true",
                   help="enable MIG mode on idle GPUs that need it (simulated backend only)")
    p.set_defaults(func=_apply)

    p = sub.add_parser("assert", parents=[common], help="exit 0 if the node matches the layout")
    p.add_argument("--layout", default="", help="layout name (default: the pool's mig_layout)")
    p.set_defaults(func=_assert)

    p = sub.add_parser("show", parents=[common], help="list GPUs and MIG instances")
    p.add_argument("--profiles", action="store_true",
                   help="also list each GPU model's MIG profiles and placements as the "
                   "backend reports them (NVML on a real node), with a catalogue entry for "
                   "a model slurmiso has no table for")
    p.set_defaults(func=_show)


def _open(args: argparse.Namespace) -> Tuple[Any, Any, Any, Any, str]:
    """(config, pool, backend, NodeState, node) for this node."""
    from slurmiso.config import load_config
    from slurmiso.gpu import open_backend
    from slurmiso.hostlist import node_name
    from slurmiso.state import NodeState

    cfg = load_config(args.config)
    node = node_name(args.node)
    pool = cfg.node_pool(node)
    backend = open_backend(cfg.gpu.backend, cfg.gpu.sim_state, node)
    return cfg, pool, backend, NodeState(cfg.paths.state_dir_for(node)), node


def _plan(args: argparse.Namespace, cfg: Any, pool: Any, backend: Any, state: Any) -> Any:
    """The plan from this node's instances to the chosen layout."""
    from slurmiso.errors import UsageError
    from slurmiso.gpu.profiles import lookup_model
    from slurmiso.mig.apply import read_node
    from slurmiso.mig.claims import claimed_instances
    from slurmiso.mig.plan import plan_layout

    name = args.layout or pool.mig_layout
    if not name:
        raise UsageError(f"pool {pool.name} (mode {pool.mode}) has no mig_layout",
                         hint="pass --layout NAME")
    layout = cfg.mig_layout(name)
    if layout is None:
        known = ", ".join(x.name for x in cfg.mig_layouts) or "none"
        raise UsageError(f"no MIG layout {name!r} in {cfg.source}; known layouts: {known}")
    snap = read_node(backend, claimed_instances(state))
    model = lookup_model(snap.devices[0].model if snap.devices else pool.gpu_model)
    if model is None or not model.mig_capable:
        what = snap.devices[0].name if snap.devices else pool.gpu_model or "no GPU"
        raise UsageError(f"{what} has no MIG profile table in slurmiso",
                         hint="'slurmiso mig show --profiles' lists what the driver reports")
    return plan_layout(model, layout, len(snap.devices), snap.existing, snap.mig_enabled,
                       snap.busy)


def _apply(args: argparse.Namespace) -> int:
    import contextlib

    from slurmiso.cli.output import print_json
    from slurmiso.mig import gres
    from slurmiso.mig.apply import apply_plan
    from slurmiso.state import Journal

    cfg, pool, backend, state, node = _open(args)
    # The lock keeps prologs from claiming an instance between plan and act; a dry run
    # changes nothing and must work for admins who cannot create the state dir.
    guard = contextlib.nullcontext() if args.dry_run else state.locked()
    with guard:
        plan = _plan(args, cfg, pool, backend, state)
        advice = _mode_advice(cfg, node, backend, plan, args.json)
        journal = Journal(cfg.paths.journal_for(node))
        done = apply_plan(backend, plan, journal, dry_run=args.dry_run,
                          enable_mig=args.enable_mig)
        if not args.dry_run:
            entries = gres.live_entries(backend.devices(), backend.instances(),
                                        gres.read_mig_minors())
            gres.save_record(state.state_dir, plan.layout, entries)
    if args.json:
        print_json(dict(plan.to_dict(), dry_run=args.dry_run, done=[s.to_dict() for s in done],
                        mode_change=advice))
    elif not done:
        print(f"node {node} matches MIG layout {plan.layout!r}: nothing to do")
    else:
        verb = "would" if args.dry_run else "did"
        print(f"node {node}, MIG layout {plan.layout!r}: {verb}")
        for step in done:
            print(f"  {step.describe()}")
    return 0


def _assert(args: argparse.Namespace) -> int:
    from slurmiso.cli.output import print_json

    cfg, pool, backend, state, node = _open(args)
    plan = _plan(args, cfg, pool, backend, state)
    diffs = plan.differences()
    advice = _mode_advice(cfg, node, backend, plan, args.json)
    if args.json:
        print_json({"layout": plan.layout, "matches": not diffs, "differences": diffs,
                    "mode_change": advice})
    elif diffs:
        print(f"node {node} does not match MIG layout {plan.layout!r}:")
        for line in diffs:
            print(f"  {line}")
    else:
        print(f"node {node} matches MIG layout {plan.layout!r}")
    return 1 if diffs else 0


def _mode_advice(cfg: Any, node: str, backend: Any, plan: Any, quiet: bool) -> List[str]:
    """Reset or not, and who holds the GPU, for each GPU whose MIG mode the layout changes;
    printed (to stderr) before anything is done, so a refused apply still says it."""
    import sys

    from slurmiso.mig.apply import mode_change_advice

    lines: List[str] = mode_change_advice(backend, plan, dev_root=cfg.paths.dev_root_for(node))
    if lines and not quiet:
        print("before the MIG mode change:", file=sys.stderr)
        for line in lines:
            print(f"  {line}", file=sys.stderr)
    return lines


def _show(args: argparse.Namespace) -> int:
    from slurmiso.cli.output import print_json, table
    from slurmiso.mig.claims import claimed_instances

    _cfg, _pool, backend, state, node = _open(args)
    claims = claimed_instances(state)
    devices = backend.devices()
    rows = []
    for inst in backend.instances():
        rows.append({**inst.to_dict(), "job": claims.get((inst.gpu_index, inst.gi_id), "")})
    profiles = _profiles(backend, devices) if args.profiles else {}
    if args.json:
        extra = {"profiles": profiles} if args.profiles else {}
        print_json({"node": node, "gpus": [d.to_dict() for d in devices], "instances": rows,
                    **extra})
        return 0
    for d in devices:
        pending = " (change pending)" if d.mig_pending != d.mig_enabled else ""
        arch = f" [{d.architecture}]" if d.architecture else ""
        print(f"GPU {d.index} {d.model or d.name}{arch} MIG "
              f"{'on' if d.mig_enabled else 'off'}{pending}")
    if rows:
        print(table(
            [(r["gpu_index"], r["gi_id"], r["ci_id"] if r["ci_id"] is not None else "-",
              r["profile"], r["placement_start"], r["uuid"] or "-", r["job"] or "-")
             for r in rows],
            ["GPU", "GI", "CI", "PROFILE", "START", "UUID", "JOB"]))
    else:
        print("no MIG instances")
    for text in (_profiles_text(entry) for entry in profiles.values()):
        print(text)
    return 0


def _profiles(backend: Any, devices: List[Any]) -> Dict[str, Dict[str, Any]]:
    """Per GPU model on the node (its first GPU): the backend's MIG profiles, the catalogue
    source when slurmiso has the table, else a catalogue entry built from them."""
    from slurmiso.gpu.catalogue import entry_text
    from slurmiso.gpu.profiles import lookup_model, model_from_driver

    out: Dict[str, Dict[str, Any]] = {}
    for d in devices:
        if d.name in out:
            continue
        found = backend.profiles(d.index)
        known = lookup_model(d.model or d.name)
        entry: Dict[str, Any] = {"gpu": d.index, "name": d.name, "model": d.model,
                                 "architecture": d.architecture,
                                 "profiles": [p.to_dict() for p in found]}
        if known is not None and known.mig_capable:
            entry["source"] = known.source
        elif found:
            made = model_from_driver(d.name, d.memory_total_mb, found, d.architecture)
            entry["catalogue_entry"] = entry_text(
                made, f"{backend.name} on this node (nvidia-smi mig -lgip / -lgipp)")
        out[d.name] = entry
    return out


def _profiles_text(entry: Dict[str, Any]) -> str:
    from slurmiso.cli.output import table

    head = f"MIG profiles of {entry['name']} (GPU {entry['gpu']})"
    if not entry["profiles"]:
        return (f"{head}: none reported; the GPU has no MIG, or MIG mode is off and the "
                "driver lists profiles only with it on (enable it on one idle GPU: 'slurmiso "
                "doctor' says whether that needs a reset)")
    rows = [(p["name"], p["profile_id"], p["compute_slices"], p["memory_slices"],
             p["memory_mb"], p["max_instances"],
             ",".join(map(str, p["placements"])) or "? (root needed)")
            for p in entry["profiles"]]
    text = head + "\n" + table(rows, ["PROFILE", "ID", "SLICES", "MEM SLICES", "MIB", "MAX",
                                      "STARTS"])
    if "source" in entry:
        return text + f"\ntable in slurmiso: {entry['source']}"
    return (text + "\nslurmiso has no MIG table for this GPU; to use it in a MIG pool, add "
            "this entry to slurmiso/gpu/catalogue.py (_MIG_MODELS) and cite NVIDIA's table:\n"
            + entry.get("catalogue_entry", ""))
