"""The SLO ladder on the sandbox: running inference protected from the training beside it.

An inference job (the stand-in server :mod:`slurmiso_sandbox.latency_server`, declared with
``--iso-metrics``) and a training job (:mod:`slurmiso_sandbox.train_counter` under
``slurmiso run``) share one MPS GPU of n2. A real ``slurmiso agent`` serves n2's metrics and a
real ``slurmiso monitor`` daemon (not dry-run) runs the ladder on them. The demo drives the
stand-in's latency over the SLO and back, and reads what happened from Slurm, the monitor's
journal and the two programs' own logs: which steps were taken in which order, what the
training program saw (throttled steps, a standstill while suspended, a checkpoint and resume
when requeued), whether a training step was lost or counted twice, and whether anything
touched the inference job.
"""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from typing import Any, Dict, List, Optional, Sequence

from slurmiso.errors import SandboxError
from slurmiso_sandbox.client import REPO, SandboxClient
from slurmiso_sandbox.procs import wait_until
from slurmiso_sandbox.scenes import monitor_config, record_gpu

SLO_MS = 250
CALM_MS, HOT_MS = 40, 400
LADDER_KINDS = ("throttle", "unthrottle", "park", "unpark", "suspend", "resume-job", "requeue",
                "ladder-end")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ladder_config(sbx: SandboxClient, folder: str, steps: Sequence[str], dwell_s: int = 2,
                  unknown_after_s: int = 0, window_s: int = 6,
                  budgets: Optional[Dict[str, str]] = None, name: str = "") -> str:
    """The sandbox config with an SLO for ``infer``, a ladder of ``steps`` whose dwells are
    ``dwell_s`` (the shipped ones are minutes), the agent reading signals every second over a
    ``window_s`` window, and the monitor applying (not dry-run). ``budgets`` replaces a step's
    ``per_job``/``per_hour`` text; ``name`` writes ``slurmiso-<name>.yaml`` beside the others
    (a monitor restarted with other steps keeps the agents' config)."""
    config = monitor_config(sbx, folder)
    with open(config) as fh:
        text = fh.read()
    budget = {"throttle": "per_job: 6, per_hour: 120", "suspend": "per_job: 3, per_hour: 30",
              "requeue": "per_job: 1, per_hour: 10"}
    budget.update(budgets or {})
    rows = []
    for step in steps:
        after = 0 if step == "hold" else (2 * dwell_s if step != "throttle" else dwell_s)
        extra = f", {budget[step]}" if step in budget else ""
        rows.append(f"    {step}: {{after: {after}s, release_after: {dwell_s}s{extra}}}\n")
    block = (
        "\nmonitor:\n"
        "  slo:\n"
        "    - class: infer\n"
        "      signal: ttft\n"
        f"      p99_ms: {SLO_MS}\n"
        "  ladder:\n"
        f"    steps: [{', '.join(steps)}]\n" + "".join(rows) +
        "  signals:\n"
        "    refresh: 1s\n"
        f"    window: {window_s}s\n"
    )
    text = text.replace("\nmonitor:\n", block, 1)
    if name:
        os.unlink(config)
        config = os.path.join(folder, f"slurmiso-{name}.yaml")
    with open(config, "w") as fh:
        fh.write(text)
    return config


