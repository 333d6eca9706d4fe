"""Inference start under preemption, in the sandbox: slurmiso against bare Slurm (issue 14).

An ordinary user's (``sbxuser``) training job holds both GPUs of partition ``gpu``; an
``infer`` job needing one is submitted, and the figure is submit -> the infer program's first
line (wall clock, sub-second). Same program in both modes: on its stop signal it finishes its
current 0.25 s step, saves and fsyncs a checkpoint, and exits.

* bare: slurmiso's hooks off for that run (the Prolog, Epilog and TaskProlog the sandbox
  points at are swapped for ``exit 0`` and plugstack.conf for an empty one, restored after
  the run; slurmstepd reads both afresh per job) and ``srun prog`` (it stops on SIGTERM);
* slurmiso: the sandbox's hooks and ``srun slurmiso run -- prog`` (checkpoint signal, marker,
  requeue).

Runs alternate, so machine noise hits both alike. The program's own time (rest of its step +
save) is taken out of each run and replaced by the median over all runs, so the difference is
what slurmiso adds. Target: at most bare + 0.3 s. A timeline per mode (medians, seconds from
the infer job's submission) comes from slurmctld's and slurmd's logs (millisecond stamps),
slurmiso's journal (hooks, and the wrapper's folded events) and the programs' own stamps.

Needs root and the sandbox up (``slurmiso sandbox up``); otherwise it says why and skips.
Takes the sandbox session lock the tests and the demo take (``<sandbox dir>.tests.lock``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Dict, Iterator, List, Optional, Tuple

from common import ROOT, report

SANDBOX = os.environ.get("SLURMISO_SANDBOX_DIR", "/var/lib/slurmiso-sandbox")
USER = "sbxuser"
PYTHON = "/usr/bin/python3"  # the job's user cannot reach root's interpreters
STEP_S = 0.25
RUNS = int(os.environ.get("BENCH_PREEMPT_RUNS", "6"))
TARGET_S = 0.3
HOOKS = ("slurmiso-prolog", "slurmiso-epilog", "slurmiso-task-prolog")

# Bare it stops on SIGTERM; under the wrapper on the checkpoint signal (SIGTERM stays ignored
# as the wrapper starts it). Writes wall-clock stamps (signal, saved) so they line up with
# Slurm's and the journal's; bench_wrapper's local stop bench runs the same program.
PROGRAM = r"""
import json, os, signal, sys, time
out, step_s = sys.argv[1], float(sys.argv[2])
marker = os.environ.get("SLURMISO_CKPT_MARKER", "")
name = os.environ.get("SLURMISO_CKPT_SIGNAL", "USR2") if marker else "TERM"
got = []
signal.signal(getattr(signal, "SIG" + name), lambda n, f: got.append(time.time()))
open(out + ".ready", "w").close()
nxt = time.monotonic() + step_s
step = 0
while not got:
    time.sleep(max(0.0, nxt - time.monotonic()))  # one step of work
    step, nxt = step + 1, nxt + step_s
path = f"{out}.ckpt-{step}"
with open(path, "w") as fh:
    fh.write("x" * 65536)
    fh.flush()
    os.fsync(fh.fileno())
