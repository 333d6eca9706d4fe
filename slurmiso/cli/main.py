"""The ``slurmiso`` command: a thin dispatcher over one module per subcommand.

Each subcommand module exposes ``add_parser(subparsers)`` which registers its parser and sets
``func`` (``args -> int``). Modules keep heavy imports inside their functions so that building
the parser (and ``--help``) stays fast. Errors are mapped to exit codes here, in one place.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from typing import List, Optional

from slurmiso import __version__
from slurmiso.errors import SlurmisoError, exit_code_for

#: Subcommand modules, in the order ``--help`` lists them.
SUBCOMMANDS = [
    "slurmiso.cli.check_config",
    "slurmiso.cli.sim",
    "slurmiso.cli.sandbox",
    "slurmiso.cli.status",
    "slurmiso.cli.reconcile",
    "slurmiso.cli.hooks",
    "slurmiso.cli.mig",
    "slurmiso.cli.gen",
    "slurmiso.cli.run",
    "slurmiso.cli.audit",
    "slurmiso.cli.qos",
    "slurmiso.cli.doctor",
    "slurmiso.cli.probe",
    "slurmiso.cli.signals",
    "slurmiso.cli.agent",
    "slurmiso.cli.monitor",
]

log = logging.getLogger("slurmiso")
CONFIG_HELP = "config file (default: $SLURMISO_CONFIG or /etc/slurmiso/slurmiso.yaml)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slurmiso",
        description=(
            "Run GPU training and inference on one Slurm cluster without one hurting the "
            "other: job classes, per-job GPU isolation, checkpoint on preemption."
        ),
        epilog="Run 'slurmiso COMMAND --help' for the options of each command.",
    )
    parser.add_argument("--version", action="version", version=f"slurmiso {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)"
    )
    parser.add_argument("-c", "--config", metavar="PATH", help=CONFIG_HELP)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:  # a subcommand not built yet must not break the rest
            if exc.name != name:
                raise
            continue
        module.add_parser(sub)
    _config_everywhere(parser)
    return parser


def _config_everywhere(parser: argparse.ArgumentParser) -> None:
    """Accept ``-c/--config`` after the subcommand too (``slurmiso doctor -c F``), as admins
    type it. SUPPRESS keeps an absent sub-level option from hiding the top-level one."""
    for action in parser._actions:
        if not isinstance(action, argparse._SubParsersAction):
            continue
        for child in {id(p): p for p in action.choices.values()}.values():
            try:
                child.add_argument("-c", "--config", metavar="PATH", default=argparse.SUPPRESS,
                                   help=CONFIG_HELP)
            except argparse.ArgumentError:  # the subcommand uses -c itself: its meaning wins
                pass
            _config_everywhere(child)


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=[logging.WARNING, logging.INFO, logging.DEBUG][min(args.verbose, 2)],
        format="slurmiso: %(levelname)s: %(message)s",
        stream=sys.stderr,
    )
    if not getattr(args, "func", None):
        # A bare 'slurmiso' is a question ("what can this do?"), answered like --help: on
        # stdout, exit 0. Scripts never call it bare; a wrong subcommand still exits 2.
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except SlurmisoError as err:
        print(f"slurmiso: error: {err}", file=sys.stderr)
        return exit_code_for(err)
    except KeyboardInterrupt:
        print("slurmiso: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
