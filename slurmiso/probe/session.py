"""A probe's runs: inference alone, training alone, then both on one GPU; collect, judge, and
leave nothing running (the per-mode figures and the loop over modes: :mod:`slurmiso.probe.modes`).

Why three runs per mode: the mode's own solo runs are the baseline its mixed run is compared
with (what sharing costs *in* that mode), and the fastest training alone across modes (a whole
GPU) is the baseline a partition's cost is measured against. The pair's overlap is real: the
training run starts first and inference begins only once training has printed a step (the
``ready`` file), and only the training steps taken while inference ran count for the mixed
figures (each output line's arrival time is recorded beside it).

Every run's result is judged before the next one starts, so a broken ``--infer-cmd`` stops the
probe at its first run with one message naming the command and its output files. A run that was
interrupted from outside (Slurm requeued it, a preemption or a scancel signalled it) is not the
command's fault: it is :class:`RunInvalid`, its mode is reported as not measured with the reason,
and the probe goes on with the next mode; its half-measured figures are never used. Whatever ends
the probe (an error, Ctrl-C, SIGTERM), :meth:`Session.close` cancels every run it started and
waits until none is left.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from slurmiso.errors import ProbeError, SlurmisoError
from slurmiso.probe import gpumem
from slurmiso.probe.contract import ENV_DOC, Parsed, parse_output
from slurmiso.probe.launch import ENDED, PENDING, Launcher, Run
from slurmiso.values import Value, field

log = logging.getLogger(__name__)

ROLES = ("infer", "train")
#: After the stop file, how long training has to end before it is cancelled.
STOP_WAIT_S = 30.0
#: A result file may reach a shared file system a little after Slurm reports the job ended.
RESULT_WAIT_S = 15.0
#: How much of the training peak must stay free under the class's limit (DESIGN: 20-30%).
HEADROOM_MIN_PCT = gpumem.HEADROOM_MIN_PCT


class RunInvalid(ProbeError):
    """A run was interrupted from outside the probe (requeued, preempted, signalled): its
    figures are partial, so its mode is not measured. Not the workload's fault."""


class Options(Value):
    """What and how long to measure (the CLI's options)."""

    infer_cmd: str = ""  # "" = the built-in workload
    train_cmd: str = ""
    requests: int = 200
    rate: float = 20.0
    request_timeout_ms: float = 1000.0
    train_seconds: float = 10.0
    run_timeout_s: float = 300.0
    queue_timeout_s: float = 600.0
    ready_timeout_s: float = 120.0
    warmup_steps: int = 1
    python: str = sys.executable
    poll_s: float = 0.1
    #: How the runner samples its command's GPU memory (:func:`gpumem.open_sampler`'s spec);
    #: {} = not sampled.
    gpu_mem: Dict[str, Any] = field(default_factory=dict)


class Placement(Value):
    """Where one role runs in a mode: env for a local process, sbatch args for a job."""

    env: Dict[str, str] = field(default_factory=dict)
    sbatch: List[str] = field(default_factory=list)


#: (mode, cleanup) -> ({role: Placement}, "") or (None, why the mode is skipped here).
Placer = Callable[[str, contextlib.ExitStack],
                  Tuple[Optional[Dict[str, Placement]], str]]


class Outcome(Value, frozen=False):
    """One finished run: where it ran, what it printed, how it ended."""

    name: str
    role: str
    handle: str
    paths: Dict[str, str]
    started: Dict[str, Any] = field(default_factory=dict)
    result: Dict[str, Any] = field(default_factory=dict)
    parsed: Parsed = field(default_factory=Parsed)


