#!/usr/bin/env python3
"""``make gpu-check``: what a session with an NVIDIA GPU runs first (at most 8 minutes).

It never changes MIG mode or compute mode and never resets the GPU; it reads both before and
after and fails if either changed. Steps, each with its own time limit inside the budget:

1. ``tests/nvml``: slurmiso's NVML backend, read-only, against nvidia-smi;
2. slurmiso's MPS daemon code (``NvidiaMpsControl``, ``mps_dirs``) with the training class's
   thread percentage and a small memory limit: a torch client allocating beyond the limit must
   fail, and one measuring its SM share must see about the class's percentage (SMs CUDA reports,
   or matmul throughput against the same client under a 100% daemon). Without torch these two
   are skipped with the reason; the daemon's own read-back of its limits still counts;
3. ``slurmiso probe --local --workload builtin`` for timeslice, MPS with the shipped shares and
   MPS with priority (mps-priority).

It writes ``gpu-check.json`` and ``gpu-check.txt`` to ``--out`` (default ``$OUT``, else
``./gpu-check-out``). Exit 0: nothing failed; 1: a check failed; 2: no usable NVIDIA GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
CONFIG = os.path.join(REPO, "etc", "slurmiso.yaml")
BUDGET_S = 470.0
MPS_TEST_MEM_MB = 2048  # small: the over-limit allocation stays far below the GPU's memory
SM_SECONDS = 4.0


class Checks:
    def __init__(self, budget: float) -> None:
        self.deadline = time.monotonic() + budget
        self.results: List[Dict[str, Any]] = []

    def left(self, want: float) -> float:
        return max(1.0, min(want, self.deadline - time.monotonic()))

    def add(self, name: str, status: str, reason: str = "", **details: Any) -> None:
        self.results.append({"check": name, "status": status, "reason": reason, **details})
        print(f"gpu-check: {status.upper():4} {name}" + (f": {reason}" if reason else ""),
              flush=True)

    def run(self, name: str, fn: Callable[[], None]) -> None:
        t0 = time.monotonic()
        if time.monotonic() >= self.deadline:
            self.add(name, "skip", "out of time budget")
            return
        try:
            fn()
        except Exception as exc:  # a check that breaks is a failure with its reason, not a crash
            self.add(name, "fail", f"{type(exc).__name__}: {exc}")
        self.results[-1].setdefault("seconds", round(time.monotonic() - t0, 1))


def smi(*args: str, timeout: float = 30) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True,
                          timeout=timeout).stdout


def gpu_state() -> List[List[str]]:
    """Per GPU: index, uuid, MIG mode, compute mode (read-only)."""
    out = smi("--query-gpu=index,uuid,mig.mode.current,compute_mode",
              "--format=csv,noheader,nounits")
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def run_cmd(argv: List[str], timeout: float, env: Optional[Dict[str, str]] = None,
            cwd: str = REPO) -> subprocess.CompletedProcess:
    full_env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env,
                          cwd=cwd, check=False)


def client(mode: str, arg: str, env: Dict[str, str], timeout: float) -> Dict[str, Any]:
    cp = run_cmd([sys.executable, os.path.join(HERE, "mps_client.py"), mode, arg], timeout,
                 env=env)
    lines = [x for x in cp.stdout.splitlines() if x.startswith("{")]
    data = json.loads(lines[-1]) if lines else {"error": (cp.stderr or "no output")[-300:]}
    data["exit"] = cp.returncode
    return data


def check_nvml(c: Checks, out: str) -> None:
    cp = run_cmd([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                  os.path.join(REPO, "tests", "nvml")], c.left(120))
    with open(os.path.join(out, "nvml-tests.txt"), "w") as fh:
        fh.write(cp.stdout + cp.stderr)
    tail = (cp.stdout.strip().splitlines() or ["no output"])[-1]
    c.add("tests/nvml", "pass" if cp.returncode == 0 else "fail", tail)


def check_mps(c: Checks, out: str) -> None:
    from slurmiso.config import load_config
    from slurmiso.gpu.nvml import NvmlBackend
    from slurmiso.isolation.mps_daemon import NvidiaMpsControl
    from slurmiso.isolation.mps_dirs import (
        DaemonKey,
        daemon_paths,
        hand_over,
        prepare_dirs,
        remove_tree,
    )

    cfg = load_config(CONFIG)
    train = cfg.job_class("train")
    pct = train.mps.thread_percentage if train else 60
    backend = NvmlBackend()
    backend.connect()
    gpu = backend.devices()[0]
    if gpu.mig_enabled:
        c.add("mps daemon", "skip", "GPU 0 is in MIG mode (MPS runs on a whole GPU here; MIG "
              "mode is never changed)")
        return
    control = NvidiaMpsControl()
    control.binary()  # NodeFault with the packages to install when it is missing
    baseline = client("sm", str(SM_SECONDS), {}, c.left(90))  # no MPS: the whole GPU
    state = tempfile.mkdtemp(prefix="sgc-", dir="/tmp")
    os.chmod(state, 0o755)
    started: List[Dict[str, str]] = []

    def daemon(threads: int, mem: int) -> Dict[str, str]:
        paths = daemon_paths(state, DaemonKey(gpu.index, os.getuid(), threads, mem))
        prepare_dirs(paths)
        control.start(gpu.uuid, paths["pipe"], paths["log"])
        started.append(paths)
        control.set_limits(paths["pipe"], threads, mem)  # read back: NodeFault if not held
        hand_over(paths, os.getuid())
        return paths

    def env(paths: Dict[str, str]) -> Dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": paths["pipe"], "CUDA_MPS_LOG_DIRECTORY": paths["log"],
                "CUDA_VISIBLE_DEVICES": "0"}

    def stop(paths: Dict[str, str]) -> None:
        control.stop(paths["pipe"], 10)
        started.remove(paths)

    try:
        limited = daemon(pct, MPS_TEST_MEM_MB)
        c.add("mps daemon limits", "pass", f"daemon took threads {pct}% and pinned memory "
              f"{MPS_TEST_MEM_MB} MiB (read back)")
        if baseline.get("exit") == 3:
            c.add("mps memory limit", "skip", baseline.get("error", "torch unavailable"))
            c.add("mps SM share", "skip", baseline.get("error", "torch unavailable"))
            return
        mem = client("mem", str(MPS_TEST_MEM_MB), env(limited), c.left(90))
        held = mem.get("under_limit_ok") and mem.get("over_limit_allocated") is False
        c.add("mps memory limit", "pass" if held else "fail",
              f"{MPS_TEST_MEM_MB // 2} MiB {'ok' if mem.get('under_limit_ok') else 'FAILED'}, "
              f"{MPS_TEST_MEM_MB + 512} MiB "
              f"{'refused' if mem.get('over_limit_allocated') is False else 'ALLOCATED'}",
              client=mem)
        share = client("sm", str(SM_SECONDS), env(limited), c.left(90))
        stop(limited)
        full = client("sm", str(SM_SECONDS), env(daemon(100, 0)), c.left(90))
        total_sm = baseline.get("sm_count") or 0
        sm_ratio = (share.get("sm_count") or 0) / total_sm if total_sm else None
        tp_ratio = (share.get("matmuls_per_s") or 0) / full["matmuls_per_s"] if full.get(
            "matmuls_per_s") else None
        want = pct / 100.0
        ok = (sm_ratio is not None and sm_ratio <= want + 0.05) or (
            tp_ratio is not None and tp_ratio <= want + 0.15)
        c.add("mps SM share", "pass" if ok else "fail",
              f"class {pct}%: SMs reported {share.get('sm_count')}/{total_sm}"
              f" ({'-' if sm_ratio is None else f'{sm_ratio:.0%}'}), throughput "
              f"{'-' if tp_ratio is None else f'{tp_ratio:.0%}'} of a 100% daemon",
              baseline=baseline, limited=share, full=full)
    finally:
        for paths in list(started):
            with contextlib.suppress(Exception):
                control.stop(paths["pipe"], 10)
        remove_tree(state)


def check_probe(c: Checks, out: str) -> None:
    work = os.path.join(out, "probe-work")
    cp = run_cmd([sys.executable, "-m", "slurmiso", "-c", CONFIG, "probe", "--local",
                  "--workload", "builtin", "--modes", "timeslice,mps,mps-priority",
                  "--requests", "300", "--rate", "50", "--train-seconds", "8", "--json",
                  "--no-save", "--work-dir", work, "--html", os.path.join(out, "probe.html")],
                 c.left(260))
    with open(os.path.join(out, "probe.json"), "w") as fh:
        fh.write(cp.stdout)
    with open(os.path.join(out, "probe.stderr.txt"), "w") as fh:
        fh.write(cp.stderr)
    if cp.returncode not in (0, 1):
        c.add("probe --local", "fail", f"exit {cp.returncode}: {cp.stderr.strip()[-400:]}")
        return
    report = json.loads(cp.stdout)
    rows = {m["mode"]: {"p99_ms": m["infer"]["p99_ms"], "solo_p99_ms": (
        m.get("infer_solo") or {}).get("p99_ms"), "error_rate": m["infer"]["error_rate"],
        "step_s": m["train"]["step_s"], "keeps": m["train"]["throughput_vs_solo"],
        "skipped": m.get("skipped")} for m in report["modes"]}
    measured = [m for m, r in rows.items() if not r["skipped"]]
    kind = report["workload"]["kind"]
    status = "pass" if len(measured) == 3 and kind == "torch" else "fail"
    c.add("probe --local", status, f"workload {kind}; measured {', '.join(measured)}; "
          f"recommendation {report['recommendation']['mode']}", modes=rows,
          recommendation=report["recommendation"])


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for everything")
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    c = Checks(args.budget)
    if shutil.which("nvidia-smi") is None:
        c.add("nvidia driver", "fail", "nvidia-smi is not on PATH")
        return finish(c, args.out, 2)
    try:
        before = gpu_state()
    except (subprocess.SubprocessError, OSError) as exc:
        c.add("nvidia driver", "fail", f"nvidia-smi failed: {exc}")
        return finish(c, args.out, 2)
    c.add("nvidia driver", "pass", "; ".join(" ".join(g) for g in before))
    c.run("tests/nvml", lambda: check_nvml(c, args.out))
    c.run("mps daemon", lambda: check_mps(c, args.out))
    c.run("probe --local", lambda: check_probe(c, args.out))
    after = gpu_state()
    c.add("gpu state unchanged", "pass" if after == before else "fail",
          "MIG mode and compute mode as before" if after == before
          else f"before {before}, after {after}")
    left = smi("--query-compute-apps=pid,process_name", "--format=csv,noheader").strip()
    c.add("nothing left on the GPU", "pass" if not left else "fail", left or "no compute apps")
    failed = any(r["status"] == "fail" for r in c.results)
    return finish(c, args.out, 1 if failed else 0)


def finish(c: Checks, out: str, code: int) -> int:
    summary = {"exit": code, "checks": c.results}
    with open(os.path.join(out, "gpu-check.json"), "w") as fh:
        json.dump(summary, fh, indent=2, sort_keys=True, default=str)
    with open(os.path.join(out, "gpu-check.txt"), "w") as fh:
        for r in c.results:
            fh.write(f"{r['status'].upper():4} {r['check']}: {r['reason']}\n")
        fh.write(f"exit {code}\n")
    return code


if __name__ == "__main__":
    sys.exit(main())
