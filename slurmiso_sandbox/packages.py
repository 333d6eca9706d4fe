"""What the sandbox needs installed: Debian packages (apt) and the test user.

    missing = missing_packages(PACKAGES)   # what dpkg does not list as installed
    install_named(missing)                 # apt-get install, updating the lists when stale

On the host for the host's Slurm; a Slurm root (:mod:`.roots`) installs its own packages, and
:func:`ensure_root_user` gives the test user the host's uid there (files are shared).
"""

from __future__ import annotations

import glob
import os
import pwd
from typing import List, Sequence

from slurmiso_sandbox import layout
from slurmiso_sandbox.procs import environ_with, run

#: lua5.1: the Lua job_submit/lua links (and the unit tests run the generated script with);
#: gcc, make and libslurm-dev build the SPANK plugin; crun runs ``srun --container`` (oci.py).
PACKAGES = ("slurm-wlm", "slurmdbd", "munge", "mariadb-server", "libslurm-dev", "lua5.1", "gcc",
            "make", "crun")
#: What the system Python needs to run ``slurmiso task-prolog`` when it stands in (make_site).
TASK_PACKAGES = ("python3-yaml", "python3-psutil")
SYSTEM_PYTHON = "/usr/bin/python3"
APT_GET = "/usr/bin/apt-get"
DPKG_QUERY = "/usr/bin/dpkg-query"
USERADD = "/usr/sbin/useradd"
GROUPADD = "/usr/sbin/groupadd"


def missing_packages(wanted: Sequence[str]) -> List[str]:
    cp = run([DPKG_QUERY, "-W", "-f=${Package} ${Status}\\n", *wanted], check=False)
    ok = {ln.split()[0] for ln in cp.stdout.splitlines() if ln.endswith("install ok installed")}
    return [p for p in wanted if p not in ok]


def install_packages(site: layout.Site) -> str:
    """apt-get install what is missing; ``apt-get update`` only when lists are absent/stale."""
    wanted = PACKAGES + (TASK_PACKAGES if site.task_python == SYSTEM_PYTHON else ())
    missing = missing_packages(wanted)
    if not missing:
        return "all installed"
    return install_named(missing)


def install_named(missing: Sequence[str]) -> str:
    """``apt-get install`` these Debian packages (``apt-get update`` first when the lists are
    absent, and again once if the install fails on stale lists)."""
    env = environ_with({"DEBIAN_FRONTEND": "noninteractive"})
    install = [APT_GET, "install", "-y", "-q", "-o", "Dpkg::Options::=--force-confold", *missing]
    if not glob.glob("/var/lib/apt/lists/*_Packages*"):
        run([APT_GET, "update", "-q"], env=env, timeout=300)
    if run(install, env=env, timeout=600, check=False).returncode != 0:
        run([APT_GET, "update", "-q"], env=env, timeout=300)
        run(install, env=env, timeout=600)
    return "installed " + " ".join(missing)


def ensure_test_user() -> str:
    try:
        return f"{layout.TEST_USER} uid {pwd.getpwnam(layout.TEST_USER).pw_uid}"
    except KeyError:
        run([USERADD, "-m", "-s", "/bin/bash", layout.TEST_USER])
        return f"created {layout.TEST_USER} uid {pwd.getpwnam(layout.TEST_USER).pw_uid}"


def ensure_root_user(site: layout.Site) -> str:
    """The test user in the root, with the host's uid and gid (files are shared), and no
    subordinate ids there (:func:`drop_subids`)."""
    pw = pwd.getpwnam(layout.TEST_USER)
    cp = run(site.exe("/usr/bin/getent", "passwd", layout.TEST_USER), check=False)
    dropped = drop_subids(site.chroot, layout.TEST_USER)
    if cp.returncode == 0:
        return f"{layout.TEST_USER} in the root" + (f"; {dropped}" if dropped else "")
    run(site.exe("/bin/sh", "-c", f"getent group {pw.pw_gid} >/dev/null || "
                 f"{GROUPADD} -g {pw.pw_gid} {layout.TEST_USER}"))
    run(site.exe(USERADD, "-m", "-K", "SUB_UID_COUNT=0", "-K", "SUB_GID_COUNT=0", "-u",
                 str(pw.pw_uid), "-g", str(pw.pw_gid), "-s", "/bin/bash", layout.TEST_USER))
    return f"created {layout.TEST_USER} uid {pw.pw_uid} in the root"


def drop_subids(root: str, user: str) -> str:
    """Remove ``user``'s lines from the root's /etc/subuid and /etc/subgid ("" if none).

    With subordinate ids and the setuid ``newuidmap`` (the uidmap package, which apptainer
    pulls in), rootless crun maps 65,536 more ids into a job's container (measured: the fence
    tests' uid_map grew). The sandbox's containers map the job's user alone, as the tests
    assume and as the least a job needs."""
    if not root or os.path.realpath(root) == "/":
        return ""  # a Debian root's files only, never the host's
    dropped = []
    for name in ("subuid", "subgid"):
        path = os.path.join(root, "etc", name)
        try:
            with open(path, encoding="utf-8") as fh:
                lines = fh.read().splitlines(keepends=True)
        except FileNotFoundError:
            continue
        kept = [ln for ln in lines if ln.split(":", 1)[0] != user]
        if kept != lines:
            with open(path, "w", encoding="utf-8") as fh:
                fh.writelines(kept)
            dropped.append(name)
    return f"dropped {user}'s {' and '.join(dropped)}" if dropped else ""
