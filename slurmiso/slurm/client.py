"""The Slurm CLI as slurmiso uses it: absolute paths, bounded time, errors translated once.

Commands are looked up in ``$SLURMISO_SLURM_BIN``, then ``$PATH`` (module and Bright-style
installs put Slurm under /cm/shared/... or /opt/slurm/<version>/bin and add it to PATH), then
fixed directories, because hooks run with no PATH. Every call has a
timeout: a hung slurmctld must not hang a prolog forever. ``CalledProcessError``/``OSError``
become :class:`~slurmiso.errors.SlurmError` here and nowhere else.
"""

from __future__ import annotations

import logging
import os
import subprocess
from typing import TYPE_CHECKING, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from slurmiso.errors import SlurmError, SlurmUnavailable

if TYPE_CHECKING:
    from slurmiso.slurm.rows import RowCounts

log = logging.getLogger(__name__)

BIN_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin")
#: What Slurm's commands print when slurmctld or slurmdbd cannot be reached (the audit's
#: streamed sacct query reads it too)
UNREACHABLE = (
    "Unable to contact slurm controller",
    "Socket timed out",
    "Connection refused",
    "slurm_load_jobs error: Unable",
    "Zero Bytes were transmitted",
    "Problem talking to the database",
)
_UNREACHABLE_HINT = {
    "": "is slurmctld running and reachable? (scontrol ping)",
    "sacctmgr": "is slurmdbd running and reachable? (sacctmgr show cluster)",
}


def search_dirs(env: Optional[Mapping[str, str]] = None) -> List[str]:
    """Where Slurm commands are looked for, in order, each once.

    Only absolute ``PATH`` entries count: an empty or relative entry would run a ``scontrol``
    from whatever directory a root hook happens to be in.
    """
    env = os.environ if env is None else env
    dirs: List[str] = []
    for var in ("SLURMISO_SLURM_BIN", "PATH"):
        dirs += [d for d in env.get(var, "").split(":") if d.startswith("/")]
    dirs += list(BIN_DIRS)
    return list(dict.fromkeys(dirs))


