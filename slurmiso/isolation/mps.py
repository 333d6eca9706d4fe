"""MPS pools: one MPS control daemon per GPU, user and limits, started while it has clients.

Slurm hands the job ``gres/mps`` on one GPU and sets ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``,
but it neither runs the daemons nor caps memory, and a client's variables can only narrow
what its daemon allows. So the limits that hold are the daemon's: each daemon gets its
class's thread percentage and pinned-memory limit as ``set_default_*`` before anyone can reach
it, and the job's variables only repeat (or narrow) them.

Why a daemon per (GPU, uid, limits) rather than one per GPU:

* MPS runs one server per uid at a time anyway (other users' clients wait until that server
  has no clients), so a shared daemon buys no concurrency across users; it only lets every
  user on the GPU ``quit`` it or change its defaults. A daemon per uid lets its pipe
  directory belong to that uid, mode 0700: only that user and root can reach it. This is
  NVIDIA's "MPS per user" provisioning (a pipe directory per user, not shared).
* Daemon defaults bind every client of the server, and per-server settings bind every
  client of that server; neither can tell two jobs of one user apart. Jobs of one user with
  different limits (two classes, or a lowered ``--iso-mps-mem``) therefore get daemons of
  their own ("multiple control/server pairs" in NVIDIA's terms), and same-limit jobs of one
  user share one, keeping MPS's concurrency where it is real.

One source of truth for "who uses which daemon": the allocation keys ``mps/<N>/job/<jobid>``
of jobs whose record is live; each record's ``mps`` resource holds the uid and limits that
name its daemon; :mod:`slurmiso.isolation.mps_dirs` says where that daemon lives.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Set

from slurmiso.config.model import MpsServer, MpsShare
from slurmiso.errors import JobProblem, NodeFault
from slurmiso.isolation import mps_shared as shared
from slurmiso.isolation.base import Context, ReconcileContext
from slurmiso.isolation.mps_daemon import MpsControl, mps_control_for
from slurmiso.isolation.mps_dirs import (
    DAEMON_DIR_RE,
    LEGACY_DIRS,
    DaemonKey,
    daemon_paths,
    gpu_dir,
    hand_over,
    has_leftovers,
    prepare_dirs,
    remove_tree,
)
from slurmiso.isolation.processes import clean_job_devices
from slurmiso.state import Journal, NodeState
from slurmiso.state.record import JobRecord, Resource, ResourceState
from slurmiso.units import parse_size

if TYPE_CHECKING:  # the protocols are costly to define; hooks only annotate with them
    from slurmiso.gpu.protocols import GpuBackend

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 10.0
_KEY_RE = re.compile(r"mps/([0-9]+)/job/([0-9_]+)")
_GPU_DIR_RE = re.compile(r"gpu([0-9]+)")


@dataclass(frozen=True)
class Client:
    """A job registered on a GPU, as its record describes it."""

    job_id: str
    key: DaemonKey
    #: Its namespace on the GPU's shared server ("": a client of a per-class daemon).
    namespace: str = ""

    @property
    def uid(self) -> int:
        return self.key.uid

    @property
    def memory_limit_mb(self) -> int:
        return self.key.memory_limit_mb


def client_key(gpu: int, job_id: str) -> str:
    return f"mps/{gpu}/job/{job_id}"


def entry_key(entry: Resource, job_id: str) -> DaemonKey:
    """The daemon a record's ``mps`` resource names; NodeFault naming the job if it is corrupt."""
    if entry.gpu is None or entry.uid is None or entry.thread_percentage is None:
        raise NodeFault(f"job {job_id}'s record has a corrupt mps resource (no gpu, uid or "
                        f"thread_percentage): {entry.to_dict()}",
                        hint="check the job record under the state dir's jobs/")
    key = DaemonKey(entry.gpu, entry.uid, entry.thread_percentage, entry.memory_limit_mb or 0)
    if min(key.gpu, key.uid, key.thread_percentage, key.memory_limit_mb) < 0:
        raise NodeFault(f"job {job_id}'s record has a negative mps value: {entry.to_dict()}")
    return key


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


def _mps_entries(record: Optional[JobRecord]) -> List[Resource]:
    return list(record.of_kind("mps")) if record is not None else []


def _job_live(state: NodeState, job_id: str, live_jobs: Optional[List[str]] = None) -> bool:
    """A job counts while its record exists (and Slurm, if asked, agrees)."""
    if live_jobs is not None and job_id not in live_jobs and job_id.split("_")[0] not in live_jobs:
        return False
    return state.read_job(job_id) is not None