class Ladder:
    """The running parts of one scenario: the two jobs, the agent, the monitor; started by
    :meth:`start`, stopped (whatever happened) by :meth:`stop`."""

    def __init__(self, sbx: SandboxClient, steps: Sequence[str], dwell_s: int = 2,
                 window_s: int = 6, budgets: Optional[Dict[str, str]] = None,
                 interval_s: float = 1.0) -> None:
        self.sbx = sbx
        self.work = tempfile.mkdtemp(prefix="protect-", dir=sbx.jobs_dir)
        os.chmod(self.work, 0o1777)
        self.dwell_s, self.window_s, self.budgets = dwell_s, window_s, dict(budgets or {})
        self.config = ladder_config(sbx, self.work, steps, dwell_s, window_s=window_s,
                                    budgets=budgets)
        self.monitor_config = self.config  # replaced by restart_monitor()
        self.state = os.path.join(self.work, "monitor-state.json")
        self.metrics_port = free_port()
        #: node -> (agent, its port) for nodes beside the stand-in's (``start_daemons``)
        self.agents: Dict[str, Any] = {}
        #: training jobs beside the scene (``add_training``): job -> its step log
        self.others: Dict[str, str] = {}
        self.node = "n2"
        self.restarts = 0
        self.interval_s = interval_s
        self.control = os.path.join(self.work, "latency-ms")
        self.infer_log = os.path.join(self.work, "infer.log")
        self.train_log = os.path.join(self.work, "train.log")
        self.stop_file = os.path.join(self.work, "stop")
        self.port, self.agent_port = free_port(), free_port()
        self.infer = self.train = ""
        self.agent: Optional[subprocess.Popen] = None
        self.monitor: Optional[subprocess.Popen] = None
        self.agent_starts = 0
        self.started = time.time()
        self.set_latency(CALM_MS)

    # -- the jobs ----------------------------------------------------------------------------
    def set_latency(self, ms: float) -> None:
        self._control(f"{ms}")

    def set_garbage(self, ms: float) -> None:
        """The stand-in's endpoint answers an HTML page, no series, while its requests take
        ``ms``."""
        self._control(f"garbage {ms}")

    def _control(self, text: str) -> None:
        tmp = self.control + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(f"{text}\n")
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.control)

    def start_jobs(self, node: str = "n2", train_args: str = "", container: str = "") -> None:
        """The stand-in server and the training job; with ``container`` (an OCI bundle)
        each runs in it (``srun --container``)."""
        sbx = self.sbx
        inside = f"srun --container={container} " if container else ""
        py, path = sbx.job_python, sbx.job_pythonpath
        here = os.path.join(path, "slurmiso_sandbox")
        self.infer = sbx.submit(
            f"#!/bin/bash\n{inside or 'exec '}{py} {here}/latency_server.py --port {self.port} "
            f"--control {self.control} --log {self.infer_log}\n",
            "-p", "mps", "--qos=infer", "--gres=mps:50", "-w", node, "-J", "infer-standin",
            f"--iso-metrics={self.port}")
        sbx.wait_for(self.infer, {"RUNNING"}, timeout=60)
        wait_until("the stand-in to listen",
                   lambda: "# listening" in read_text(self.infer_log), timeout=30)
        self.train = sbx.submit(
            "#!/bin/bash\n"
            f"export PYTHONPATH={path}\n"
            f"{inside or 'srun '}{py} -m slurmiso run --ckpt-dir {self.work}/ckpt -- "
            f"{py} {here}/train_counter.py --steps 100000 --step-time 0.05 --report-steps "
            f"--stop-file {self.stop_file} --log {self.train_log} {train_args}\n",
            "-p", "mps", "--qos=train", "--gres=mps:50", "-w", node, "--requeue",
            "--open-mode=append", "-J", "train-beside")
        sbx.wait_for(self.train, {"RUNNING"}, timeout=60)
        wait_until("the training job to make progress",
                   lambda: len(self.steps()) >= 20, timeout=120)

    def sim_path(self) -> str:
        """The simulated GPUs of the scene's node (its state file)."""
        return self.sbx.path("sim", f"{self.node}.json")

    def hold_sim_gpu(self, memory_mb: int = 4000) -> int:
        """Register the training program as a CUDA process on its simulated GPU (what the
        driver would list for it, and what the park rung finds through its cgroup); its
        pid. Start the program with ``--sim-cuda`` (:meth:`sim_path`) so it waits while
        parked."""
        from slurmiso.gpu.sim import SimBackend

        found = re.findall(r"^# start at=\d+ restart=\d+ pid=(\d+)", read_text(self.train_log),
                           re.M)
        if not found:
            raise SandboxError(f"training job {self.train} logged no pid")
        pid = int(found[-1])
        gpu = record_gpu(self.sbx, self.node, self.train)
        SimBackend(self.sim_path()).add_process(gpu, pid, memory_mb, name="train_counter")
        return pid

    def gpus(self, node: str = "n2") -> Dict[str, int]:
        return {job: record_gpu(self.sbx, node, job) for job in (self.infer, self.train)}

    def add_training(self, name: str, *sbatch_args: str) -> str:
        """Another training job (the stand-in program under ``slurmiso run``, its log
        ``<work>/<name>.log``), running once this returns: a bystander whose fate a test
        checks."""
        sbx = self.sbx
        py, path = sbx.job_python, sbx.job_pythonpath
        here = os.path.join(path, "slurmiso_sandbox")
        log = os.path.join(self.work, f"{name}.log")
        job = sbx.submit(
            "#!/bin/bash\n"
            f"export PYTHONPATH={path}\n"
            f"srun {py} -m slurmiso run --ckpt-dir {self.work}/ckpt-{name} -- "
            f"{py} {here}/train_counter.py --steps 100000 --step-time 0.1 --report-steps "
            f"--stop-file {self.stop_file} --log {log}\n",
            "--qos=train", "-J", name, *sbatch_args)
        self.others[job] = log
        sbx.wait_for(job, {"RUNNING"}, timeout=60)
        wait_until(f"training job {job} to make progress",
                   lambda: len(steps_in(log)) >= 5, timeout=120)
        return job

    def steps(self, log: str = "") -> List[int]:
        return steps_in(log or self.train_log)

    def throttled_steps(self, log: str = "") -> List[int]:
        return [int(m) for m in re.findall(r"^step=(\d+) .*throttled=1",
                                           read_text(log or self.train_log), re.M)]

    def infer_signals(self) -> List[str]:
        """The signals the stand-in server received (it logs each one it can catch)."""
        return re.findall(r"^# signal (\S+)", read_text(self.infer_log), re.M)

    def served(self) -> int:
        found = re.findall(r"^served=(\d+) ", read_text(self.infer_log), re.M)
        return int(found[-1]) if found else 0

    # -- agent and monitor -------------------------------------------------------------------
    def _slurmiso(self, *args: str) -> List[str]:
        return self.sbx.ns_argv(sys.executable, "-m", "slurmiso", "--config",
                                self.monitor_config, *args)

    def start_daemons(self, node: str = "n2", more: Sequence[str] = ()) -> None:
        """The agent of ``node`` (the stand-in's), one for each node of ``more``, and the
        monitor daemon reading them all (its metrics on ``metrics_port``)."""
        self.node = node
        self.start_agent()
        for other in more:
            port = free_port()
            self.agents[other] = (self._daemon(f"agent-{other}", "agent", "--node", other,
                                               "--port", str(port)), port)
        wait_until(f"the agent to read job {self.infer}'s latency",
                   lambda: self.job_p99() is not None, timeout=60)
        for other, (_, port) in self.agents.items():
            def answers(port: int = port) -> bool:
                return http_get(port, "/metrics").startswith("#")

            wait_until(f"the agent of {other} to answer", answers, timeout=60)
        self._start_monitor()

    def _start_monitor(self) -> None:
        urls = [f"{self.node}=http://127.0.0.1:{self.agent_port}/metrics"]
        urls += [f"{n}=http://127.0.0.1:{port}/metrics" for n, (_, port) in self.agents.items()]
        args = ["-v", "monitor", "--apply", "--interval", f"{self.interval_s:g}",
                "--telemetry", "agents",
                "--state", self.state, "--lock", os.path.join(self.work, "monitor.lock"),
                "--metrics-port", str(self.metrics_port)]
        for url in urls:
            args += ["--agent-url", url]
        name = "monitor" if not self.restarts else f"monitor-{self.restarts}"
        self.monitor = self._daemon(name, *args, config=self.monitor_config)
        wait_until("the monitor's first cycle", lambda: self.cycles() >= 1, timeout=60)

    def restart_monitor(self, steps: Sequence[str], budgets: Optional[Dict[str, str]] = None,
                        dwell_s: Optional[int] = None) -> None:
        """The monitor again with a ladder of ``steps`` (budgets as given, else the
        scenario's), keeping its memory (state file): budgets spent stay spent."""
        _end(self.monitor)
        self.monitor = None
        self.restarts += 1
        self.monitor_config = ladder_config(
            self.sbx, self.work, steps, self.dwell_s if dwell_s is None else dwell_s,
            window_s=self.window_s, budgets={**self.budgets, **(budgets or {})},
            name=f"monitor-{self.restarts}")
        self._start_monitor()

    def _daemon(self, name: str, *args: str, config: str = "") -> subprocess.Popen:
        """Start one slurmiso daemon in the nodes' view, its output in <work>/<name>.log."""
        env = dict(self.sbx.env, PYTHONPATH=REPO)
        argv = self.sbx.ns_argv(sys.executable, "-m", "slurmiso", "--config",
                                config or self.config, *args)
        with open(os.path.join(self.work, f"{name}.log"), "w") as log:
            return subprocess.Popen(argv, env=env, cwd=REPO, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)

    def start_agent(self) -> None:
        """The stand-in's node's agent (again, on the same port, after :meth:`stop_agent`)."""
        self.agent = self._daemon("agent" if self.agent_starts == 0 else
                                  f"agent-{self.agent_starts}", "agent", "--node", self.node,
                                  "--port", str(self.agent_port))
        self.agent_starts += 1

    def stop_agent(self) -> None:
        _end(self.agent)
        self.agent = None

    def cycles(self) -> int:
        """Decision cycles the monitor daemon has run (its own counter; 0 before it serves)."""
        m = re.search(r"^slurmiso_monitor_cycles_total (\S+)$",
                      http_get(self.metrics_port, "/metrics"), re.M)
        return int(float(m.group(1))) if m else 0

    def wait_cycles(self, n: int, timeout: float = 120) -> int:
        """Wait until the monitor has run ``n`` more cycles; returns its count then."""
        base = self.cycles()
        return int(wait_until(f"{n} monitor cycles",
                              lambda: self.cycles() >= base + n and self.cycles(), timeout=timeout))

    def memory(self) -> Dict[str, Any]:
        """The monitor's memory as its state file holds it (rewritten every cycle)."""
        try:
            with open(self.state) as fh:
                return dict(json.load(fh).get("memory") or {})
        except (OSError, ValueError):
            return {}

    def scrape(self) -> str:
        return http_get(self.agent_port, "/metrics")

    def job_p99(self) -> Optional[float]:
        """The P99 the agent shows for the inference job (seconds), None if it shows none."""
        job = re.escape(self.infer)
        pat = (r'^slurmiso_job_latency_seconds\{(?=[^}]*job="' + job + r'")'
               r'(?=[^}]*signal="ttft")(?=[^}]*percentile="99")[^}]*\} (\S+)$')
        m = re.search(pat, self.scrape(), re.M)
        return float(m.group(1)) if m else None

    def actions(self) -> List[Dict[str, Any]]:
        """The monitor's applied actions since the scenario started, in order."""
        from slurmiso.state.journal import Journal

        out: List[Dict[str, Any]] = []
        for path in sorted(glob.glob(self.sbx.path("log", "journal-*.jsonl"))):
            for e in Journal(path).read():
                if e.get("event") == "monitor-action" and not e.get("dry_run") and \
                        _ts(e) >= self.started - 1:
                    out.append(e)
        return sorted(out, key=_ts)

    def ladder_kinds(self, job: str) -> List[str]:
        return [str(e.get("action")) for e in self.actions()
                if e.get("target") == job and e.get("action") in LADDER_KINDS and e.get("ok")]

    def wait_kinds(self, job: str, kinds: Sequence[str], timeout: float) -> List[str]:
        def got() -> List[str]:
            seen = self.ladder_kinds(job)
            return seen if all(k in seen for k in kinds) else []

        try:
            return list(wait_until(f"the monitor to {', '.join(kinds)} job {job}", got,
                                   timeout=timeout))
        except SandboxError as exc:
            raise SandboxError(f"{exc}; its actions so far: {self.ladder_kinds(job)}; "
                               f"monitor log: {_tail(os.path.join(self.work, 'monitor.log'))}"
                               ) from None

    def debug_cycle(self) -> None:
        """One dry-run cycle on a copy of the monitor's memory, into ``debug-cycle.json``: what
        the monitor makes of the scene at the moment a wait failed."""
        import shutil

        state = os.path.join(self.work, "monitor-state.json")
        copy = os.path.join(self.work, "debug-state.json")
        if os.path.exists(state):
            shutil.copy(state, copy)
        cp = subprocess.run(
            self._slurmiso("monitor", "--once", "--dry-run", "--json", "--telemetry", "agents",
                           "--agent-url", f"n2=http://127.0.0.1:{self.agent_port}/metrics",
                           "--state", copy, "--lock", copy + ".lock"),
            env=dict(self.sbx.env, PYTHONPATH=REPO), cwd=REPO, text=True,
            capture_output=True, timeout=120)
        subprocess.run(
            self._slurmiso("monitor", "snapshot", "-o", os.path.join(self.work, "debug-snap.json"),
                           "--telemetry", "agents", "--agent-url",
                           f"n2=http://127.0.0.1:{self.agent_port}/metrics"),
            env=dict(self.sbx.env, PYTHONPATH=REPO), cwd=REPO, capture_output=True, timeout=120)
        with open(os.path.join(self.work, "debug-cycle.json"), "w") as fh:
            fh.write(cp.stdout + cp.stderr + "\n" + self.scrape())

    def alive(self) -> Dict[str, Optional[int]]:
        """The daemons' exit codes (None: still running)."""
        return {name: (None if p is None else p.poll())
                for name, p in (("monitor", self.monitor), ("agent", self.agent))}

    def stop(self) -> None:
        for proc in [self.monitor, self.agent] + [a for a, _ in self.agents.values()]:
            _end(proc)
        self.monitor = self.agent = None
        self.agents = {}
        open(self.stop_file, "w").close()
        for job in [self.infer, self.train, *self.others]:
            if job:
                self.sbx.cmd("scontrol", "resume", job, check=False)
                self.sbx.cmd("scancel", job, check=False)


