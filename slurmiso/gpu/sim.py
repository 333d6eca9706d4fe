"""A simulated GPU node, kept in a JSON file that separate processes share.

The prolog, the epilog, the job and the monitor are separate processes (often separate users),
so the simulated node lives in a file: every read or change holds ``<state>.lock`` (a
``slurmiso.state.lock.FileLock``) and every write is atomic (temp file in the same folder, fsync,
``os.replace``). The backend fails exactly where NVML fails, with the same
:mod:`slurmiso.errors` classes the NVML backend translates NVML's codes to, so the hooks'
failure policy is exercised on a laptop. Processes are real pids: an entry disappears from
:meth:`SimBackend.processes` once its pid is gone, just as NVML stops reporting a killed job.

Sim-only knobs (``set_mig_mode``, ``set_lost``, ``add_process``, ``set_load``, ``clear_load``)
play what the admin, the hardware and the workload would do.

Environment, read only here (a node on NVML never looks at it):

``SLURMISO_SIM_DELAY_MS``
    How long each mutating driver call takes, half before its change and half after, as a
    slow MIG creation does on real hardware (benches and concurrency tests).
``SLURMISO_SIM_KILL_AT``
    A deterministic kill point, so a test can kill a hook at a chosen step instead of at a
    chosen time (a time means a different step on a faster or busier machine). ``before:N``
    / ``after:N``: the process SIGKILLs itself before its Nth mutating driver call takes
    effect, or once that call is over (its change written, or its error raised).
    ``before:write:N`` / ``after:write:N``: the same around its Nth node-state write or
    removal (job record, allocation table, node document: :mod:`slurmiso.state.store`
    reports them once a simulated backend exists in the process). Steps are counted per
    process from its first :class:`SimBackend`; every ``SimBackend`` method that changes
    the node, sim-only knobs included, is a driver call. Anything else is a UsageError.
``SLURMISO_SIM_TRACE``
    A file to which each step is appended as ``<pid> call|write <N> <name or path>``
    before it runs: one unkilled run tells a test which kill points exist (1..N of each).
"""

from __future__ import annotations

import json
import logging
import os
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Tuple

from slurmiso.atomic import write_atomic
from slurmiso.errors import (
    GpuError,
    GpuInsufficientResources,
    GpuInUse,
    GpuLost,
    GpuNotFound,
    GpuNotSupported,
    GpuUnavailable,
    UsageError,
)
from slurmiso.gpu import profiles
from slurmiso.gpu.backend import Capabilities, DeviceInfo, GpuProcess, MigInstance, Telemetry
from slurmiso.gpu.profiles import GpuModel, MigProfile
from slurmiso.pids import pid_alive, start_ticks

if TYPE_CHECKING:
    from slurmiso.gpu.cuda_checkpoint import Action, CudaState
    from slurmiso.gpu.memory_limits import JobMemoryLimits
    from slurmiso.gpu.timeslice import Timeslice
from slurmiso.state.lock import FileLock, LockTimeout

log = logging.getLogger(__name__)

STATE_VERSION = 1
#: Namespace of the deterministic UUIDs, so a re-initialised node keeps its GPU UUIDs.
_UUID_NS = "6f1d3c2a-5b7e-4c1a-9e0f-3a2b1c4d5e6f"
_MAX_GPUS = 16
ENV_DELAY_MS = "SLURMISO_SIM_DELAY_MS"
ENV_KILL_AT = "SLURMISO_SIM_KILL_AT"
ENV_TRACE = "SLURMISO_SIM_TRACE"

State = Dict[str, Any]


def _short_hostname() -> str:
    return os.uname().nodename.split(".")[0]


def uuid5_text(name: str) -> str:
    """``str(uuid.uuid5(UUID(_UUID_NS), name))`` without the ``uuid`` module.

    The simulated driver makes a UUID per MIG instance in the prolog; ``uuid`` imports
    ``platform`` and ``hashlib`` loads OpenSSL, several ms per prolog that the real driver
    (which reports the UUID) never costs. The builtin SHA-1 gives the same digest.
    """
    try:
        from _sha1 import sha1  # type: ignore[import-not-found]  # hashlib's own fallback
    except ImportError:  # pragma: no cover - an interpreter built without it
        from hashlib import sha1
    raw = bytearray(sha1(bytes.fromhex(_UUID_NS.replace("-", "")) + name.encode()).digest()[:16])
    raw[6] = (raw[6] & 0x0F) | 0x50  # version 5
    raw[8] = (raw[8] & 0x3F) | 0x80  # RFC 4122 variant
    text = raw.hex()
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


def _gpu_uuid(node: str, index: int) -> str:
    return "GPU-" + uuid5_text(f"{node}/gpu/{index}")


def _mig_uuid(gpu_uuid: str, gi_id: int, ci_id: int, generation: int) -> str:
    """MIG device UUID; ``generation`` makes a re-created instance a new device, as on NVML."""
    return "MIG-" + uuid5_text(f"{gpu_uuid}/gi{gi_id}/ci{ci_id}/g{generation}")


def _fresh_load() -> Dict[str, Any]:
    return {"util": 0, "sm": 0, "gr": None, "memory_mb": 0}


def _known_models() -> str:
    return ", ".join(profiles.MODELS)