def live_clients(state: NodeState, gpu: int, exclude: str = "") -> List[Client]:
    """Every job with a live record registered on ``gpu``, whatever its daemon."""
    clients = []
    for job_id in registered(state).get(gpu, []):
        if job_id == exclude:
            continue
        record = state.read_job(job_id)
        if record is None:
            continue
        entry = next((r for r in _mps_entries(record) if r.gpu == gpu), None)
        if entry is not None:  # registered before its resource was written: no daemon yet
            clients.append(Client(job_id, entry_key(entry, job_id),
                                  shared.namespace_of(entry.extra) or ""))
    return clients


def daemon_clients(state: NodeState, key: DaemonKey, exclude: str = "") -> List[Client]:
    """The clients of ``key``'s per-class daemon."""
    return [c for c in live_clients(state, key.gpu, exclude)
            if c.key == key and not c.namespace]


def shared_clients(state: NodeState, gpu: int, exclude: str = "") -> List[Client]:
    """The clients of ``gpu``'s shared server."""
    return [c for c in live_clients(state, gpu, exclude) if c.namespace]


def _unregister(state: NodeState, gpu: int, job_id: str) -> bool:
    allocs = state.allocations()
    if allocs.pop(client_key(gpu, job_id), None) is None:
        return False
    state.set_allocations(allocs)
    return True


def refuse_run_in_job(job_id: str, gpu: int, sluid: str = "", proc: str = "/proc") -> None:
    """NodeFault when this prolog runs inside a job's cgroup (PrologFlags=RunInJob, 24.05+:
    Slurm forks the Prolog from the job's extern slurmstepd, src/slurmd/slurmstepd/mgr.c).
    A daemon started there lives in that job's cgroup: proctrack/cgroup kills it when that
    job ends, under every later job sharing it, and the job's device constraint is its own.
    slurmiso needs PrologFlags=Alloc,Contain without RunInJob (doctor says so too)."""
    from slurmiso.sluid import job_of_process

    holder = job_of_process(os.getpid(), proc)
    if holder is not None and holder in (job_id.split("_")[0], sluid or None):
        raise NodeFault(
            f"PrologFlags=RunInJob: the prolog of job {job_id} runs in the job's own cgroup; "
            f"an MPS daemon started there for GPU {gpu} would die with that job",
            hint="set PrologFlags=Alloc,Contain (without RunInJob) in slurm.conf, restart "
            "slurmd, then resume the node")


def _warn_job(state: NodeState, job_id: str, message: str) -> None:
    """Add a warning to another job's persisted record (callers hold the node lock)."""
    record = state.read_job(job_id)
    if record is None:
        return
    if message not in record.warnings:
        record.warnings.append(message)
        state.write_job(job_id, record)


