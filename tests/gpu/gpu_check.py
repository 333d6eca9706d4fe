#!/usr/bin/env python3
"""``make gpu-check``: what a session with an NVIDIA GPU runs first (at most 8 minutes).

It never changes MIG mode or compute mode, never resets the GPU and never creates MIG
instances; it reads MIG mode and compute mode before and after and fails if either changed.
Stages, each a child process with its own time limit inside the budget (a stage that hangs is
ended, SIGTERM then SIGKILL to its process group, recorded as failed, and the next stage runs):

1. ``preflight``: Python, slurmiso's modules (pyyaml, psutil, nvidia-ml-py), torch and whether
   it sees CUDA, ``nvidia-cuda-mps-control``, pytest: what the later stages will be able to do;
2. ``tests/nvml``: slurmiso's NVML backend, read-only, against nvidia-smi;
3. ``mps daemon``: slurmiso's MPS daemon code (``mps_control_for``, ``mps_dirs``) with the
   training class's thread percentage and a small memory limit, read back from the daemon; a
   torch client allocating beyond the limit must fail, and one measuring its SM share must see
   about the class's percentage (SMs CUDA reports, or matmul throughput against the same client
   under a 100% daemon). Without torch those two are skipped with the reason;
4. ``probe --local``: ``slurmiso probe --local --workload builtin`` for timeslice, MPS with the
   shipped shares, MPS with priority (mps-priority), MPS v3 (mps-v3: a namespace per class,
   where the control binary has protocol 3; else skipped with that reason) and static SM
   partitions (mps-sm-partition: ``-d -S``, skipped with the reason where the daemon refuses),
   and the GPU memory it sampled per run.

Read-only capability checks in ``preflight`` (issue 35): whether ``nvidia-cuda-mps-control
-p 3 -h`` lists MPS v3, and whether NVML has the per-cgroup memory partitions
(``nvmlDeviceGetMemoryLimits_v1`` on this process's own cgroup: "not found" means the call
exists and no limit is set; nothing is ever set here).

After the stages: any MPS daemon a stage left is stopped, the GPU state is compared with the
one before, and nothing may be left on the GPU. ``gpu-check.json`` and ``gpu-check.txt`` are
written to ``--out`` (default ``$OUT``, else ``./gpu-check-out``) before the first stage, after
each one and at the end, also when the script itself is sent SIGTERM (``timeout 480``).

``--sim`` runs the same stages with no GPU: a simulated node (slurmiso's sim backend), its
simulated MPS daemon and the probe's CPU stand-ins, so the script itself is tested where there is
no GPU (tests/unit/test_gpu_check_script.py). Exit 0: nothing failed; 1: a check failed;
2: no usable NVIDIA GPU.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
CONFIG = os.path.join(REPO, "etc", "slurmiso.yaml")
BUDGET_S = 460.0  # inside make's `timeout 480`, with room for the summary
#: Each stage's own limit (seconds); the budget's remainder caps it.
STAGES: Tuple[Tuple[str, float], ...] = (
    ("preflight", 40.0), ("tests/nvml", 80.0), ("mps daemon", 120.0), ("probe --local", 170.0))
FINAL_RESERVE_S = 30.0  # kept for the leftovers, the GPU state read-back and the summary
STOP_GRACE_S = 15.0  # SIGTERM, then this long, then SIGKILL
KILL_WAIT_S = 10.0  # after SIGKILL
MPS_TEST_MEM_MB = 2048  # small: the over-limit allocation stays far below the GPU's memory
SM_SECONDS = 4.0
SIM_MODEL = "H100-80GB"


class Checks:
    """The checks recorded so far; ``sink`` is called after each (the summary, kept current)."""

    def __init__(self, deadline: float, sink: Optional[Callable[[], None]] = None) -> None:
        self.deadline = deadline
        self.results: List[Dict[str, Any]] = []
        self.sink = sink
        self.current: Optional[subprocess.Popen] = None  # the stage running now

    def left(self, want: float) -> float:
        return max(1.0, min(want, self.deadline - time.monotonic()))

    def add(self, name: str, status: str, reason: str = "", **details: Any) -> None:
        self.results.append({"check": name, "status": status, "reason": reason, **details})
        print(f"gpu-check: {status.upper():4} {name}" + (f": {reason}" if reason else ""),
              flush=True)
        if self.sink is not None:
            self.sink()


class Ctx:
    """What a stage gets: its checks, where to write, the MPS state dir, sim or real."""

    def __init__(self, checks: Checks, out: str, work: str, state_dir: str, sim: str) -> None:
        self.c = checks
        self.out = out  # what comes back: the summaries, probe.json, probe.html
        self.work = work  # logs and scratch, packed into gpu-check-logs.tar.gz at the end
        self.state_dir = state_dir
        self.sim = sim  # the simulated node's state file; "" on a real GPU


# -- running things, bounded -----------------------------------------------------------------


def child_env(ctx: Optional[Ctx] = None, extra: Optional[Dict[str, str]] = None
              ) -> Dict[str, str]:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONUNBUFFERED="1")
    if ctx is not None and ctx.sim:
        env.update(SLURMISO_GPU_BACKEND="sim", SLURMISO_SIM_STATE=ctx.sim,
                   SLURMISO_PROBE_FORCE_CPU="1")
    env.update(extra or {})
    return env


def end_group(proc: subprocess.Popen, grace: float = STOP_GRACE_S) -> None:
    """SIGTERM the process group (its own cleanup runs), SIGKILL what is left after ``grace``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, KILL_WAIT_S)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the group, if any


