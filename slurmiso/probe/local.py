"""``--local``: the same pairs on this node without Slurm, isolated by slurmiso's own code.

A GPU box (or a test machine) has no prolog to give each class its share, so this module does
what the prolog would, with the same building blocks: the MPS control daemons come from
:func:`slurmiso.isolation.mps_daemon.mps_control_for` (``NvidiaMpsControl`` on a real GPU,
``SimMpsControl`` on simulated GPUs), laid out by :mod:`slurmiso.isolation.mps_dirs`, given the
classes' thread percentage and pinned-memory limit before any client connects, and stopped and
removed when the mode is done, whatever happened. Nothing here changes MIG mode or compute mode:
``mig-static`` uses MIG instances that already exist; ``mig-dynamic`` (which creates them) runs
only through Slurm, where the prolog and epilog own that.

Without an NVIDIA driver and without a simulated node, a throw-away simulated node is made in
the work directory, and the report says so.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Tuple

from slurmiso.config.model import Config, JobClass
from slurmiso.errors import GpuError, SlurmisoError
from slurmiso.gpu.backend import DeviceInfo
from slurmiso.probe.launch import ENDED, RUNNING, Run, with_package_path
from slurmiso.probe.plan import PRIORITY, Pair
from slurmiso.values import Value, field

log = logging.getLogger(__name__)

STOP_GRACE_S = 15.0
DAEMON_STOP_S = 10.0
#: A stand-in for the node's GPUs when there is neither a driver nor a simulated node.
FALLBACK_MODEL = "H100-80GB"


class LocalGpus(Value):
    """This node's GPUs as the probe uses them, and which MPS daemon goes with them."""

    devices: List[DeviceInfo]
    simulated: bool
    note: str
    instances: List = field(default_factory=list)  # MIG instances that exist now
    backend: object = None
    sim_state: str = ""  # the simulated node's state file ("" on real GPUs)


def open_gpus(cfg: Config, work_dir: str) -> LocalGpus:
    """The node's backend as the config says; a throw-away simulated node when none exists."""
    from slurmiso.gpu import open_backend

    try:
        backend = open_backend(cfg.gpu.backend, cfg.gpu.sim_state, socket.gethostname())
        devices = backend.devices()
        instances = list(backend.instances()) if any(d.mig_enabled for d in devices) else []
        simulated = bool(backend.capabilities.simulated)
        note = ("simulated GPUs (sim backend) with slurmiso's simulated MPS daemon"
                if simulated else "NVIDIA GPUs through NVML; MPS through nvidia-cuda-mps-control")
        from slurmiso.gpu import sim_state_path

        return LocalGpus(devices, simulated, note, instances, backend,
                         sim_state_path(cfg.gpu.sim_state, socket.gethostname())
                         if simulated else "")
    except GpuError as err:
        from slurmiso.gpu.sim import SimBackend, init_state

        model = next((p.gpu_model for p in cfg.pools), FALLBACK_MODEL) or FALLBACK_MODEL
        path = os.path.join(work_dir, "sim-node.json")
        try:
            init_state(path, model, 2, node=socket.gethostname(), force=True)
        except SlurmisoError:
            init_state(path, FALLBACK_MODEL, 2, node=socket.gethostname(), force=True)
        backend = SimBackend(path)
        note = (f"no usable GPU backend ({err.message}): a throw-away simulated node "
                f"({path}) and slurmiso's simulated MPS daemon (SimMpsControl)")
        return LocalGpus(backend.devices(), True, note, [], backend, path)


# -- MPS daemons -------------------------------------------------------------------------------


def _start_daemon(control: object, state_dir: str, gpu: DeviceInfo, pct: int,
                  mem_mb: int) -> Dict[str, str]:
    """One control daemon for ``gpu`` holding ``pct`` % threads and ``mem_mb`` MiB, as the
    prolog starts it: directories first, limits before any client, then the hand-over."""
    from slurmiso.isolation.mps_dirs import DaemonKey, daemon_paths, hand_over, prepare_dirs

    key = DaemonKey(gpu.index, os.getuid(), pct, mem_mb)
    paths = daemon_paths(state_dir, key)
    prepare_dirs(paths)
    control.start(gpu.uuid, paths["pipe"], paths["log"])  # type: ignore[attr-defined]
    try:
        control.set_limits(paths["pipe"], pct, mem_mb)  # type: ignore[attr-defined]
        hand_over(paths, key.uid)
    except BaseException:
        control.stop(paths["pipe"], DAEMON_STOP_S)  # type: ignore[attr-defined]
        raise
    log.info("MPS control daemon for GPU %d: threads %d%%, pinned %s MiB (%s)", gpu.index, pct,
             mem_mb or "unlimited", paths["pipe"])
    return paths