def _read_json(path: str) -> Dict[str, Any]:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _read_lines(path: str) -> List[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read().splitlines()
    except OSError:
        return []


def _is_sample(line: str) -> bool:
    """Whether an output line is a latency or step sample (not a peak or info line)."""
    text = line.strip()
    if text.startswith("{"):
        return any(k in text for k in ('"step_s"', '"latency_ms"', '"ok"'))
    try:
        float(text)
    except ValueError:
        return False
    return True


class Session:
    """Runs a probe's workloads through one launcher and cleans up after them."""

    def __init__(self, launcher: Launcher, work_dir: str, opts: Options) -> None:
        self.launcher = launcher
        self.work_dir = work_dir
        self.opts = opts
        self.live: List[str] = []
        self.cancelled: set = set()  # handles this session cancelled itself
        self.runs: List[Dict[str, Any]] = []
        self.workload_info: Dict[str, Dict[str, Any]] = {}

    # -- naming what went wrong ---------------------------------------------------------------

    def label(self, role: str) -> str:
        cmd = self.opts.infer_cmd if role == "infer" else self.opts.train_cmd
        if cmd:
            return f"--{role}-cmd {cmd!r}"
        return f"the built-in {'inference' if role == 'infer' else 'training'} workload"

    def _where(self, o: Outcome) -> str:
        files = [o.paths["output"], o.paths["stderr"]]
        if self.launcher.where == "slurm":
            files.append(o.paths["slurm_out"])
        return "output in " + ", ".join(files)

    # -- one run --------------------------------------------------------------------------------

    def _spec(self, name: str, role: str, env: Dict[str, str]) -> Dict[str, str]:
        base = os.path.join(self.work_dir, name)
        paths = {k: f"{base}.{ext}" for k, ext in (
            ("spec", "spec.json"), ("output", "out"), ("times", "times"), ("stderr", "err"),
            ("started", "started.json"), ("result", "result.json"), ("ready", "ready"),
            ("stop", "stop"), ("starts", "starts"))}
        paths["slurm_out"] = f"{base}.slurm.out"
        cmd = self.opts.infer_cmd if role == "infer" else self.opts.train_cmd
        argv = ["/bin/sh", "-c", cmd] if cmd else [
            self.opts.python, "-m", "slurmiso.probe.workloads", role]
        for key in ("output", "times", "stderr", "started", "result", "ready", "stop", "starts"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(paths[key])
        spec = {"role": role, "argv": argv, "cwd": self.work_dir,
                "timeout_s": self.opts.run_timeout_s, "env": env,
                "gpu_mem": dict(self.opts.gpu_mem),
                **{k: paths[k] for k in ("output", "times", "stderr", "started", "result",
                                         "ready", "starts")}}
        if role == "train":
            spec["stop_file"] = paths["stop"]
            spec["env"] = dict(env, SLURMISO_PROBE_STOP_FILE=paths["stop"])
        with open(paths["spec"], "w", encoding="utf-8") as fh:
            json.dump(spec, fh, indent=1, sort_keys=True)
        return paths

    def _workload_env(self, role: str) -> Dict[str, str]:
        env = {"SLURMISO_PROBE_ROLE": role}
        if role == "infer":
            env.update(SLURMISO_PROBE_REQUESTS=str(self.opts.requests),
                       SLURMISO_PROBE_RATE=f"{self.opts.rate:g}",
                       SLURMISO_PROBE_REQUEST_TIMEOUT_MS=f"{self.opts.request_timeout_ms:g}")
        assert set(env) <= set(ENV_DOC)
        return env

    def start(self, name: str, role: str, place: Placement, node: str = "") -> Outcome:
        env = self._workload_env(role)
        paths = self._spec(name, role, env)
        run = Run(name, role, paths["spec"], env=dict(place.env), sbatch=list(place.sbatch),
                  node=node)
        handle = self.launcher.start(run)
        self.live.append(handle)
        log.info("started %s as %s", name, self.launcher.describe(handle))
        return Outcome(name, role, handle, paths)

    def wait_running(self, o: Outcome) -> None:
        """Until the run has left the queue; ProbeError when it waits past the queue timeout."""
        deadline = time.monotonic() + self.opts.queue_timeout_s
        while self.launcher.state(o.handle) == PENDING:
            if time.monotonic() >= deadline:
                why = self.launcher.why_pending(o.handle)
                raise ProbeError(
                    f"probe run {o.name} ({self.launcher.describe(o.handle)}) did not start "
                    f"within {self.opts.queue_timeout_s:g}s" + (f" (Slurm: {why})" if why else ""),
                    hint="free the pool's GPUs or raise --queue-timeout")
            time.sleep(self.opts.poll_s)

    def wait_ready(self, o: Outcome) -> None:
        """Until training has printed its first step (or ended, which is judged as a result)."""
        self.wait_running(o)
        deadline = time.monotonic() + self.opts.ready_timeout_s
        while not os.path.exists(o.paths["ready"]):
            if self.launcher.state(o.handle) == ENDED:
                self.collect(o)
                self.judge(o)
                raise ProbeError(f"{self.label('train')} ended before inference could run beside "
                                 f"it (probe run {o.name}); {self._where(o)}")
            if time.monotonic() >= deadline:
                o.started, o.result = _read_json(o.paths["started"]), _read_json(
                    o.paths["result"])
                interrupted = self.interrupted(o)
                if interrupted:  # requeued before its first step: pending again, not silent
                    raise RunInvalid(f"{self.label('train')} (probe run {o.name}, "
                                     f"{self.launcher.describe(o.handle)}) {interrupted}; "
                                     f"{self._where(o)}")
                raise ProbeError(
                    f"{self.label('train')} printed no step within "
                    f"{self.opts.ready_timeout_s:g}s (probe run {o.name}); it must print one "
                    f"step time per line; {self._where(o)}",
                    hint="a slow first step? raise --ready-timeout")
            time.sleep(self.opts.poll_s)

    def wait_ended(self, o: Outcome, timeout: Optional[float] = None) -> bool:
        """Until the run has ended (True) or ``timeout`` passed (False)."""
        limit = self.opts.run_timeout_s + STOP_WAIT_S if timeout is None else timeout
        deadline = time.monotonic() + limit
        while self.launcher.state(o.handle) != ENDED:
            if time.monotonic() >= deadline:
                return False
            time.sleep(self.opts.poll_s)
        return True

    def collect(self, o: Outcome) -> None:
        deadline = time.monotonic() + (RESULT_WAIT_S if self.launcher.where == "slurm" else 1.0)
        while not os.path.exists(o.paths["result"]) and time.monotonic() < deadline:
            time.sleep(min(self.opts.poll_s, 0.5))
        o.result = _read_json(o.paths["result"])
        o.started = _read_json(o.paths["started"])
        with contextlib.suppress(ValueError):
            self.live.remove(o.handle)

    def parse(self, o: Outcome, since: float = 0.0, until: float = 0.0) -> Parsed:
        """The run's output by the contract; with a window, only the lines that came in it."""
        lines = _read_lines(o.paths["output"])
        if since or until:
            times = _read_lines(o.paths["times"])
            kept = []
            for line, t in zip(lines, times):
                try:
                    at = float(t)
                except ValueError:
                    continue
                if not _is_sample(line) or ((not since or at >= since)
                                            and (not until or at <= until)):
                    kept.append(line)  # memory peak and info lines count whenever they came
            lines = kept
        return parse_output("\n".join(lines), o.role)

    def judge(self, o: Outcome) -> None:
        """ProbeError unless the run ended the way its role must and printed its figures."""
        what, res = self.label(o.role), o.result
        where = f"probe run {o.name}, {self.launcher.describe(o.handle)}"
        interrupted = self.interrupted(o)
        if interrupted:
            raise RunInvalid(f"{what} ({where}) {interrupted}; its figures are from an "
                             f"interrupted run and are not used; {self._where(o)}",
                             hint="probe when the pool is quiet, or on a partition that does "
                                  "not preempt")
        if not res:
            raise ProbeError(f"{what} ({where}) ended without a result: the job was cancelled, "
                             f"preempted or could not start; {self._where(o)}")
        if res.get("error"):
            raise ProbeError(f"{what} ({where}): {res['error']}; {self._where(o)}")
        if res.get("timed_out"):
            raise ProbeError(f"{what} ({where}) did not finish within "
                             f"{self.opts.run_timeout_s:g}s and was killed (hung?); "
                             f"{self._where(o)}", hint="raise --run-timeout if it is just slow")
        if not res.get("stopped") and res.get("exit_code") != 0:
            how = (f"exit status {res['exit_code']}" if res.get("exit_code") is not None
                   else f"signal {res.get('signal')}")
            raise ProbeError(f"{what} ({where}) failed with {how}; {self._where(o)}")
        o.parsed = self.parse(o)
        if o.parsed.info:
            self.workload_info.setdefault(o.role, dict(o.parsed.info))
        if o.role == "infer" and not o.parsed.infer:
            raise ProbeError(
                f"{what} ({where}) printed no latencies ({o.parsed.ignored} other lines"
                + (f", e.g. {o.parsed.ignored_samples[0]!r}" if o.parsed.ignored_samples else "")
                + f"); it must print one latency in ms per line, or JSON lines "
                f'{{"latency_ms": 12.3, "ok": true}}; {self._where(o)}')
        if o.role == "train" and not o.parsed.steps:
            raise ProbeError(
                f"{what} ({where}) printed no step times ({o.parsed.ignored} other lines); it "
                f"must print one step time in seconds per line, or JSON lines "
                f'{{"step_s": 0.2}}; {self._where(o)}')

    def interrupted(self, o: Outcome) -> str:
        """Why ``o`` was interrupted from outside the probe ("" when it was not): a second
        start or a restart count (Slurm requeued it: preemption, node failure), or a signal
        to its runner that this session did not send (scancel, preemption)."""
        starts = [ln for ln in _read_lines(o.paths["starts"]) if ln.strip()]
        counts = [int(d.get("restart_count") or 0) for d in (o.started, o.result)
                  if isinstance(d.get("restart_count"), int)]
        try:
            slurm_count = self.launcher.restarts(o.handle)
        except SlurmisoError as exc:  # the files decide when Slurm cannot answer
            log.warning("restart count of %s: %s", self.launcher.describe(o.handle), exc)
            slurm_count = None
        if slurm_count:
            counts.append(slurm_count)
        if len(starts) > 1 or any(counts):
            facts = []
            if len(starts) > 1:
                facts.append(f"it started {len(starts)} times ({o.paths['starts']})")
            if any(counts):
                facts.append(f"Slurm's restart count is {max(counts)}")
            return ("was requeued mid-probe (preempted, or its node failed): "
                    + " and ".join(facts))
        if o.result.get("stop_cause") == "signal" and o.handle not in self.cancelled:
            return (f"was ended by a signal from outside the probe after "
                    f"{o.result.get('seconds', '?')}s (scancel, preemption or a node shutdown)")
        return ""

    def finish(self, o: Outcome, started_mono: float) -> None:
        self.collect(o)
        self.judge(o)
        self.runs.append({"run": o.name, "role": o.role, "where": self.launcher.describe(o.handle),
                          "node": o.started.get("node"),
                          "seconds": round(time.monotonic() - started_mono, 2),
                          "output": o.paths["output"]})

    def solo(self, mode: str, role: str, place: Placement) -> Outcome:
        t0 = time.monotonic()
        o = self.start(f"{mode}-solo-{role}", role, place)
        if role == "train":  # alone for train_seconds once stepping, then stopped as contracted
            self.wait_ready(o)
            end = time.monotonic() + self.opts.train_seconds
            while time.monotonic() < end and self.launcher.state(o.handle) != ENDED:
                time.sleep(self.opts.poll_s)
            self.stop_training(o)
        else:
            self.wait_running(o)
            if not self.wait_ended(o):
                self.cancel(o)
        self.finish(o, t0)
        return o

    def cancel(self, o: Outcome) -> None:
        """Cancel one run; its end by a signal is then the probe's doing, not an outside one."""
        self.cancelled.add(o.handle)
        self.launcher.cancel(o.handle)

    def stop_training(self, o: Outcome) -> None:
        with open(o.paths["stop"], "w", encoding="utf-8"):
            pass
        if not self.wait_ended(o, STOP_WAIT_S):
            log.warning("%s did not end %gs after its stop file; cancelling it", o.name,
                        STOP_WAIT_S)
            self.cancel(o)
            self.wait_ended(o, STOP_WAIT_S)

    def mixed(self, mode: str, places: Dict[str, Placement]) -> Tuple[Outcome, Outcome]:
        t0 = time.monotonic()
        train = self.start(f"{mode}-mixed-train", "train", places["train"])
        self.wait_ready(train)
        node = _read_json(train.paths["started"]).get("node", "")
        t1 = time.monotonic()
        infer = self.start(f"{mode}-mixed-infer", "infer", places["infer"],
                           node=node if self.launcher.where == "slurm" else "")
        try:
            self.wait_running(infer)
            if not self.wait_ended(infer):
                self.cancel(infer)
            self.finish(infer, t1)
        finally:
            self.stop_training(train)
        self.finish(train, t0)
        return infer, train

    def close(self) -> List[str]:
        """Cancel every run still alive; the handles that survived (none, normally)."""
        left = self.launcher.cancel_all()
        if left:
            log.error("probe runs still alive after cancelling: %s",
                      ", ".join(self.launcher.describe(h) for h in left))
        return left