def run_bounded(argv: List[str], timeout: float, env: Optional[Dict[str, str]] = None,
                cwd: str = REPO) -> Tuple[Optional[int], str, str]:
    """(exit status, stdout, stderr); status None when it ran past ``timeout`` and was ended
    (its own process group: SIGTERM first, so a probe cancels its runs and stops its daemons)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        try:
            proc = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                                    env=env or child_env(), cwd=cwd, start_new_session=True,
                                    text=True)
        except OSError as exc:
            return 127, "", f"cannot start {argv[0]}: {exc}"
        try:
            code: Optional[int] = proc.wait(timeout)
        except subprocess.TimeoutExpired:
            end_group(proc)
            code = None
        except BaseException:
            end_group(proc)
            raise
        out.seek(0)
        err.seek(0)
        return code, out.read(), err.read()


def smi(*args: str, timeout: float = 12) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True,
                          timeout=timeout).stdout


def gpu_state(sim: str) -> List[List[str]]:
    """Per GPU: index, uuid, MIG mode, compute mode (read-only)."""
    if sim:
        from slurmiso.gpu.sim import SimBackend

        return [[str(d.index), d.uuid, "Enabled" if d.mig_enabled else "Disabled", "Default"]
                for d in SimBackend(sim).devices()]
    out = smi("--query-gpu=index,uuid,mig.mode.current,compute_mode",
              "--format=csv,noheader,nounits")
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def gpu_processes(sim: str) -> str:
    if sim:
        from slurmiso.gpu.sim import SimBackend

        return "\n".join(f"{p.pid}, {p.name}" for p in SimBackend(sim).processes())
    return smi("--query-compute-apps=pid,process_name", "--format=csv,noheader").strip()


# -- stages (each runs in its own child process) ---------------------------------------------


def stage_preflight(ctx: Ctx) -> None:
    c = ctx.c
    c.add("python", "pass", f"{sys.executable} {sys.version.split()[0]}")
    mods = [("yaml", "pyyaml"), ("psutil", "psutil")]
    if not ctx.sim:
        mods.append(("pynvml", "nvidia-ml-py"))
    for mod, package in mods:
        try:
            __import__(mod)
            c.add(f"module {mod}", "pass")
        except Exception as exc:  # what is missing on this box, named with its package
            c.add(f"module {mod}", "fail", f"{type(exc).__name__}: {exc} (pip install {package})")
    try:
        import pytest  # noqa: F401
        c.add("module pytest", "pass")
    except Exception as exc:
        c.add("module pytest", "fail", f"{exc}: tests/nvml cannot run")
    if ctx.sim:
        c.add("torch", "skip", "--sim: the CPU stand-ins run, torch is not used")
        c.add("nvidia-cuda-mps-control", "skip", "--sim: slurmiso's simulated MPS daemon")
        return
    code, out, err = run_bounded([sys.executable, "-c", (
        "import json, torch; ok = torch.cuda.is_available(); print(json.dumps({'torch': "
        "torch.__version__, 'cuda': ok, 'device': torch.cuda.get_device_name(0) if ok "
        "else None}))")], c.left(30))
    info = json.loads(out.strip().splitlines()[-1]) if code == 0 and out.strip() else {}
    if info.get("cuda"):
        c.add("torch", "pass", f"torch {info['torch']} sees {info['device']}", **info)
    else:
        c.add("torch", "skip", (f"torch {info['torch']} sees no CUDA device" if info else
                                f"torch not importable ({(err.strip() or 'timed out')[-200:]})")
              + ": the torch clients are skipped and the probe runs CPU stand-ins")
    found = shutil.which("nvidia-cuda-mps-control")
    c.add("nvidia-cuda-mps-control", "pass" if found else "fail",
          found or "not on PATH: the MPS checks cannot run")
    capabilities(c)
    # read-only: what the driver prints for its compute policies (the time slice slurmiso
    # sets on timeslice pools; NVML cannot read it), kept so a check can parse it later
    code, out, err = run_bounded(["nvidia-smi", "compute-policy", "-l"], c.left(15))
    c.add("compute-policy list", "pass" if code == 0 else "skip",
          "recorded (read-only)" if code == 0 else (err.strip() or "timed out")[-200:],
          output=out[-2000:])


def capabilities(c: Checks) -> None:
    """MPS v3 and memory partitions, read from the driver (never set: issue 35)."""
    code, out, err = run_bounded([sys.executable, "-c", (
        "import json, os\n"
        "from slurmiso.isolation.mps_daemon import NvidiaMpsControl\n"
        "p = NvidiaMpsControl().protocol()\n"
        "res = {'mps_v3': p.v3, 'mps_v3_reason': p.reason}\n"
        "from slurmiso.errors import GpuError, GpuNotFound\n"
        "from slurmiso.gpu.nvml import NvmlBackend\n"
        "line = [x for x in open('/proc/self/cgroup') if x.startswith('0::')]\n"
        "cg = '/sys/fs/cgroup' + line[0][3:].strip() if line else '/sys/fs/cgroup'\n"
        "try:\n"
        "    got = NvmlBackend().memory_limits(0, cg)\n"
        "    res['partitions'] = f'limits on {cg}: {got.describe()}'\n"
        "except GpuNotFound:\n"
        "    res['partitions'] = f'the call exists; no limits on {cg}'\n"
        "except GpuError as exc:\n"
        "    res['partitions_error'] = str(exc)\n"
        "print(json.dumps(res))\n")], c.left(30))
    info = json.loads(out.strip().splitlines()[-1]) if code == 0 and out.strip() else {}
    if not info:
        c.add("mps v3", "fail", f"could not ask: {(err.strip() or 'timed out')[-300:]}")
        return
    c.add("mps v3", "pass" if info["mps_v3"] else "skip", info["mps_v3_reason"])
    if "partitions" in info:
        c.add("memory partitions", "pass", info["partitions"])
    else:
        c.add("memory partitions", "skip", f"not on this driver: {info['partitions_error']}")


def stage_nvml(ctx: Ctx) -> None:
    c = ctx.c
    code, out, err = run_bounded([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                  "-rs", os.path.join(REPO, "tests", "nvml")],
                                 max(1.0, c.left(STAGES[1][1]) - 5), env=child_env(ctx))
    with open(os.path.join(ctx.work, "nvml-tests.txt"), "w") as fh:
        fh.write(out + err)
    tail = (out.strip().splitlines() or ["no output"])[-1]
    if code is None:
        c.add("tests/nvml", "fail", "timed out: " + tail)
    elif code == 0 and " passed" in tail:
        c.add("tests/nvml", "pass", tail)
    elif code == 0 and " skipped" in tail:
        # without a driver every test skips: that is the sim's expected answer, a GPU's fault
        c.add("tests/nvml", "skip" if ctx.sim else "fail", "every test skipped: " + tail)
    else:
        c.add("tests/nvml", "fail", f"exit {code}: {tail}")


def mps_client(mode: str, arg: str, env: Dict[str, str], timeout: float) -> Dict[str, Any]:
    code, out, err = run_bounded([sys.executable, os.path.join(HERE, "mps_client.py"), mode,
                                  arg], timeout, env=child_env(None, env))
    lines = [x for x in out.splitlines() if x.startswith("{")]
    data = json.loads(lines[-1]) if lines else {"error": (err or "no output")[-300:]}
    data["exit"] = code
    return data


def stage_mps(ctx: Ctx) -> None:
    from slurmiso.config import load_config
    from slurmiso.isolation.mps_daemon import mps_control_for
    from slurmiso.isolation.mps_dirs import DaemonKey, daemon_paths, hand_over, prepare_dirs

    c = ctx.c
    cfg = load_config(CONFIG)
    train = cfg.job_class("train")
    pct = train.mps.thread_percentage if train else 60
    if ctx.sim:
        from slurmiso.gpu.sim import SimBackend

        backend: Any = SimBackend(ctx.sim)
    else:
        from slurmiso.gpu.nvml import NvmlBackend

        backend = NvmlBackend()
        backend.connect()
    gpu = backend.devices()[0]
    if gpu.mig_enabled:
        c.add("mps daemon limits", "skip", "GPU 0 is in MIG mode (MPS runs on a whole GPU "
              "here; MIG mode is never changed)")
        return
    control = mps_control_for(backend)
    started: List[Dict[str, str]] = []

    def daemon(threads: int, mem: int) -> Dict[str, str]:
        paths = daemon_paths(ctx.state_dir, DaemonKey(gpu.index, os.getuid(), threads, mem))
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
        baseline: Dict[str, Any] = ({"exit": 3, "error": "--sim: no CUDA client"} if ctx.sim else
                    mps_client("sm", str(SM_SECONDS), {}, c.left(60)))  # no MPS: whole GPU
        limited = daemon(pct, MPS_TEST_MEM_MB)
        c.add("mps daemon limits", "pass", f"daemon took threads {pct}% and pinned memory "
              f"{MPS_TEST_MEM_MB} MiB (read back)")
        if ctx.sim:
            from slurmiso.isolation import mps_sim

            granted = mps_sim.connect(env(limited))
            ok = (float(granted.get("active_thread_percentage", -1)) == pct  # type: ignore
                  and granted.get("pinned_device_mem_limit_mb") == {"0": MPS_TEST_MEM_MB})
            c.add("mps client granted", "pass" if ok else "fail", f"granted {granted}")
        if baseline.get("exit") == 3:
            c.add("mps memory limit", "skip", baseline.get("error", "torch unavailable"))
            c.add("mps SM share", "skip", baseline.get("error", "torch unavailable"))
            return
        mem = mps_client("mem", str(MPS_TEST_MEM_MB), env(limited), c.left(60))
        held = mem.get("under_limit_ok") and mem.get("over_limit_allocated") is False
        c.add("mps memory limit", "pass" if held else "fail",
              f"{MPS_TEST_MEM_MB // 2} MiB {'ok' if mem.get('under_limit_ok') else 'FAILED'}, "
              f"{MPS_TEST_MEM_MB + 512} MiB "
              f"{'refused' if mem.get('over_limit_allocated') is False else 'ALLOCATED'}",
              client=mem)
        share = mps_client("sm", str(SM_SECONDS), env(limited), c.left(60))
        stop(limited)
        full = mps_client("sm", str(SM_SECONDS), env(daemon(100, 0)), c.left(60))
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


def stage_probe(ctx: Ctx) -> None:
    c = ctx.c
    work = os.path.join(ctx.work, "probe-work")
    quick = (["--requests", "8", "--rate", "0", "--train-seconds", "0.3"] if ctx.sim else
             ["--requests", "150", "--rate", "50", "--train-seconds", "4"])
    code, out, err = run_bounded(
        [sys.executable, "-m", "slurmiso", "-c", CONFIG, "probe", "--local", "--workload",
         "builtin", "--modes", "timeslice,mps,mps-priority,mps-v3,mps-sm-partition", *quick,
         "--json",
         "--no-save",
         "--work-dir", work, "--html", os.path.join(ctx.out, "probe.html")],
        max(5.0, c.left(STAGES[3][1]) - STOP_GRACE_S - 5), env=child_env(ctx))
    with open(os.path.join(ctx.out, "probe.json"), "w") as fh:
        fh.write(out)
    with open(os.path.join(ctx.work, "probe.stderr.txt"), "w") as fh:
        fh.write(err)
    if code not in (0, 1):
        c.add("probe --local", "fail", ("timed out" if code is None else f"exit {code}")
              + f": {err.strip()[-400:]}")
        return
    report = json.loads(out)
    rows = {m["mode"]: {"p99_ms": m["infer"]["p99_ms"], "solo_p99_ms": (
        m.get("infer_solo") or {}).get("p99_ms"), "error_rate": m["infer"]["error_rate"],
        "step_s": m["train"]["step_s"], "keeps": m["train"]["throughput_vs_solo"],
        "memory": m.get("memory"), "skipped": m.get("skipped")} for m in report["modes"]}
    measured = [m for m, r in rows.items() if not r["skipped"]]
    kind = report["workload"]["kind"]
    for optional in ("mps-v3", "mps-sm-partition"):  # where the driver has them
        row = rows.get(optional) or {}
        c.add(f"probe {optional}", "skip" if row.get("skipped") else "pass" if row else "fail",
              str(row.get("skipped") or ("measured" if row else "not in the report")))
    required = {"timeslice", "mps", "mps-priority"}
    c.add("probe --local", "pass" if required <= set(measured) else "fail",
          f"workload {kind}; measured {', '.join(measured) or 'nothing'}; recommendation "
          f"{report['recommendation']['mode']}", modes=rows,
          recommendation=report["recommendation"])
    if ctx.sim or kind != "torch":
        c.add("probe on the GPU (torch)", "skip", "--sim" if ctx.sim else
              f"workload {kind}: torch with CUDA was not importable, CPU stand-ins ran")
    else:
        c.add("probe on the GPU (torch)", "pass", f"workload {kind}")
    sampled = {m: (r["memory"] or {}).get("train_sampled_mb") for m, r in rows.items()
               if not r["skipped"]}
    sources = {m: (r["memory"] or {}).get("train_sampled_source") for m, r in rows.items()
               if not r["skipped"]}
    if any(v == 0 for v in sampled.values()):
        c.add("probe memory sampled", "fail", f"a sampled peak of 0 (unknown must be None): "
              f"{sampled}")
    elif kind == "torch":
        ok = all(v and sources[m] == "nvml" for m, v in sampled.items())
        c.add("probe memory sampled", "pass" if ok else "fail",
              f"training peaks through NVML: {sampled} MiB ({sources})")
    else:
        c.add("probe memory sampled", "skip", f"no GPU workload: {sampled} ({sources})")


def stage_hang(ctx: Ctx) -> None:
    """--hang's stand-in for a stage that never returns, with a child of its own."""
    child = subprocess.Popen(["sleep", "3600"])
    with open(os.path.join(ctx.work, "hang.pids"), "w") as fh:
        fh.write(f"{os.getpid()} {child.pid}\n")
    ctx.c.add("hang", "pass", "about to hang (the readiness marker for tests)")
    while True:
        time.sleep(3600)