def _client_env(paths: Dict[str, str], c: JobClass, simulated: bool, gpu_total_mb: int,
                priority: str = "") -> Dict[str, str]:
    """What the prolog exports to an MPS job (see MpsIsolation.setup)."""
    env = {"CUDA_MPS_PIPE_DIRECTORY": paths["pipe"], "CUDA_MPS_LOG_DIRECTORY": paths["log"],
           "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(c.mps.thread_percentage),
           "CUDA_VISIBLE_DEVICES": "0", "SLURMISO_CLASS": c.name}
    limit = c.mps.limit_mb(gpu_total_mb)
    if limit:
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = f"0={limit}M"
    if priority:
        env["CUDA_MPS_CLIENT_PRIORITY"] = priority
    if simulated:
        env["SLURMISO_PROBE_SIM_MPS"] = "1"
    return env


def mode_envs(mode: str, gpus: LocalGpus, pair: Pair, gpu_index: int,
              cleanup: contextlib.ExitStack) -> Tuple[Optional[Dict[str, Dict[str, str]]], str]:
    """({"infer": env, "train": env}, "") for ``mode`` on this node, its daemons started and
    their teardown pushed onto ``cleanup``; (None, reason) when this node cannot do ``mode``."""
    by_index = {d.index: d for d in gpus.devices}
    if gpu_index not in by_index:
        return None, f"this node has no GPU {gpu_index}"
    gpu = by_index[gpu_index]
    base = {"infer": {"SLURMISO_CLASS": pair.infer.name},
            "train": {"SLURMISO_CLASS": pair.train.name}}
    if mode == "timeslice":
        return {r: dict(e, CUDA_VISIBLE_DEVICES=gpu.uuid) for r, e in base.items()}, ""
    if mode == "exclusive":
        other = next((d for d in gpus.devices if d.index != gpu_index), None)
        if other is None:
            return None, "exclusive needs a second GPU on this node (the reference is two GPUs)"
        return {"infer": dict(base["infer"], CUDA_VISIBLE_DEVICES=gpu.uuid),
                "train": dict(base["train"], CUDA_VISIBLE_DEVICES=other.uuid)}, ""
    if mode == "mig-dynamic":
        return None, ("mig-dynamic creates MIG instances per job: measure it through Slurm, "
                      "where the prolog and epilog own them (--local never changes the GPU)")
    if mode == "mig-static":
        return _mig_static(gpus, pair, base)
    if mode in ("mps", "mps-priority"):
        return _mps(mode, gpus, gpu, pair, cleanup), ""
    if mode == "mps-v3":
        return _mps_v3(gpus, gpu, pair, cleanup)
    if mode == "mps-sm-partition":
        return _mps_sm_partition(gpus, gpu, pair, cleanup)
    return None, f"unknown mode {mode}"


def _mig_static(gpus: LocalGpus, pair: Pair,
                base: Dict[str, Dict[str, str]]) -> Tuple[Optional[Dict[str, Dict[str, str]]], str]:
    found: Dict[str, str] = {}
    for role, c in (("infer", pair.infer), ("train", pair.train)):
        model = next((d.model for d in gpus.devices), "")
        want = c.mig_profile_for(model)
        inst = next((i for i in gpus.instances if i.profile == want and i.uuid
                     and i.uuid not in found.values()), None)
        if inst is None:
            return None, (f"no existing MIG instance of profile {want or '(none)'} for class "
                          f"{c.name}; --local never creates instances or changes MIG mode")
        found[role] = inst.uuid
    return {r: dict(e, CUDA_VISIBLE_DEVICES=found[r]) for r, e in base.items()}, ""