def custom_model(name: str, memory_mb: int, product: str = "") -> GpuModel:
    """A GPU the catalogue has no entry for, known by name and memory: no MIG."""
    if not product:
        product = name if name.upper().startswith(("NVIDIA", "TESLA")) else f"NVIDIA {name}"
    return GpuModel(name, product, int(memory_mb), 0, 0, 0, ())


def new_state(
    model: str, gpus: int, mig: bool = False, node: str = "", memory_mb: int = 0
) -> State:
    """The state of a freshly booted simulated node (pure; :func:`init_state` writes it).

    ``model`` is a catalogue model, or any name when ``memory_mb`` says how much memory the
    GPU has (a GPU slurmiso has no entry for, without MIG): exclusive, mps and timeslice pools
    work on any NVIDIA GPU, so the sandbox and tests can play one.
    """
    gpu_model = profiles.lookup_model(model)
    if gpu_model is None and memory_mb > 0 and model.strip():
        gpu_model = custom_model(model.strip(), memory_mb)
    if gpu_model is None:
        raise UsageError(
            f"unknown GPU model {model!r}; known models: {_known_models()}",
            hint="for another GPU give its memory too (sim init --memory 24G)",
        )
    if not 1 <= gpus <= _MAX_GPUS:
        raise UsageError(f"a simulated node has 1 to {_MAX_GPUS} GPUs, not {gpus}")
    if mig and not gpu_model.profiles:
        raise UsageError(f"{gpu_model.name} has no MIG support")
    node = node or _short_hostname()
    custom = profiles.lookup_model(gpu_model.name) is None
    return {
        "version": STATE_VERSION,
        "node": node,
        "model": gpu_model.name,
        **({"custom_model": {"product_name": gpu_model.product_name,
                             "memory_mb": gpu_model.memory_mb}} if custom else {}),
        "mig_generation": 0,
        "gpus": [
            {
                "index": i,
                "uuid": _gpu_uuid(node, i),
                "minor": i,
                "pci_bus_id": f"00000000:{0x18 + i:02X}:00.0",
                "mig_enabled": bool(mig),
                "lost": False,
                "load": _fresh_load(),
                "instances": [],
            }
            for i in range(gpus)
        ],
        "processes": [],
    }


def init_state(
    path: str, model: str, gpus: int, mig: bool = False, node: str = "", force: bool = False,
    memory_mb: int = 0,
) -> None:
    """Create the state file of a simulated node; refuses to replace one unless ``force``."""
    state = new_state(model, gpus, mig, node, memory_mb)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as exc:
        raise GpuUnavailable(
            f"cannot create folder {folder} for simulated GPU state: {exc}"
        ) from exc
    store = _StateFile(path)
    with store.locked():
        if os.path.exists(path) and not force:
            raise UsageError(
                f"simulated GPU state {path} already exists",
                hint="use force=True / 'slurmiso sim init --force' to replace it, "
                "which forgets its MIG instances and processes",
            )
        store.write(state)
    log.info(
        "initialised simulated node %s: %d x %s at %s", state["node"], gpus, state["model"], path
    )


class _StateFile:
    """Locked, atomic access to one JSON state file."""

    def __init__(self, path: str, lock_timeout: float = 30.0) -> None:
        self.path = path
        self.lock_path = path + ".lock"
        self.lock_timeout = lock_timeout

    @contextmanager
    def locked(self) -> Iterator[None]:
        lock = _make_lock(self.lock_path, self.lock_timeout)
        try:
            lock.acquire()
        except LockTimeout as exc:
            raise GpuUnavailable(
                f"simulated GPU state is busy: lock {self.lock_path} not acquired within "
                f"{self.lock_timeout:g}s",
                hint="another slurmiso process holds it; check for a hung prolog/epilog",
            ) from exc
        except OSError as exc:
            raise GpuUnavailable(f"cannot open lock file {self.lock_path}: {exc}") from exc
        try:
            yield
        finally:
            lock.release()

    def read(self) -> State:
        fix = f"recreate it: slurmiso sim init --force --state {self.path} --model MODEL --gpus N"
        try:
            with open(self.path, encoding="utf-8") as fh:
                state = json.load(fh)
        except FileNotFoundError as exc:
            raise GpuUnavailable(
                f"no simulated GPU state at {self.path}",
                hint=f"create it: slurmiso sim init --state {self.path} --model H100-80GB --gpus 8",
            ) from exc
        except (OSError, ValueError) as exc:
            raise GpuUnavailable(
                f"simulated GPU state {self.path} is unreadable or corrupt: {exc}", hint=fix
            ) from exc
        problem = _schema_problem(state)
        if problem:
            raise GpuUnavailable(f"simulated GPU state {self.path} is corrupt: {problem}", hint=fix)
        checked: State = state
        return checked

    def write(self, state: State) -> None:
        text = json.dumps(state, indent=1, sort_keys=True) + "\n"
        try:
            write_atomic(self.path, text, _file_mode(self.path))
        except OSError as exc:
            raise GpuUnavailable(f"cannot write simulated GPU state {self.path}: {exc}") from exc

    @contextmanager
    def transaction(self, call: str = "change") -> Iterator[State]:
        """Read, let the caller change, write back; nothing is written if the caller raises.

        ``call`` names the driver call for the kill points and the trace (module docstring).
        """
        # A driver call takes time (SLURMISO_SIM_DELAY_MS, e.g. 500 for MIG creation): half
        # before the change, half after it, so a hook can be killed with the change made but
        # not yet reported. Outside the file lock: the latency is the driver's, and the file
        # lock is only how the simulation stays consistent.
        step = _step_begins("call", call)
        try:
            _driver_latency()
            with self.locked():
                state = self.read()
                yield state
                self.write(state)
        finally:
            _step_ends(step)
        _driver_latency()

    def snapshot(self) -> State:
        with self.locked():
            return self.read()