STAGE_FUNCS: Dict[str, Callable[[Ctx], None]] = {
    "preflight": stage_preflight, "tests/nvml": stage_nvml, "mps daemon": stage_mps,
    "probe --local": stage_probe}


def run_stage(args: argparse.Namespace) -> int:
    """One stage in this (child) process; its checks go to ``--result`` after each one."""
    def on_term(_signum: int, _frame: Any) -> None:
        raise SystemExit(143)  # finally blocks run: daemons stopped, probe runs cancelled

    signal.signal(signal.SIGTERM, on_term)
    checks: List[Dict[str, Any]] = []

    def sink() -> None:
        write_json(args.result, checks)

    c = Checks(time.monotonic() + args.stage_timeout, sink)
    c.results = checks
    ctx = Ctx(c, args.out, args.work, args.state_dir, args.sim_state)
    fn = stage_hang if args.stage == args.hang else STAGE_FUNCS[args.stage]
    try:
        fn(ctx)
    except Exception as exc:  # a check that breaks is a failure with its reason, not a crash
        c.add(args.stage, "fail", f"{type(exc).__name__}: {exc}"[:600])
    return 0


# -- the orchestrator -------------------------------------------------------------------------


def write_json(path: str, data: Any) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump(data, fh, indent=2, sort_keys=True, default=str)
    os.replace(tmp, path)


