"""``slurmiso check-config [PATH]``: validate a config file and list every problem in it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from slurmiso.cli.output import print_json


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "check-config",
        help="validate a slurmiso.yaml and list every problem",
        description=(
            "Load PATH (default: --config, $SLURMISO_CONFIG or /etc/slurmiso/slurmiso.yaml) "
            "strictly: unknown keys, wrong types, MIG profiles the pool's GPU does not have, "
            "MPS shares outside 1..100, limits larger than the GPU, duplicate names. "
            "Exit 0 when valid, 2 when not."
        ),
        epilog="example: slurmiso check-config etc/slurmiso.yaml",
    )
    p.add_argument("path", nargs="?", help="config file to check")
    p.add_argument("--json", action="store_true", help="machine-readable result")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from slurmiso.config import config_path, load_config
    from slurmiso.errors import ConfigError

    path = config_path(args.path or args.config)
    try:
        cfg = load_config(path)
    except ConfigError as err:
        if args.json:
            print_json({"ok": False, "path": path, "error": err.message, "problems": err.problems})
        else:
            print(f"slurmiso: error: {err}", file=sys.stderr)
        return 2
    classes = [c.name for c in cfg.classes]
    pools = {p.name: p.mode for p in cfg.pools}
    layouts = [m.name for m in cfg.mig_layouts]
    if args.json:
        print_json(
            {
                "ok": True,
                "path": path,
                "warnings": list(cfg.warnings),
                "classes": classes,
                "pools": pools,
                "mig_layouts": layouts,
                "default_class": cfg.default_class,
            }
        )
        return 0
    for w in cfg.warnings:
        print(f"slurmiso: warning: {w}", file=sys.stderr)
    print(f"{path}: OK")
    print(f"  classes: {', '.join(classes)} (default: {cfg.default_class or 'none'})")
    print(f"  pools:   {', '.join(f'{n} ({m})' for n, m in pools.items()) or 'none'}")
    print(f"  MIG layouts: {', '.join(layouts) or 'none'}")
    return 0