def find_command(name: str, env: Optional[Mapping[str, str]] = None) -> str:
    """Absolute path of a Slurm command (see :func:`search_dirs`)."""
    dirs = search_dirs(env)
    for d in dirs:
        path = os.path.join(d, name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise SlurmUnavailable(
        f"{name} not found in {', '.join(dirs)}",
        hint="install Slurm's client commands, add their directory to PATH, "
        "or set SLURMISO_SLURM_BIN",
    )


def parse_version(text: str) -> Optional[Tuple[int, int, int]]:
    """``slurm 22.05.8`` / ``slurm-wlm 24.11.5`` / ``22.05.8-4+deb12u3`` -> (22, 5, 8)."""
    for word in text.replace("-", " ").split():
        parts = word.split(".")
        if len(parts) >= 2 and all(p.isdigit() for p in parts[:3]):
            nums = [int(p) for p in parts[:3]] + [0]
            return nums[0], nums[1], nums[2]
    return None


def parse_show_config(text: str) -> Dict[str, str]:
    """``scontrol show config`` text as key -> value.

    From 24.11 on (measured on 24.11.5 and 26.05.5) list-valued keys print indexed:
    ``Prolog[0] = /path``, ``Epilog[0] = ...`` (22.05.8 prints ``Prolog = /path``). The indexed
    keys are kept, and the plain key gets the first (index 0), so readers of ``Prolog`` work
    on every release.
    """
    out: Dict[str, str] = {}
    indexed: Dict[str, List[Tuple[int, str]]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or " " in key:
            continue
        out[key] = value
        base, bracket, rest = key.partition("[")
        if bracket and rest.endswith("]") and rest[:-1].isdigit():
            indexed.setdefault(base, []).append((int(rest[:-1]), value))
    for base, items in indexed.items():
        out.setdefault(base, sorted(items)[0][1])
    return out


def parse_kv_line(line: str) -> Dict[str, str]:
    """``scontrol show ... -o`` output: ``Key=Value Key2=Value two`` (values may hold spaces;
    a ``Key=`` token starts a field, the first time that key appears:
    :func:`slurmiso.slurm.rows.split_kv_line`)."""
    from slurmiso.slurm.rows import split_kv_line

    return split_kv_line(line)


#: ``squeue -O`` fields :meth:`SlurmCli.job_fields` may ask for: values Slurm makes itself,
#: never blank and never with spaces (names an admin defines, states, counts, times).
JOB_FIELDS = frozenset({"JobID", "State", "QOS", "Partition", "Account", "StartTime",
                        "PreemptTime", "RestartCnt", "Requeue"})
_FIELD_WIDTH = 64


class SlurmCli:
    """Thin runner of Slurm commands."""

    def __init__(self, timeout: float = 10.0) -> None:
        self.timeout = timeout

    def run(self, cmd: str, args: Sequence[str], timeout: Optional[float] = None,
            env: Optional[Mapping[str, str]] = None) -> str:
        argv = [find_command(cmd), *args]
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                errors="replace",  # a job's comment may hold any byte: never a traceback
                timeout=timeout or self.timeout,
                check=False,
                env=None if env is None else dict(env),
            )
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(
                f"{cmd} {' '.join(args)} did not answer within {timeout or self.timeout:g}s",
                hint="is slurmctld running and reachable? (scontrol ping)",
            ) from None
        except OSError as exc:
            raise SlurmError(f"cannot run {argv[0]}: {exc.strerror}") from None
        if proc.returncode != 0:
            err = (proc.stderr or proc.stdout).strip().splitlines()
            msg = err[-1] if err else f"exit status {proc.returncode}"
            if any(s in msg for s in UNREACHABLE):
                raise SlurmUnavailable(f"{cmd} {' '.join(args)} failed: {msg}",
                                       hint=_UNREACHABLE_HINT.get(cmd, _UNREACHABLE_HINT[""]))
            raise SlurmError(f"{cmd} {' '.join(args)} failed: {msg}")
        return proc.stdout

    def version(self) -> Optional[Tuple[int, int, int]]:
        """The installed Slurm release, or None when no Slurm command answers.

        ``scontrol --version`` needs a readable slurm.conf; ``slurmd -V``/``slurmctld -V``
        do not, so a host that is being set up (no config yet) still gets its answer.
        """
        for cmd, args in (("scontrol", ["--version"]), ("slurmd", ["-V"]),
                          ("slurmctld", ["-V"])):
            try:
                found = parse_version(self.run(cmd, args))
            except SlurmError:
                continue
            if found:
                return found
        return None

    def show_config(self, timeout: Optional[float] = None) -> Dict[str, str]:
        """``scontrol show config`` as key -> value (``(null)`` kept: it means unset)."""
        return parse_show_config(self.run("scontrol", ["show", "config"], timeout))

    def show_all(self, kind: str, timeout: Optional[float] = None,
                 counts: Optional[RowCounts] = None) -> Dict[str, Dict[str, str]]:
        """``scontrol show partition|node -o``: name -> fields, for every entity.

        One entity a line (split on ``\\n`` alone), each key read where it first appears
        (:func:`~slurmiso.slurm.rows.split_kv_line`); a line that names no entity first (the
        rest of a free-text field that held a newline) and an entity named twice (which line
        is Slurm's cannot be told) are rejected and counted into ``counts``."""
        from slurmiso.slurm.rows import RowCounts, lines_of, split_kv_line

        key = {"partition": "PartitionName", "node": "NodeName"}[kind]
        mine = RowCounts(f"scontrol show {kind}")
        out: Dict[str, Dict[str, str]] = {}
        twice = set()
        for line in lines_of(self.run("scontrol", ["show", kind, "-o"], timeout)):
            if not line.strip():
                continue
            fields = split_kv_line(line)
            name = fields.get(key, "") if line.startswith(key + "=") else ""
            if not name or " " in name:
                mine.reject("malformed", line)
                continue
            if name in out or name in twice:
                mine.reject("duplicate", line)
                if out.pop(name, None) is not None:
                    mine.duplicate += 1
                twice.add(name)
                continue
            out[name] = fields
        mine.log()
        if counts is not None:
            counts.merge(mine)
        return out

    def job_fields(self, job_id: str, fields: Sequence[str], node: Optional[str] = None,
                   timeout: Optional[float] = None) -> Optional[Dict[str, str]]:
        """Slurm's own fields of one job: :func:`job_fields` through this client."""
        return job_fields(self.run, job_id, fields, node, timeout)

    def show_node(self, node: str, timeout: Optional[float] = None) -> Dict[str, str]:
        """``scontrol show node -o NODE``: its fields, {} unless Slurm printed exactly one
        line for it (:meth:`show_all`'s rules)."""
        from slurmiso.slurm.rows import lines_of, split_kv_line

        found = [split_kv_line(ln) for ln in
                 lines_of(self.run("scontrol", ["show", "node", "-o", node], timeout))
                 if ln.startswith(f"NodeName={node} ")]
        return found[0] if len(found) == 1 else {}

    def drain(self, node: str, reason: str, timeout: Optional[float] = None) -> None:
        reason = " ".join(reason.split())[:200] or "slurmiso"
        self.run(
            "scontrol",
            ["update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"],
            timeout,
        )

    def jobs_on_node(self, node: str) -> List[str]:
        """The jobs whose records must stay on ``node``: running, starting, ending, and
        suspended (a suspended job keeps its GPUs and its isolation: the ladder or an admin
        resumes it). ``squeue %A``: the id alone, no field a user writes; odd or repeated ids
        are rejected and logged."""
        from slurmiso.slurm.rows import RowCounts, job_rows

        out = self.run(
            "squeue", ["-h", "-w", node, "-t", "RUNNING,CONFIGURING,COMPLETING,SUSPENDED",
                       "-o", "%A"], env=squeue_env())
        counts = RowCounts(f"squeue -w {node}")
        rows = job_rows(out, ("id",), counts)
        counts.log()
        return list(rows)

    # -- the monitor's reads and actions (slurmiso.monitor) -------------------------------
    #: squeue fields the monitor reads, in order (``-o`` with ``|``): every one made by Slurm
    #: or an admin, or a name Slurm validated (partition, QoS, account, ``--gres``,
    #: ``--exclude``), so no row is a user's text; the reason (an admin's words at most,
    #: which may hold ``|``) is last. The comment, which the job's user writes, is read apart
    #: (:meth:`queue`). ``--json`` is not used: see :mod:`slurmiso.slurm.rows`.
    QUEUE_FIELDS = ("id", "state", "partition", "qos", "submit", "nodes", "gres", "account",
                    "priority", "exc_nodes", "num_nodes", "start", "reason")
    QUEUE_FORMAT = "%i|%T|%P|%q|%V|%N|%b|%a|%Q|%x|%D|%S|%r"

    def queue(self, states: str = "PENDING,RUNNING",
              counts: Optional[RowCounts] = None) -> List[Dict[str, str]]:
        """Jobs in ``states`` as dicts keyed by :attr:`QUEUE_FIELDS` plus ``comment``; a job
        whose comment could not be read apart from a forged row has no ``comment`` key
        (unread). Rejected rows are counted into ``counts`` and logged at WARNING."""
        from slurmiso.slurm.rows import (
            COMMENT_FORMAT,
            COUNT,
            STATE,
            RowCounts,
            comment_rows,
            job_rows,
        )

        wait, env = max(self.timeout, 30.0), squeue_env()
        mine = RowCounts("squeue")
        out = self.run("squeue", ["-h", "-t", states, "-o", self.QUEUE_FORMAT], timeout=wait,
                       env=env)
        rows = job_rows(out, self.QUEUE_FIELDS, mine, free_last=True,
                        shapes={"state": STATE, "priority": COUNT, "num_nodes": COUNT})
        if rows:
            # after the facts, in the same states: a job listed above has its row here unless
            # it ended since, so a forged row for it is a second one
            text = self.run("squeue", ["-h", "-t", states, "-o", COMMENT_FORMAT], timeout=wait,
                            env=env)
            for jid, comment in comment_rows(text, rows, mine).items():
                if comment is not None:
                    rows[jid]["comment"] = comment
        mine.log()
        if counts is not None:
            counts.merge(mine)
        return list(rows.values())

    def update_jobs(self, job_ids: Sequence[str], fields: Dict[str, str]) -> None:
        """``scontrol update JobId=a,b,c K=V ...`` (pending jobs; an empty value clears)."""
        self.run("scontrol", ["update", f"JobId={','.join(job_ids)}",
                              *(f"{k}={v}" for k, v in fields.items())])

    def hold(self, job_ids: Sequence[str]) -> None:
        """``scontrol hold`` (priority 0 until released); several jobs in one call."""
        self.run("scontrol", ["hold", ",".join(job_ids)])

    def release(self, job_ids: Sequence[str]) -> None:
        self.run("scontrol", ["release", ",".join(job_ids)])

    def requeue(self, job_ids: Sequence[str]) -> None:
        """``scontrol requeue``: the job is signalled (SIGTERM, KillWait before SIGKILL), goes
        back to PENDING and keeps its id; the slurmiso wrapper checkpoints on the signal."""
        self.run("scontrol", ["requeue", ",".join(job_ids)])

    # -- running jobs (the monitor's ladder): "already so" is an answer, not a failure ------
    #: What slurmctld says when a job is already as asked, or no longer there to act on.
    GONE = ("Job/step already completing or completed", "Invalid job id specified",
            "Job has already finished")

    def _job_op(self, args: Sequence[str], already: Sequence[str]) -> str:
        """Run a job operation: "done", "already" (the job is as asked) or "gone" (it ended);
        any other refusal is a SlurmError naming the job and Slurm's words."""
        try:
            self.run(args[0], list(args[1:]))
        except SlurmUnavailable:
            raise
        except SlurmError as exc:
            text = str(exc)
            if any(s in text for s in already):
                return "already"
            if any(s in text for s in self.GONE):
                return "gone"
            raise
        return "done"

    def suspend(self, job_id: str) -> str:
        """``scontrol suspend``: SIGSTOP to the job's processes, its time limit paused (an
        operator's or SlurmUser's right). "already": it was not running (suspended, or
        ended just now: the next snapshot tells)."""
        return self._job_op(["scontrol", "suspend", str(job_id)],
                            ("Job is current suspended", "Job is not running"))

    def resume_job(self, job_id: str) -> str:
        """``scontrol resume`` of a job this monitor suspended."""
        return self._job_op(["scontrol", "resume", str(job_id)], ("Job is not suspended",))

    def signal_job(self, job_id: str, signal: str) -> str:
        """Send ``signal`` to every process of the job: ``scancel --signal=SIG JOB`` reaches
        its steps (a wrapper under ``srun``) and ``scancel --signal=SIG --full JOB`` the batch
        script and its children (a wrapper run without ``srun``). Measured on 22.05.8:
        ``--full`` alone reached the batch shell only, never a step's tasks (srun does not
        forward URG), and the plain form reached the steps only. A process in both (none
        today) gets it twice, which the wrapper's throttle handling is built to ignore. Only
        for signals ignored by default (URG, WINCH), so a shell or program that does not know
        them is not hurt. Names Slurm knows are passed as names, others (WINCH: 22.05 says
        "Unknown job signal") as the number. "gone" when the job had ended."""
        import signal as _signal

        name = signal.upper().removeprefix("SIG")
        known = ("HUP", "INT", "QUIT", "ABRT", "KILL", "ALRM", "TERM", "USR1", "USR2", "URG",
                 "CONT", "STOP", "TSTP", "TTIN", "TTOU")
        value = name if name in known else str(int(getattr(_signal, "SIG" + name)))
        steps = self._job_op(["scancel", f"--signal={value}", str(job_id)], ())
        if steps == "gone":
            return steps
        return self._job_op(["scancel", f"--signal={value}", "--full", str(job_id)], ())

    def requeue_job(self, job_id: str, resume_first: bool = False) -> str:
        """``scontrol requeue`` of a running job (the wrapper checkpoints on the SIGTERM);
        a job this monitor suspended is resumed first, since Slurm holds a suspended job it
        requeues and a stopped program cannot checkpoint. "already": it is pending."""
        if resume_first:
            self.resume_job(job_id)
        return self._job_op(["scontrol", "requeue", str(job_id)], ("Job is pending execution",))

    #: The longest ``AdminComment`` squeue is asked to print (the site's own text included).
    ADMIN_COMMENT_WIDTH = 1024

    def admin_comment(self, job_id: str) -> Optional[str]:
        """A job's ``AdminComment`` (only an admin sets it; None: Slurm no longer lists the
        job). Read with ``squeue -O`` at a fixed width, the value last on its line."""
        if not str(job_id).replace("_", "").isdigit():
            raise SlurmError(f"not a job id: {str(job_id)[:40]!r}")
        try:
            out = self.run("squeue", ["-h", "-t", "all", "-j", str(job_id), "-O",
                                      f"JobID:40,admin_comment:{self.ADMIN_COMMENT_WIDTH}"])
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise
        line = next((ln for ln in out.splitlines() if ln.strip()), None)
        if line is None:
            return None
        parts = line.split(None, 1)
        text = parts[1].strip() if len(parts) > 1 else ""
        return "" if text in ("(null)", "N/A") else text

    def set_admin_comment(self, job_id: str, text: str) -> None:
        """``scontrol update JobId=J AdminComment=...`` (an admin's right; "" clears it)."""
        self.run("scontrol", ["update", f"JobId={job_id}", f"AdminComment={text}"])

    def set_qos_grp_tres(self, qos: str, tres: Dict[str, int]) -> None:
        """Set a QoS's ``GrpTRES`` for GRES counts: ``{"gpu": 4, "shard": -1}`` ->
        ``gres/gpu=4,gres/shard=-1`` (-1 lifts that limit)."""
        value = ",".join(f"gres/{t}={int(c)}" for t, c in sorted(tres.items()))
        self.run("sacctmgr", ["-i", "modify", "qos", "where", f"name={qos}", "set",
                              f"GrpTRES={value}"])

    def set_partition_nodes(self, partition: str, nodes: str) -> None:
        """Replace a partition's node list (``nodes`` a hostlist expression)."""
        self.run("scontrol", ["update", f"PartitionName={partition}", f"Nodes={nodes}"])

    def resume(self, node: str) -> None:
        """Return a drained node to service."""
        self.run("scontrol", ["update", f"NodeName={node}", "State=RESUME"])


def squeue_env() -> Dict[str, str]:
    """The environment squeue runs in: no ``SQUEUE_*`` setting filters or reshapes what it
    prints, one cluster, and times in ISO form without spaces."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SQUEUE_") and k not in ("SLURM_CLUSTERS", "SLURM_TIME_FORMAT")}
    env["SLURM_TIME_FORMAT"] = "standard"
    return env


def job_fields(run: Callable[..., str], job_id: str, fields: Sequence[str],
               node: Optional[str] = None,
               timeout: Optional[float] = None) -> Optional[Dict[str, str]]:
    """Slurm's own fields of one job (``squeue -O``), or None when slurmctld does not list
    it (on ``node``, when given). ``run(cmd, args, timeout, env=...)`` runs a Slurm command
    (:meth:`SlurmCli.run`): the hooks and the wrapper share this one reader.

    Never ``scontrol show job -o`` for a decision: it prints text the job's user chose
    (``Comment``, ``WorkDir``, ``StdOut``, ``Command``) unquoted among Slurm's own keys,
    after ``QOS`` and ``JobState``, so a job submitted with ``--comment "x QOS=infer"``
    reads as QoS infer. squeue prints only the fields asked for (:data:`JOB_FIELDS`, none
    of them user text), each padded to a fixed width; the environment is one that no
    ``SQUEUE_*`` setting filters and whose times have no spaces.
    """
    unknown = [f for f in fields if f not in JOB_FIELDS]
    if unknown or not fields:
        raise ValueError(f"not a squeue field of Slurm's own: {unknown or 'none'}")
    if not str(job_id).isdigit():
        raise SlurmError(f"not a job id: {str(job_id)[:40]!r}")
    args = ["-h", "-t", "all", "-j", str(job_id),
            "-O", ",".join(f"{f}:{_FIELD_WIDTH}" for f in fields)]
    if node is not None:
        args += ["-w", node]
    try:
        out = run("squeue", args, timeout, env=squeue_env())
    except SlurmError as exc:
        if "Invalid job id" in str(exc):
            return None  # slurmctld no longer holds the job (MinJobAge)
        raise
    lines = [ln for ln in out.splitlines() if ln.strip()]
    if not lines:
        return None
    values = lines[0].split()
    if (len(lines) > 1 or len(values) != len(fields)
            or any(len(v) >= _FIELD_WIDTH for v in values)):
        raise SlurmError(f"squeue -j {job_id}: unexpected output {out[:200]!r}")
    return dict(zip(fields, values))
