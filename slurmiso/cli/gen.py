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
  slurmiso gen config -o /etc/slurmiso/slurmiso.yaml   # the annotated example, to edit
  slurmiso gen systemd --dir /etc/systemd/system      # monitor and agent units
  slurmiso gen cron -o /etc/cron.d/slurmiso-audit
  slurmiso gen man --dir /usr/local/share/man         # slurmiso(1), slurmiso.yaml(5), ...
  slurmiso gen gres-conf                       # this node, from its live MIG instances
  slurmiso gen gres-conf --node gpu017 --from-layout
  slurmiso gen gres-conf --dev-root /srv/sandbox/dev --node-prefix   # stand-in devices
  slurmiso gen job-submit -o /etc/slurm/job_submit.lua
  slurmiso gen plugstack -o /etc/slurm/plugstack.conf.d/slurmiso.conf
  slurmiso gen slurm-conf --slurm-version 22.05.8
  slurmiso gen oci-conf --ckpt-root /scratch -o /etc/slurm/oci.conf
  slurmiso gen enroot-mounts --ckpt-root /scratch -o /etc/enroot/mounts.d/50-slurmiso.fstab
  slurmiso gen apptainer-binds --ckpt-root /scratch
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


def _write(text: str, path: str, overwrite: bool = True) -> None:
    from slurmiso.cli.output import write_text

    write_text(text, path, overwrite=overwrite)


def _bindir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bindir", default=None, metavar="DIR",
                        help="where the slurmiso scripts are (default: this installation's, "
                        "found from the running slurmiso)")


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
    from slurmiso.errors import UsageError
    from slurmiso.gpu.profiles import lookup_model
    from slurmiso.hostlist import node_name
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
    p.add_argument("--prefix", default=None, metavar="DIR",
                   help="where the slurmiso-prolog/-epilog/-task-prolog scripts are "
                   "(default: this installation's scripts directory, e.g. /usr/bin for the "
                   "packages, VENV/bin for pip)")
    p.add_argument("--slurm-version", default=None, metavar="X.Y.Z",
                   help="the cluster's Slurm release (default: asked of scontrol --version "
                   "or slurmd -V here); settings newer Slurm added are left out for older")
    _output(p)
    p.set_defaults(func=_gen_slurm_conf)