def _driver_latency() -> None:
    delay = os.environ.get(ENV_DELAY_MS, "")
    if delay:
        try:
            seconds = min(float(delay), 60_000.0) / 2000.0
        except ValueError:
            return
        time.sleep(max(seconds, 0.0))


class _KillPoints:
    """Where ``$SLURMISO_SIM_KILL_AT`` wants this process to die, and its steps so far.

    Steps are counted per process and per kind: ``call`` (a mutating driver call) and
    ``write`` (a node-state write or removal, reported by :mod:`slurmiso.state.store`).
    """

    def __init__(self, spec: str, trace: str) -> None:
        self.spec = spec.strip()
        self.trace = trace
        self.when, self.kind, self.number = _parse_kill_at(self.spec)
        self.counts = {"call": 0, "write": 0}

    def begin(self, kind: str, name: str) -> Tuple[str, int]:
        self.counts[kind] += 1
        step = (kind, self.counts[kind])
        if self.trace:
            _append_line(self.trace, f"{os.getpid()} {kind} {step[1]} {name}\n")
        self._maybe_die("before", step, name)
        return step

    def end(self, step: Tuple[str, int]) -> None:
        self._maybe_die("after", step, "")

    def _maybe_die(self, when: str, step: Tuple[str, int], name: str) -> None:
        if (when, step[0], step[1]) != (self.when, self.kind, self.number):
            return
        import signal  # here: the hooks' import budget has no room for it (test_hook_imports)

        log.warning("sim: SIGKILL %s %s %d %s(%s=%s)", when, step[0], step[1],
                    f"{name} " if name else "", ENV_KILL_AT, self.spec)
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(128 + signal.SIGKILL)  # not reached: SIGKILL to oneself lands at once


def _parse_kill_at(spec: str) -> Tuple[str, str, int]:
    """``before:3`` -> ("before", "call", 3); ``after:write:2`` -> ("after", "write", 2);
    "" -> no kill point ("", "", 0). A typo must not silently test nothing: UsageError."""
    if not spec:
        return "", "", 0
    parts = spec.split(":")
    if len(parts) == 2:
        parts.insert(1, "call")
    number = parts[2] if len(parts) == 3 else ""
    if (len(parts) != 3 or parts[0] not in ("before", "after")
            or parts[1] not in ("call", "write") or not number.isdigit() or int(number) < 1):
        raise UsageError(
            f"{ENV_KILL_AT}={spec!r} is not a kill point",
            hint="use before:N or after:N (the Nth mutating driver call of the process), "
            "or before:write:N / after:write:N (its Nth node-state write), N >= 1",
        )
    return parts[0], parts[1], int(number)