def finish(c: Checks, out: str, code: Optional[int], state: str = "done") -> None:
    """Both summaries, as they stand (``state`` running/interrupted/done)."""
    write_json(os.path.join(out, "gpu-check.json"),
               {"exit": code, "state": state, "checks": c.results})
    with open(os.path.join(out, "gpu-check.txt.tmp"), "w") as fh:
        for r in c.results:
            fh.write(f"{r['status'].upper():4} {r['check']}: {r['reason']}\n")
        fh.write(f"exit {code}\n" if state == "done" else f"{state}\n")
    os.replace(os.path.join(out, "gpu-check.txt.tmp"), os.path.join(out, "gpu-check.txt"))


def pack(args: argparse.Namespace) -> None:
    """The work folder as one file beside the summaries: a device machine sends back only a few
    files from $OUT. Removed afterwards unless --keep-work."""
    import tarfile

    try:
        with tarfile.open(os.path.join(args.out, "gpu-check-logs.tar.gz"), "w:gz") as tar:
            tar.add(args.work, arcname="gpu-check-work")
    except (OSError, tarfile.TarError) as exc:
        print(f"gpu-check: cannot pack {args.work}: {exc}", file=sys.stderr)
        return
    if not args.keep_work and os.path.dirname(args.work) == args.out:
        shutil.rmtree(args.work, ignore_errors=True)


