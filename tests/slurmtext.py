"""What Slurm's text commands print for a table of jobs, user fields raw, as Slurm does.

``squeue -o FORMAT`` prints, for each job, the format's literal characters and each ``%X``
field through ``printf("%s", value)`` (src/squeue/print.c ``_print_str``, tags
slurm-22-05-8-1 to slurm-26-05-3-1: no quoting, no escaping; a NULL string prints
``(null)``), then ``\\n``. Measured on 22.05.8 (tests/fixtures/slurm/22.05/squeue-forged-*):
a comment with newlines comes out as several lines, byte for byte. Tests use this to feed a
reader whatever query it makes, so a reader that asks for a user field meets it raw.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Sequence

#: squeue ``-o`` letters -> the job table's key.
SQUEUE_LETTERS = {"i": "id", "A": "id", "T": "state", "P": "partition", "q": "qos",
                  "V": "submit", "r": "reason", "N": "nodes", "b": "gres", "a": "account",
                  "Q": "priority", "x": "exc_nodes", "D": "num_nodes", "S": "start",
                  "k": "comment", "j": "name", "Z": "workdir"}
#: squeue ``-O`` names -> the job table's key (the fields SlurmCli.job_fields may ask, and
#: user ones for tests that ask them).
SQUEUE_NAMES = {"JobID": "id", "State": "state", "QOS": "qos", "Partition": "partition",
                "Account": "account", "StartTime": "start", "PreemptTime": "preempt_time",
                "RestartCnt": "restarts", "Requeue": "requeue", "Comment": "comment",
                "Name": "name", "admin_comment": "admin_comment"}
_STATE_CODES = {"PENDING": "PD", "RUNNING": "R", "SUSPENDED": "S", "COMPLETED": "CD",
                "COMPLETING": "CG", "CONFIGURING": "CF", "CANCELLED": "CA"}

Job = Dict[str, Any]


def job(jid: str, state: str = "PENDING", **fields: Any) -> Job:
    """A job as squeue would print it; every field has Slurm's own default."""
    out: Job = {"id": jid, "state": state, "partition": "train", "qos": "train",
                "submit": "2026-01-01T10:00:00", "reason": "Priority" if state == "PENDING"
                else "None", "nodes": "n1" if state != "PENDING" else "", "gres": "gres:gpu:1",
                "account": "acct", "priority": "100", "exc_nodes": "", "num_nodes": "1",
                "start": "N/A", "comment": None, "name": "wrap", "workdir": "/home/u",
                "preempt_time": "None", "restarts": "0", "requeue": "1",
                "admin_comment": None}
    out.update(fields)
    return out


def squeue_O(spec: str, jobs: Sequence[Job]) -> str:  # noqa: N802 - squeue's own option
    """``squeue -h -O NAME:WIDTH,...`` of ``jobs``: each value cut or padded to its width."""
    out = []
    for j in jobs:
        cells = []
        for item in spec.split(","):
            name, _, width = item.partition(":")
            value = j.get(SQUEUE_NAMES[name])
            text = "(null)" if value is None else str(value)
            cells.append(text[: int(width)].ljust(int(width)) if width else text + " ")
        out.append("".join(cells) + "\n")
    return "".join(out)


def squeue_o(fmt: str, jobs: Sequence[Job]) -> str:
    """``squeue -h -o FMT`` of ``jobs``."""
    lines: List[str] = []
    for j in jobs:
        out, i = [], 0
        while i < len(fmt):
            if fmt[i] == "%" and i + 1 < len(fmt):
                value = j.get(SQUEUE_LETTERS[fmt[i + 1]])
                out.append("(null)" if value is None else str(value))
                i += 2
            else:
                out.append(fmt[i])
                i += 1
        lines.append("".join(out))
    return "".join(line + "\n" for line in lines)


class FakeSqueue:
    """A ``run(cmd, args, timeout=None, env=None)`` that answers squeue (``-o`` or ``-O``)
    from a job table (``-t`` filters by state, ``-t all`` lists every job, ``-w`` by node,
    ``-j`` by id) and scontrol
    ``show node|partition -o`` from text given; every call is kept in ``calls``."""

    def __init__(self, jobs: Sequence[Job], scontrol: Mapping[str, str] = ()) -> None:
        self.jobs = list(jobs)
        self.scontrol = dict(scontrol)
        self.calls: List[List[str]] = []

    def __call__(self, cmd: str, args: Sequence[str], timeout: Any = None,
                 env: Any = None) -> str:
        self.calls.append([cmd, *args])
        if cmd == "scontrol":
            return self.scontrol[args[1]]
        assert cmd == "squeue", cmd
        opts = dict(zip(args[:-1], args[1:]))
        states = opts.get("-t", "PENDING,RUNNING").split(",")
        picked = [j for j in self.jobs
                  if "all" in states or j["state"] in states
                  or _STATE_CODES.get(j["state"]) in states]
        if "-w" in opts:
            picked = [j for j in picked if opts["-w"] in str(j["nodes"]).split(",")]
        if "-j" in opts:
            picked = [j for j in picked if j["id"] in opts["-j"].split(",")]
        if "-O" in opts:
            return squeue_O(opts["-O"], picked)
        return squeue_o(opts["-o"], picked)
