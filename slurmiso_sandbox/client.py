"""Jobs on the sandbox cluster: submit, wait, read output and accounting.

Used by the integration tests (tests/integration/conftest.py) and by ``slurmiso sandbox demo``,
so both drive the cluster the same way. Slurm clients run with the sandbox's ``SLURM_CONF``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Set, Tuple

from slurmiso.errors import SandboxError
from slurmiso.state.lock import FileLock, LockTimeout

#: This checkout (the hooks the sandbox wires run from it; ``slurmiso()`` runs it).
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_DIR = os.environ.get("SLURMISO_SANDBOX_DIR", "/var/lib/slurmiso-sandbox")

#: States after which a job will not change by itself (PENDING after requeue is not one).
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


def hostlist_ints(text: str) -> List[int]:
    """``0``, ``0-1``, ``0,2-3`` -> the indices."""
    out: List[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


#: ``scontrol show job`` keys whose value is the submitter's text, alone on their line
_USER_TEXT = frozenset({"Command", "WorkDir", "Comment", "AdminComment", "SystemComment",
                        "StdErr", "StdIn", "StdOut", "MailUser", "Container", "Reservation"})


class SandboxClient:
    """The running sandbox: its paths, the environment for Slurm clients, job helpers."""

    def __init__(self, root: str, jobs_dir: str) -> None:
        self.root = root
        self.slurm_conf = os.path.join(root, "etc", "slurm.conf")
        self.slurmiso_config = os.path.join(root, "etc", "slurmiso.yaml")
        self.jobs_dir = jobs_dir
        self.env = dict(os.environ, SLURM_CONF=self.slurm_conf,
                        SLURMISO_CONFIG=self.slurmiso_config)
        bin_dir = os.path.join(root, "slurm-bin")
        if os.path.isdir(bin_dir):
            # A sandbox of another Slurm release: its clients (and runuser) enter its root.
            self.env["SLURMISO_SLURM_BIN"] = bin_dir
            self.env["PATH"] = bin_dir + os.pathsep + self.env.get("PATH", "/usr/bin:/bin")

    @property
    def in_root(self) -> bool:
        """Whether this sandbox runs another Slurm release from a Debian root."""
        return "SLURMISO_SLURM_BIN" in self.env and self.env["SLURMISO_SLURM_BIN"].startswith(
            self.root)

    @property
    def job_python(self) -> str:
        """A Python a job script can run slurmiso with: the root's own in a root sandbox
        (this interpreter is not there), else this one."""
        return "/usr/bin/python3" if self.in_root else sys.executable

    @property
    def job_pythonpath(self) -> str:
        """Where a job finds this checkout's slurmiso: the copy
        ``sandbox up`` made under ``<dir>/lib/py`` in a root sandbox, else the checkout."""
        return os.path.join(self.root, "lib", "py") if self.in_root else REPO

    @property
    def hooks(self) -> bool:
        """Whether slurmiso's Prolog/Epilog/TaskProlog are wired (they change job envs)."""
        try:
            return "\nProlog=" in Path(self.slurm_conf).read_text()
        except OSError:
            return False

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def cgroup_version(self) -> int:
        """1 or 2: the cgroup plugin the sandbox's slurmds run (``sandbox up --cgroup``)."""
        try:
            data = json.loads(Path(self.root, "run", "sandbox.json").read_text())
        except (OSError, ValueError):
            data = {}
        recorded = data.get("cgroup") if isinstance(data, dict) else None
        if recorded in ("v1", "v2"):
            return int(recorded[1])
        return 1 if os.path.isdir("/sys/fs/cgroup/devices") else 2

    def node_slurmiso(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        """``slurmiso ARGS`` as a node of this sandbox runs it (its hooks do): in the cgroup v2
        namespace where there is one, in the Slurm root with the root's Python on the copy
        ``up`` made, and with the hybrid-host shim the slurmds have (hybrid_shim.c), so
        /sys/fs/cgroup and /proc/self/cgroup read as on a pure cgroup v2 node."""
        from slurmiso_sandbox.sites import make_site

        site = make_site(self.root)
        env = [f"SLURM_CONF={self.slurm_conf}", f"SLURMISO_CONFIG={self.slurmiso_config}",
               f"PYTHONPATH={self.job_pythonpath}"]
        if site.hybrid_shim:
            env.append(f"LD_PRELOAD={site.hybrid_shim}")
        argv = site.exe("/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin", *env,
                        self.job_python, "-m", "slurmiso", *args)
        return subprocess.run(self.ns_argv(*argv), text=True, capture_output=True,
                              timeout=timeout)

    def ns_argv(self, *argv: str) -> List[str]:
        """``argv`` as it must run to see what the daemons see at /sys/fs/cgroup: in the cgroup
        v2 sandbox's mount namespace where it has one (a hybrid host), else as it is."""
        from slurmiso_sandbox.procs import process_matches, read_pid

        pid = read_pid(self.path("run", "cgroup-ns.pid"))
        if self.cgroup_version == 2 and pid and process_matches(
                pid, ("sleep",), (f"slurmiso-cgroup-ns {self.root}",)):
            return ["/usr/bin/nsenter", f"--mount=/proc/{pid}/ns/mnt", "--", *argv]
        return list(argv)

    def slurmiso(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        """Run ``python -m slurmiso ARGS`` from this checkout."""
        env = dict(self.env, PYTHONPATH=REPO)
        return subprocess.run([sys.executable, "-m", "slurmiso", *args], env=env, text=True,
                              capture_output=True, timeout=timeout, cwd=REPO)

    def cmd(self, *argv: str, user: str = "", check: bool = True, timeout: float = 30) -> str:
        """Run a Slurm client with the sandbox's SLURM_CONF (as ``user`` if given)."""
        full = (["runuser", "-u", user, "--", "env", f"SLURM_CONF={self.slurm_conf}"]
                if user else []) + list(argv)
        cp = subprocess.run(full, env=self.env, text=True, capture_output=True, timeout=timeout,
                            cwd=self.jobs_dir)
        if check and cp.returncode != 0:
            raise SandboxError(f"{' '.join(full)} failed ({cp.returncode}): "
                                 f"{cp.stderr or cp.stdout}")
        return cp.stdout

    def submit(self, script_text: str, *sbatch_args: str, user: str = "") -> str:
        """sbatch a script (written where the job can read it); returns the job id."""
        fd, script = tempfile.mkstemp(prefix="job-", suffix=".sh", dir=self.jobs_dir)
        with os.fdopen(fd, "w") as fh:
            fh.write(script_text if script_text.startswith("#!") else "#!/bin/bash\n"
                     + script_text)
        os.chmod(script, 0o755)
        out = self.cmd("sbatch", "--parsable", f"--chdir={self.jobs_dir}",
                       f"--output={self.jobs_dir}/job-%j.out", *sbatch_args, script, user=user)
        return out.strip().split(";")[0]

    def job_state(self, job_id: str) -> str:
        """State as slurmctld sees it now, or from accounting once the job has aged out."""
        fields = self.job_fields(job_id)
        if fields:
            return fields.get("JobState", "UNKNOWN")
        out = self.cmd("sacct", "-X", "-n", "-P", "-j", job_id, "-o", "State", check=False)
        lines = [ln.split()[0] for ln in out.splitlines() if ln.strip()]
        return lines[-1] if lines else "UNKNOWN"

    def job_fields(self, job_id: str) -> Dict[str, str]:
        """``scontrol show job`` as a dict (empty when slurmctld forgot the job).

        Read line by line, not from ``-o``: the job's name, command, paths and comment are
        text its submitter chose, printed unquoted (a job named ``x JobState=RUNNING`` once
        read as running). Slurm prints each of them last on its line (the name) or alone on
        its own line, so each takes the rest of its line; the tests' own jobs use such names.
        """
        out = self.cmd("scontrol", "show", "job", job_id, check=False)
        fields: Dict[str, str] = {}
        for line in out.splitlines():
            text = line.strip()
            key, sep, value = text.partition("=")
            if sep and key in _USER_TEXT:
                fields.setdefault(key, value)
                continue
            text, named, name = text.partition(" JobName=")
            if named:
                fields.setdefault("JobName", name)
            for tok in text.split():
                key, sep, value = tok.partition("=")
                if sep and key not in fields:
                    fields[key] = value
        return fields

    def slurm_version(self) -> Optional[Tuple[int, int, int]]:
        """The sandbox's Slurm release (``scontrol --version`` with its SLURM_CONF)."""
        from slurmiso.slurm.client import parse_version

        return parse_version(self.cmd("scontrol", "--version", check=False))

    def alloc_tres(self, job_id: str) -> str:
        """The job's allocated TRES as ``scontrol show job`` names it: ``TRES=`` on 22.05,
        ``AllocTRES=`` (beside ``ReqTRES=``) from 24.11 on (measured)."""
        fields = self.job_fields(job_id)
        return fields.get("AllocTRES", fields.get("TRES", ""))

    def gres_per_gpu(self, job_id: str, name: str) -> Dict[int, int]:
        """GPU index -> count of GRES ``name`` the job holds, from ``scontrol show job -d``:
        ``GRES=shard:3(IDX:0)`` on 22.05, ``GRES=shard:3(3/7,0/7)`` (taken/total per GPU)
        from 24.11 on (measured)."""
        detail = self.cmd("scontrol", "show", "job", "-d", job_id)
        m = re.search(rf"\bGRES={re.escape(name)}:(\d+)\(([^)]*)\)", detail)
        if not m:
            raise SandboxError(f"no GRES={name} in 'scontrol show job -d {job_id}':\n{detail}")
        count, inner = int(m.group(1)), m.group(2)
        if inner.startswith("IDX:"):
            return {int(i): count for i in hostlist_ints(inner[4:])}
        taken = [int(part.split("/")[0]) for part in inner.split(",")]
        return {i: n for i, n in enumerate(taken) if n}

    def wait_for(self, job_id: str, states: Iterable[str] = ("COMPLETED",),
                 timeout: float = 60) -> str:
        """Wait until the job is in one of ``states``; fail early on another final state."""
        want: Set[str] = set(states)
        deadline = time.monotonic() + timeout
        state = "UNKNOWN"
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in want:
                return state
            if state in TERMINAL or self._held_by_failure(job_id):
                break
            time.sleep(0.25)
        raise SandboxError(
            f"job {job_id} is {state}, wanted {sorted(want)} (within {timeout:g}s)\n"
            f"{self.cmd('scontrol', 'show', 'job', job_id, check=False)}\n"
            f"nodes down/drained:\n{self.cmd('sinfo', '-R', check=False)}\n"
            f"output:\n{self.job_output(job_id)}")

    def _held_by_failure(self, job_id: str) -> bool:
        """A failed Prolog requeues the job held and drains the node: it will never run."""
        reason = self.job_fields(job_id).get("Reason", "")
        return reason in ("launch_failed_requeued_held", "JobHeldAdmin")

    def job_output(self, job_id: str) -> str:
        try:
            return Path(self.jobs_dir, f"job-{job_id}.out").read_text()
        except OSError:
            return ""

    def sacct(self, job_id: str, fields: str = "JobID,State,AllocTRES,NodeList",
              duplicates: bool = True) -> List[Dict[str, str]]:
        """Accounting records of a job (``-D``: one per requeued attempt too).

        slurmdbd receives records asynchronously, so an empty answer is retried briefly.
        """
        args = ["sacct", "-X", "-n", "-P", "-j", job_id, "-o", fields]
        names = fields.split(",")
        deadline = time.monotonic() + 10
        while True:
            out = self.cmd(*(args + (["-D"] if duplicates else [])))
            rows = [dict(zip(names, ln.split("|"))) for ln in out.splitlines() if ln.strip()]
            if rows or time.monotonic() > deadline:
                return rows
            time.sleep(0.5)

    def node_states(self) -> Dict[str, str]:
        out = self.cmd("sinfo", "-h", "-N", "-o", "%N %T")
        return dict(ln.split() for ln in out.splitlines() if ln.strip())

    def wait_idle(self, timeout: float = 30) -> Dict[str, str]:
        """Node states once all are idle (completing jobs of earlier tests may linger)."""
        deadline = time.monotonic() + timeout
        states = self.node_states()
        while any(s != "idle" for s in states.values()) and time.monotonic() < deadline:
            time.sleep(0.25)
            states = self.node_states()
        return states

    def idle_gpus(self) -> None:
        """Forget the simulated load and GPU processes of every node: with the queue empty no
        job holds any, and what a crashed or earlier run injected (a state file carried on a
        machine image) must not make a GPU look busy to the next session."""
        import glob

        from slurmiso.gpu.sim import SimBackend

        for state in sorted(glob.glob(self.path("sim", "*.json"))):
            SimBackend(state).clear_load()

    def clear_queue(self, timeout: float = 60) -> None:
        """Cancel every job and wait until none is left (epilogs included)."""
        deadline = time.monotonic() + timeout
        last_cancel = 0.0
        while True:
            ids = self.cmd("squeue", "-h", "-o", "%i", check=False).split()
            if not ids:
                return
            if time.monotonic() > deadline:
                raise SandboxError("jobs left in the queue after scancel:\n"
                                     + self.cmd("squeue", check=False))
            if time.monotonic() - last_cancel > 2:  # again: a job may requeue itself
                self.cmd("scancel", *ids, check=False)
                last_cancel = time.monotonic()
            time.sleep(0.25)


@contextmanager
def session_lock(root: str = DEFAULT_DIR, timeout: float = 1200) -> Iterator[None]:
    """One session (a test run, the demo) per sandbox at a time: each empties the queue."""
    path = root.rstrip("/") + ".tests.lock"
    lock = FileLock(path, timeout=timeout)
    try:
        lock.acquire()
    except LockTimeout:
        with open(path) as fh:
            holder = fh.read().strip() or "unknown"
        raise SandboxError(f"another sandbox session holds {path} ({holder})",
                           hint="wait for it (tests, demo) or stop it") from None
    try:
        with open(path, "w") as fh:  # who holds it, for the message above
            fh.write(f"pid {os.getpid()}\n")
        yield
    finally:
        lock.release()