def _gen_slurm_conf(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config
    from slurmiso.errors import UsageError
    from slurmiso.install import scripts_dir
    from slurmiso.slurm import slurmconf
    from slurmiso.slurm.client import SlurmCli, parse_version

    cfg = load_config(args.config)
    if args.slurm_version:
        version = parse_version(args.slurm_version)
        if version is None:
            raise UsageError(f"--slurm-version {args.slurm_version!r} is not a Slurm release",
                             hint="e.g. --slurm-version 22.05.8")
    else:
        version = SlurmCli(timeout=10).version()
    _write(slurmconf.render(cfg, args.prefix or scripts_dir(), cfg.source, version),
           args.output)
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
    import os

    from slurmiso.install import PACKAGE_FENCE_PLUGIN, PACKAGE_SPANK_PLUGIN
    from slurmiso.submit.plugstack import DEFAULT_FENCE_PLUGIN, DEFAULT_PLUGIN

    if os.path.exists(PACKAGE_SPANK_PLUGIN):  # the slurmiso-spank package is installed
        DEFAULT_PLUGIN = PACKAGE_SPANK_PLUGIN
        DEFAULT_FENCE_PLUGIN = PACKAGE_FENCE_PLUGIN
    p = sub.add_parser(
        "plugstack", help="plugstack.conf line for the slurmiso SPANK plugin",
        description="The plugstack.conf lines loading spank/slurmiso.so with the config's job "
        "classes and MIG profiles as allow-lists, so sbatch refuses other --iso-class and "
        "--iso-mig-profile values, and slurmiso_fence.so, which closes in each task's device "
        "cgroup what the prolog fenced (docs/security.md).",
    )
    p.add_argument("--plugin", default=DEFAULT_PLUGIN, metavar="PATH",
                   help=f"where the plugin is installed (default {DEFAULT_PLUGIN})")
    p.add_argument("--fence-plugin", default=DEFAULT_FENCE_PLUGIN, metavar="PATH",
                   help="where the device-fence plugin is installed (default "
                   f"{DEFAULT_FENCE_PLUGIN}); '' leaves it out (refused jobs then keep their "
                   "GPU: doctor reports it)")
    _output(p)
    p.set_defaults(func=_gen_plugstack)


def _gen_plugstack(args: argparse.Namespace) -> int:
    from slurmiso.config import load_config
    from slurmiso.submit.plugstack import render_plugstack

    _write(render_plugstack(load_config(args.config), args.plugin, args.fence_plugin),
           args.output)
    return 0


# -------------------------------------------------------------------- cgroup.conf
def _add_cgroup_conf(sub: Any) -> None:
    p = sub.add_parser(
        "cgroup-conf", help="cgroup.conf for GPU nodes (the device constraint)",
        description="cgroup.conf with ConstrainDevices=yes (and cores, memory): without it a "
        "job can open every GPU of its node. Use v1 on a hybrid hierarchy (the device fence "
        "for mig-dynamic pools and refused jobs needs it), v2 on a pure unified one.",
    )
    p.add_argument("--cgroup", choices=("v1", "v2"), default="v1",
                   help="CgroupPlugin to name (default v1)")
    _output(p)
    p.set_defaults(func=_gen_cgroup_conf)


def _gen_cgroup_conf(args: argparse.Namespace) -> int:
    from slurmiso.slurm.slurmconf import render_cgroup_conf

    _write(render_cgroup_conf(args.cgroup), args.output)
    return 0


# ------------------------------------------------------------------- containers
def _container_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--node", default="",
                   help="node whose state dir to name when paths.state_dir has %%n "
                   "(default: $SLURMD_NODENAME or host)")
    p.add_argument("--ckpt-root", action="append", default=[], metavar="DIR",
                   help="host directory holding jobs' checkpoint and working directories, "
                   "bound at the same path (repeatable; e.g. /scratch)")
    _output(p)


def _bind_roots(args: argparse.Namespace) -> Any:
    from slurmiso.config import load_config
    from slurmiso.hostlist import node_name
    from slurmiso.slurm.containers import bind_roots

    cfg = load_config(args.config)
    return cfg, bind_roots(cfg, node_name(args.node), args.ckpt_root)


def _add_oci_conf(sub: Any) -> None:
    from slurmiso.slurm.ociconf import GATE, RUNTIMES

    p = sub.add_parser(
        "oci-conf", help="oci.conf for Slurm's --container, each line with its reason",
        description="oci.conf (next to slurm.conf) for Slurm 23.02 or later with crun or runc, "
        "and, as comments, the config.json mounts every bundle needs (oci.conf cannot bind "
        "a path). 'slurmiso doctor' checks a live oci.conf against the same table.",
    )
    p.add_argument("--runtime", choices=RUNTIMES, default="crun",
                   help="the OCI runtime slurmstepd calls (default crun)")
    p.add_argument("--slurm-version", default=None, metavar="X.Y.Z",
                   help="the cluster's Slurm (default: asked of scontrol/slurmd); 22.05 is "
                   "refused: its containers never see slurmiso's environment")
    p.add_argument("--config-json", action="store_true",
                   help="print only the config.json 'mounts' entries, as JSON")
    p.add_argument("--gate", default=GATE, metavar="PATH",
                   help=f"slurmiso-oci-gate as installed on the nodes (default {GATE}); "
                   "RunTimeRun runs through it")
    _container_args(p)
    p.set_defaults(func=_gen_oci_conf)