class MpsIsolation:
    mode = "mps"

    def __init__(self, control_factory: Callable[[GpuBackend], MpsControl] = mps_control_for):
        #: Picks the daemon implementation for a backend; tests inject their own.
        self.control_factory = control_factory

    # -- setup ----------------------------------------------------------------------------

    def setup(self, ctx: Context) -> None:
        existing = _mps_entries(ctx.record)
        if any(r.state is ResourceState.READY for r in existing):
            return  # setup again on a ready record changes nothing
        gpu = self._job_gpu(ctx)
        dev = ctx.backend.device(gpu)
        share = ctx.job_class.mps if ctx.job_class else MpsShare()
        headroom_pct = ctx.job_class.memory_headroom_pct if ctx.job_class else 0
        limit = resolve_memory_limit(share.limit_mb(dev.memory_total_mb),
                                     ctx.env.spank.get("iso_mps_mem", ""))
        others = live_clients(ctx.state, gpu, exclude=ctx.job_id)
        check_headroom(gpu, dev.memory_total_mb, others, limit, headroom_pct)
        if ctx.pool.mps_server is MpsServer.SHARED:
            if self._setup_shared(ctx, gpu, dev.uuid, share, limit):
                return
            existing = [r for r in _mps_entries(ctx.record) if not r.extra.get("namespace")]

        key = DaemonKey(gpu, ctx.env.uid, share.thread_percentage, limit)
        paths = daemon_paths(ctx.state.state_dir, key)
        entry = existing[0] if existing else ctx.add_resource(Resource(
            "mps", gpu=gpu, gpu_uuid=dev.uuid, uid=ctx.env.uid,
            pipe_dir=paths["pipe"], log_dir=paths["log"],
            thread_percentage=share.thread_percentage, memory_limit_mb=limit,
        ))
        ctx.claim(client_key(gpu, ctx.job_id))
        ctx.save()
        pid = self._ensure_daemon(ctx, key, dev.uuid, paths,
                                  [c for c in others if c.key == key])
        self._report_other_users(ctx, gpu, others)

        entry.daemon_pid, entry.state = pid, ResourceState.READY
        # What the daemon enforces, repeated for the job: unsetting or raising these changes
        # nothing (a client's variables only narrow), lowering them narrows this job alone.
        ctx.set_env("CUDA_MPS_PIPE_DIRECTORY", paths["pipe"])
        ctx.set_env("CUDA_MPS_LOG_DIRECTORY", paths["log"])
        ctx.set_env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(share.thread_percentage))
        if limit:
            # Device 0: the daemon sees only this GPU, so it is ordinal 0 for the client.
            ctx.set_env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"0={limit}M")
        ctx.set_env("CUDA_VISIBLE_DEVICES", "0")
        ctx.save()

    def _setup_shared(
        self, ctx: Context, gpu: int, uuid: str, share: MpsShare, limit: int
    ) -> bool:
        """The job as a client of ``gpu``'s shared server, in a namespace of its own;
        False (said in the journal and to the job) where the driver has no MPS v3 or its
        daemon does not do what NVIDIA documents: the job then gets a per-class daemon.

        Intent first, as everywhere in the hooks: the record names the namespace (and so
        the GPU's shared daemon) before the daemon is started, so a prolog killed at any
        point leaves the epilog what it needs to stop it."""
        control = self.control_factory(ctx.backend)
        paths = shared.shared_paths(ctx.state.state_dir, gpu)
        entry = self._intend_namespace(ctx, control, paths, gpu, uuid, share, limit)
        namespace, prio = str(entry.extra["namespace"]), int(entry.extra["priority"])
        pid = control.running(paths["pipe"])
        why = ""
        if pid is None:
            reason = control.protocol()
            if not reason.v3:
                why = f"this node's driver has no MPS v3 ({reason.reason})"
            else:
                refuse_run_in_job(ctx.job_id, gpu, ctx.env.sluid)
                try:
                    pid = self._start_shared(ctx, control, gpu, uuid, paths)
                except NodeFault as exc:  # what NVIDIA documents did not hold: older path
                    why = f"its MPS v3 daemon could not be laid out ({exc})"
        folder = ""
        if pid is not None:
            try:
                folder = shared.open_namespace(
                    control, paths["pipe"], namespace, ctx.env.uid,
                    shared.namespace_argv(namespace, share.thread_percentage, limit, prio))
            except NodeFault as exc:  # deleted again; the claim stays the job's
                why = f"the job's MPS v3 namespace could not be made ({exc})"
        if why:
            ctx.record.resources.remove(entry)
            ctx.save()
            if pid is not None and not shared_clients(ctx.state, gpu, exclude=ctx.job_id):
                self._stop_daemon(control, ctx.journal, DaemonKey(gpu, 0, 100, 0), paths,
                                  f"job {ctx.job_id} fell back to a per-class daemon")
            self._fall_back(ctx, gpu, why)
            return False
        entry.daemon_pid, entry.state = pid, ResourceState.READY
        ctx.journal.append("mps-namespace-opened", job=ctx.job_id, gpu=gpu,
                           namespace=namespace, uid=ctx.env.uid,
                           thread_percentage=share.thread_percentage,
                           memory_limit_mb=limit, priority=prio)
        ctx.set_env("CUDA_MPS_PIPE_DIRECTORY", folder)
        ctx.set_env("CUDA_MPS_CLIENT_PRIORITY", str(prio))
        ctx.set_env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(share.thread_percentage))
        if limit:
            ctx.set_env("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", f"0={limit}M")
        ctx.set_env("CUDA_VISIBLE_DEVICES", "0")
        ctx.save()
        return True

    @staticmethod
    def _intend_namespace(
        ctx: Context, control: MpsControl, paths: Dict[str, str], gpu: int, uuid: str,
        share: MpsShare, limit: int,
    ) -> Resource:
        """The job's namespace in its record and its claim, saved before anything is made."""
        for stale in _mps_entries(ctx.record):  # a prolog killed halfway, run again
            ctx.record.resources.remove(stale)
            with contextlib.suppress(NodeFault):
                shared.close_namespace(control, paths["pipe"],
                                       shared.namespace_of(stale.extra) or "")
        namespace = shared.new_namespace(ctx.job_id)
        prio = int(share.priority_for(ctx.job_class.preemptible if ctx.job_class else False))
        entry = ctx.add_resource(Resource(
            "mps", gpu=gpu, gpu_uuid=uuid, uid=ctx.env.uid,
            pipe_dir=shared.namespace_dir(paths["pipe"], namespace), log_dir=paths["log"],
            thread_percentage=share.thread_percentage, memory_limit_mb=limit,
            extra={"arrangement": shared.ARRANGEMENT, "namespace": namespace,
                   "priority": prio},
        ))
        ctx.claim(client_key(gpu, ctx.job_id))
        ctx.save()
        return entry

    def _start_shared(
        self, ctx: Context, control: MpsControl, gpu: int, uuid: str, paths: Dict[str, str],
    ) -> int:
        """Start ``gpu``'s shared daemon; namespaces of live jobs a dead one held come back."""
        survivors = shared_clients(ctx.state, gpu, exclude=ctx.job_id)
        if survivors or shared.has_leftovers(paths["pipe"]):
            message = (f"the shared MPS daemon of GPU {gpu} had died; restarted it; jobs that "
                       f"were using it: {', '.join(c.job_id for c in survivors) or 'none'}")
            ctx.warn(message)
            for other in survivors:
                _warn_job(ctx.state, other.job_id, message)
            ctx.journal.append("mps-daemon-restarted", job=ctx.job_id, gpu=gpu,
                               pipe_dir=paths["pipe"], clients=[c.job_id for c in survivors])
            control.stop(paths["pipe"], STOP_TIMEOUT_S)
        try:
            pid = shared.start_daemon(control, uuid, paths)
        except OSError as exc:
            raise NodeFault(f"cannot prepare the shared MPS daemon of GPU {gpu}: {exc}") from None
        for other in survivors:
            self._reopen(ctx, control, paths["pipe"], other)
        log.info("job %s: started the shared MPS v3 daemon pid %d on GPU %d", ctx.job_id,
                 pid, gpu)
        ctx.journal.append("mps-daemon-started", job=ctx.job_id, gpu=gpu, pid=pid,
                           arrangement=shared.ARRANGEMENT)
        return pid

    @staticmethod
    def _reopen(ctx: Context, control: MpsControl, pipe_dir: str, client: Client) -> None:
        """A live job's namespace again, with the terms and name its record holds."""
        record = ctx.state.read_job(client.job_id)
        entry = next((r for r in _mps_entries(record) if r.gpu == client.key.gpu), None)
        prio = entry.extra.get("priority") if entry is not None else None
        shared.open_namespace(control, pipe_dir, client.namespace, client.uid,
                              shared.namespace_argv(client.namespace,
                                                    client.key.thread_percentage,
                                                    client.memory_limit_mb,
                                                    prio if prio in (0, 1) else 1))

    @staticmethod
    def _fall_back(ctx: Context, gpu: int, why: str) -> None:
        """The job goes to a per-class daemon, saying why the shared server could not be."""
        message = (f"pool {ctx.pool.name} asks for a shared MPS server, but {why}: "
                   f"GPU {gpu} runs a daemon per class for this job")
        ctx.warn(message)
        ctx.journal.append("mps-arrangement", job=ctx.job_id, gpu=gpu,
                           arrangement="per-class", reason=why)

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
        self, ctx: Context, key: DaemonKey, uuid: str, paths: Dict[str, str],
        sharing: List[Client],
    ) -> int:
        """The pid of ``key``'s daemon, started (limits set, then handed over) if need be."""
        control = self.control_factory(ctx.backend)
        pid = control.running(paths["pipe"])
        if pid is not None:
            return pid
        if has_leftovers(paths["pipe"]):
            users = (", ".join(c.job_id for c in sharing)
                     or "none (stale files, e.g. after a reboot)")
            message = (
                f"the MPS control daemon of GPU {key.gpu} had died (leftovers in "
                f"{paths['pipe']}); restarted it; jobs that were using it: {users}"
            )
            ctx.warn(message)
            for other in sharing:  # their MPS connections died with it
                _warn_job(ctx.state, other.job_id, message)
            ctx.journal.append(
                "mps-daemon-restarted", job=ctx.job_id, gpu=key.gpu, pipe_dir=paths["pipe"],
                clients=[c.job_id for c in sharing],
            )
            control.stop(paths["pipe"], STOP_TIMEOUT_S)  # clears a corpse's files and servers
        refuse_run_in_job(ctx.job_id, key.gpu, ctx.env.sluid)
        try:
            prepare_dirs(paths)
        except OSError as exc:
            raise NodeFault(f"cannot prepare MPS directories for GPU {key.gpu}: {exc}") from None
        pid = control.start(uuid, paths["pipe"], paths["log"])
        try:
            control.set_limits(paths["pipe"], key.thread_percentage, key.memory_limit_mb)
            try:
                hand_over(paths, key.uid)
            except OSError as exc:
                raise NodeFault(
                    f"cannot give the MPS directories of GPU {key.gpu} to uid {key.uid}: {exc}",
                    hint="the prolog must run as root",
                ) from None
        except NodeFault:
            # Fail closed: no job may reach a daemon that does not hold its limits.
            self._stop_daemon(control, ctx.journal, key, paths, "limits not confirmed")
            raise
        log.info("job %s: started MPS control daemon pid %d on GPU %d for uid %d "
                 "(threads %d%%, pinned %s MiB)", ctx.job_id, pid, key.gpu, key.uid,
                 key.thread_percentage, key.memory_limit_mb or "unlimited")
        ctx.journal.append("mps-daemon-started", job=ctx.job_id, gpu=key.gpu, pid=pid,
                           uid=key.uid, thread_percentage=key.thread_percentage,
                           memory_limit_mb=key.memory_limit_mb)
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
            f"{', '.join(map(str, uids))}: MPS does not run different users' work together "
            "(each user has its own daemon and server), so this job's work is time-sliced "
            "with theirs, not concurrent"
        )
        for c in foreign:
            _warn_job(
                ctx.state, c.job_id,
                f"job {ctx.job_id} of uid {ctx.env.uid} joined MPS GPU {gpu}: MPS does not run "
                "different users' work together, so this job's work is time-sliced with it, "
                "not concurrent",
            )
        ctx.journal.append(
            "mps-user-conflict", gpu=gpu, job=ctx.job_id, uid=ctx.env.uid,
            other_jobs=[c.job_id for c in foreign], other_uids=uids,
        )

    # -- teardown -------------------------------------------------------------------------

    def teardown(self, ctx: Context) -> None:
        for entry in _mps_entries(ctx.record):
            if entry.state is ResourceState.RELEASED:
                continue
            key = entry_key(entry, ctx.job_id)
            clean_job_devices(ctx.backend, ctx.job_id, ctx.env.uid, gpus=[key.gpu],
                              sluid=ctx.env.sluid)
            _unregister(ctx.state, key.gpu, ctx.job_id)
            namespace = shared.namespace_of(entry.extra)
            if namespace:
                self._leave_shared(ctx, key, namespace)
            elif not daemon_clients(ctx.state, key, exclude=ctx.job_id):
                self._stop_daemon(
                    self.control_factory(ctx.backend), ctx.journal, key,
                    daemon_paths(ctx.state.state_dir, key), f"last client job {ctx.job_id} ended",
                )
            entry.state = ResourceState.RELEASED
        ctx.release_claims()
        if ctx.state.read_job(ctx.job_id) is not None:  # never resurrect a deleted record
            ctx.save()

    def _leave_shared(self, ctx: Context, key: DaemonKey, namespace: str) -> None:
        """Close the job's namespace; the GPU's shared daemon stops with its last client."""
        control = self.control_factory(ctx.backend)
        paths = shared.shared_paths(ctx.state.state_dir, key.gpu)
        shared.close_namespace(control, paths["pipe"], namespace)
        ctx.journal.append("mps-namespace-closed", job=ctx.job_id, gpu=key.gpu,
                           namespace=namespace)
        if not shared_clients(ctx.state, key.gpu, exclude=ctx.job_id):
            self._stop_daemon(control, ctx.journal, key, paths,
                              f"last client job {ctx.job_id} ended")

    @staticmethod
    def _stop_daemon(
        control: MpsControl, journal: Journal, key: DaemonKey, paths: Dict[str, str],
        reason: str,
    ) -> None:
        """Stop the daemon, prove it is gone (NodeFault if not), remove its directories."""
        pid = control.running(paths["pipe"])
        control.stop(paths["pipe"], STOP_TIMEOUT_S)
        survivor = control.running(paths["pipe"])
        if survivor is not None:
            raise NodeFault(
                f"MPS control daemon pid {survivor} of GPU {key.gpu} survived quit, SIGTERM "
                "and SIGKILL",
                hint="the GPU may be hung; check nvidia-smi and reset it before resuming",
            )
        if pid is not None:
            log.info("stopped MPS control daemon pid %d of GPU %d (%s)", pid, key.gpu, reason)
            journal.append("mps-daemon-stopped", gpu=key.gpu, pid=pid, uid=key.uid,
                           reason=reason)
        remove_tree(paths["base"])
        with contextlib.suppress(OSError):  # the GPU's directory goes with its last daemon
            os.rmdir(os.path.dirname(paths["base"]))

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
            live: List[str] = []
            for job_id in clients.get(gpu, []):
                if _job_live(ctx.state, job_id, ctx.live_jobs):
                    live.append(job_id)
                    continue
                fixes.append(f"drop MPS client registration of job {job_id} on GPU {gpu} "
                             "(no live job record)")
                if not ctx.dry_run:
                    _unregister(ctx.state, gpu, job_id)
            mine = [c for c in live_clients(ctx.state, gpu) if c.job_id in live]
            in_use = {c.key.name for c in mine if not c.namespace}
            fixes += self._reconcile_shared(ctx, control, gpu,
                                            [c.namespace for c in mine if c.namespace])
            fixes += self._reconcile_gpu_dir(ctx, control, gpu, in_use, bool(live))
        if not ctx.dry_run:
            for fix in fixes:
                ctx.journal.append("mps-reconcile", fix=fix)
        return fixes

    def _reconcile_shared(
        self, ctx: ReconcileContext, control: MpsControl, gpu: int, live: List[str],
    ) -> List[str]:
        """Close the namespaces no live job holds; stop a shared daemon nobody uses."""
        paths = shared.shared_paths(ctx.state.state_dir, gpu)
        if not os.path.lexists(paths["base"]):
            return []
        pid = control.running(paths["pipe"])
        if not live:
            fixes = [f"stop the shared MPS daemon of GPU {gpu}"
                     + (f" (pid {pid}, no live client)" if pid else "")
                     + f" and remove {paths['base']}"]
            if not ctx.dry_run:
                self._stop_daemon(control, ctx.journal, DaemonKey(gpu, 0, 100, 0), paths,
                                  "reconcile: no client")
            return fixes
        if pid is None:
            return []  # the next prolog on the GPU restarts it and reopens the live ones
        fixes = []
        for namespace in shared.stale_namespaces(control, paths["pipe"], live):
            fixes.append(f"close MPS namespace {namespace} of GPU {gpu} (no live job)")
            if not ctx.dry_run:
                shared.close_namespace(control, paths["pipe"], namespace)
        return fixes

    def _reconcile_gpu_dir(
        self, ctx: ReconcileContext, control: MpsControl, gpu: int, in_use: Set[str],
        any_live: bool,
    ) -> List[str]:
        """Stop and remove every daemon directory of ``gpu`` that no live job uses."""
        fixes: List[str] = []
        where = gpu_dir(ctx.state.state_dir, gpu)
        try:
            names = sorted(os.listdir(where))
        except FileNotFoundError:
            return fixes
        for name in names:
            path = os.path.join(where, name)
            m = DAEMON_DIR_RE.fullmatch(name)
            if m:
                if name in in_use:
                    continue
                key = DaemonKey(gpu, *map(int, m.groups()))
                paths = daemon_paths(ctx.state.state_dir, key)
            elif name in LEGACY_DIRS and not any_live:
                key = DaemonKey(gpu, -1, 100, 0)
                paths = {"base": path, "pipe": os.path.join(where, "pipe")}
            else:
                continue  # not ours to judge (or a legacy daemon a live job may still use)
            pid = control.running(paths["pipe"])
            if pid is not None:
                fixes.append(f"stop MPS control daemon pid {pid} of GPU {gpu} in {name} "
                             "(no live client)")
                if not ctx.dry_run:  # removes its directory too, when it is a daemon's own
                    self._stop_daemon(control, ctx.journal, key, paths, "reconcile: no client")
            fixes.append(f"remove stale MPS directory {path}")
            if not ctx.dry_run:
                remove_tree(path)
        if not ctx.dry_run:
            with contextlib.suppress(OSError):
                os.rmdir(where)
        return fixes


HANDLER = MpsIsolation()