def _append_line(path: str, line: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
    try:
        os.write(fd, line.encode("utf-8", "replace"))
    finally:
        os.close(fd)


#: This process's kill points; read from the environment by the first SimBackend.
_kill_points: Optional[_KillPoints] = None
_kill_points_read = False


def _arm_kill_points() -> None:
    """Read ``$SLURMISO_SIM_KILL_AT`` / ``$SLURMISO_SIM_TRACE`` once per process.

    Only a simulated backend gets here, so a node on NVML never reads them; and only when
    one is set does the node-state store report its writes (its hook stays None otherwise).
    """
    global _kill_points, _kill_points_read
    if _kill_points_read:
        return
    spec, trace = os.environ.get(ENV_KILL_AT, ""), os.environ.get(ENV_TRACE, "")
    points = _KillPoints(spec, trace) if spec.strip() or trace else None
    _kill_points, _kill_points_read = points, True
    if points is not None:
        from slurmiso.state import store

        store.write_hook = _state_write_hook


#: The node-state write in progress (the store reports "before" and "after" of each).
_state_writes: List[Tuple[str, int]] = []


def _state_write_hook(when: str, path: str) -> None:
    """:data:`slurmiso.state.store.write_hook`: node-state writes are kill points too."""
    points = _kill_points
    if points is None:
        return
    if when == "before":
        _state_writes.append(points.begin("write", path))
    elif _state_writes:
        points.end(_state_writes.pop())


def _step_begins(kind: str, name: str) -> Optional[Tuple[str, int]]:
    return _kill_points.begin(kind, name) if _kill_points is not None else None


def _step_ends(step: Optional[Tuple[str, int]]) -> None:
    if step is not None and _kill_points is not None:
        _kill_points.end(step)


def _make_lock(lock_path: str, timeout: float) -> FileLock:
    # 0o666: the prolog (root) and the job (a user) share one simulated node.
    return FileLock(lock_path, timeout=timeout, mode=0o666)


def _file_mode(path: str) -> int:
    """Keep an existing file's mode; a new one gets what ``open()`` would give it."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def _schema_problem(state: Any) -> str:
    if not isinstance(state, dict):
        return "top level is not an object"
    if state.get("version") != STATE_VERSION:
        return f"version {state.get('version')!r}, expected {STATE_VERSION}"
    if state_model(state) is None:
        return f"unknown model {state.get('model')!r} (and no custom_model with its memory)"
    if not isinstance(state.get("gpus"), list) or not isinstance(state.get("processes"), list):
        return "'gpus' or 'processes' is not a list"
    if not isinstance(state.get("node"), str):
        return "'node' is not a string"
    for i, gpu in enumerate(state["gpus"]):
        problem = _fields_problem(f"gpus[{i}]", gpu, _GPU_FIELDS) or _fields_problem(
            f"gpus[{i}].load", gpu["load"], _LOAD_FIELDS
        )
        if problem:
            return problem
        if gpu["index"] != i:
            return f"gpus[{i}].index is {gpu['index']}"
        for j, inst in enumerate(gpu["instances"]):
            problem = _fields_problem(f"gpus[{i}].instances[{j}]", inst, _INSTANCE_FIELDS)
            if problem:
                return problem
    for k, proc in enumerate(state["processes"]):
        problem = _fields_problem(f"processes[{k}]", proc, _PROCESS_FIELDS)
        if problem:
            return problem
    return ""


def _process_sm(proc: Dict[str, Any]) -> Optional[float]:
    """A simulated process's SM share 0..1; None where the state gives none (not modelled,
    or not a well-formed percentage: unknown, never 0)."""
    sm = proc.get("sm")
    if not isinstance(sm, (int, float)) or isinstance(sm, bool) or not 0 <= sm <= 100:
        return None
    return None if proc.get("mig_uuid") else float(sm) / 100.0


#: What every reader of a simulated node relies on, so a corrupt file is one clear error
#: naming it instead of a KeyError in the middle of a hook.
_Fields = Dict[str, Tuple[type, ...]]
_GPU_FIELDS: _Fields = {
    "index": (int,), "uuid": (str,), "minor": (int,), "mig_enabled": (bool,),
    "lost": (bool,), "load": (dict,), "instances": (list,),
}
_LOAD_FIELDS: _Fields = {
    "util": (int, float), "sm": (int, float), "gr": (int, float, type(None)),
    "memory_mb": (int, float),
}
_INSTANCE_FIELDS: _Fields = {
    "gi_id": (int,), "profile": (str,), "start": (int,), "size": (int,),
    "ci_id": (int, type(None)), "uuid": (str,),
}
_PROCESS_FIELDS: _Fields = {
    "pid": (int,), "gpu_index": (int,), "used_memory_mb": (int,), "mig_uuid": (str,),
    "start": (int, type(None)),
}


def _fields_problem(where: str, item: Any, fields: _Fields) -> str:
    if not isinstance(item, dict):
        return f"{where} is not an object"
    for name, kinds in fields.items():
        value = item.get(name)
        if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
            return f"{where}.{name} is missing or not {' or '.join(k.__name__ for k in kinds)}"
    return ""


class SimBackend:
    """:class:`~slurmiso.gpu.backend.GpuBackend` on a simulated node stored at ``state_path``.

    The constructor does no I/O (hooks build backends on every job start); each call locks,
    reads and, for changes, atomically rewrites the file.
    """

    name = "sim"
    capabilities = Capabilities(set_mig_mode=True, simulated=True)

    def __init__(self, state_path: str, lock_timeout: float = 30.0) -> None:
        _arm_kill_points()
        self.state_path = state_path
        self._store = _StateFile(state_path, lock_timeout)

    def __enter__(self) -> SimBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- GpuBackend: queries
    def devices(self) -> List[DeviceInfo]:
        state = self._store.snapshot()
        return [_device_info(state, _gpu(state, g["index"])) for g in state["gpus"]]

    def device(self, index: int) -> DeviceInfo:
        state = self._store.snapshot()
        return _device_info(state, _gpu(state, index))

    def mig_mode(self, index: int) -> Tuple[bool, bool]:
        gpu = _gpu(self._store.snapshot(), index)
        return bool(gpu["mig_enabled"]), bool(gpu["mig_enabled"])

    def profiles(self, index: int) -> List[MigProfile]:
        state = self._store.snapshot()
        _gpu(state, index)
        return list(_model(state).profiles)

    def free_placements(self, index: int, profile: str) -> List[int]:
        state = self._store.snapshot()
        gpu = _gpu(state, index)
        prof = _profile(state, index, profile)
        if not gpu["mig_enabled"] or _capacity_problem(state, gpu, prof):
            return []
        return _geometric_free(state, gpu, prof)

    def instances(self, index: Optional[int] = None) -> List[MigInstance]:
        state = self._store.snapshot()
        return [
            _mig_instance(state, gpu, inst)
            for gpu in _selected(state, index)
            for inst in gpu["instances"]
        ]

    def processes(self, index: Optional[int] = None) -> List[GpuProcess]:
        state = self._store.snapshot()
        wanted = {g["index"] for g in _selected(state, index)}
        return [
            GpuProcess(p["pid"], p["gpu_index"], p["used_memory_mb"], p["mig_uuid"], p["name"],
                       sm_util=_process_sm(p))
            for p in _on_gpu(state)
            if p["gpu_index"] in wanted
        ]

    def telemetry(self, index: int) -> Telemetry:
        state = self._store.snapshot()
        gpu = _gpu(state, index)
        load = gpu["load"]
        gr = load["gr"] if load["gr"] is not None else load["util"]
        # Which path the simulated node reports SM through: "gpm" (NVML, Hopper+), "dcgm",
        # or "none" (an A100 without DCGM: SM unknown, graphics-engine activity only).
        source = load.get("sm_source", "gpm")
        return Telemetry(
            gpu_index=index,
            sm_active=None if source == "none" or load["sm"] is None else load["sm"] / 100.0,
            gr_engine_active=gr / 100.0,
            sm_source="" if source == "none" else source,
            memory_used_mb=_memory_used(state, gpu),
            memory_total_mb=_model(state).memory_mb,
        )

    # --------------------------------------------------------------- GpuBackend: changes
    def create_gpu_instance(
        self, index: int, profile: str, placement: Optional[int] = None
    ) -> MigInstance:
        with self._store.transaction("create_gpu_instance") as state:
            gpu = _gpu(state, index)
            prof = _profile(state, index, profile)
            start = _choose_placement(state, gpu, prof, placement)
            used_ids = {i["gi_id"] for i in gpu["instances"]}
            gi_id = next(n for n in range(1, len(used_ids) + 2) if n not in used_ids)
            inst = {
                "gi_id": gi_id,
                "profile": prof.name,
                "start": start,
                "size": prof.memory_slices,
                "ci_id": None,
                "uuid": "",
            }
            gpu["instances"].append(inst)
            gpu["instances"].sort(key=lambda i: i["gi_id"])
            log.debug("sim: GPU %d: created GI %d (%s at %d)", index, gi_id, prof.name, start)
            return _mig_instance(state, gpu, inst)

    def create_compute_instance(self, index: int, gi_id: int) -> MigInstance:
        with self._store.transaction("create_compute_instance") as state:
            gpu = _gpu(state, index)
            inst = _instance(gpu, gi_id)
            if inst["ci_id"] is not None:
                raise GpuInsufficientResources(
                    f"GPU instance {gi_id} on GPU {index} already has its full-size compute "
                    f"instance {inst['ci_id']}"
                )
            state["mig_generation"] = int(state.get("mig_generation", 0)) + 1
            inst["ci_id"] = 0
            inst["uuid"] = _mig_uuid(gpu["uuid"], gi_id, 0, state["mig_generation"])
            return _mig_instance(state, gpu, inst)

    def destroy_compute_instance(self, index: int, gi_id: int, ci_id: int) -> None:
        with self._store.transaction("destroy_compute_instance") as state:
            gpu = _gpu(state, index)
            inst = _instance(gpu, gi_id)
            if inst["ci_id"] is None or inst["ci_id"] != ci_id:
                raise GpuNotFound(
                    f"no compute instance {ci_id} in GPU instance {gi_id} on GPU {index}"
                )
            users = [p["pid"] for p in _live_processes(state) if p["mig_uuid"] == inst["uuid"]]
            if users:
                raise GpuInUse(
                    f"compute instance {ci_id} of GPU instance {gi_id} on GPU {index} is in use "
                    f"by pid(s) {', '.join(map(str, users))}",
                    hint="stop those processes first",
                )
            state["processes"] = [p for p in state["processes"] if p["mig_uuid"] != inst["uuid"]]
            inst["ci_id"], inst["uuid"] = None, ""

    def destroy_gpu_instance(self, index: int, gi_id: int) -> None:
        with self._store.transaction("destroy_gpu_instance") as state:
            gpu = _gpu(state, index)
            inst = _instance(gpu, gi_id)
            if inst["ci_id"] is not None:
                raise GpuInUse(
                    f"GPU instance {gi_id} on GPU {index} still has compute instance "
                    f"{inst['ci_id']}",
                    hint="destroy the compute instance first",
                )
            gpu["instances"].remove(inst)

    def close(self) -> None:
        """Nothing to release: every call opens and closes the file."""

    # ------------------------------------------------------------------- sim-only knobs
    def state(self) -> State:
        """The raw simulated node (for ``sim show``); lost GPUs included, dead pids dropped."""
        state = self._store.snapshot()
        state["processes"] = _live_processes(state)
        return state

    def set_mig_mode(self, index: int, enabled: bool) -> None:
        """Switch MIG mode now (a real GPU needs an idle GPU and a reset; here it is instant)."""
        with self._store.transaction("set_mig_mode") as state:
            gpu = _gpu(state, index)
            if enabled and not _model(state).profiles:
                raise GpuNotSupported(f"GPU {index} ({state['model']}) has no MIG support")
            if bool(gpu["mig_enabled"]) == bool(enabled):
                return
            busy = _busy_reason(state, gpu)
            if busy:
                raise GpuInUse(f"cannot change MIG mode of GPU {index}: {busy}")
            gpu["mig_enabled"] = bool(enabled)

    def set_compute_timeslice(self, index: int, value: Timeslice) -> None:
        """``nvidia-smi compute-policy --set-timeslice``: the GPU keeps it until reset."""
        with self._store.transaction("set_compute_timeslice") as state:
            _gpu(state, index)["timeslice"] = value.value

    def compute_timeslice(self, index: int) -> str:
        """The time slice last set (``default`` as the driver starts); the sim only: NVML
        has no call to read it."""
        return str(_gpu(self._store.snapshot(), index).get("timeslice", "default"))

    # ----------------------------------------------- memory partitions, simulated (r615)
    def set_memory_limits(self, index: int, cgroup: str, limits: JobMemoryLimits) -> None:
        """``nvmlDeviceSetMemoryLimits_v1``: see :mod:`slurmiso.gpu.sim_partitions`."""
        from slurmiso.gpu import sim_partitions

        with self._store.transaction("set_memory_limits") as state:
            sim_partitions.set_limits(state, _gpu(state, index), cgroup, limits,
                                      _model(state).memory_mb)

    def memory_limits(self, index: int, cgroup: str) -> JobMemoryLimits:
        from slurmiso.gpu import sim_partitions

        state = self._store.snapshot()
        return sim_partitions.limits_of(state, _gpu(state, index), cgroup,
                                        [p for p in _on_gpu(state) if p["gpu_index"] == index])

    def set_memory_partitioning(self, available: bool) -> None:
        """Model a driver with (r615+) or without the memory-partition calls (sim only)."""
        with self._store.transaction("set_memory_partitioning") as state:
            state["memory_partitioning"] = bool(available)

    def set_lost(self, index: int, lost: bool) -> None:
        """Make a GPU fall off the bus (or come back): every call touching it then raises."""
        with self._store.transaction("set_lost") as state:
            _gpu(state, index, allow_lost=True)["lost"] = bool(lost)

    def add_process(
        self, index: int, pid: int, used_memory_mb: int, mig_uuid: str = "", name: str = "",
        sm_util: Optional[float] = None, cgroup: Optional[str] = None,
    ) -> GpuProcess:
        """Register a process holding memory on a GPU (or one of its MIG devices), and, if
        given, its SM (3D/compute) utilization in percent, as NVML's per-process samples
        give it on a whole GPU (never on a MIG device: NVML does not sample those).

        An entry for the same pid on the same device is replaced, so repeating a
        ``sim load`` updates instead of adding up. The process's cgroup (``cgroup``, else
        its own from ``/proc``) is held to any memory partition above it: an allocation
        past a hard limit fails as CUDA's out-of-memory does.
        """
        if used_memory_mb < 0 or pid <= 0:
            raise UsageError(f"invalid process: pid {pid}, memory {used_memory_mb} MiB")
        if sm_util is not None and (mig_uuid or not 0 <= sm_util <= 100):
            raise UsageError(f"process SM utilization {sm_util}: a percentage 0-100, and only "
                             "on a whole GPU (NVML samples no MIG device's processes)")
        with self._store.transaction("add_process") as state:
            gpu = _gpu(state, index, allow_lost=True)
            if mig_uuid and not any(i["uuid"] == mig_uuid for i in gpu["instances"]):
                raise GpuNotFound(f"no MIG device {mig_uuid} on GPU {index}")
            where = cgroup if cgroup is not None else _process_cgroup(pid)
            if not mig_uuid and gpu.get("memory_limits"):
                from slurmiso.gpu import sim_partitions  # (a partition set: rare, not hooks')

                sim_partitions.refusal(gpu, where, int(pid), int(used_memory_mb),
                                       [p for p in _on_gpu(state) if p["gpu_index"] == index])
            entry: Dict[str, Any] = {
                "pid": int(pid),
                "start": start_ticks(int(pid)),
                "gpu_index": index,
                "used_memory_mb": int(used_memory_mb),
                "mig_uuid": mig_uuid,
                "name": name,
            }
            if sm_util is not None:
                entry["sm"] = float(sm_util)
            if where:
                entry["cgroup"] = where
            state["processes"] = [
                p
                for p in _live_processes(state)
                if (p["pid"], p["gpu_index"], p["mig_uuid"]) != (pid, index, mig_uuid)
            ] + [entry]
            return GpuProcess(int(pid), index, int(used_memory_mb), mig_uuid, name,
                              sm_util=_process_sm(entry))

    def set_load(
        self,
        index: int,
        util: Optional[float] = None,
        sm_active: Optional[float] = None,
        memory_used_mb: Optional[int] = None,
        gr_active: Optional[float] = None,
        sm_source: Optional[str] = None,
    ) -> None:
        """Inject activity: ``util``, ``sm_active`` and ``gr_active`` in percent (0-100),
        ``memory_used_mb`` as memory used outside any registered process.

        Unset figures keep their value; graphics-engine activity follows ``util`` unless set.
        """
        for label, pct in (("util", util), ("sm_active", sm_active), ("gr_active", gr_active)):
            if pct is not None and not 0 <= pct <= 100:
                raise UsageError(f"{label} must be a percentage 0-100, not {pct}")
        if memory_used_mb is not None and memory_used_mb < 0:
            raise UsageError(f"memory_used_mb must not be negative, not {memory_used_mb}")
        if sm_source not in (None, "gpm", "dcgm", "none"):
            raise UsageError(f"sm_source must be gpm, dcgm or none, not {sm_source!r}")
        with self._store.transaction("set_load") as state:
            load = _gpu(state, index, allow_lost=True)["load"]
            if sm_source is not None:
                load["sm_source"] = sm_source
            for key, value in (
                ("util", util),
                ("sm", sm_active),
                ("gr", gr_active),
                ("memory_mb", memory_used_mb),
            ):
                if value is not None:
                    load[key] = value

    # ------------------------------------------------------- cuda-checkpoint, simulated
    def cuda_state(self, pid: int) -> CudaState:
        """The CUDA state of a registered process (as ``cuda-checkpoint --get-state``)."""
        from slurmiso.gpu.cuda_checkpoint import CudaState

        return CudaState(_cuda_entries(self._store.snapshot(), pid)[0].get("cuda", "running"))

    def cuda_act(self, pid: int, action: Action) -> None:
        """One cuda-checkpoint action, with the driver's state machine and refusals."""
        from slurmiso.errors import CheckpointRefused
        from slurmiso.gpu.cuda_checkpoint import TRANSITIONS, CudaState

        with self._store.transaction("cuda_act") as state:
            entries = _cuda_entries(state, pid)
            now = CudaState(entries[0].get("cuda", "running"))
            needs, leaves = TRANSITIONS[action]
            if now is not needs:
                raise CheckpointRefused(
                    f"pid {pid} is {now.value}: {action.value} needs {needs.value}")
            refusal = entries[0].get("refuses", "") if action.value == "checkpoint" else ""
            if refusal:  # the README: the driver does not try to keep the process usable
                leaves = CudaState.FAILED
            for e in entries:
                e["cuda"] = leaves.value
        if refusal:  # after the transaction: the failed state is written, as the driver's is
            raise CheckpointRefused(f"pid {pid}: checkpoint failed: {refusal}")

    def refuse_checkpoint(self, pid: int, reason: str) -> None:
        """Make a registered process refuse ``checkpoint`` (e.g. it holds UVM memory)."""
        with self._store.transaction("refuse_checkpoint") as state:
            for e in _cuda_entries(state, pid):
                e["refuses"] = reason

    def clear_load(self, index: Optional[int] = None) -> None:
        """Reset injected activity and forget registered processes, of one GPU or all."""
        with self._store.transaction("clear_load") as state:
            gpus = [_gpu(state, index, allow_lost=True)] if index is not None else state["gpus"]
            for gpu in gpus:
                gpu["load"] = _fresh_load()
            indices = {g["index"] for g in gpus}
            state["processes"] = [p for p in state["processes"] if p["gpu_index"] not in indices]


