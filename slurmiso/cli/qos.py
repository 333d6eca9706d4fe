"""``slurmiso qos apply|show``: make slurmdbd's QoS what the config's classes say.

``apply`` prints the plan first, then acts (assert, then act: a second run changes nothing);
``show`` only compares and exits 1 when slurmdbd and the config differ, so cron can watch it.
"""

from __future__ import annotations

import argparse
from typing import Any, List

from slurmiso.cli.output import print_json, table

_EPILOG = """\
examples:
  slurmiso qos apply --dry-run        # what would change
  slurmiso qos apply                  # create/update infer, train, debug; grant them
  slurmiso qos show                   # live QoS vs config; exit 1 when they differ
"""


def add_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "qos", help="create/update the classes' QoS in slurmdbd (sacctmgr) and compare them",
        description=__doc__.splitlines()[0].split(": ", 1)[1], epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    qsub = parser.add_subparsers(dest="qos_command", metavar="ACTION", required=True)
    a = qsub.add_parser("apply", help="create or update QoS and grants (prints the diff first)")
    a.add_argument("--dry-run", action="store_true", help="print the changes, make none")
    a.add_argument("--json", action="store_true", help="machine-readable output")
    a.set_defaults(func=run_apply)
    s = qsub.add_parser("show", help="live QoS next to the config's; exit 1 if they differ")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=run_show)


def _grant_note(plan: Any) -> List[str]:
    out = []
    if not plan.grants_managed:
        out.append("note: no class lists qos.accounts; QoS grants to accounts are left alone "
                   "(grant with: sacctmgr modify account where name=A set qos+=Q)")
    for acct in plan.unknown_accounts:
        out.append(f"error: account {acct!r} in qos.accounts does not exist in slurmdbd "
                   f"(create it: sacctmgr add account {acct}, or remove it from the config)")
    return out


def run_apply(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config
    from slurmiso.errors import SlurmisoError
    from slurmiso.slurm import qos
    from slurmiso.slurm.client import SlurmCli

    cfg = load_config(args.config)
    cli = SlurmCli(timeout=30)
    plan = qos.plan(cfg, cli)
    if plan.unknown_accounts and not args.dry_run:
        raise SlurmisoError(
            f"accounts {', '.join(plan.unknown_accounts)} in qos.accounts do not exist in "
            "slurmdbd; nothing was changed",
            hint="create them with 'sacctmgr add account NAME' or fix the config",
        )
    if not args.dry_run and plan.changes:
        qos.apply_changes(cli, plan.changes)
    if args.json:
        print_json(dict(plan.to_dict(), dry_run=args.dry_run, applied=not args.dry_run))
        return 0
    for c in plan.changes:
        print(c.describe())
    for line in _grant_note(plan):
        print(line)
    if not plan.changes:
        print("nothing to change")
    elif args.dry_run:
        print(f"dry run: {len(plan.changes)} change(s) not made")
    else:
        print(f"applied {len(plan.changes)} change(s)")
    return 0


def run_show(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config
    from slurmiso.slurm import qos
    from slurmiso.slurm.client import SlurmCli

    cfg = load_config(args.config)
    cli = SlurmCli(timeout=30)
    live = qos.read_live(cli)
    plan = qos.plan(cfg, cli)
    differs = bool(plan.changes or plan.unknown_accounts)
    desired = qos.desired_qos(cfg)
    if args.json:
        print_json({
            "in_sync": not differs,
            "qos": {q.name: {f: q.value(f) for f in qos.FIELDS} for q in desired},
            "live": {n: {f: q.value(f) for f in qos.FIELDS} for n, q in live.items()
                     if n in {d.name for d in desired}},
            **plan.to_dict(),
        })
        return 1 if differs else 0
    rows = []
    for want in desired:
        have = live.get(want.name)
        for f in qos.FIELDS:
            target = want.value(f)
            current = (have.value(f) if have else None) or ""
            mark = "" if target is None or current.lower() == target.lower() else "DIFFERS"
            if have is None:
                mark = "MISSING"
            rows.append([want.name, f, current or "-",
                         "(not managed)" if target is None else target or "-", mark])
    print(table(rows, ["QOS", "FIELD", "LIVE", "CONFIG", ""]))
    for line in _grant_note(plan):
        print(line)
    for c in plan.changes:
        if c.action == "grant":
            print(c.describe().replace("+ ", "missing: ", 1))
    print("QoS differ from the config: run 'slurmiso qos apply'" if differs
          else "QoS match the config")
    return 1 if differs else 0
