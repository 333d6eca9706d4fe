"""Helpers shared by the benchmarks: timing of commands and functions, and result lines.

Every benchmark prints its figure *and* a ratio to a baseline measured in the same run, so a
noisy shared machine moves both and the ratio stays meaningful.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def time_command(
    argv: Sequence[str], runs: int, env: Optional[Dict[str, str]] = None
) -> List[float]:
    """Wall seconds of ``runs`` executions of ``argv`` (stdout discarded); fails loudly."""
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(
            list(argv), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        out.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"benchmark command failed: {' '.join(argv)}\n{proc.stderr.decode()}")
    return out


def interleaved(
    commands: Dict[str, Sequence[str]], runs: int, env: Optional[Dict[str, str]] = None
) -> Dict[str, List[float]]:
    """Time several commands round-robin so machine noise hits them alike."""
    times: Dict[str, List[float]] = {k: [] for k in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            times[name].extend(time_command(argv, 1, env))
    return times


def time_call(fn: Callable[[], object], runs: int) -> List[float]:
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return out


def median_ms(samples: Sequence[float]) -> float:
    return 1000.0 * statistics.median(samples)


def report(
    name: str, value: str, ratio: float, baseline: str, target: Optional[float] = None
) -> bool:
    """Print one result line; returns whether the target (a maximum ratio) is met."""
    ok = target is None or ratio <= target
    goal = "" if target is None else f"  target <= {target:g}x: {'met' if ok else 'MISSED'}"
    print(f"{name:<44} {value:>16}   {ratio:6.2f}x {baseline}{goal}")
    sys.stdout.flush()
    return ok


def python_env(extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.update(extra or {})
    return env
