"""The job wrapper behind ``slurmiso run``: isolation env, checkpoint on preemption, requeue.

One module per concern so each is tested alone:

    signals              flags set by signal handlers (nothing else happens in a handler)
    child                the program in its own process group: start, signal, wait, end all
    guardian             between wrapper and program: ends the program's tree if the wrapper dies
    procctl              Linux prctl: subreaper, parent-death signal; processes from /proc
    checkpoint_protocol  the marker file a program writes to report a finished checkpoint
    resume               the last good checkpoint (``.slurmiso/latest.json``) and resume env
    requeue              whether to requeue, always with a reason; ``scontrol requeue``
    throttle             the monitor's throttle signals as the program's throttle file
    steps                the program's step times folded into the job's step file
    record               the prolog's job record: isolation env, or refusal
    supervisor           the main loop that ties them together (the job step's init)

Nothing is imported here: ``slurmiso.checkpoint`` (the program-side helper) and the CLI
import only what they use.
"""
