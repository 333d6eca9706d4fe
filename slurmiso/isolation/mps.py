"""MPS pools: one MPS control daemon per GPU, shared by the jobs Slurm puts on that GPU.

Slurm hands the job ``gres/mps`` on one GPU and sets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``,
but it neither runs the daemons nor caps memory. This handler runs the daemon of a GPU while
it has clients, pins each client's device memory (``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``) from
its class, refuses a job whose pinned memory would not fit, and reports what MPS cannot
isolate: clients of different users are serialised (time-sliced), not run concurrently.

One source of truth for "who uses the daemon of GPU N": the allocation keys
``mps/<N>/job/<jobid>`` of jobs whose record is live; each record's ``mps`` resource holds
that job's uid and memory limit. Layout (root-owned)::

    <state_dir>/mps/gpu<N>/pipe   CUDA_MPS_PIPE_DIRECTORY (1777, see _prepare_dirs)
    <state_dir>/mps/gpu<N>/log    CUDA_MPS_LOG_DIRECTORY  (0755)
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional

from slurmiso.config.model import MpsShare
from slurmiso.gpu.backend import GpuBackend
from slurmiso.isolation.base import (
    RELEASED,
    Context,
    JobProblem,
    NodeFault,
    ReconcileContext,
)
from slurmiso.isolation.mps_daemon import MpsControl, mps_control_for
from slurmiso.isolation.processes import clean_job_devices
from slurmiso.state import Journal, NodeState
from slurmiso.units import parse_size

log = logging.getLogger(__name__)

DIR_MODE = 0o755
PIPE_DIR_MODE = 0o1777
STOP_TIMEOUT_S = 10.0
_KEY_RE = re.compile(r"mps/([0-9]+)/job/([0-9_]+)")
_GPU_DIR_RE = re.compile(r"gpu([0-9]+)")


@dataclass(frozen=True)
class Client:
    """A job registered on a GPU's daemon, as its record describes it."""

    job_id: str
    uid: int
    memory_limit_mb: int


def client_key(gpu: int, job_id: str) -> str:
    return f"mps/{gpu}/job/{job_id}"


def gpu_paths(state_dir: str, gpu: int) -> Dict[str, str]:
    base = os.path.join(state_dir, "mps", f"gpu{gpu}")
    return {"base": base, "pipe": os.path.join(base, "pipe"), "log": os.path.join(base, "log")}


def resolve_memory_limit(class_limit_mb: int, option: str) -> int:
    """The job's pinned-memory limit in MiB (0 = none): ``--iso-mps-mem`` may only lower it."""
    if not option:
        return class_limit_mb
    try:
        wanted = parse_size(option)
    except ValueError as exc:
        raise JobProblem(f"--iso-mps-mem={option}: {exc}") from None
    if wanted <= 0:
        raise JobProblem(f"--iso-mps-mem={option} must be more than 0")
    if class_limit_mb and wanted > class_limit_mb:
        raise JobProblem(
            f"--iso-mps-mem={option} ({wanted} MiB) is above the class limit of "
            f"{class_limit_mb} MiB; it may only lower it",
            hint=f"ask for at most {class_limit_mb}M or use a class with a larger limit",
        )
    return wanted


def check_headroom(
    gpu: int, total_mb: int, others: List[Client], limit_mb: int, headroom_pct: int
) -> None:
    """JobProblem unless all pinned limits on the GPU plus the class headroom fit in it."""
    pinned = sum(c.memory_limit_mb for c in others)
    headroom = total_mb * headroom_pct // 100
    need = pinned + limit_mb + headroom
    if need > total_mb:
        raise JobProblem(
            f"not enough MPS memory on GPU {gpu}: {len(others)} job(s) already pin "
            f"{pinned} MiB, this job asks {limit_mb} MiB and its class keeps {headroom_pct}% "
            f"({headroom} MiB) headroom: {need} MiB > {total_mb} MiB",
            hint="lower --iso-mps-mem or resubmit; Slurm's mps count does not cover memory",
        )


