"""Slurm ``Prolog``: give the job its GPU share before it starts (runs as root).

Usage: point ``Prolog=`` (or a file in ``prolog.d/``) at ``slurmiso-prolog``. Exit 0 also
when the job is refused (its record says why; the task prolog tells the job); exit 1 only for
a node fault, after draining the node with the reason. Run without ``SLURM_JOB_ID`` (by hand,
not by slurmd) it does nothing and exits 2 with a one-line reason.
"""

from __future__ import annotations

import os
import sys
from typing import List, Mapping, Optional

#: Exit status when run outside a job (no SLURM_JOB_ID): a usage error, as in the CLI.
NO_JOB_EXIT = 2

USAGE = {
    "prolog": """usage: slurmiso-prolog [-h]

Slurm Prolog (slurm.conf: Prolog=/usr/bin/slurmiso-prolog, PrologFlags=Alloc). slurmd runs
it as root before each job on the node. It reads the job from Slurm's environment
(SLURM_JOB_ID, SLURM_JOB_GPUS, SLURM_JOB_PARTITION, ...), picks the job's class and gives it
its GPU share: checks a whole GPU is free, maps or creates a MIG instance, or joins the GPU's
MPS daemon with the class's thread percentage and memory limit. It records what it did under
paths.state_dir for the epilog and 'slurmiso status'.

Config: $SLURMISO_CONFIG or /etc/slurmiso/slurmiso.yaml.
Exit status: 0 job prepared, or refused alone (the job's task prolog prints why);
1 node fault: the node is drained with the reason ('sinfo -R');
2 run without SLURM_JOB_ID (by hand, outside a job): nothing was done.
See slurmiso-prolog(8).""",
    "epilog": """usage: slurmiso-epilog [-h]

Slurm Epilog (slurm.conf: Epilog=/usr/bin/slurmiso-epilog). slurmd runs it as root after each
job on the node. It undoes exactly what the prolog recorded for $SLURM_JOB_ID: ends the job's
leftover GPU processes, destroys its dynamic MIG instance or leaves its MPS daemon (stopping
the daemon when no job uses it), checks the GPU is clean, writes the job's journal record and
removes its record.

Config: $SLURMISO_CONFIG or /etc/slurmiso/slurmiso.yaml.
Exit status: 0 released (also when the prolog never ran for the job);
1 the GPU could not be brought back to a clean state: the node is drained with the reason;
2 run without SLURM_JOB_ID (by hand, outside a job): nothing was done.
See slurmiso-prolog(8).""",
}


def missing_job(env: Mapping[str, str], phase: str) -> Optional[str]:
    """The one-line reason a hook cannot run, or None: slurmd always sets SLURM_JOB_ID."""
    from slurmiso.slurm.jobenv import job_id

    if job_id(env).strip():
        return None
    return (f"slurmiso-{phase}: SLURM_JOB_ID is not set: slurmd runs this hook for a job; "
            f"nothing done (see slurmiso-{phase} --help)")


def main(argv: Optional[List[str]] = None, phase: str = "prolog") -> int:
    args = sys.argv[1:] if argv is None else argv
    if args and args[0] in ("-h", "--help"):
        print(USAGE[phase])
        return 0
    why = missing_job(os.environ, phase)
    if why:
        print(why, file=sys.stderr)
        return NO_JOB_EXIT
    from slurmiso.hooks.runner import run_hook

    status = run_hook(phase, os.environ)
    if argv is None:  # the process's entry point (script or console script): it exits next
        # Spare the interpreter's last full garbage collection at exit, which cost more than
        # the hook's own work on the sim (bench_hooks: about 10 ms per hook on a busy
        # machine). Objects still alive at exit are freed by the OS; nothing here relies on
        # a finalizer running at exit, which Python never guarantees anyway.
        import gc

        gc.freeze()
    return status


if __name__ == "__main__":
    sys.exit(main())
