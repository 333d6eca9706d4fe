"""Node-local state: one JSON record per job, the node's allocation table, one node lock.

The prolog and epilog run as root on every job start and end, possibly several at once and
possibly killed halfway. This module is what lets them be idempotent and never hand out
the same GPU slice twice:

* ``with state.locked():`` serialises every read-modify-write on the node (a ``flock`` on
  ``node.lock``, so a killed holder releases it with its last file descriptor);
* every write is atomic and durable (temp file in the same directory, fsync, ``os.replace``,
  fsync of the directory), so a reader sees either the old or the new version, never half;
* a job id becomes a file name only after it is validated, and as root the state directory
  must be a real, root-owned directory that nobody else can write, because root must not
  follow paths a user controls.

Layout::

    state_dir/node.lock          the node lock
    state_dir/allocations.json   {"schema": 1, "allocations": {resource-key: job id}}
    state_dir/jobs/<jobid>.json  one record per job (:class:`~slurmiso.state.record.JobRecord`,
                                 "schema": 2; schema 1 files are migrated as they are read)

Temp files (``.<name>.<pid>.<token>.tmp``) left by a killed writer are ignored by readers
and removed by :meth:`NodeState.ensure` / :meth:`NodeState.cleanup_temp`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import stat
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Union

from slurmiso.atomic import fsync_dir, write_atomic
from slurmiso.errors import StateError
from slurmiso.pids import pid_alive
from slurmiso.state.record import JobRecord, RecordError

if TYPE_CHECKING:  # the lock module is imported lazily: hooks that only read state skip it
    from slurmiso.state.lock import FileLock

log = logging.getLogger(__name__)

#: Schema of the allocation table and node documents (job records: state.record.SCHEMA).
SCHEMA = 1
DIR_MODE = 0o755
FILE_MODE = 0o644

#: Slurm job ids as they reach the hooks: ``1234`` or an array task ``1234_7``. ASCII only
#: (``\d`` would accept other scripts' digits) and bounded, so it is always a safe file name.
_JOB_ID_RE = re.compile(r"[0-9]{1,20}(?:_[0-9]{1,10})?")
#: ``.<target name>.<writer pid>.<random token>.tmp``
_TEMP_RE = re.compile(r"\.(?P<target>.+)\.(?P<pid>[0-9]+)\.[0-9a-f]+\.tmp")
#: A temp file this old is a leftover even if its pid was reused by another process.
_TEMP_MAX_AGE_S = 3600.0

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)

JobId = Union[str, int]

#: ``write_hook("before" | "after", path)`` around every write and removal of a state file.
#: None on real nodes; only the simulated GPU backend sets it, for its deterministic kill
#: points (``SLURMISO_SIM_KILL_AT=before:write:N``, see :mod:`slurmiso.gpu.sim`).
write_hook: Optional[Callable[[str, str], None]] = None


def _is_root() -> bool:
    """Whether the strict ownership rules apply (a seam so tests can pretend to be root)."""
    return os.geteuid() == 0


def validate_job_id(job_id: JobId) -> str:
    """Return ``job_id`` as a string if it is a Slurm job id; otherwise raise StateError.

    This is the path-injection guard: ``../etc/passwd`` or ``1;rm`` never become file names.
    """
    if isinstance(job_id, int) and not isinstance(job_id, bool):
        job_id = str(job_id)
    if not isinstance(job_id, str) or not _JOB_ID_RE.fullmatch(job_id):
        raise StateError(
            f"refusing job id {job_id!r}: not a Slurm job id",
            hint="expected digits with an optional _N array suffix, e.g. 1234 or 1234_7",
        )
    return job_id


def _lock_holders(path: str) -> List[int]:
    """Pids holding a lock on ``path`` according to ``/proc/locks`` (Linux); [] if unknown."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as fh:
            lines = fh.readlines()
    except OSError:
        return []
    exact: List[int] = []
    by_inode: List[int] = []
    for line in lines:
        parts = line.split()
        # "1: FLOCK  ADVISORY  WRITE 9413 fe:00:2146570 0 EOF"; waiters have "->" after "1:"
        if len(parts) < 6 or parts[1] == "->":
            continue
        try:
            pid = int(parts[4])
            major, minor, inode = parts[5].split(":")
            dev = (int(major, 16), int(minor, 16))
            ino = int(inode)
        except ValueError:
            continue
        if ino != st.st_ino or pid <= 0:
            continue
        by_inode.append(pid)
        if dev == (os.major(st.st_dev), os.minor(st.st_dev)):
            exact.append(pid)
    # Overlay filesystems report another device number; an inode-only match is still useful.
    return sorted(set(exact or by_inode))