# ------------------------------------------------------------------ pure state helpers
def _cuda_entries(state: State, pid: int) -> List[Dict[str, Any]]:
    """The live process entries of ``pid`` (one per GPU it uses); refused if it has none."""
    from slurmiso.errors import CheckpointRefused

    found = [p for p in _live_processes(state) if p["pid"] == int(pid)]
    if not found:
        raise CheckpointRefused(f"pid {pid} is not a CUDA process on this node")
    return found


def state_model(state: State) -> Optional[GpuModel]:
    """The simulated GPUs' model: a catalogue entry, or the ``custom_model`` the state names."""
    model = profiles.lookup_model(str(state.get("model", "")))
    custom = state.get("custom_model")
    if model is None and isinstance(custom, dict):
        memory = custom.get("memory_mb")
        product = custom.get("product_name")
        if isinstance(memory, int) and not isinstance(memory, bool) and memory > 0:
            model = custom_model(str(state["model"]), memory,
                                 product if isinstance(product, str) else "")
    return model


def _model(state: State) -> GpuModel:
    model = state_model(state)
    assert model is not None  # checked by _schema_problem on every read
    return model


def _gpu(state: State, index: int, allow_lost: bool = False) -> Dict[str, Any]:
    gpus = state["gpus"]
    if not isinstance(index, int) or not 0 <= index < len(gpus):
        raise GpuNotFound(
            f"no GPU {index} on simulated node {state['node']} (GPUs 0-{len(gpus) - 1})"
        )
    gpu: Dict[str, Any] = gpus[index]
    if gpu["lost"] and not allow_lost:
        raise GpuLost(
            f"GPU {index} has fallen off the bus (NVML_ERROR_GPU_IS_LOST)",
            hint=f"drain the node, reset the GPU (simulated: slurmiso sim fault --gpu {index} ok)",
        )
    return gpu


