"""``slurmiso mig``: lay out, check and show a node's static MIG layout (mig-parted style).

``apply`` asserts first and acts only on differences, so running it twice changes nothing;
``assert`` is the same plan without acting (exit 1 with the differences); ``show`` lists the
instances and which job holds each.
"""

from __future__ import annotations

import argparse
from typing import Any, Tuple

_EPILOG = """\
examples:
  slurmiso mig assert                      # does this node match its pool's layout?
  slurmiso mig apply --dry-run             # what would change
  slurmiso mig apply                       # make it so (instances in use are never touched)
  slurmiso mig apply --layout all-3g.40gb --enable-mig   # simulated GPUs only
  slurmiso mig show --json

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
    if model is None:
        raise UsageError(f"unknown GPU model {pool.gpu_model!r}")
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
        journal = Journal(cfg.paths.journal_for(node))
        done = apply_plan(backend, plan, journal, dry_run=args.dry_run,
                          enable_mig=args.enable_mig)
        if not args.dry_run:
            entries = gres.live_entries(backend.devices(), backend.instances(),
                                        gres.read_mig_minors())
            gres.save_record(state.state_dir, plan.layout, entries)
    if args.json:
        print_json(dict(plan.to_dict(), dry_run=args.dry_run, done=[s.to_dict() for s in done]))
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
    if args.json:
        print_json({"layout": plan.layout, "matches": not diffs, "differences": diffs})
    elif diffs:
        print(f"node {node} does not match MIG layout {plan.layout!r}:")
        for line in diffs:
            print(f"  {line}")
    else:
        print(f"node {node} matches MIG layout {plan.layout!r}")
    return 1 if diffs else 0


def _show(args: argparse.Namespace) -> int:
    from slurmiso.cli.output import print_json, table
    from slurmiso.mig.claims import claimed_instances

    _cfg, _pool, backend, state, node = _open(args)
    claims = claimed_instances(state)
    devices = backend.devices()
    rows = []
    for inst in backend.instances():
        rows.append({**inst.to_dict(), "job": claims.get((inst.gpu_index, inst.gi_id), "")})
    if args.json:
        print_json({"node": node, "gpus": [d.to_dict() for d in devices], "instances": rows})
        return 0
    for d in devices:
        print(f"GPU {d.index} {d.model or d.name} MIG {'on' if d.mig_enabled else 'off'}")
    if rows:
        print(table(
            [(r["gpu_index"], r["gi_id"], r["ci_id"] if r["ci_id"] is not None else "-",
              r["profile"], r["placement_start"], r["uuid"] or "-", r["job"] or "-")
             for r in rows],
            ["GPU", "GI", "CI", "PROFILE", "START", "UUID", "JOB"]))
    else:
        print("no MIG instances")
    return 0