def _describe_pid(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return f"pid {pid}"
    return f"pid {pid} ({cmd[:120]})" if cmd else f"pid {pid}"


class NodeState:
    """The node-local state directory. Building one does no I/O (hooks build it per job)."""

    def __init__(self, state_dir: str, lock_timeout: float = 30.0) -> None:
        self.state_dir = os.path.abspath(os.fspath(state_dir))
        self.lock_timeout = lock_timeout
        self.jobs_dir = os.path.join(self.state_dir, "jobs")
        self.allocations_path = os.path.join(self.state_dir, "allocations.json")
        self.lock_path = os.path.join(self.state_dir, "node.lock")
        self._lock: Optional[FileLock] = None
        #: ``time.monotonic()`` by which every lock wait must end (None: lock_timeout only).
        self.deadline: Optional[float] = None
        self._ensured = False  # ensure() ran: dirs exist and passed the checks
        self._checked = False  # the checks passed (reads do not create dirs)

    def __repr__(self) -> str:
        return f"NodeState({self.state_dir!r})"

    # -- directory ------------------------------------------------------------------------

    def ensure(self) -> None:
        """Create the directories (mode 0o755) and check they are safe for root to use.

        As root, refuses (StateError) a state dir or jobs dir that is a symlink, not owned
        by root, or writable by group/other, and an ancestor a non-root user could swap;
        ancestors are checked first so root never creates anything through such a path.
        Also removes temp files left by killed writers.
        """
        root = _is_root()
        missing: List[str] = []
        existing = os.path.dirname(os.path.abspath(self.state_dir))
        while not os.path.lexists(existing):  # e.g. state_dir /var/lib/x/state/%n
            missing.insert(0, existing)
            existing = os.path.dirname(existing)
        if root:
            self._check_ancestors(existing)
        for path in (*missing, self.state_dir, self.jobs_dir):
            self._make_dir(path)
            if root:
                self._check_owned_dir(path)
        self._ensured = self._checked = True
        self.cleanup_temp()

    def _ensure_once(self) -> None:
        if not self._ensured:
            self.ensure()

    def _verify_once(self) -> None:
        """Before root reads or deletes, run ensure()'s checks without creating anything.

        Reads must work where the state dir does not exist yet (nothing to check then) and
        for non-root admins who cannot create it.
        """
        if self._checked or not _is_root() or not os.path.lexists(self.state_dir):
            return
        self._check_ancestors(os.path.dirname(self.state_dir))
        for path in (self.state_dir, self.jobs_dir):
            if os.path.lexists(path):
                self._check_owned_dir(path)
        self._checked = True

    def _make_dir(self, path: str) -> None:
        try:
            os.mkdir(path, DIR_MODE)
        except FileExistsError:
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                raise StateError(
                    f"state directory {path} is a symlink; refusing to follow it",
                    hint="point state_dir at a real root-owned directory",
                ) from None
            if not stat.S_ISDIR(st.st_mode):
                raise StateError(f"state path {path} exists and is not a directory") from None
            return
        except FileNotFoundError:
            raise StateError(
                f"cannot create state directory {path}: its parent does not exist",
                hint="create the parent directory or fix state_dir in the config",
            ) from None
        except OSError as exc:
            raise StateError(f"cannot create state directory {path}: {exc.strerror}") from None
        # mkdir's mode is cut by the umask (slurmd's may be 077): set the documented mode.
        os.chmod(path, DIR_MODE)
        log.info("created state directory %s", path)

    @staticmethod
    def _check_owned_dir(path: str) -> None:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise StateError(
                f"state directory {path} is a symlink; refusing to follow it as root",
                hint="point state_dir at a real root-owned directory",
            )
        if not stat.S_ISDIR(st.st_mode):
            raise StateError(f"state path {path} is not a directory")
        if st.st_uid != 0:
            raise StateError(
                f"state directory {path} is owned by uid {st.st_uid}, not root",
                hint=f"chown root:root {path}",
            )
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise StateError(
                f"state directory {path} is writable by group or others "
                f"(mode {stat.S_IMODE(st.st_mode):o})",
                hint=f"chmod 755 {path}",
            )

    @staticmethod
    def _check_ancestors(parent: str) -> None:
        """A user who can rename an ancestor can redirect root's writes; refuse that."""
        path = os.path.realpath(parent)
        while True:
            st = os.stat(path)
            writable = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            if st.st_uid != 0 or (writable and not st.st_mode & stat.S_ISVTX):
                raise StateError(
                    f"state directory parent {path} can be modified by non-root users "
                    f"(uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):o})",
                    hint="put state_dir under a root-owned path such as /var/lib/slurmiso",
                )
            if path == os.path.dirname(path):
                return
            path = os.path.dirname(path)

    def cleanup_temp(self) -> int:
        """Remove temp files whose writer is gone; return how many were removed.

        A temp file of a live writer is kept (it is about to be renamed into place).
        """
        removed = 0
        now = time.time()
        for directory in (self.state_dir, self.jobs_dir):
            try:
                names = os.listdir(directory)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StateError(f"cannot list state directory {directory}: {exc}") from None
            for name in names:
                m = _TEMP_RE.fullmatch(name)
                if not m:
                    continue
                path = os.path.join(directory, name)
                try:
                    age = now - os.lstat(path).st_mtime
                except FileNotFoundError:
                    continue
                if pid_alive(int(m.group("pid"))) and age < _TEMP_MAX_AGE_S:
                    continue
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    removed += 1
                    log.info("removed leftover temp file %s", path)
        return removed

    # -- lock -----------------------------------------------------------------------------

    def _wait_s(self) -> float:
        """How long the next lock wait may take: ``lock_timeout``, cut to the deadline."""
        if self.deadline is None:
            return self.lock_timeout
        return max(0.0, min(self.lock_timeout, self.deadline - time.monotonic()))

    def _acquire(self, depth: int = 0) -> None:
        """Take the node lock (one level deeper), or back at ``depth`` after :meth:`unlocked`."""
        from slurmiso.state.lock import FileLock, LockTimeout

        if self._lock is None:
            self._lock = FileLock(self.lock_path, timeout=self.lock_timeout)
        wait = self._wait_s()
        try:
            if depth:
                self._lock.resume(depth, timeout=wait)
            else:
                self._lock.acquire(timeout=wait)
        except LockTimeout:
            holders = _lock_holders(self.lock_path)
            who = ", ".join(_describe_pid(p) for p in holders) if holders else "an unknown process"
            raise StateError(
                f"timed out after {wait:g}s waiting for node lock "
                f"{self.lock_path}, held by {who}",
                hint="another slurmiso prolog/epilog is running or hung; "
                "check it with ps and kill it if it is stuck",
            ) from None
        except OSError as exc:
            raise StateError(f"cannot take node lock {self.lock_path}: {exc}") from None

    @contextlib.contextmanager
    def locked(self) -> Iterator[NodeState]:
        """Hold the node lock; reentrant on the same NodeState.

        A timeout raises StateError naming the lock file and, where ``/proc/locks`` tells,
        the holder, so the admin can see which hook is hung. The wait is ``lock_timeout``,
        cut to ``deadline`` (the hooks set it from Slurm's PrologEpilogTimeout).
        """
        self._ensure_once()
        self._acquire()
        try:
            yield self
        finally:
            assert self._lock is not None
            self._lock.release()

    @contextlib.contextmanager
    def unlocked(self) -> Iterator[None]:
        """Let go of the node lock for a slow driver call, then take it back.

        The node lock guards state transactions, never a GPU driver call: a MIG instance can
        take a second to create, and 32 prologs queued behind each other's driver calls
        would time out. Callers record their intent (a ``pending`` resource naming the spot)
        before they let go, so other hooks and ``reconcile`` leave that spot alone.
        """
        lock = self._lock
        depth = lock.suspend() if lock is not None else 0
        if depth == 0:
            yield
            return
        try:
            yield
        finally:
            self._acquire(depth)

    # -- jobs -----------------------------------------------------------------------------

    def job_path(self, job_id: JobId) -> str:
        return os.path.join(self.jobs_dir, validate_job_id(job_id) + ".json")

    def read_job(self, job_id: JobId) -> Optional[JobRecord]:
        """The job's record, or None if this node has none.

        StateError naming the file if it is corrupt or of a schema this code does not read;
        an older schema is migrated (the file itself is rewritten at the next save).
        """
        self._verify_once()
        path = self.job_path(job_id)
        data = self._read_json(path)
        return None if data is None else self._record(data, path)

    def _record(self, data: Any, path: str) -> JobRecord:
        try:
            return JobRecord.from_dict(data)
        except RecordError as exc:
            raise self._corrupt(path, str(exc)) from None

    def write_job(self, job_id: JobId, record: JobRecord) -> None:
        """Atomically replace the job's record (written in the current schema).

        What is written must read back: a record the epilog could not read would leave
        whatever it names behind and drain every later prolog, so the reader's own checks run
        here first and refuse the write (StateError), before anything it names exists.
        """
        path = self.job_path(job_id)
        data = record.to_dict()
        try:
            JobRecord.from_dict(data)
        except RecordError as exc:
            raise StateError(f"refusing to write job {job_id}'s record, it would not read back: "
                             f"{exc}", hint="this is a bug in slurmiso; please report it"
                             ) from None
        self._ensure_once()
        self._write_json(path, data)

    def delete_job(self, job_id: JobId) -> None:
        """Remove the job's record; a missing record is fine (epilogs may run twice)."""
        path = self.job_path(job_id)
        self._verify_once()
        hook = write_hook
        if hook is not None:
            hook("before", path)
        try:
            self._unlink(path)
        finally:
            if hook is not None:
                hook("after", path)

    def _unlink(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StateError(f"cannot remove state file {path}: {exc.strerror}") from None
        self._fsync_dir_or_raise(self.jobs_dir)

    def jobs(self) -> Dict[str, JobRecord]:
        """Every job record on this node, by job id; temp and foreign files are ignored."""
        self._verify_once()
        try:
            names = sorted(os.listdir(self.jobs_dir))
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise StateError(f"cannot list state directory {self.jobs_dir}: {exc}") from None
        out: Dict[str, JobRecord] = {}
        for name in names:
            stem, ext = os.path.splitext(name)
            if ext != ".json" or not _JOB_ID_RE.fullmatch(stem):
                if not _TEMP_RE.fullmatch(name):
                    log.debug("ignoring unexpected file %s in %s", name, self.jobs_dir)
                continue
            path = os.path.join(self.jobs_dir, name)
            data = self._read_json(path)
            if data is not None:  # deleted between listdir and open
                out[stem] = self._record(data, path)
        return out

    # -- allocations ----------------------------------------------------------------------

    def allocations(self) -> Dict[str, str]:
        """What is handed out on this node: resource key (``mig/0/gi3``) -> job id."""
        self._verify_once()
        data = self._read_json(self.allocations_path)
        if data is None:
            return {}
        table = self._expect_dict(data, self.allocations_path).get("allocations")
        if not isinstance(table, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in table.items()
        ):
            raise self._corrupt(self.allocations_path, "'allocations' is not a str->str map")
        return dict(table)

    def set_allocations(self, mapping: Mapping[str, JobId]) -> None:
        """Atomically replace the allocation table (call it under :meth:`locked`)."""
        table: Dict[str, str] = {}
        for key, job_id in mapping.items():
            if not isinstance(key, str) or not key:
                raise StateError(f"refusing allocation key {key!r}: must be a non-empty string")
            table[key] = validate_job_id(job_id)
        self._ensure_once()
        self._write_json(self.allocations_path, {"schema": SCHEMA, "allocations": table})

    # -- node documents -------------------------------------------------------------------

    def doc_path(self, name: str) -> str:
        if not re.fullmatch(r"[a-z][a-z0-9-]{0,63}", name):
            raise StateError(f"refusing node document name {name!r}")
        return os.path.join(self.state_dir, name + ".json")

    def read_doc(self, name: str) -> Optional[Dict[str, Any]]:
        """A named node-level JSON document (e.g. ``mig-gres``), or None if never written."""
        self._verify_once()
        path = self.doc_path(name)
        data = self._read_json(path)
        return None if data is None else self._expect_dict(data, path)

    def write_doc(self, name: str, data: Mapping[str, Any]) -> str:
        """Atomically replace a named node document; returns its path."""
        path = self.doc_path(name)
        doc = dict(data)
        doc.setdefault("schema", SCHEMA)
        self._ensure_once()
        self._write_json(path, doc)
        return path

    # -- file primitives ------------------------------------------------------------------

    def _read_json(self, path: str) -> Any:
        """Parsed content of ``path``, None if missing; never follows a symlink."""
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW | _CLOEXEC)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise StateError(
                    f"state file {path} is a symlink; refusing to follow it",
                    hint=f"remove {path}; state files are only written by slurmiso",
                ) from None
            raise StateError(f"cannot read state file {path}: {exc.strerror}") from None
        try:
            with os.fdopen(fd, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise StateError(f"cannot read state file {path}: {exc.strerror}") from None
        try:
            return json.loads(raw)
        except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError
            raise self._corrupt(path, f"not valid JSON: {exc}") from None

    @staticmethod
    def _corrupt(path: str, why: str) -> StateError:
        return StateError(
            f"state file {path} is corrupt ({why})",
            hint=f"slurmiso writes it atomically, so suspect a disk error; inspect it, then "
            f"move it aside (mv {path} {path}.bad) and check the GPUs it described by hand",
        )

    def _expect_dict(self, data: Any, path: str) -> Dict[str, Any]:
        if not isinstance(data, dict):
            raise self._corrupt(path, f"expected a JSON object, found {type(data).__name__}")
        return data

    def _write_json(self, path: str, data: Mapping[str, Any]) -> None:
        """Write ``data`` so a reader, or the next boot, sees the old file or the new one."""
        payload = json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n"
        hook = write_hook
        if hook is not None:
            hook("before", path)
        try:
            # FILE_MODE exactly: the umask must not make state unreadable to admins
            write_atomic(path, payload, FILE_MODE)
        except OSError as exc:
            raise StateError(
                f"cannot write state file {path}: {exc.strerror or exc}",
                hint="check free space and health of the filesystem holding the state dir",
            ) from None
        finally:
            if hook is not None:
                hook("after", path)

    @staticmethod
    def _fsync_dir_or_raise(directory: str) -> None:
        try:
            fsync_dir(directory)
        except OSError as exc:
            raise StateError(f"cannot sync state directory {directory}: {exc.strerror}") from None