def _mps(mode: str, gpus: LocalGpus, gpu: DeviceInfo, pair: Pair,
         cleanup: contextlib.ExitStack) -> Dict[str, Dict[str, str]]:
    from slurmiso.isolation.mps_daemon import mps_control_for
    from slurmiso.isolation.mps_dirs import remove_tree

    control = mps_control_for(gpus.backend)  # type: ignore[arg-type]
    # Short and private: NVIDIA's daemon puts unix sockets in the pipe directory.
    state_dir = tempfile.mkdtemp(prefix="sip-", dir="/tmp")
    os.chmod(state_dir, 0o755)

    def stop(paths: Dict[str, str]) -> None:
        try:
            control.stop(paths["pipe"], DAEMON_STOP_S)
        finally:
            remove_tree(paths["base"])

    cleanup.callback(remove_tree, state_dir)
    if mode == "mps":  # the prolog's way: a daemon per class, each with its class's limits
        envs = {}
        for role, c in (("infer", pair.infer), ("train", pair.train)):
            paths = _start_daemon(control, state_dir, gpu, c.mps.thread_percentage,
                                  c.mps.limit_mb(gpu.memory_total_mb))
            cleanup.callback(stop, paths)
            envs[role] = _client_env(paths, c, gpus.simulated, gpu.memory_total_mb)
        return envs
    # mps-priority: one server for both (client priority only orders clients of one server);
    # the classes' limits come from their variables, which can only narrow the daemon's.
    paths = _start_daemon(control, state_dir, gpu, 100, 0)
    cleanup.callback(stop, paths)
    return {role: _client_env(paths, c, gpus.simulated, gpu.memory_total_mb, PRIORITY[role])
            for role, c in (("infer", pair.infer), ("train", pair.train))}


def _mps_v3(gpus: LocalGpus, gpu: DeviceInfo, pair: Pair, cleanup: contextlib.ExitStack
            ) -> Tuple[Optional[Dict[str, Dict[str, str]]], str]:
    """MPS v3 where the control binary has it (read, never assumed): one ``-p 3`` daemon,
    one server for both classes, a namespace per class holding its thread percentage,
    pinned-memory limit and client priority; each client routed to its namespace by its
    pipe directory (docs/mps-v3.md)."""
    from slurmiso.isolation.mps_daemon import mps_control_for
    from slurmiso.isolation.mps_dirs import DaemonKey, daemon_paths, prepare_dirs, remove_tree

    control = mps_control_for(gpus.backend)  # type: ignore[arg-type]
    protocol = control.protocol()
    if not protocol.v3:
        return None, f"no MPS v3 on this node: {protocol.reason}"
    state_dir = tempfile.mkdtemp(prefix="sip-", dir="/tmp")
    os.chmod(state_dir, 0o755)
    cleanup.callback(remove_tree, state_dir)
    paths = daemon_paths(state_dir, DaemonKey(gpu.index, os.getuid(), 100, 0))
    prepare_dirs(paths)
    try:  # the v3 verbs are read from NVIDIA's guide, not yet run on a GPU: a failure
        control.start(gpu.uuid, paths["pipe"], paths["log"], protocol=3)  # skips the mode
        cleanup.callback(control.stop, paths["pipe"], DAEMON_STOP_S)
        _v3_layout(control, paths["pipe"], pair, gpu)
    except SlurmisoError as exc:
        return None, f"the MPS v3 daemon could not be laid out: {exc}"
    envs = {}
    for role, c in (("infer", pair.infer), ("train", pair.train)):
        ns = role  # the namespace's name: lower-case letters only, whatever the class's
        env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(paths["pipe"], "probe", ns),
               "CUDA_MPS_LOG_DIRECTORY": paths["log"], "CUDA_VISIBLE_DEVICES": "0",
               "SLURMISO_CLASS": c.name}
        if gpus.simulated:
            env["SLURMISO_PROBE_SIM_MPS"] = "1"
        envs[role] = env
    return envs, ""