def _end(proc: Optional[subprocess.Popen]) -> None:
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def http_get(port: int, path: str) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
            return str(r.read().decode())
    except (OSError, ValueError):
        return ""


def steps_in(log: str) -> List[int]:
    """The steps a stand-in training program logged."""
    return [int(m) for m in re.findall(r"^step=(\d+) ", read_text(log), re.M)]


def _ts(e: Dict[str, Any]) -> float:
    from datetime import datetime

    ts = e.get("ts")
    if isinstance(ts, (int, float)):
        return float(ts)
    try:
        return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def read_text(path: str) -> str:
    try:
        with open(path, errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def _tail(path: str, n: int = 1500) -> str:
    return read_text(path)[-n:]


def contiguous(steps: List[int]) -> bool:
    """Every step from 1 to the last counted exactly once."""
    return bool(steps) and sorted(steps) == list(range(1, max(steps) + 1))


def protect_scenario(sbx: SandboxClient, steps: Sequence[str] = ("hold", "throttle", "suspend"),
                     ) -> Dict[str, Any]:
    """Drive the inference job's P99 over the SLO until the ladder has taken its last step
    (suspend or requeue; park, where the steps have it, stands for suspend), hold it there,
    then let it calm until training runs at full speed again; returns what each side saw."""
    parks = "park" in steps
    top = "park" if parks else steps[-1]
    lad = Ladder(sbx, steps)
    out: Dict[str, Any] = {"steps": list(steps), "work": lad.work}
    probe = ""
    try:
        lad.start_jobs(train_args=f"--sim-cuda {lad.sim_path()}" if parks else "")
        if parks:  # the program on its simulated GPU, as the park rung finds a CUDA process
            out["pid"] = lad.hold_sim_gpu()
        out["infer"], out["train"] = lad.infer, lad.train
        out["gpus"] = lad.gpus()
        if len(set(out["gpus"].values())) != 1:
            raise SandboxError(f"the two jobs did not share one GPU: {out['gpus']}")
        lad.start_daemons()
        out["calm_p99_ms"] = round((lad.job_p99() or 0) * 1000, 1)
        time.sleep(3.0)  # calm cycles: the monitor must take no step while the SLO holds
        out["calm_actions"] = lad.ladder_kinds(lad.train)
        served_before = lad.served()
        lad.set_latency(HOT_MS)
        # a training job that arrives now must not start on the GPU being protected
        probe = sbx.submit("#!/bin/bash\nsleep 1\n", "-p", "mps", "--qos=train",
                           "--gres=mps:50", "--begin=now+600", "-J", "train-arrives")
        out["probe"] = probe
        want = ["throttle", top] if top != "throttle" else ["throttle"]
        out["hot_kinds"] = lad.wait_kinds(lad.train, want, timeout=90)
        out["hot_p99_ms"] = round((lad.job_p99() or 0) * 1000, 1)
        out["throttled_steps"] = lad.throttled_steps()
        probe_f = sbx.job_fields(probe)
        out["probe_while_hot"] = {"exclude": probe_f.get("ExcNodeList", ""),
                                  "reason": probe_f.get("Reason", ""),
                                  "comment": sbx.cmd("squeue", "-h", "-j", probe, "-o", "%k",
                                                     check=False).strip()}
        if top == "park":
            from slurmiso.gpu.sim import SimBackend

            sim = SimBackend(lad.sim_path())
            wait_until("the node to park the training program",
                       lambda: sim.cuda_state(out["pid"]).value == "checkpointed", timeout=60)
            out["gpu_processes_parked"] = [p.pid for p in sim.processes()
                                           if p.pid == out["pid"]]
            before = len(lad.steps())
            lad.wait_cycles(4)  # past the suspend step's dwell: a parked program takes no step
            out["steps_while_parked"] = len(lad.steps()) - before
            out["state_while_parked"] = sbx.job_state(lad.train)
        elif top == "suspend":
            wait_until("the suspend", lambda: sbx.job_state(lad.train) == "SUSPENDED", timeout=30)
            before = len(lad.steps())
            time.sleep(3.0)  # a stopped program counts no step, however long it is stopped
            out["steps_while_suspended"] = len(lad.steps()) - before
        elif top == "requeue":
            wait_until("the requeued training job's checkpoint",
                       lambda: "# checkpoint" in read_text(lad.train_log), timeout=90)
            out["state_after_requeue"] = sbx.job_state(lad.train)
        out["infer_state_while_hot"] = sbx.job_state(lad.infer)
        lad.set_latency(CALM_MS)
        back = {"suspend": ["resume-job", "unthrottle"], "requeue": [],
                "throttle": ["unthrottle"], "park": ["unpark", "unthrottle"]}[top]
        if back:
            lad.wait_kinds(lad.train, back, timeout=90)
        wait_until("the training job to run again",
                   lambda: sbx.job_state(lad.train) == "RUNNING", timeout=180)
        base = len(lad.steps())
        wait_until("training to progress again", lambda: len(lad.steps()) >= base + 20, timeout=120)
        out["restarts"] = sbx.job_fields(lad.train).get("Restarts", "0")
        out["daemons_after_calm"] = lad.alive()
        out["served_during"] = lad.served() - served_before
        out["infer_state_after"] = sbx.job_state(lad.infer)
        out["infer_suspend_time"] = sbx.job_fields(lad.infer).get("SuspendTime", "")
        open(lad.stop_file, "w").close()
        out["train_state"] = sbx.wait_for(lad.train, ("COMPLETED",), timeout=120)
        wait_until(f"the monitor to release job {probe}",
                   lambda: sbx.job_fields(probe).get("Reason", "") not in (
                       "JobHeldAdmin", "JobHeldUser"), timeout=60)
        # (n2's MPS shares are all taken while both jobs run: it starts once training ends)
        sbx.cmd("scontrol", "update", f"JobId={probe}", "StartTime=now", check=False)
        out["probe_state"] = sbx.wait_for(probe, ("COMPLETED", "FAILED", "CANCELLED"),
                                          timeout=90)
        out["all_kinds"] = lad.ladder_kinds(lad.train)
        out["infer_actions"] = [e for e in lad.actions() if e.get("target") == lad.infer]
        out["probe_actions"] = [str(e.get("action")) for e in lad.actions()
                                if e.get("target") == probe]
        out["step_log"] = lad.steps()
        out["finished"] = "# finished steps=" in read_text(lad.train_log)
        out["train_reports"] = journal_events(sbx, lad.train)
    except SandboxError as exc:
        lad.debug_cycle()
        raise SandboxError(f"{exc} (daemons {lad.alive()}; logs in {lad.work})") from None
    finally:
        lad.stop()
        if probe:
            sbx.cmd("scancel", probe, check=False)
    return out


def journal_events(sbx: SandboxClient, job: str) -> List[str]:
    """The wrapper's own events for ``job`` in the node journals (throttle and checkpoint)."""
    from slurmiso.state.journal import Journal

    found = []
    for path in sorted(glob.glob(sbx.path("log", "journal-*.jsonl"))):
        found += [str(e.get("event")) for e in Journal(path).read() if e.get("job") == job]
    return found


def check(r: Dict[str, Any]) -> str:
    """What the demo step asserts; raises SandboxError naming what did not hold."""
    top = "park" if "park" in r["steps"] else r["steps"][-1]
    if r["calm_actions"]:
        raise SandboxError(f"the monitor acted while the SLO held: {r['calm_actions']}")
    order = {"suspend": ["throttle", "suspend", "resume-job", "unthrottle"],
             "requeue": ["throttle", "requeue"], "throttle": ["throttle", "unthrottle"],
             "park": ["throttle", "park", "unpark", "unthrottle"]}[top]
    kinds = [k for k in r["all_kinds"] if k != "ladder-end"]
    if kinds != order:
        raise SandboxError(f"the ladder's steps on training job {r['train']} were {kinds}, "
                           f"expected {order}")
    if not r["throttled_steps"]:
        raise SandboxError("the training program never saw the throttle (no throttled step)")
    if top == "suspend" and r["steps_while_suspended"] != 0:
        raise SandboxError(f"{r['steps_while_suspended']} steps were counted while suspended")
    if top == "park" and (r["steps_while_parked"] != 0 or r["state_while_parked"] != "RUNNING"
                          or r["gpu_processes_parked"]):
        raise SandboxError(f"parked, training took {r['steps_while_parked']} steps, Slurm "
                           f"showed it {r['state_while_parked']}, its GPU listed "
                           f"{r['gpu_processes_parked']}")
    if top == "requeue" and r["restarts"] in ("", "0"):
        raise SandboxError("the requeued training job did not start again")
    if not contiguous(r["step_log"]) or not r["finished"]:
        raise SandboxError("a training step was lost or counted twice (or the run did not "
                           "finish)")
    if r["infer_actions"] or r["infer_state_while_hot"] != "RUNNING" or \
            r["infer_state_after"] != "RUNNING" or r["served_during"] <= 0:
        raise SandboxError(f"the inference job was touched: actions {r['infer_actions']}, "
                           f"states {r['infer_state_while_hot']}/{r['infer_state_after']}, "
                           f"served {r['served_during']}")
    held = r["probe_while_hot"]
    if "n2" not in held["exclude"] and held["reason"] not in ("JobHeldAdmin", "JobHeldUser"):
        raise SandboxError(f"a training job arriving while hot was not kept off n2: {held}")
    if r["probe_state"] != "COMPLETED":
        raise SandboxError(f"the arriving training job ended {r['probe_state']} once calm")
    return (f"P99 {r['calm_p99_ms']} -> {r['hot_p99_ms']} ms (SLO {SLO_MS}): training "
            f"{r['train']} on the same GPU {' -> '.join(kinds)}; "
            f"{len(r['throttled_steps'])} steps taken throttled"
            + {"suspend": ", none while suspended",
               "park": ", none while parked (its GPU memory on the host, Slurm showing it "
                       "RUNNING)"}.get(top, f", restarted {r['restarts']}x from its checkpoint")
            + f"; all {len(r['step_log'])} steps counted once; a training job arriving while "
            f"hot kept off n2, then ran; inference {r['infer']} untouched "
            f"({r['served_during']} requests served meanwhile)")


def dumps(r: Dict[str, Any]) -> str:
    small = {k: v for k, v in r.items() if k not in ("step_log",)}
    return json.dumps(small, indent=1, default=str)