def _gen_oci_conf(args: argparse.Namespace) -> int:
    from slurmiso.errors import UsageError
    from slurmiso.slurm import ociconf
    from slurmiso.slurm.containers import CKPT_DEFAULT_NOTE, config_json_fragment

    cfg, roots = _bind_roots(args)
    if args.config_json:
        _write(config_json_fragment(roots), args.output)
        return 0
    version = _slurm_version(args.slurm_version)
    if not ociconf.env_after_task_prolog(version):
        raise UsageError(
            f"Slurm {version[0]}.{version[1]:02d}.{version[2]} writes a container's config.json "
            "before GRES and the TaskProlog set the job's environment: CUDA_VISIBLE_DEVICES and "
            "slurmiso's MPS variables never reach the container",
            hint="run isolated GPU jobs with --container on Slurm 23.02 or later")
    notes = [] if args.ckpt_root else [CKPT_DEFAULT_NOTE]
    _write(ociconf.render_oci_conf(roots, args.runtime, cfg.source, notes,
                                            gate=args.gate), args.output)
    return 0


def _slurm_version(text: Any) -> Any:
    """--slurm-version parsed, else the live cluster's release."""
    from slurmiso.errors import UsageError
    from slurmiso.slurm.client import SlurmCli, parse_version

    if not text:
        return SlurmCli(timeout=10).version()
    version = parse_version(text)
    if version is None:
        raise UsageError(f"--slurm-version {text!r} is not a Slurm release",
                         hint="e.g. --slurm-version 24.11.5")
    return version


#: The runtimes' bind files: (help, description, the renderer in slurm/containers.py).
_BIND_FILES = {
    "enroot-mounts": (
        "/etc/enroot/mounts.d file binding slurmiso's directories",
        "An enroot mounts.d file (pyxis runs containers through enroot) binding the MPS pipe "
        "root and the checkpoint roots at the same path inside every container.",
        "render_enroot_mounts"),
    "apptainer-binds": (
        "apptainer.conf 'bind path' lines (and APPTAINER_BIND)",
        "'bind path' lines for apptainer.conf binding the MPS pipe root and the checkpoint "
        "roots at the same path, and the APPTAINER_BIND value doing the same.",
        "render_apptainer_binds"),
}


def _bind_file_adder(name: str) -> Any:
    """The ``gen`` subcommand writing one runtime's bind file (:data:`_BIND_FILES`)."""
    help_text, description, renderer = _BIND_FILES[name]

    def add(sub: Any) -> None:
        p = sub.add_parser(name, help=help_text, description=description)
        _container_args(p)
        p.set_defaults(func=lambda args: _gen_bind_file(args, renderer))

    return add


def _gen_bind_file(args: argparse.Namespace, renderer: str) -> int:
    from slurmiso.slurm import containers

    cfg, roots = _bind_roots(args)
    notes = [] if args.ckpt_root else [containers.CKPT_DEFAULT_NOTE]
    _write(getattr(containers, renderer)(roots, cfg.source, notes), args.output)
    return 0


# ------------------------------------------------- shipped files: config, units, cron
def _add_config(sub: Any) -> None:
    p = sub.add_parser(
        "config", help="the annotated example slurmiso.yaml",
        description="The shipped, annotated example configuration (every key with a comment), "
        "to copy to /etc/slurmiso/slurmiso.yaml and edit. 'slurmiso check-config' then lists "
        "every problem in it.",
    )
    _output(p)
    p.add_argument("--force", action="store_true", help="replace an existing -o file")
    p.set_defaults(func=_gen_config)


def _gen_config(args: argparse.Namespace) -> int:
    from slurmiso.install import asset_text

    _write(asset_text("slurmiso.yaml"), args.output, overwrite=args.force)
    return 0


def with_bindir(text: str, bindir: str) -> str:
    """A shipped unit or cron file pointed at ``bindir`` (they name the packages' /usr/bin)."""
    from slurmiso.install import PACKAGE_BINDIR

    bindir = bindir.rstrip("/") or "/"
    if bindir == PACKAGE_BINDIR:
        return text
    text = text.replace(f"{PACKAGE_BINDIR}/slurmiso", f"{bindir}/slurmiso")
    return text.replace("PATH=/usr/bin:/bin", f"PATH={bindir}:/usr/bin:/bin")


UNITS = ("slurmiso-monitor.service", "slurmiso-agent.service")