def reap_mps(c: Checks, state_dir: str, sim: str) -> None:
    """Stop any MPS daemon a stage left under ``state_dir`` (one killed outright)."""
    from slurmiso.isolation.mps_daemon import NvidiaMpsControl, SimMpsControl
    from slurmiso.isolation.mps_dirs import remove_tree

    control = SimMpsControl() if sim else NvidiaMpsControl()
    left = [p for p in glob.glob(os.path.join(state_dir, "*", "*", "pipe"))
            if control.running(p) is not None]
    for pipe in left:
        try:
            control.stop(pipe, 10)
        except Exception as exc:  # noted, and the next one is still stopped
            c.add("mps daemons stopped", "fail", f"{pipe}: {exc}")
    if left:
        c.add("mps daemons stopped", "fail", f"a stage left {len(left)} MPS daemon(s); "
              f"stopped now: {', '.join(left)}")
    remove_tree(state_dir)


def run_stages(c: Checks, args: argparse.Namespace, stages: List[Tuple[str, float]]) -> None:
    for name, own in stages:
        # a stage ended at its limit takes up to the grace and the kill wait more
        room = c.deadline - FINAL_RESERVE_S - STOP_GRACE_S - KILL_WAIT_S - time.monotonic()
        if room < 5:
            c.add(name, "skip", "out of time budget")
            continue
        limit = min(own, args.timeouts.get(name, own), room)
        state_dir = tempfile.mkdtemp(prefix="sgc-", dir="/tmp")  # short: sockets live there
        os.chmod(state_dir, 0o755)
        result = os.path.join(args.work, "stage-" + name.replace("/", "-").replace(" ", "-")
                              + ".json")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(result)
        argv = [sys.executable, os.path.abspath(__file__), "--stage", name, "--out", args.out,
                "--work", args.work,
                "--result", result, "--state-dir", state_dir, "--stage-timeout", str(limit),
                "--hang", args.hang or ""]
        if args.sim:
            argv += ["--sim", "--sim-state", args.sim_state]
        t0 = time.monotonic()
        log = os.path.join(args.work, "stage-" + name.replace("/", "-").replace(" ", "-")
                           + ".log")
        with open(log, "w") as fh:
            proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=child_env(),
                                    start_new_session=True)
            c.current = proc
            try:
                proc.wait(limit)
                timed_out = False
            except subprocess.TimeoutExpired:
                end_group(proc)
                timed_out = True
            c.current = None
        try:
            with open(result) as fh:
                found = json.load(fh)
        except (OSError, ValueError):
            found = []
        for r in found:
            r.setdefault("stage", name)
            c.results.append(r)
            print(f"gpu-check: {r['status'].upper():4} {r['check']}"
                  + (f": {r['reason']}" if r.get("reason") else ""), flush=True)
        seconds = round(time.monotonic() - t0, 1)
        if timed_out:
            c.add(name, "fail", f"timed out after {limit:.0f}s (hung?) and was ended; "
                  f"its output: {log}", seconds=seconds)
        elif proc.returncode != 0 or not found:
            c.add(name, "fail", f"exit {proc.returncode} with {len(found)} checks; its "
                  f"output: {log}", seconds=seconds)
        elif c.sink is not None:
            c.sink()
        try:
            reap_mps(c, state_dir, args.sim_state if args.sim else "")
        except Exception as exc:  # the next stage still runs
            c.add("mps daemons stopped", "fail", f"cannot check {state_dir}: {exc}")