def _selected(state: State, index: Optional[int]) -> List[Dict[str, Any]]:
    if index is not None:
        return [_gpu(state, index)]
    return [_gpu(state, g["index"]) for g in state["gpus"]]


def _profile(state: State, index: int, name: str) -> MigProfile:
    model = _model(state)
    prof = model.profile(name)
    if prof is None:
        allowed = ", ".join(model.profile_names) or "none (no MIG support)"
        raise GpuNotSupported(
            f"MIG profile {name!r} does not exist on GPU {index} ({model.name}); "
            f"allowed profiles: {allowed}"
        )
    return prof


def _instance(gpu: Dict[str, Any], gi_id: int) -> Dict[str, Any]:
    for inst in gpu["instances"]:
        if inst["gi_id"] == gi_id:
            found: Dict[str, Any] = inst
            return found
    raise GpuNotFound(f"no GPU instance {gi_id} on GPU {gpu['index']}")


def _process_cgroup(pid: int) -> str:
    """The full path of ``pid``'s cgroup v2 (its ``0::`` line), or "" where it has none."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("0::/"):
                    return "/sys/fs/cgroup" + line[3:].strip()
    except OSError:
        pass
    return ""


def _live_processes(state: State) -> List[Dict[str, Any]]:
    """The registered processes still running: the same pid *and* the same start time.

    A pid alone outlives its process: a state file kept across jobs, reboots or machine images
    would otherwise charge a dead job's memory to whatever process reuses its pid (a GPU that
    stays "hot" for good). An entry without a start time cannot be told apart, so it is gone.
    """
    return [p for p in state["processes"] if _same_process(p)]


def _same_process(p: Dict[str, Any]) -> bool:
    pid, start = int(p["pid"]), p.get("start")
    if not pid_alive(pid):
        return False
    if start is None and "start" in p:  # registered where /proc had no start time to give
        return True
    return isinstance(start, int) and start_ticks(pid) == start


def _on_gpu(state: State) -> List[Dict[str, Any]]:
    """The live processes that hold the GPU: a checkpointed one (cuda-checkpoint) has released
    every GPU resource and is gone from NVML's process list until it is restored."""
    return [p for p in _live_processes(state) if p.get("cuda", "running") != "checkpointed"]


