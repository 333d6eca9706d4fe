"""The probe's workloads as Slurm batch jobs, submitted the way users submit them.

Each run is ``sbatch`` of a two-line script that starts :mod:`slurmiso.probe.jobrun` on the
node, with the pool's partition, the class's QoS (or ``--iso-class``) and the GRES the mode
shares a GPU through, so the real prolog gives it its real share. ``--no-requeue`` for inference
runs: one preempted must end, not come back and run unobserved; training runs stay requeueable,
as a site's job_submit (slurmiso's own included) demands of every train job. Results come back
through files in the work directory, which must be on a file system the nodes see (as job
output is). State is read with ``squeue`` (a job it no longer lists has ended) and every job
submitted is cancelled with ``scancel`` at the end, then waited for until ``squeue`` shows none.

All Slurm calls go through one object with ``run(cmd, args, timeout=None) -> stdout``
(:class:`slurmiso.slurm.client.SlurmCli`), so tests give it a fake Slurm.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import time
from typing import Any, Dict, List, Optional

from slurmiso.errors import SlurmError
from slurmiso.probe.launch import ENDED, PENDING, RUNNING, Run, package_root

log = logging.getLogger(__name__)

_PENDING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "RESIZING", "SUSPENDED"}
_RUNNING = {"RUNNING", "COMPLETING", "STAGE_OUT", "SIGNALING"}
GONE_WAIT_S = 60.0


def _shell_value(value: str) -> str:
    """Quoted for sh; a ``${PYTHONPATH:+...}`` tail stays an expansion."""
    head, sep, tail = value.partition("${")
    return shlex.quote(head) + (sep + tail if sep else "")


class SlurmLauncher:
    """sbatch/squeue/scancel through ``slurm.run``; ``python`` is what the job runs."""

    where = "slurm"

    def __init__(self, slurm: Any, work_dir: str, python: str = sys.executable,
                 poll_s: float = 1.0) -> None:
        self.slurm = slurm
        self.work_dir = work_dir
        self.python = python
        self.poll_s = poll_s
        self.jobs: Dict[str, str] = {}  # job id -> run name

    def start(self, run: Run) -> str:
        script = run.spec_path[:-len(".json")] + ".sh"
        env = dict(run.env)
        if self.python == sys.executable:  # the job runs this slurmiso, checkout or not
            env["PYTHONPATH"] = package_root() + "${PYTHONPATH:+:$PYTHONPATH}"
        with open(script, "w", encoding="utf-8") as fh:
            fh.write("#!/bin/sh\n# slurmiso probe: " + run.name + "\n"
                     + "".join(f"export {k}={_shell_value(v)}\n" for k, v in sorted(
                         env.items()))
                     + f"exec {shlex.quote(self.python)} -m slurmiso.probe.jobrun "
                     f"{shlex.quote(run.spec_path)}\n")
        os.chmod(script, 0o755)
        args = ["--parsable", f"--job-name=slurmiso-probe-{run.name}",
                f"--output={os.path.join(self.work_dir, run.name + '.slurm.out')}",
                f"--chdir={self.work_dir}",
                # a requeued job's second start adds to its first's output instead of erasing it
                "--open-mode=append",
                # A site's job_submit refuses train jobs that cannot be requeued (slurmiso's
                # own does): training is submitted as users submit it; inference never needs it.
                *(["--no-requeue"] if run.role != "train" else []), *run.sbatch]
        if run.node:
            args.append(f"--nodelist={run.node}")
        out = self.slurm.run("sbatch", [*args, script], timeout=60)
        job = out.strip().split(";")[0].strip()
        if not job.isdigit():
            raise SlurmError(f"sbatch for probe run {run.name} answered {out.strip()[:200]!r} "
                             "instead of a job id")
        self.jobs[job] = run.name
        log.info("probe run %s: job %s (%s)", run.name, job, " ".join(run.sbatch))
        return job

    def _squeue(self, job: str, fmt: str) -> str:
        try:
            return self.slurm.run("squeue", ["-h", "-j", job, "-o", fmt], timeout=30).strip()
        except SlurmError as err:
            if "Invalid job id" in str(err):
                return ""  # aged out of slurmctld: it has ended
            raise

    def state(self, handle: str) -> str:
        words = self._squeue(handle, "%T").split()
        state = words[0] if words else ""
        if state in _PENDING:
            return PENDING
        if state in _RUNNING:
            return RUNNING
        return ENDED

    def why_pending(self, handle: str) -> str:
        try:
            return self._squeue(handle, "%r")
        except SlurmError:
            return ""

    def restarts(self, handle: str) -> Optional[int]:
        """Slurm's RestartCnt of the job (None once slurmctld has forgotten it): a requeued
        training job (preempted, node failure) ran again, so its figures are interrupted."""
        from slurmiso.slurm.client import job_fields
        from slurmiso.slurm.jobenv import whole_number

        info = job_fields(self.slurm.run, handle, ("RestartCnt",), timeout=30)
        if info is None:
            return None
        count = whole_number(info["RestartCnt"], -1, 10**6)
        return None if count < 0 else count

    def cancel(self, handle: str) -> None:
        try:
            self.slurm.run("scancel", [handle], timeout=30)
        except SlurmError as err:
            log.warning("scancel %s: %s", handle, err)

    def cancel_all(self) -> List[str]:
        """scancel every job submitted, then wait until squeue lists none of them."""
        if not self.jobs:
            return []
        ids = sorted(self.jobs, key=int)
        try:
            self.slurm.run("scancel", ids, timeout=60)
        except SlurmError as err:
            log.warning("scancel %s: %s", " ".join(ids), err)
        deadline = time.monotonic() + GONE_WAIT_S
        left = ids
        while True:
            try:
                left = [j for j in left if self.state(j) != ENDED]
            except SlurmError as err:
                log.warning("cannot confirm the probe's jobs ended: %s", err)
                return left
            if not left or time.monotonic() >= deadline:
                return left
            time.sleep(self.poll_s)

    def describe(self, handle: str) -> str:
        return f"job {handle}"
