"""Munge for the sandbox: the key, and a munged when none works.

The host's munged is used when it answers; otherwise the sandbox makes the key, starts munged
and records its pid in the dir, so ``down`` stops only the one it started. A Slurm root has its
own key, socket and munged (its /run/munge).
"""

from __future__ import annotations

import os
import shutil
from typing import Optional

from slurmiso_sandbox import guard, layout, state
from slurmiso_sandbox.procs import read_pid, run, wait_until

MUNGED = "/usr/sbin/munged"
MUNGE = "/usr/bin/munge"
UNMUNGE = "/usr/bin/unmunge"
MUNGEKEY = "/usr/sbin/mungekey"
MUNGE_KEY = guard.MUNGE_KEY
MUNGE_PIDFILE = "/run/munge/munged.pid"
RUNUSER = "/usr/sbin/runuser"


def munge_works(site: Optional[layout.Site] = None) -> bool:
    exe = site.exe if site is not None else (lambda *a: list(a))
    cp = run(exe(MUNGE, "-n"), check=False, timeout=10)
    if cp.returncode != 0:
        return False
    return run(exe(UNMUNGE), input=cp.stdout, check=False, timeout=10).returncode == 0


def ensure_munge(site: layout.Site) -> str:
    """Use the host's munged if it works; otherwise start one and remember that we did.

    A Slurm root has its own munged, key and socket (its /run/munge): the host's is never
    touched."""
    if site.chroot:
        return _ensure_root_munge(site)
    if munge_works():
        return "running"
    if not os.path.exists(MUNGE_KEY):
        run([MUNGEKEY, "--create", f"--keyfile={MUNGE_KEY}"])
        shutil.chown(MUNGE_KEY, "munge", "munge")
        os.chmod(MUNGE_KEY, 0o400)
    os.makedirs("/run/munge", exist_ok=True)
    shutil.chown("/run/munge", "munge", "munge")
    os.chmod("/run/munge", 0o755)
    run([RUNUSER, "-u", "munge", "--", MUNGED], timeout=30, logfile="/var/log/munge/munged.log")
    wait_until("munged", munge_works, timeout=20, logfile="/var/log/munge/munged.log")
    state.record(site, munged_pid=read_pid(MUNGE_PIDFILE))
    return "started"


def _ensure_root_munge(site: layout.Site) -> str:
    if munge_works(site):
        return "running (in the root)"
    key = site.chroot + MUNGE_KEY
    setup = (f"[ -s {MUNGE_KEY} ] || {MUNGEKEY} --create --keyfile={MUNGE_KEY}; "
             f"chown munge:munge {MUNGE_KEY}; chmod 0400 {MUNGE_KEY}; "
             "mkdir -p /run/munge /var/log/munge /var/lib/munge; "
             "chown munge:munge /run/munge /var/log/munge /var/lib/munge; chmod 0755 /run/munge")
    run(site.exe("/bin/sh", "-c", setup), timeout=30)
    logfile = site.chroot + "/var/log/munge/munged.log"
    run(site.exe(RUNUSER, "-u", "munge", "--", MUNGED), timeout=30, logfile=logfile)
    wait_until("munged (root)", lambda: munge_works(site), timeout=20, logfile=logfile)
    state.record(site, munged_pid=read_pid(site.chroot + MUNGE_PIDFILE))
    return f"started in the root (key {key})"