def partition_chunks(total: int, infer_pct: int, train_pct: int) -> Tuple[int, int]:
    """The GPU's ``total`` chunks split by the classes' thread percentages (static partitions
    are never oversubscribed): at least one chunk each, inference rounded up."""
    infer = min(total - 1, max(1, -(-total * infer_pct // (infer_pct + train_pct))))
    return infer, total - infer


def _mps_sm_partition(gpus: LocalGpus, gpu: DeviceInfo, pair: Pair,
                      cleanup: contextlib.ExitStack
                      ) -> Tuple[Optional[Dict[str, Dict[str, str]]], str]:
    """Static SM partitions (CUDA 13.1+, ``-d -S``): one daemon, the GPU's SMs split between
    the classes by their thread percentages, each client on its own partition. Skipped with
    the reason where the daemon refuses (a driver or GPU without them: read by trying)."""
    from slurmiso.gpu.profiles import lookup_model
    from slurmiso.isolation.mps_daemon import mps_control_for
    from slurmiso.isolation.mps_dirs import DaemonKey, daemon_paths, prepare_dirs, remove_tree
    from slurmiso.isolation.mps_sim_partitions import CHUNK_SMS

    model = lookup_model(gpu.model) if gpu.model else None
    if model is None or model.sm_count < 2 * CHUNK_SMS:
        return None, f"the SM count of GPU {gpu.index} ({gpu.name}) is not in slurmiso's table"
    control = mps_control_for(gpus.backend)  # type: ignore[arg-type]
    state_dir = tempfile.mkdtemp(prefix="sip-", dir="/tmp")
    os.chmod(state_dir, 0o755)
    cleanup.callback(remove_tree, state_dir)
    paths = daemon_paths(state_dir, DaemonKey(gpu.index, os.getuid(), 100, 0))
    prepare_dirs(paths)
    split = partition_chunks(model.sm_count // CHUNK_SMS, pair.infer.mps.thread_percentage,
                             pair.train.mps.thread_percentage)
    envs = {}
    try:  # NVIDIA documents the verbs, not yet run here on a GPU: a refusal skips the mode
        control.start(gpu.uuid, paths["pipe"], paths["log"], static_sms=model.sm_count)
        cleanup.callback(control.stop, paths["pipe"], DAEMON_STOP_S)
        for (role, c), chunks in zip((("infer", pair.infer), ("train", pair.train)), split):
            env = _client_env(paths, c, gpus.simulated, gpu.memory_total_mb)
            env["CUDA_MPS_SM_PARTITION"] = control.sm_partition(paths["pipe"], gpu.uuid, chunks)
            envs[role] = env
    except SlurmisoError as exc:
        return None, f"static SM partitions could not be made: {exc}"
    return envs, ""


def _v3_layout(control: object, pipe: str, pair: Pair, gpu: DeviceInfo) -> None:
    """Server ``probe`` and a namespace per role with its class's limits and priority."""
    v3 = control.v3  # type: ignore[attr-defined]
    v3(pipe, ["server", "create", "probe"])
    for role, c in (("infer", pair.infer), ("train", pair.train)):
        v3(pipe, ["namespace", "create", role, "--server=probe"])
        limit = c.mps.limit_mb(gpu.memory_total_mb)
        v3(pipe, ["namespace", "set", role, "--server=probe",
                  f"--active-thread-percentage={c.mps.thread_percentage}",
                  f"--client-priority={PRIORITY[role]}",
                  *([f"--pinned-memory-limit={limit}M"] if limit else [])])


# -- the launcher ------------------------------------------------------------------------------


def _started_path(spec_path: str) -> str:
    import json

    try:
        with open(spec_path, encoding="utf-8") as fh:
            return str(json.load(fh).get("started", ""))
    except (OSError, ValueError):
        return ""


def _kill_child_group(started_path: str) -> None:
    """A runner killed outright leaves its command's group: end that too (from ``started``)."""
    import json

    try:
        with open(started_path, encoding="utf-8") as fh:
            pgid = int(json.load(fh).get("child_pgid") or 0)
    except (OSError, ValueError, TypeError):
        return
    if pgid > 1:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


class LocalLauncher:
    """Workloads as processes on this node: :mod:`slurmiso.probe.jobrun` in its own session."""

    where = "local"

    def __init__(self, python: str = sys.executable,
                 popen: Callable[..., subprocess.Popen] = subprocess.Popen) -> None:
        self.python = python
        self.popen = popen
        self.procs: Dict[str, subprocess.Popen] = {}
        self.started_files: Dict[str, str] = {}

    def start(self, run: Run) -> str:
        env = with_package_path(os.environ)
        env.update(run.env)
        proc = self.popen([self.python, "-m", "slurmiso.probe.jobrun", run.spec_path],
                          env=env, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[str(proc.pid)] = proc
        self.started_files[str(proc.pid)] = _started_path(run.spec_path)
        return str(proc.pid)

    def state(self, handle: str) -> str:
        return RUNNING if self.procs[handle].poll() is None else ENDED

    def why_pending(self, handle: str) -> str:
        return ""

    def restarts(self, handle: str) -> Optional[int]:
        return None  # a local process is never requeued: only its files could tell

    def cancel(self, handle: str) -> None:
        proc = self.procs.get(handle)
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)  # the runner ends its command's group itself
        try:
            proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            _kill_child_group(self.started_files.get(handle, ""))

    def cancel_all(self) -> List[str]:
        for handle in list(self.procs):
            self.cancel(handle)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(p.poll() is None for p in self.procs.values()):
            time.sleep(0.05)
        return [h for h, p in self.procs.items() if p.poll() is None]

    def describe(self, handle: str) -> str:
        return f"pid {handle}"
