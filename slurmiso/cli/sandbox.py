"""``slurmiso sandbox up|down|status|demo``: a real Slurm cluster here, for tests and demos.

The sandbox itself is a development tool outside the runtime package (``slurmiso_sandbox``:
a source checkout, or the ``slurmiso-sandbox`` Debian package). This module only parses the
command line and imports it when a sandbox command runs; where it is absent the command fails
with one error saying how to get it.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import TYPE_CHECKING, Any, Dict

from slurmiso.errors import SandboxError

if TYPE_CHECKING:
    from types import ModuleType

#: The development package (not part of the slurmiso distribution).
SANDBOX_PACKAGE = "slurmiso_sandbox"

DIR_HELP = "sandbox directory (default: $SLURMISO_SANDBOX_DIR or /var/lib/slurmiso-sandbox)"


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "sandbox",
        help="run a local 5-node Slurm cluster with simulated GPUs (root)",
        description=(
            "A real Slurm cluster (slurmctld, slurmdbd, MariaDB, 5 slurmd) on this machine, one "
            "node per GPU mode, simulated GPUs. Everything lives under one directory; "
            "/etc/slurm is not touched. Point clients at it with SLURM_CONF."
        ),
    )
    sub = p.add_subparsers(dest="sandbox_command", metavar="ACTION")
    up = sub.add_parser("up", help="install what is missing, start what is not running")
    up.add_argument("--dir", help=DIR_HELP)
    up.add_argument("--json", action="store_true", help="print the step timings as JSON")
    up.add_argument("--force", action="store_true",
                    help="run on a host with a Slurm or munge setup the sandbox did not create "
                    "(/etc/slurm/slurm.conf, /etc/munge/munge.key, running daemons), and "
                    "record them as the sandbox's; only on a machine that is not a real "
                    "cluster's")
    up.add_argument("--from-packages", action="store_true",
                    help="run the installed slurmiso packages' hooks and SPANK plugins "
                    "(/usr/bin/slurmiso-prolog, /usr/lib/slurmiso/*.so) instead of the "
                    "checkout's; install them first (docs/admin-guide.md)")
    up.add_argument(
        "--slurm", metavar="RELEASE",
        help="Slurm release to run: 22.05, 24.11 or 26.05 (default: the host's own, or the "
        "one this dir was made with). A release the host lacks runs from a cached Debian "
        "root (debootstrap; 24.11: trixie, 26.05: sid). Ports: $SLURMISO_SANDBOX_PORT_BASE "
        "(default 16800) plus fixed offsets")
    up.add_argument(
        "--plain-gpu", metavar="MODEL[:MEMORY]",
        help="the GPU the exclusive, mps and timeslice nodes (n1, n2, n5) play, e.g. L40S, "
        "L4, RTX-4090, or any NAME:MEMORY (RTX-A5000:24G); MIG nodes keep H100-80GB. "
        "Default: $SLURMISO_SANDBOX_PLAIN_GPU, else what the dir was made with, else "
        "A100-80GB/H100-80GB")
    up.add_argument(
        "--cgroup", choices=("v1", "v2"),
        help="cgroup version of Slurm's cgroup plugin (CgroupPlugin=cgroup/v1|v2; default: "
        "$SLURMISO_SANDBOX_CGROUP, the one this dir was made with, else v1 where the host "
        "mounts the v1 devices controller). v2 on a hybrid host runs the Slurm daemons in a "
        "mount namespace with the cgroup2 hierarchy at /sys/fs/cgroup")
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="stop every sandbox process")
    down.add_argument("--dir", help=DIR_HELP)
    down.add_argument("--purge", action="store_true", help="also remove the sandbox directory")
    down.set_defaults(func=cmd_down)
    st = sub.add_parser("status", help="services and nodes of the sandbox")
    st.add_argument("--dir", help=DIR_HELP)
    st.add_argument("--json", action="store_true", help="machine-readable output")
    st.set_defaults(func=cmd_status)
    sync = sub.add_parser(
        "sync-gres",
        help="tell Slurm about the simulated GPUs' MIG instances as they are now",
        description=(
            "Rewrites gres.conf and the nodes' Gres= from the simulated GPUs' live MIG "
            "instances and restarts slurmctld and the slurmds when that changed them "
            "(Slurm 22.05 keeps GRES counts across 'scontrol reconfigure'). The sandbox's "
            "after-re-layout step: slurmiso monitor --after-relayout 'slurmiso sandbox "
            "sync-gres'. Drained nodes stay drained."
        ),
    )
    sync.add_argument("--dir", help=DIR_HELP)
    sync.set_defaults(func=cmd_sync_gres)
    demo = sub.add_parser(
        "demo",
        help="run a short mixed inference/training scenario on the running sandbox",
        description=(
            "Submits real jobs: a whole-GPU job, inference + training sharing one GPU through "
            "MIG and through MPS, a job slurmiso refuses, training preempted three times by "
            "inference, the monitor holding training off hot GPUs (partition-wide and per "
            "node), and the SLO ladder protecting running inference (the training beside it "
            "throttled, suspended, resumed); shows what each job saw and checks the GPUs are "
            "clean after. Exit 0 when every step held. Needs 'sandbox up'."
        ),
    )
    demo.add_argument("--dir", help=DIR_HELP)
    demo.add_argument("--json", action="store_true", help="also print the results as JSON")
    demo.set_defaults(func=cmd_demo)
    p.set_defaults(func=lambda args: _help(p))


def _help(p: argparse.ArgumentParser) -> int:
    p.print_help()
    return 2


def checkout_root(package_file: str) -> str:
    """The source checkout a ``slurmiso`` imported from ``package_file`` lives in, when that
    checkout has the sandbox beside it ("" otherwise: a wheel or a package install)."""
    from pathlib import Path  # not at import time: every 'slurmiso' command builds this parser

    root = Path(package_file).resolve().parent.parent
    return str(root) if (root / SANDBOX_PACKAGE / "__init__.py").is_file() else ""


def sandbox_module(name: str) -> ModuleType:
    """``slurmiso_sandbox.<name>``: installed, or from the checkout this slurmiso runs from
    (an editable install maps only the runtime package); else a SandboxError saying how to
    get it. A module missing *inside* the sandbox is not hidden behind that message."""
    full = f"{SANDBOX_PACKAGE}.{name}"
    try:
        return importlib.import_module(full)
    except ModuleNotFoundError as err:
        if err.name != SANDBOX_PACKAGE:
            raise
    import slurmiso

    root = checkout_root(slurmiso.__file__ or "")
    if not root:
        raise SandboxError(
            "the sandbox is a development tool and is not installed here",
            hint="install the slurmiso-sandbox package beside slurmiso (make deb, then "
            "docs/admin-guide.md section 13), or run it from a source checkout: "
            "python3 -m slurmiso sandbox ...")
    sys.path.insert(0, root)
    return importlib.import_module(full)


def cmd_up(args: argparse.Namespace) -> int:
    from slurmiso.cli.output import print_json, table

    cluster = sandbox_module("cluster")
    report = cluster.up(args.dir, args.slurm, from_packages=args.from_packages,
                        force=args.force, plain=args.plain_gpu, cgroup=args.cgroup)
    if args.json:
        print_json(cluster.report_dict(report))
        return 0
    rows = [(s.name, f"{s.seconds:.1f}s", s.detail) for s in report.steps]
    print(table(rows, ["step", "time", "detail"]))
    print(f"sandbox up in {report.seconds:.1f}s: cluster {report.site.root}"
          + (f" (Slurm {report.site.slurm} from {report.site.chroot})"
             if report.site.chroot else ""))
    print(f"export SLURM_CONF={report.site.slurm_conf}")
    print(f"export SLURMISO_CONFIG={report.site.slurmiso_yaml}")
    return 0


def cmd_sync_gres(args: argparse.Namespace) -> int:
    cluster = sandbox_module("cluster")
    changed = cluster.sync_gres(args.dir)
    conf = [c for c in changed if c.startswith("etc/")]
    print(f"GRES changed ({', '.join(conf)}): restarted slurmctld and the slurmds"
          if conf else "GRES unchanged: nothing restarted")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    client, demo = sandbox_module("client"), sandbox_module("demo")
    return int(demo.run_demo(args.dir or client.DEFAULT_DIR, args.json))


def cmd_down(args: argparse.Namespace) -> int:
    cluster = sandbox_module("cluster")
    report = cluster.down(args.dir, purge=args.purge)
    print(f"stopped: {', '.join(report.stopped) or 'nothing was running'}")
    for line in report.killed:
        print(f"killed leftover: {line}")
    if report.purged:
        print("removed the sandbox directory")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from slurmiso.cli.output import print_json

    data = sandbox_module("cluster").status(args.dir)
    if args.json:
        print_json(data)
    else:
        print(_status_text(data))
    running = all(s["running"] for s in data["services"])
    return 0 if running else 1


def _status_text(data: Dict[str, Any]) -> str:
    from slurmiso.cli.output import table

    lines = [f"sandbox {data['cluster']} in {data['dir']}"
             + ("" if data["exists"] else " (does not exist)"),
             f"slurm {data['slurm_version'] or 'unknown'}"
             + (f" from {data['slurm_root']}" if data["slurm_root"] else " (host)")
             + f", slurmctld port {data['ports']['slurmctld']}"
             + f", cgroup v{data.get('cgroup_version', 1)}"
             + (f" (mount namespace of pid {data['cgroup_namespace']['pid']})"
                if data.get("cgroup_namespace") else "")]
    rows = [(s["name"], "running" if s["running"] else "stopped", s["pid"] or "",
             "sandbox" if s.get("started_by_sandbox") else "")
            for s in data["services"]]
    lines.append(table(rows, ["service", "state", "pid", "owner"]))
    if data["nodes"]:
        lines.append("")
        lines.append(table([(n["name"], n["state"], n["reason"]) for n in data["nodes"]],
                           ["node", "state", "reason"]))
    user = data["test_user"]
    lines.append("")
    lines.append(f"test user: {user['name']} uid {user['uid'] if user['uid'] is not None else '-'}"
                 f"; hooks wired: {'yes' if data['hooks'] else 'no'}")
    lines.append(f"export SLURM_CONF={data['slurm_conf']}")
    lines.append(f"export SLURMISO_CONFIG={data['slurmiso_config']}")
    return "\n".join(lines)
