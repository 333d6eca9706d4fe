#!/usr/bin/env python3
"""Run every benchmark in bench/ (``make bench``); exit 1 if any target was missed."""

from __future__ import annotations

import importlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))

BENCHES = ["bench_startup", "bench_sim_mig", "bench_hooks", "bench_audit", "bench_wrapper",
           "bench_monitor", "bench_agent",
           # root and cached Slurm roots only (each release skipped with its reason otherwise)
           "bench_sandbox_up",
           # root and a sandbox up only (skipped with its reason otherwise)
           "bench_reaction"]


def main() -> int:
    only = sys.argv[1:]
    ok = True
    for name in BENCHES:
        if only and name not in only:
            continue
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        print(f"\n== {name}: {(module.__doc__ or '').strip().splitlines()[0]}")
        ok = bool(module.main()) and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