def _memory_used(state: State, gpu: Dict[str, Any], mig_uuid: Optional[str] = None) -> int:
    procs = [p for p in _on_gpu(state) if p["gpu_index"] == gpu["index"]]
    if mig_uuid is not None:
        return sum(int(p["used_memory_mb"]) for p in procs if p["mig_uuid"] == mig_uuid)
    return int(gpu["load"]["memory_mb"]) + sum(int(p["used_memory_mb"]) for p in procs)


def _device_info(state: State, gpu: Dict[str, Any]) -> DeviceInfo:
    model = _model(state)
    mig = bool(gpu["mig_enabled"])
    return DeviceInfo(
        index=gpu["index"],
        uuid=gpu["uuid"],
        name=model.product_name,
        model=model.name,
        minor=gpu["minor"],
        pci_bus_id=gpu["pci_bus_id"],
        memory_total_mb=model.memory_mb,
        memory_used_mb=_memory_used(state, gpu),
        # NVML answers NOT_SUPPORTED for utilization in MIG mode; backends report 0 then.
        utilization_pct=None if mig else int(gpu["load"]["util"]),
        mig_enabled=mig,
        mig_pending=mig,
        architecture=model.architecture,
    )


def _mig_instance(state: State, gpu: Dict[str, Any], inst: Dict[str, Any]) -> MigInstance:
    prof = _model(state).profile(inst["profile"])
    return MigInstance(
        gpu_index=gpu["index"],
        gi_id=inst["gi_id"],
        profile=inst["profile"],
        placement_start=inst["start"],
        placement_size=inst["size"],
        ci_id=inst["ci_id"],
        uuid=inst["uuid"],
        memory_total_mb=prof.memory_mb if prof else 0,
        memory_used_mb=_memory_used(state, gpu, inst["uuid"]) if inst["uuid"] else 0,
    )