def registered(state: NodeState) -> Dict[int, List[str]]:
    """GPU -> job ids registered as MPS clients in the allocation table."""
    out: Dict[int, List[str]] = {}
    for key in state.allocations():
        m = _KEY_RE.fullmatch(key)
        if m:
            out.setdefault(int(m.group(1)), []).append(m.group(2))
    return out


def _mps_entries(record: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    return [r for r in (record or {}).get("resources", []) if r.get("kind") == "mps"]


def _job_live(state: NodeState, job_id: str, live_jobs: Optional[List[str]] = None) -> bool:
    """A job counts while its record exists and is not released (and Slurm, if asked, agrees)."""
    if live_jobs is not None and job_id not in live_jobs and job_id.split("_")[0] not in live_jobs:
        return False
    record = state.read_job(job_id)
    return record is not None and record.get("status") != RELEASED


def live_clients(state: NodeState, gpu: int, exclude: str = "") -> List[Client]:
    clients = []
    for job_id in registered(state).get(gpu, []):
        if job_id == exclude:
            continue
        record = state.read_job(job_id)
        if record is None or record.get("status") == RELEASED:
            continue
        entry = next((r for r in _mps_entries(record) if r.get("gpu") == gpu), {})
        uid, limit = int(entry.get("uid", -1)), int(entry.get("memory_limit_mb") or 0)
        clients.append(Client(job_id, uid, limit))
    return clients


def _unregister(state: NodeState, gpu: int, job_id: str) -> bool:
    allocs = state.allocations()
    if allocs.pop(client_key(gpu, job_id), None) is None:
        return False
    state.set_allocations(allocs)
    return True


def _warn_job(state: NodeState, job_id: str, message: str) -> None:
    """Add a warning to another job's persisted record (callers hold the node lock)."""
    record = state.read_job(job_id)
    if record is None:
        return
    warnings = record.setdefault("warnings", [])
    if message not in warnings:
        warnings.append(message)
        state.write_job(job_id, record)


def _prepare_dirs(paths: Dict[str, str]) -> None:
    """Fresh pipe dir, kept log dir. chmod after mkdir because slurmd's umask may be 077.

    The pipe dir is 1777 like NVIDIA's default ``/tmp/nvidia-mps``: every MPS server runs as
    its client's uid and creates its pipes there, and clients of several uids connect to one
    daemon, so chown to one job's uid would lock the next user out; the sticky bit stops users
    deleting each other's pipes. Its parent ``gpu<N>`` stays root-owned 0755, so nobody can
    swap the pipe dir itself, and it is recreated (symlink-safe rmtree) before each start.
    """
    for path in (os.path.dirname(paths["base"]), paths["base"], paths["log"]):
        os.makedirs(path, DIR_MODE, exist_ok=True)
        os.chmod(path, DIR_MODE)
    if os.path.lexists(paths["pipe"]):
        if os.path.islink(paths["pipe"]):
            os.unlink(paths["pipe"])
        else:
            shutil.rmtree(paths["pipe"])
    os.mkdir(paths["pipe"], DIR_MODE)
    os.chmod(paths["pipe"], PIPE_DIR_MODE)


def _has_leftovers(pipe_dir: str) -> bool:
    try:
        return bool(os.listdir(pipe_dir))
    except OSError:
        return False


class MpsIsolation:
    mode = "mps"

    def __init__(self, control_factory: Callable[[GpuBackend], MpsControl] = mps_control_for):
        #: Picks the daemon implementation for a backend; tests inject their own.
        self.control_factory = control_factory

    # -- setup ----------------------------------------------------------------------------

    def setup(self, ctx: Context) -> None:
        existing = _mps_entries(ctx.record)
        if any(r.get("state") == "ready" for r in existing):
            return  # setup again on a ready record changes nothing
        gpu = self._job_gpu(ctx)
        dev = ctx.backend.device(gpu)
        share = ctx.job_class.mps if ctx.job_class else MpsShare()
        headroom_pct = ctx.job_class.memory_headroom_pct if ctx.job_class else 0
        limit = resolve_memory_limit(share.memory_limit_mb, ctx.env.spank.get("iso_mps_mem", ""))
        others = live_clients(ctx.state, gpu, exclude=ctx.job_id)
        check_headroom(gpu, dev.memory_total_mb, others, limit, headroom_pct)

        paths = gpu_paths(ctx.state.state_dir, gpu)
        entry = existing[0] if existing else ctx.add_resource({
            "kind": "mps", "gpu": gpu, "gpu_uuid": dev.uuid, "uid": ctx.env.uid,
            "pipe_dir": paths["pipe"], "log_dir": paths["log"], "daemon_pid": None,
            "thread_percentage": share.thread_percentage, "memory_limit_mb": limit,
        })
        ctx.claim(client_key(gpu, ctx.job_id))
        ctx.save()
        pid = self._ensure_daemon(ctx, gpu, dev.uuid, paths, others)
        self._report_other_users(ctx, gpu, others)

        entry.update(daemon_pid=pid, state="ready")
        ctx.set_env("CUDA_MPS_PIPE_DIRECTORY", paths["pipe"])
        ctx.set_env("CUDA_MPS_LOG_DIRECTORY", paths["log"])
        ctx.set_env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(share.thread_percentage))
        if limit:
            # Device 0: the daemon sees only this GPU, so it is ordinal 0 for the client.
            ctx.set_env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"0={limit}M")
        ctx.set_env("CUDA_VISIBLE_DEVICES", "0")
        ctx.save()

    def _job_gpu(self, ctx: Context) -> int:
        """NVML index of the job's one GPU (GRES index i is /dev/nvidia<i>, i.e. minor i)."""
        if len(ctx.env.gpus) != 1:
            raise JobProblem(
                f"an MPS job gets exactly one GPU on a node; job {ctx.job_id} has "
                f"{len(ctx.env.gpus)} ({','.join(map(str, ctx.env.gpus)) or 'none'})",
                hint="request --gres=mps:N; Slurm allows one MPS GPU per node per job",
            )
        by_minor = {d.minor: d.index for d in ctx.backend.devices()}
        gres = ctx.env.gpus[0]
        if gres not in by_minor:
            raise NodeFault(
                f"job {ctx.job_id} was given GPU {gres} but this node has no /dev/nvidia{gres}",
                hint="gres.conf does not match the GPUs; "
                "regenerate it with 'slurmiso gen gres-conf'",
            )
        return by_minor[gres]

    def _ensure_daemon(
        self, ctx: Context, gpu: int, uuid: str, paths: Dict[str, str], others: List[Client]
    ) -> int:
        control = self.control_factory(ctx.backend)
        pid = control.running(paths["pipe"])
        if pid is not None:
            return pid
        if _has_leftovers(paths["pipe"]):
            users = ", ".join(c.job_id for c in others) or "none (stale files, e.g. after a reboot)"
            message = (
                f"the MPS control daemon of GPU {gpu} had died (leftovers in {paths['pipe']}); "
                f"restarted it; jobs that were using it: {users}"
            )
            ctx.warn(message)
            for other in others:  # their MPS connections died with it
                _warn_job(ctx.state, other.job_id, message)
            ctx.journal.append(
                "mps-daemon-restarted", job=ctx.job_id, gpu=gpu, pipe_dir=paths["pipe"],
                clients=[c.job_id for c in others],
            )
            control.stop(paths["pipe"], STOP_TIMEOUT_S)  # clears a corpse's files and servers
        try:
            _prepare_dirs(paths)
        except OSError as exc:
            raise NodeFault(f"cannot prepare MPS directories for GPU {gpu}: {exc}") from None
        pid = control.start(uuid, paths["pipe"], paths["log"])
        log.info("job %s: started MPS control daemon pid %d on GPU %d", ctx.job_id, pid, gpu)
        ctx.journal.append("mps-daemon-started", job=ctx.job_id, gpu=gpu, pid=pid)
        return pid

    def _report_other_users(self, ctx: Context, gpu: int, others: List[Client]) -> None:
        """MPS runs one server per uid at a time, so other users' work is time-sliced."""
        foreign = [c for c in others if c.uid != ctx.env.uid]
        if not foreign:
            return
        ids = ", ".join(c.job_id for c in foreign)
        uids = sorted({c.uid for c in foreign})
        ctx.warn(
            f"GPU {gpu} is shared over MPS with job(s) {ids} of uid(s) "
            f"{', '.join(map(str, uids))}: MPS serialises different users, so this job's work "
            "is time-sliced with theirs, not concurrent"
        )
        for c in foreign:
            _warn_job(
                ctx.state, c.job_id,
                f"job {ctx.job_id} of uid {ctx.env.uid} joined MPS GPU {gpu}: MPS serialises "
                "different users, so this job's work is time-sliced with it, not concurrent",
            )
        ctx.journal.append(
            "mps-user-conflict", gpu=gpu, job=ctx.job_id, uid=ctx.env.uid,
            other_jobs=[c.job_id for c in foreign], other_uids=uids,
        )

    # -- teardown -------------------------------------------------------------------------

    def teardown(self, ctx: Context) -> None:
        for entry in _mps_entries(ctx.record):
            if entry.get("state") == RELEASED:
                continue
            gpu = int(entry["gpu"])
            clean_job_devices(ctx.backend, ctx.job_id, ctx.env.uid, gpus=[gpu])
            _unregister(ctx.state, gpu, ctx.job_id)
            if not live_clients(ctx.state, gpu, exclude=ctx.job_id):
                self._stop_daemon(
                    self.control_factory(ctx.backend), ctx.journal, gpu,
                    gpu_paths(ctx.state.state_dir, gpu),
                    f"last client job {ctx.job_id} ended",
                )
            entry["state"] = RELEASED
        ctx.release_claims()
        if ctx.state.read_job(ctx.job_id) is not None:  # never resurrect a deleted record
            ctx.save()

    @staticmethod
    def _stop_daemon(
        control: MpsControl, journal: Journal, gpu: int, paths: Dict[str, str], reason: str
    ) -> None:
        """Stop the daemon, prove it is gone (NodeFault if not), drop its pipe dir."""
        pid = control.running(paths["pipe"])
        control.stop(paths["pipe"], STOP_TIMEOUT_S)
        survivor = control.running(paths["pipe"])
        if survivor is not None:
            raise NodeFault(
                f"MPS control daemon pid {survivor} of GPU {gpu} survived quit, SIGTERM and "
                "SIGKILL",
                hint="the GPU may be hung; check nvidia-smi and reset it before resuming",
            )
        if pid is not None:
            log.info("stopped MPS control daemon pid %d of GPU %d (%s)", pid, gpu, reason)
            journal.append("mps-daemon-stopped", gpu=gpu, pid=pid, reason=reason)
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(paths["pipe"])

    # -- reconcile ------------------------------------------------------------------------

    def reconcile(self, ctx: ReconcileContext) -> List[str]:
        fixes: List[str] = []
        control = self.control_factory(ctx.backend)
        clients = registered(ctx.state)
        root = os.path.join(ctx.state.state_dir, "mps")
        gpus = set(clients)
        with contextlib.suppress(FileNotFoundError):
            gpus |= {int(m.group(1)) for m in map(_GPU_DIR_RE.fullmatch, os.listdir(root)) if m}
        for gpu in sorted(gpus):
            paths = gpu_paths(ctx.state.state_dir, gpu)
            live = []
            for job_id in clients.get(gpu, []):
                if _job_live(ctx.state, job_id, ctx.live_jobs):
                    live.append(job_id)
                    continue
                fixes.append(f"drop MPS client registration of job {job_id} on GPU {gpu} "
                             "(no live job record)")
                if not ctx.dry_run:
                    _unregister(ctx.state, gpu, job_id)
            if live:
                continue
            pid = control.running(paths["pipe"])
            if pid is not None:
                fixes.append(f"stop MPS control daemon pid {pid} of GPU {gpu} (no live client)")
                if not ctx.dry_run:
                    self._stop_daemon(control, ctx.journal, gpu, paths, "reconcile: no client")
            if os.path.isdir(paths["base"]):
                fixes.append(f"remove stale MPS directory {paths['base']}")
                if not ctx.dry_run:
                    shutil.rmtree(paths["base"])
        if not ctx.dry_run:
            for fix in fixes:
                ctx.journal.append("mps-reconcile", fix=fix)
        return fixes


HANDLER = MpsIsolation()