def final_checks(c: Checks, before: List[List[str]], sim: str) -> None:
    try:
        after = gpu_state(sim)
        c.add("gpu state unchanged", "pass" if after == before else "fail",
              "MIG mode and compute mode as before" if after == before
              else f"before {before}, after {after}")
    except Exception as exc:
        c.add("gpu state unchanged", "fail", f"cannot read it back: {exc}")
    try:
        left = gpu_processes(sim)
        c.add("nothing left on the GPU", "pass" if not left else "fail",
              left or "no compute apps")
    except Exception as exc:
        c.add("nothing left on the GPU", "fail", f"cannot list compute apps: {exc}")


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu-check-out")
    ap.add_argument("--budget", type=float, default=BUDGET_S, help="seconds for everything")
    ap.add_argument("--sim", action="store_true",
                    help="no GPU: a simulated node, its MPS daemon and the CPU stand-ins")
    ap.add_argument("--work", default="", help="logs and scratch (default OUT/work, packed "
                    "into OUT/gpu-check-logs.tar.gz and removed at the end)")
    ap.add_argument("--keep-work", action="store_true", help="keep the work folder too")
    ap.add_argument("--stages", default="", help="only these stages (comma-separated)")
    ap.add_argument("--timeout", action="append", default=[], metavar="STAGE=SECONDS",
                    help="a stage's own limit (tests)")
    ap.add_argument("--hang", default="", help=argparse.SUPPRESS)  # --sim tests: STAGE hangs
    ap.add_argument("--stage", default="", help=argparse.SUPPRESS)
    ap.add_argument("--result", default="", help=argparse.SUPPRESS)
    ap.add_argument("--state-dir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--stage-timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    ap.add_argument("--sim-state", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.timeouts = {}
    for item in args.timeout:
        name, _, seconds = item.rpartition("=")
        args.timeouts[name] = float(seconds)
    if args.hang and not args.sim:
        ap.error("--hang is for --sim tests only")
    return args


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    args.out = os.path.abspath(args.out)
    args.work = os.path.abspath(args.work or os.path.join(args.out, "work"))
    os.makedirs(args.work, exist_ok=True)
    if args.stage:
        return run_stage(args)
    c = Checks(time.monotonic() + args.budget)
    c.sink = lambda: finish(c, args.out, None, "running")
    c.sink()

    def on_term(_signum: int, _frame: Any) -> None:
        if c.current is not None:
            end_group(c.current, 5.0)
        c.sink = None
        c.add("gpu-check", "fail", "interrupted (SIGTERM: the outer time limit?)")
        finish(c, args.out, 1, "interrupted")
        pack(args)
        os._exit(1)

    signal.signal(signal.SIGTERM, on_term)
    if args.sim:
        from slurmiso.gpu.sim import init_state

        args.sim_state = os.path.join(args.work, "sim-node.json")
        init_state(args.sim_state, SIM_MODEL, 2, node="gpu-check", force=True)
        c.add("nvidia driver", "skip", f"--sim: simulated {SIM_MODEL} node {args.sim_state}")
    elif shutil.which("nvidia-smi") is None:
        c.add("nvidia driver", "fail", "nvidia-smi is not on PATH")
        c.sink = None
        finish(c, args.out, 2)
        return 2
    try:
        before = gpu_state(args.sim_state if args.sim else "")
    except (subprocess.SubprocessError, OSError) as exc:
        c.add("nvidia driver", "fail", f"nvidia-smi failed: {exc}")
        c.sink = None
        finish(c, args.out, 2)
        return 2
    if not args.sim:
        c.add("nvidia driver", "pass", "; ".join(" ".join(g) for g in before))
    wanted = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in wanted if s not in STAGE_FUNCS]
    if unknown:
        c.add("gpu-check", "fail", f"unknown stage {', '.join(unknown)}")
    stages = [(n, t) for n, t in STAGES if not wanted or n in wanted]
    run_stages(c, args, stages)
    final_checks(c, before, args.sim_state if args.sim else "")
    code = 1 if any(r["status"] == "fail" for r in c.results) else 0
    c.sink = None
    finish(c, args.out, code)
    pack(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