def _busy_reason(state: State, gpu: Dict[str, Any]) -> str:
    n_inst = len(gpu["instances"])
    n_proc = sum(1 for p in _live_processes(state) if p["gpu_index"] == gpu["index"])
    parts = []
    if n_inst:
        parts.append(f"{n_inst} MIG instance(s) exist")
    if n_proc:
        parts.append(f"{n_proc} process(es) run on it")
    return " and ".join(parts)


def _geometric_free(state: State, gpu: Dict[str, Any], prof: MigProfile) -> List[int]:
    occupied = [(i["start"], i["size"]) for i in gpu["instances"]]
    return profiles.free_placements(_model(state), prof, occupied)


def _capacity_problem(state: State, gpu: Dict[str, Any], prof: MigProfile) -> str:
    """Why no further ``prof`` instance fits, beyond geometry ("" if it may)."""
    model = _model(state)
    same = sum(1 for i in gpu["instances"] if i["profile"] == prof.name)
    if same >= prof.max_instances:
        return f"{prof.name} allows at most {prof.max_instances} instance(s) per GPU"
    used = 0
    for inst in gpu["instances"]:
        other = model.profile(inst["profile"])
        used += other.compute_slices if other else 0
    if used + prof.compute_slices > model.compute_slices:
        return (
            f"{prof.name} needs {prof.compute_slices} compute slice(s), "
            f"{model.compute_slices - used} of {model.compute_slices} are free"
        )
    return ""


def _choose_placement(
    state: State, gpu: Dict[str, Any], prof: MigProfile, placement: Optional[int]
) -> int:
    """Placement for a new GPU instance, failing the way NVML does."""
    index = gpu["index"]
    if not gpu["mig_enabled"]:
        raise GpuNotSupported(
            f"MIG mode is disabled on GPU {index}; cannot create a GPU instance",
            hint=f"enable MIG first (simulated: slurmiso sim mig-mode --gpu {index} on)",
        )
    if placement is not None and placement not in prof.placements:
        legal = ", ".join(map(str, prof.placements))
        raise GpuError(
            f"invalid argument: placement {placement} is not a legal start for {prof.name}; "
            f"legal starts: {legal}"
        )
    free = _geometric_free(state, gpu, prof)
    free_text = ", ".join(map(str, free)) or "none"
    problem = _capacity_problem(state, gpu, prof)
    if problem:
        raise GpuInsufficientResources(
            f"cannot create {prof.name} on GPU {index}: {problem}; free placements: none"
        )
    if placement is None:
        if not free:
            raise GpuInsufficientResources(
                f"cannot create {prof.name} on GPU {index}: no free placement "
                f"(occupied: {_occupied_text(gpu)}); free placements: none"
            )
        return free[0]
    if placement not in free:
        raise GpuInsufficientResources(
            f"cannot create {prof.name} at placement {placement} on GPU {index}: it overlaps "
            f"{_occupied_text(gpu)}; free placements: {free_text}"
        )
    return placement


def _occupied_text(gpu: Dict[str, Any]) -> str:
    spans = [
        f"{i['profile']} (GI {i['gi_id']}) at slices {i['start']}-{i['start'] + i['size'] - 1}"
        for i in gpu["instances"]
    ]
    return ", ".join(spans) or "nothing"
