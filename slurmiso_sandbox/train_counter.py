#!/usr/bin/env python3
"""A stand-in training program: counts steps, checkpoints on request, resumes.

Each finished step appends ``step=<n> restart=<r> pid=<p>`` to ``--log`` (one ``O_APPEND``
write), so a test can prove that no step was counted twice and none was lost across any
number of preemptions. A checkpoint is ``{"step": n}`` in ``<ckpt dir>/step-<n>.json``,
written to a temp file, fsynced and renamed, then reported with ``slurmiso.checkpoint``.

Misbehaviours for the tests: ``--ignore-signal`` (never checks the request),
``--crash-in-checkpoint`` (writes half a checkpoint, then dies without reporting),
``--slow-checkpoint S`` (takes S seconds to save), ``--fail-at N`` (exits 3 at step N);
``--misbehave-on-restart R`` limits those to the run with that restart count.
Optionally it holds a simulated GPU (``--sim-gpu``: reads ``CUDA_VISIBLE_DEVICES`` and logs
it, as a real program would pick its device). With ``--sim-cuda STATE`` (a simulated node's
state file) each step first asks the simulated driver for its own CUDA state, as each CUDA
call of a real program would: while cuda-checkpoint has it locked or checkpointed (parked),
it waits there, logging ``# parked before step N`` once and ``# unparked`` after; a process
the driver left ``failed`` ends (exit 4), as its next CUDA call would fail.

Beside the monitor's ladder: while ``slurmiso.checkpoint.throttled()`` says the monitor asked it
to slow down, each step takes twice as long and its line ends `` throttled=1``;
``--report-steps`` reports each step's time through ``slurmiso.checkpoint.report_step`` (the
agent's training signal); ``--stop-file F`` ends the run normally once F exists.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the repo (or the packages' tree), for slurmiso

from slurmiso import checkpoint  # noqa: E402


def load_step(path: str | None) -> int:
    if not path:
        return 0
    with open(path, encoding="utf-8") as fh:
        return int(json.load(fh)["step"])


def save(ckpt_dir: str, step: int, slow_s: float, crash: bool) -> str:
    os.makedirs(ckpt_dir, exist_ok=True)
    path = os.path.join(ckpt_dir, f"step-{step}.json")
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        body = json.dumps({"step": step, "pad": "x" * 256})
        if crash:
            fh.write(body[: len(body) // 2])
            fh.flush()
            os._exit(7)  # died mid-save: nothing reported
        if slow_s:
            time.sleep(slow_s)
        fh.write(body)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path


def log_line(log_path: str, text: str) -> None:
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def throttled() -> bool:
    """The wrapper's throttle marker (``checkpoint.throttled``; the file where it is older)."""
    probe = getattr(checkpoint, "throttled", None)
    if probe is not None:
        return bool(probe())
    path = os.environ.get("SLURMISO_THROTTLE_FILE", "")
    return bool(path) and os.path.lexists(path)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--step-time", type=float, default=0.02)
    p.add_argument("--log", required=True)
    p.add_argument("--ignore-signal", action="store_true")
    p.add_argument("--crash-in-checkpoint", action="store_true")
    p.add_argument("--slow-checkpoint", type=float, default=0.0)
    p.add_argument("--fail-at", type=int, default=0)
    p.add_argument("--misbehave-on-restart", type=int, default=-1)
    p.add_argument("--sim-gpu", action="store_true")
    p.add_argument("--sim-cuda", default="", help="a simulated node's state file")
    p.add_argument("--report-steps", action="store_true")
    p.add_argument("--stop-file", default="")
    args = p.parse_args()

    restart = checkpoint.restart_count()
    if args.misbehave_on_restart not in (-1, restart):
        args.ignore_signal = args.crash_in_checkpoint = False
        args.slow_checkpoint, args.fail_at = 0.0, 0
    start = load_step(checkpoint.resume_path())
    ckpt_dir = checkpoint.ckpt_dir(os.path.join(os.path.dirname(args.log), "ckpt"))
    if args.sim_gpu:
        log_line(args.log, f"# gpu={os.environ.get('CUDA_VISIBLE_DEVICES', '')} restart={restart}")
    log_line(args.log, f"# start at={start} restart={restart} pid={os.getpid()}")
    with checkpoint.on_request() as req:
        if args.ignore_signal:
            req.uninstall()
            import signal

            signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        for step in range(start + 1, args.steps + 1):
            if args.sim_cuda:
                wait_while_parked(args.sim_cuda, args.log, step)
            slow = throttled()
            time.sleep(args.step_time * (2 if slow else 1))
            if step == args.fail_at:
                return 3
            log_line(args.log, f"step={step} restart={restart} pid={os.getpid()}"
                     + (" throttled=1" if slow else ""))
            if args.report_steps:
                checkpoint.report_step()
            if args.stop_file and os.path.exists(args.stop_file):
                log_line(args.log, f"# finished steps={step}")
                return 0
            if req.pending and not args.ignore_signal:
                path = save(ckpt_dir, step, args.slow_checkpoint, args.crash_in_checkpoint)
                req.done(path, step=step)
                log_line(args.log, f"# checkpoint step={step}")
                return 0
    log_line(args.log, f"# finished steps={args.steps}")
    return 0


def wait_while_parked(state: str, log: str, step: int) -> None:
    """Block as a CUDA call blocks while the process is locked or checkpointed (a process
    the simulated driver does not know runs on: it holds no simulated GPU)."""
    from slurmiso.errors import SlurmisoError
    from slurmiso.gpu.sim import SimBackend

    sim, said = SimBackend(state), False
    while True:
        try:
            state = sim.cuda_state(os.getpid()).value
        except SlurmisoError:
            state = "running"
        if state == "failed":  # as a real program's next CUDA call fails
            log_line(log, f"# cuda failed before step {step}")
            raise SystemExit(4)
        parked = state != "running"
        if not parked:
            if said:
                log_line(log, f"# unparked at={time.time():.3f}")
            return
        if not said:
            log_line(log, f"# parked before step {step} at={time.time():.3f}")
            said = True
        time.sleep(0.1)


if __name__ == "__main__":
    sys.exit(main())
