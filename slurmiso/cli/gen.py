"""``slurmiso gen``: generate Slurm configuration that matches the slurmiso config.

One subcommand per target file, each a ``_gen_<target>`` function registered in
:data:`TARGETS`; output goes to stdout (or ``-o FILE``) with a header saying it is generated.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Dict

_EPILOG = """\
examples:
  slurmiso gen gres-conf                       # this node, from its live MIG instances
  slurmiso gen gres-conf --node gpu017 --from-layout
  slurmiso gen gres-conf --dev-root /srv/sandbox/dev --node-prefix   # stand-in devices
  slurmiso gen job-submit -o /etc/slurm/job_submit.lua
  slurmiso gen plugstack -o /etc/slurm/plugstack.conf.d/slurmiso.conf
  slurmiso gen slurm-conf --prefix /opt/slurmiso/bin
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "gen", help="generate Slurm config (gres.conf, ...) from the slurmiso config",
        description=__doc__.splitlines()[0].split(": ", 1)[1], epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="gen_target", metavar="TARGET", required=True)
    for adder in TARGETS.values():
        adder(sub)


def _output(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", metavar="FILE", default="-",
                        help="write here instead of stdout")


def _write(text: str, path: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    from slurmiso.errors import UsageError

    try:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


# ------------------------------------------------------------------------- gres.conf
def _add_gres_conf(sub: Any) -> None:
    p = sub.add_parser(
        "gres-conf", help="gres.conf lines for a node's pool",
        description="gres.conf for a node: whole GPUs, MPS or shard counts, or one MIG-typed "
        "gpu per instance in the order the mig-static prolog maps SLURM_JOB_GPUS.",
    )
    p.add_argument("--node", default="", help="node name (default: $SLURMD_NODENAME or host)")
    p.add_argument("--dev-root", default="/dev", metavar="DIR",
                   help="device folder to name (default /dev; the sandbox uses stand-ins)")
    p.add_argument("--proc-root", default="/proc", metavar="DIR",
                   help="where to find driver/nvidia-caps/mig-minors (default /proc)")
    p.add_argument("--from-layout", action="store_true",
                   help="mig-static: from the pool's planned layout, not the live instances")
    p.add_argument("--node-prefix", action="store_true",
                   help="start each line with NodeName=NODE (one file for several nodes)")
    _output(p)
    p.set_defaults(func=_gen_gres_conf)


def _gen_gres_conf(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config
    from slurmiso.config.model import node_name
    from slurmiso.errors import UsageError
    from slurmiso.gpu.profiles import lookup_model
    from slurmiso.mig import gres

    cfg = load_config(args.config)
    node = node_name(args.node)
    pool = cfg.node_pool(node)
    entries = None
    source = ""
    if pool.mode == "mig-static":
        minors = gres.read_mig_minors(args.proc_root)
        if args.from_layout:
            layout = cfg.mig_layout(pool.mig_layout)
            model = lookup_model(pool.gpu_model)
            if layout is None or model is None:
                raise UsageError(f"pool {pool.name} has no usable mig_layout")
            entries = gres.layout_entries(model, layout, pool.gpus_per_node, minors,
                                          args.dev_root)
            source = (f"MIG layout {layout.name!r} as planned (GI ids predicted for a fresh "
                      "'mig apply'; on real GPUs regenerate from the live instances)")
        else:
            from slurmiso.gpu import open_backend

            backend = open_backend(cfg.gpu.backend, cfg.gpu.sim_state, node)
            entries = gres.live_entries(backend.devices(), backend.instances(), minors,
                                        args.dev_root)
            source = "live MIG instances" + (" and mig-minors" if minors else "")
    _write(gres.render_gres_conf(pool, node, entries, args.dev_root, source,
                                 node_prefix=args.node_prefix), args.output)
    return 0


# ------------------------------------------------------------------------ slurm.conf
def _add_slurm_conf(sub: Any) -> None:
    p = sub.add_parser(
        "slurm-conf", help="the slurm.conf lines slurmiso needs, each with its reason",
        description="slurm.conf settings slurmiso relies on (preemption, requeue, hooks, "
        "GRES, accounting) and one partition per pool, with NodeName Gres= hints. "
        "'slurmiso doctor' checks a live cluster against the same table.",
    )
    p.add_argument("--prefix", default="/usr/local/bin", metavar="DIR",
                   help="where the slurmiso-prolog/-epilog/-task-prolog scripts are "
                   "(default /usr/local/bin)")
    _output(p)
    p.set_defaults(func=_gen_slurm_conf)


def _gen_slurm_conf(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config
    from slurmiso.slurm import slurmconf

    cfg = load_config(args.config)
    _write(slurmconf.render(cfg, args.prefix, cfg.source), args.output)
    return 0


# ---------------------------------------------------------------- job_submit.lua
def _add_job_submit(sub: Any) -> None:
    p = sub.add_parser(
        "job-submit", help="job_submit.lua (and cli_filter.lua) enforcing the job classes",
        description="The Lua script slurmctld's job_submit/lua runs on every submission: "
        "classifies the job as the Prolog will, fills the class's defaults (--requeue, time "
        "limit) and rejects what would fail later, with a message naming the fix. Install it "
        "next to slurm.conf as job_submit.lua (JobSubmitPlugins=lua) and, for the --signal "
        "default and check, as cli_filter.lua too (CliFilterPlugins=lua).",
    )
    _output(p)
    p.set_defaults(func=_gen_job_submit)


def _gen_job_submit(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config
    from slurmiso.submit.job_submit import render_job_submit

    _write(render_job_submit(load_config(args.config)), args.output)
    return 0


# ---------------------------------------------------------------- plugstack.conf
def _add_plugstack(sub: Any) -> None:
    from slurmiso.submit.plugstack import DEFAULT_PLUGIN

    p = sub.add_parser(
        "plugstack", help="plugstack.conf line for the slurmiso SPANK plugin",
        description="The plugstack.conf line loading spank/slurmiso.so with the config's job "
        "classes and MIG profiles as allow-lists, so sbatch refuses other --iso-class and "
        "--iso-mig-profile values.",
    )
    p.add_argument("--plugin", default=DEFAULT_PLUGIN, metavar="PATH",
                   help=f"where the plugin is installed (default {DEFAULT_PLUGIN})")
    _output(p)
    p.set_defaults(func=_gen_plugstack)


def _gen_plugstack(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config
    from slurmiso.submit.plugstack import render_plugstack

    _write(render_plugstack(load_config(args.config), args.plugin), args.output)
    return 0


#: Target name -> function adding its subparser.
TARGETS: Dict[str, Callable[[Any], None]] = {
    "gres-conf": _add_gres_conf,
    "slurm-conf": _add_slurm_conf,
    "job-submit": _add_job_submit,
    "plugstack": _add_plugstack,
}