saved = time.time()
if marker:
    with open(marker + ".tmp", "w") as fh:
        json.dump({"path": path, "step": step}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(marker + ".tmp", marker)
with open(out, "w") as fh:
    fh.write(f"{got[0]} {saved}")
"""


def skip_reason() -> Optional[str]:
    conf = os.path.join(SANDBOX, "etc", "slurm.conf")
    if os.geteuid() != 0:
        return "needs root (it switches the sandbox's hooks off for the bare runs)"
    if not os.path.exists(conf):
        return f"no sandbox at {SANDBOX} (slurmiso sandbox up)"
    if _run("scontrol", "ping").find("UP") < 0:
        return "the sandbox's slurmctld does not answer (slurmiso sandbox up)"
    if subprocess.run(["id", USER], capture_output=True).returncode != 0:
        return f"no user {USER} (the sandbox creates it)"
    return None


def _env() -> Dict[str, str]:
    return dict(os.environ, SLURM_CONF=os.path.join(SANDBOX, "etc", "slurm.conf"))


def _run(*argv: str, user: bool = False) -> str:
    cmd = (["runuser", "-u", USER, "--"] if user else []) + list(argv)
    cp = subprocess.run(cmd, env=_env(), capture_output=True, text=True)
    return cp.stdout if cp.returncode == 0 else ""


def _state(job: str) -> str:
    return _run("squeue", "-h", "-j", job, "-o", "%T").strip() or "GONE"


# -- bare Slurm: the hooks swapped out for one run ----------------------------------------


def _swap(path: str, text: str) -> Tuple[bytes, int]:
    with open(path, "rb") as fh:
        old = fh.read()
    mode = os.stat(path).st_mode & 0o7777
    tmp = path + ".bench-tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)  # slurmd never runs a half-written file
    return old, mode


def _wait_node_idle(timeout: float = 120.0) -> None:
    """No job on n1, completing ones included: a job whose Prolog ran with the hooks and whose
    Epilog runs without them would leave its record and claims behind (the next Prolog then
    drains the node: seen once, when another session's job spanned a swap)."""
    deadline = time.monotonic() + timeout
    while _run("squeue", "-h", "-w", "n1", "-t", "R,CG,CF,S", "-o", "%i").strip():
        if time.monotonic() > deadline:
            raise SystemExit("node n1 of the sandbox never went idle; not switching its hooks")
        time.sleep(0.2)


@contextmanager
def hooks_off() -> Iterator[None]:
    saved: Dict[str, Tuple[bytes, int]] = {}
    _wait_node_idle()
    try:
        for name in HOOKS:
            path = os.path.join(SANDBOX, "bin", name)
            saved[path] = _swap(path, "#!/bin/sh\nexit 0\n")
        plug = os.path.join(SANDBOX, "etc", "plugstack.conf")
        saved[plug] = _swap(plug, "# bench_preempt_start: no SPANK plugins for a bare run\n")
        yield
    finally:
        _wait_node_idle()
        for path, (data, mode) in saved.items():
            tmp = path + ".bench-tmp"
            with open(tmp, "wb") as fh:
                fh.write(data)
            os.chmod(tmp, mode)
            os.replace(tmp, path)


# -- one preemption -----------------------------------------------------------------------


class Logs:
    """What the Slurm logs and slurmiso's journal gained during one run."""

    FILES = {"ctld": "slurmctld.log", "slurmd": "slurmd-n1.log", "journal": "journal-n1.jsonl"}

    def __init__(self) -> None:
        self.start = {k: self._size(k) for k in self.FILES}

    def _path(self, key: str) -> str:
        return os.path.join(SANDBOX, "log", self.FILES[key])

    def _size(self, key: str) -> int:
        try:
            return os.path.getsize(self._path(key))
        except OSError:
            return 0

    def new(self, key: str) -> List[str]:
        try:
            with open(self._path(key), "rb") as fh:
                fh.seek(self.start[key])
                return fh.read().decode(errors="replace").splitlines()
        except OSError:
            return []


WRAPPER_EVENTS = {
    "preempt-signal": "wrapper got SIGTERM",
    "checkpoint-end": "wrapper saw the report",
    "requeue": "wrapper asked for the requeue",
}
_STAMP = re.compile(r"^\[(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})\] (.*)$")


def _log_time(lines: List[str], pattern: str) -> Optional[float]:
    """Wall time of the first log line matching ``pattern`` (Slurm logs UTC on this host)."""
    rx = re.compile(pattern)
    for line in lines:
        m = _STAMP.match(line)
        if m and rx.search(m.group(2)):
            return datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%f").replace(
                tzinfo=timezone.utc).timestamp()
    return None


def _iso(ts: object) -> Optional[float]:
    if not isinstance(ts, str):
        return None
    return datetime.strptime(ts.rstrip("Z"), "%Y-%m-%dT%H:%M:%S.%f").replace(
        tzinfo=timezone.utc).timestamp()


def timeline(logs: Logs, train: str, infer: str, out: str) -> Dict[str, float]:
    """Named instants (wall seconds) of one run; what could not be seen is left out."""
    ctld, slurmd = logs.new("ctld"), logs.new("slurmd")
    t: Dict[str, Optional[float]] = {
        "infer submitted": _log_time(ctld, rf"submit_batch_job: JobId={infer}\b"),
        "preempt signal (step cancelled)": _log_time(slurmd, rf"STEP {train}\.0 ON \S+ CANCELLED"),
        "batch step told to end": _log_time(slurmd, rf"JOB {train} ON \S+ CANCELLED"),
        "training step ended": _log_time(slurmd, rf"\[{train}\.0\] done with job"),
        "batch step ended": _log_time(slurmd, rf"\[{train}\.batch\] done with job"),
        "ctld: training job complete": _log_time(
            ctld, rf"_job_complete: JobId={train} done|Requeuing JobId={train}\b"),
        "ctld: infer allocated": _log_time(ctld, rf"Allocate JobId={infer}\b"),
        "slurmd: infer launch request (Prolog starts)": _log_time(
            slurmd, rf"batch_request: {infer}$"),
        "infer extern step up (Contain)": _log_time(slurmd, rf"\[{infer}\.extern\] task/cgroup"),
        "slurmd: infer batch launched (Prolog done)": _log_time(
            slurmd, rf"Launching batch job {infer}\b"),
        "infer batch step up": _log_time(slurmd, rf"\[{infer}\.batch\] task/cgroup"),
    }
    try:
        with open(out) as fh:
            got, saved = (float(x) for x in fh.read().split())
        t["program got its stop signal"], t["program saved"] = got, saved
    except (OSError, ValueError):
        pass
    try:
        with open(out + ".infer") as fh:
            t["infer program's first line"] = float(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    for line in logs.new("journal"):
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        job, ev = rec.get("job"), rec.get("event")
        if rec.get("source") == "user" and job == train:
            name = WRAPPER_EVENTS.get(ev)
            if name:
                t[name] = _iso(rec.get("job_ts"))
        elif ev == "job-end" and job == train:
            end = (rec.get("times") or {}).get("epilog_end")
            if isinstance(end, (int, float)):
                t["epilog (training) end"] = float(end)
                t["epilog (training) start"] = float(end) - rec.get("epilog_ms", 0) / 1000
        elif ev == "prolog" and job == infer:
            end = _iso(rec.get("ts"))
            if end is not None:
                t["prolog (infer) end"] = end
                t["prolog (infer) start"] = end - rec.get("ms", 0) / 1000
    return {k: v for k, v in t.items() if v is not None}


Run = Tuple[float, float, Dict[str, float]]


def preempt_once(work: str, n: int, wrapped: bool, phase: float) -> Optional[Run]:
    """(submit -> infer program start, program's own time, timeline) of one run, or None."""
    out = os.path.join(work, f"p{n}")
    prog = f"{PYTHON} {work}/prog.py {out} {STEP_S}"
    body = (f"export PYTHONPATH={ROOT}\nsrun {PYTHON} -m slurmiso run --ckpt-dir {work}/ckpt{n} "
            f"-- {prog}\n") if wrapped else f"srun {prog}\n"
    script = os.path.join(work, f"train{n}.sh")
    with open(script, "w") as fh:
        fh.write("#!/bin/bash\n" + body)
    os.chmod(script, 0o755)
    train = _run("sbatch", "--parsable", "--qos=train", "--requeue", "-p", "gpu", "--gres=gpu:2",
                 f"--chdir={work}", "-o", f"{work}/t-%j.out", script, user=True).strip()
    if not train:
        return None
    infer = ""
    try:
        deadline = time.monotonic() + 60
        while _state(train) != "RUNNING" or not os.path.exists(out + ".ready"):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        # slurmctld decides preemptions and starts jobs on its own ~1 s passes; a submission
        # at a fixed delay after the training job's start would sample one phase of them,
        # and a different one per mode (their start-up differs). The same random phase for
        # both runs of a pair spreads both over every phase alike.
        time.sleep(0.3 + phase)
        logs = Logs()
        t0 = time.time()
        infer = _run("sbatch", "--parsable", "--qos=infer", "-p", "gpu", "--gres=gpu:1",
                     f"--chdir={work}", "-o", "/dev/null", "--wrap",
                     f"date +%s.%N > {out}.infer; sleep 0.5", user=True).strip()
        while not os.path.exists(out + ".infer") or os.path.getsize(out + ".infer") == 0:
            if time.monotonic() - deadline > 120:
                return None
            time.sleep(0.02)
        with open(out + ".infer") as fh:
            started = float(fh.read().split()[0])
        while _state(infer) not in ("GONE", "COMPLETED"):  # its epilog logged before reading
            time.sleep(0.1)
        tl = timeline(logs, train, infer, out)
        tl.setdefault("infer submitted", t0)
        if wrapped:  # the measured path must be the real one: the job went back to the queue
            shown = _run("scontrol", "show", "job", "-o", train)
            if "Restarts=1" not in shown:
                print(f"run {n}: training job {train} was not requeued; run not counted")
                return None
        with open(out) as fh:
            got, saved = (float(x) for x in fh.read().split())
        return started - t0, saved - got, tl
    finally:
        _run("scancel", train, *([infer] if infer else []))
        while _state(train) != "GONE":
            time.sleep(0.2)


def _spread(xs: List[float]) -> str:
    return f"{statistics.median(xs):.2f} s (min {min(xs):.2f}, max {max(xs):.2f}, n={len(xs)})"


def _print_timeline(name: str, tls: List[Dict[str, float]]) -> None:
    keys: Dict[str, List[float]] = {}
    for tl in tls:
        base = tl.get("infer submitted")
        if base is None:
            continue
        for k, v in tl.items():
            keys.setdefault(k, []).append(v - base)
    print(f"timeline, {name} (median seconds after the infer job's submission, n={len(tls)}):")
    for k, vs in sorted(keys.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"  {statistics.median(vs):7.3f}  {k}  [{min(vs):.3f} .. {max(vs):.3f}]")


#: Consecutive segments (from, to) whose per-run lengths are compared; a label says whose.
SEGMENTS = [
    ("Slurm: preemption decision", "infer submitted", "preempt signal (step cancelled)"),
    ("program: rest of step + save (own time)", "program got its stop signal", "program saved"),
    ("program saved -> training step ended (wrapper: report, request, exit)", "program saved",
     "training step ended"),
    ("training step ended -> ctld: job complete", "training step ended",
     "ctld: training job complete"),
    ("job complete -> training Epilog end", "ctld: training job complete",
     "epilog (training) end"),
    ("job complete -> ctld: infer allocated (Epilog + ctld's scheduler pass)",
     "ctld: training job complete", "ctld: infer allocated"),
    ("allocated -> slurmd launch request", "ctld: infer allocated",
     "slurmd: infer launch request (Prolog starts)"),
    ("Prolog (infer), whole process", "slurmd: infer launch request (Prolog starts)",
     "slurmd: infer batch launched (Prolog done)"),
    ("batch launched -> batch step up", "slurmd: infer batch launched (Prolog done)",
     "infer batch step up"),
    ("batch step up -> program's first line (TaskProlog, SPANK, bash)", "infer batch step up",
     "infer program's first line"),
    ("preempt signal -> infer program's first line", "preempt signal (step cancelled)",
     "infer program's first line"),
]


def _print_segments(runs: Dict[str, List[Dict[str, float]]]) -> None:
    print(f"{'segment (median per run, seconds; [min .. max])':<72} " +
          " ".join(f"{m:>22}" for m in runs))
    for label, a, b in SEGMENTS:
        cells = []
        for tls in runs.values():
            d = [tl[b] - tl[a] for tl in tls if a in tl and b in tl]
            cells.append(f"{statistics.median(d):6.3f} [{min(d):.2f}..{max(d):.2f}]"
                         if d else "not seen")
        print(f"  {label:<70} " + " ".join(f"{c:>22}" for c in cells))


def main() -> bool:
    why = skip_reason()
    if why:
        print(f"preemption benchmark skipped: {why}")
        return True

    work = tempfile.mkdtemp(prefix="bench-preempt-", dir="/tmp")
    os.chmod(work, 0o1777)
    with open(os.path.join(work, "prog.py"), "w") as fh:
        fh.write(PROGRAM)
    os.chmod(os.path.join(work, "prog.py"), 0o644)
    got: Dict[bool, List[Run]] = {False: [], True: []}
    import random

    rng = random.Random(14)
    from slurmiso_sandbox.client import session_lock

    with session_lock(SANDBOX):  # the tests' and the demo's lock: one session per sandbox
        for n in range(RUNS):
            phase = rng.uniform(0.0, 1.0)
            for wrapped in ((False, True) if n % 2 == 0 else (True, False)):
                if wrapped:
                    res = preempt_once(work, 2 * n + 1, True, phase)
                else:
                    with hooks_off():
                        res = preempt_once(work, 2 * n, False, phase)
                if res is not None:
                    got[wrapped].append(res)
    if not got[False] or not got[True]:
        print("preemption benchmark: the sandbox did not run the jobs in time; no figure")
        return True
    own = statistics.median(o for runs in got.values() for _, o, _ in runs)
    matched = {w: [t - o + own for t, o, _ in runs] for w, runs in got.items()}
    print(f"program's own time (rest of its step + save), median of all: {own:.3f} s")
    print(f"baseline: bare Slurm, hooks off, srun prog: raw "
          f"{_spread([t for t, _, _ in got[False]])}; own time matched {_spread(matched[False])}")
    print(f"slurmiso: hooks on, srun slurmiso run -- prog: raw "
          f"{_spread([t for t, _, _ in got[True]])}; own time matched {_spread(matched[True])}")
    _print_timeline("bare", [tl for _, _, tl in got[False]])
    _print_timeline("slurmiso", [tl for _, _, tl in got[True]])
    _print_segments({"bare": [tl for _, _, tl in got[False]],
                     "slurmiso": [tl for _, _, tl in got[True]]})
    # Without Slurm's preemption decision (before slurmiso takes any part; its phase against
    # slurmctld's scheduler varies run to run), own time matched as above:
    after = {w: [tl["infer program's first line"] - tl["preempt signal (step cancelled)"] - o
                 + own for _, o, tl in runs
                 if "preempt signal (step cancelled)" in tl and "infer program's first line" in tl]
             for w, runs in got.items()}
    if after[False] and after[True]:
        print(f"preempt signal -> infer start, own time matched: bare {_spread(after[False])}; "
              f"slurmiso {_spread(after[True])}")
    b, w = statistics.median(matched[False]), statistics.median(matched[True])
    shutil.rmtree(work, ignore_errors=True)
    return report("sbatch --qos=infer -> infer program starts", f"+{w - b:.2f} s", w / b,
                  "of bare Slurm (own time matched)", (b + TARGET_S) / b)


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
