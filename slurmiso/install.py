"""Where this installation of slurmiso lives: its console scripts and its shipped files.

Generated configuration (slurm.conf hook lines, systemd units, the cron file) must name the
scripts of *this* installation: ``/usr/bin`` for the Debian and RPM packages, ``VENV/bin`` for
a pip install into a virtual environment. Nothing here assumes ``/usr/local/bin``.

The example config, units, cron file and plugstack snippet live under ``etc/`` in the source
tree and are copied into the package as ``slurmiso/data/etc/`` when a wheel is built (see
setup.py), so ``slurmiso gen config|systemd|cron`` work from a wheel as from a checkout.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from typing import List, Optional

#: Where the Debian and RPM packages put the console scripts (docs/admin-guide.md).
PACKAGE_BINDIR = "/usr/bin"
#: Where the slurmiso-spank package puts the SPANK plugin.
PACKAGE_SPANK_PLUGIN = "/usr/lib/slurmiso/slurmiso.so"
PACKAGE_FENCE_PLUGIN = "/usr/lib/slurmiso/slurmiso_fence.so"
#: The scripts a generated config names; all of them sit in one directory.
SCRIPTS = ("slurmiso", "slurmiso-prolog", "slurmiso-epilog", "slurmiso-task-prolog",
           "slurmiso-oci-gate")

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))


def scripts_dir(argv0: Optional[str] = None) -> str:
    """The directory holding ``slurmiso-prolog`` and friends for this installation.

    Tried in order: the directory of the running console script, the interpreter's scripts
    directory (a venv's ``bin``), the interpreter's own directory, then ``PATH``. The first
    that holds an executable ``slurmiso-prolog`` wins; with none, the interpreter's scripts
    directory (pip's choice) is the answer.
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    candidates: List[str] = []
    if argv0 and os.path.basename(argv0).startswith("slurmiso") and not argv0.endswith(".py"):
        candidates.append(os.path.dirname(os.path.abspath(argv0)))
    scripts = sysconfig.get_path("scripts")
    candidates += [scripts, os.path.dirname(sys.executable)]
    found = shutil.which("slurmiso-prolog")
    if found:
        candidates.append(os.path.dirname(found))
    for d in candidates:
        if os.access(os.path.join(d, "slurmiso-prolog"), os.X_OK):
            return d
    return scripts


def asset_path(rel: str) -> str:
    """Absolute path of a shipped file, e.g. ``systemd/slurmiso-monitor.service``.

    Wheel installs carry it in ``slurmiso/data/etc``; a source checkout (editable install,
    ``python -m slurmiso`` from the tree) reads ``etc/`` beside the package.
    """
    for base in (os.path.join(_PKG_DIR, "data", "etc"),
                 os.path.join(os.path.dirname(_PKG_DIR), "etc")):
        path = os.path.join(base, rel)
        if os.path.isfile(path):
            return path
    from slurmiso.errors import SlurmisoError

    raise SlurmisoError(f"shipped file etc/{rel} is missing from this installation",
                        hint="reinstall slurmiso (the wheel, .deb or .rpm carries it)")


def asset_text(rel: str) -> str:
    with open(asset_path(rel), encoding="utf-8") as fh:
        return fh.read()


#: Files under etc/ that installations carry (setup.py copies them; tests check the wheel).
ASSETS = (
    "slurmiso.yaml",
    "systemd/slurmiso-monitor.service",
    "systemd/slurmiso-agent.service",
    "cron.d/slurmiso-audit",
    "logrotate.d/slurmiso",
    "plugstack.conf.d/slurmiso.conf",
)
