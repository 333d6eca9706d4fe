"""sandbox up per Slurm release: cold (root cached, cluster down) and warm (all running).

Each release gets its own sandbox dir and port base (``SLURMISO_SANDBOX_DIR``,
``SLURMISO_SANDBOX_PORT_BASE``), away from the sandboxes people and tests use
(/var/lib/slurmiso-sandbox, /var/lib/slurmiso-sbx-<release>, ports 16800/17800/18800), and is
brought down at the end. Cold is ``sandbox up`` right after ``sandbox down`` (every daemon
starts, nothing is built); warm is ``sandbox up`` with everything running. The baseline, in
the same run and interleaved, is ``python3 -c pass``: the interpreter start every ``slurmiso``
command pays, so the ratio is what ``up`` costs beyond it.

A release is skipped, with the reason, when this is not root, when its Debian root is not
cached (building one takes minutes: ``slurmiso sandbox up --slurm 24.11`` once), or, for the
host release, when the host's Slurm is another one. ``SLURMISO_BENCH_SLURM=24.11,26.05``
picks releases, ``SLURMISO_BENCH_SANDBOX_RUNS`` the runs (3). Not to be run while another
sandbox of the same release is being started: a munged this one started is stopped with it.
"""

from __future__ import annotations

import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

from common import python_env, report

#: release, the Debian suite its root comes from ("" = the host's own Slurm), port base
RELEASES: Tuple[Tuple[str, str, int], ...] = (
    ("22.05", "", 19800),
    ("24.11", "trixie", 20800),
    ("26.05", "sid", 21800),
)
ROOTS = os.environ.get("SLURMISO_SLURM_ROOTS") or "/var/cache/slurmiso-dev/slurm-roots"


def bench_dir(release: str) -> str:
    return f"/var/lib/slurmiso-bench-{release}"


def _host_release() -> str:
    exe = shutil.which("slurmctld") or ("/usr/sbin/slurmctld"
                                        if os.path.exists("/usr/sbin/slurmctld") else "")
    if not exe:
        return ""
    cp = subprocess.run([exe, "-V"], capture_output=True, text=True, check=False)
    words = cp.stdout.split()
    return ".".join(words[-1].split(".")[:2]) if words else ""


def skip_reason(release: str, suite: str) -> Optional[str]:
    """Why ``release`` cannot be measured here, or None."""
    if os.geteuid() != 0:
        return "needs root (the sandbox starts daemons, mounts and chroots)"
    if not suite:
        host = _host_release()
        if host != release:
            return f"the host's Slurm is {host or 'not installed'}, not {release}"
        return None
    root = os.path.join(ROOTS, suite)
    if not os.path.exists(os.path.join(root, "usr", "sbin", "slurmctld")):
        return (f"no cached Debian root at {root} (build it once: slurmiso sandbox up "
                f"--slurm {release}; minutes)")
    return None


def _cli(args: Sequence[str], env: Dict[str, str]) -> float:
    """Wall seconds of one ``python3 -m slurmiso ...``; fails loudly."""
    t0 = time.perf_counter()
    cp = subprocess.run([sys.executable, "-m", "slurmiso", *args], env=env,
                        capture_output=True, text=True, check=False)
    secs = time.perf_counter() - t0
    if cp.returncode != 0:
        raise SystemExit(f"benchmark command failed: slurmiso {' '.join(args)}\n"
                         f"{cp.stdout[-2000:]}{cp.stderr[-2000:]}")
    if any(re.match(r"slurm \S+ root .* built ", ln) for ln in cp.stdout.splitlines()):
        raise SystemExit("sandbox up built its root during the benchmark: not a cached root")
    return secs


def _baseline() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    return time.perf_counter() - t0


def measure(release: str, suite: str, port_base: int, runs: int) -> Dict[str, List[float]]:
    """first (empty dir, if new), warm, cold and down times, and the baseline's."""
    d = bench_dir(release)
    env = python_env({"SLURMISO_SANDBOX_DIR": d, "SLURMISO_SANDBOX_PORT_BASE": str(port_base)})
    up: Tuple[str, ...] = ("sandbox", "up", "--dir", d) + (("--slurm", release) if suite else ())
    down = ("sandbox", "down", "--dir", d)
    times: Dict[str, List[float]] = {"first": [], "warm": [], "cold": [], "down": [],
                                     "baseline": []}
    fresh = not os.path.exists(os.path.join(d, "etc", "slurm.conf"))
    try:
        t = _cli(up, env)  # first: sets the dir up (or finds it from an earlier run)
        if fresh:
            times["first"].append(t)
        for _ in range(runs):
            times["baseline"].append(_baseline())
            times["warm"].append(_cli(up, env))
            times["down"].append(_cli(down, env))
            times["cold"].append(_cli(up, env))
    finally:
        subprocess.run([sys.executable, "-m", "slurmiso", *down], env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return times


def main() -> bool:
    chosen = [r for r in os.environ.get("SLURMISO_BENCH_SLURM", "").split(",") if r]
    runs = max(1, int(os.environ.get("SLURMISO_BENCH_SANDBOX_RUNS", "3")))
    for release, suite, port_base in RELEASES:
        if chosen and release not in chosen:
            print(f"sandbox up, Slurm {release}: not chosen (SLURMISO_BENCH_SLURM)")
            continue
        why = skip_reason(release, suite)
        if why:
            print(f"sandbox up, Slurm {release}: skipped: {why}")
            continue
        t = measure(release, suite, port_base, runs)
        base = statistics.median(t["baseline"])
        label = f"vs python3 -c pass {base * 1000:.0f} ms"
        for kind, what in (("cold", "cold (after down)"), ("warm", "warm (all up)"),
                           ("first", "first (empty dir)"), ("down", "down")):
            if t[kind]:
                secs = statistics.median(t[kind])
                report(f"sandbox up {release} {what}" if kind != "down"
                       else f"sandbox down {release}",
                       f"{secs:.2f} s (n={len(t[kind])})", secs / base, label)
    return True


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