def _add_systemd(sub: Any) -> None:
    p = sub.add_parser(
        "systemd", help="systemd units for the monitor and the agent",
        description="slurmiso-monitor.service (controller) and slurmiso-agent.service (GPU "
        "nodes), with ExecStart= naming this installation's slurmiso. With --dir, one file "
        "each there (then: systemctl daemon-reload); without, both on stdout.",
    )
    p.add_argument("--dir", default="", metavar="DIR",
                   help="write the unit files into DIR (e.g. /etc/systemd/system)")
    _bindir(p)
    p.set_defaults(func=_gen_systemd)


def _gen_systemd(args: argparse.Namespace) -> int:
    import os

    from slurmiso.install import asset_text, scripts_dir

    bindir = args.bindir or scripts_dir()
    texts = {u: with_bindir(asset_text(f"systemd/{u}"), bindir) for u in UNITS}
    if args.dir:
        for unit, text in texts.items():
            _write(text, os.path.join(args.dir, unit))
        return 0
    sys.stdout.write("\n".join(f"# ---- {u}\n{t}" for u, t in texts.items()))
    return 0


def _add_cron(sub: Any) -> None:
    p = sub.add_parser(
        "cron", help="the daily audit cron file (/etc/cron.d/slurmiso-audit)",
        description="The cron.d file that mails the admins yesterday's audit every morning; "
        "its PATH names this installation's scripts directory. Edit MAILTO.",
    )
    _output(p)
    _bindir(p)
    p.set_defaults(func=_gen_cron)


def _gen_cron(args: argparse.Namespace) -> int:
    from slurmiso.install import asset_text, scripts_dir

    _write(with_bindir(asset_text("cron.d/slurmiso-audit"), args.bindir or scripts_dir()),
           args.output)
    return 0


def _add_man(sub: Any) -> None:
    p = sub.add_parser(
        "man", help="man pages slurmiso(1), slurmiso.yaml(5), slurmiso-prolog(8)",
        description="Render the man pages from the command-line definitions and the config "
        "schema (the packages run this at build time). With --dir, writes DIR/man1/... "
        "(then: mandb); with --page NAME, one page to -o/stdout.",
    )
    p.add_argument("--dir", default="", metavar="DIR", help="man root, e.g. /usr/local/share/man")
    p.add_argument("--page", default="slurmiso.1", metavar="NAME",
                   help="page for -o/stdout: slurmiso.1, slurmiso.yaml.5 or slurmiso-prolog.8")
    _output(p)
    p.set_defaults(func=_gen_man)


def _gen_man(args: argparse.Namespace) -> int:
    import os

    from slurmiso.cli import manpage
    from slurmiso.errors import UsageError

    pages = manpage.all_pages()
    if args.dir:
        for name, text in pages.items():
            section_dir = os.path.join(args.dir, f"man{name.rsplit('.', 1)[1]}")
            os.makedirs(section_dir, exist_ok=True)
            _write(text, os.path.join(section_dir, name))
        return 0
    if args.page not in pages:
        raise UsageError(f"no man page {args.page!r}", hint=f"pages: {', '.join(pages)}")
    _write(pages[args.page], args.output)
    return 0


def _add_completion(sub: Any) -> None:
    p = sub.add_parser(
        "completion", help="bash completion for slurmiso",
        description="Bash completion generated from the command-line definitions. Install as "
        "/usr/share/bash-completion/completions/slurmiso (or source it).",
    )
    _output(p)
    p.set_defaults(func=_gen_completion)


def _gen_completion(args: argparse.Namespace) -> int:
    from slurmiso.cli import manpage

    _write(manpage.bash_completion(), args.output)
    return 0


#: Target name -> function adding its subparser.
TARGETS: Dict[str, Callable[[Any], None]] = {
    "gres-conf": _add_gres_conf,
    "slurm-conf": _add_slurm_conf,
    "job-submit": _add_job_submit,
    "plugstack": _add_plugstack,
    "cgroup-conf": _add_cgroup_conf,
    "oci-conf": _add_oci_conf,
    "enroot-mounts": _bind_file_adder("enroot-mounts"),
    "apptainer-binds": _bind_file_adder("apptainer-binds"),
    "config": _add_config,
    "systemd": _add_systemd,
    "cron": _add_cron,
    "man": _add_man,
    "completion": _add_completion,
}
