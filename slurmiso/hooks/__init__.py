"""Executables Slurm runs around each job: prolog, epilog and the task prolog.

Each module's ``main()`` is what ``prolog/slurmiso-prolog`` & co. call. They run as root (the
task prolog as the job's user) with no PATH, so they import lazily and trust only what Slurm
itself enforces.
"""
