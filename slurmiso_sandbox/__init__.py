"""A real Slurm cluster on one machine for tests and demos: ``slurmiso sandbox up``.

:mod:`.layout` describes it (pure), :mod:`.cluster` runs it, :mod:`.accounting` holds the
database and slurmdbd contents, :mod:`.procs` the process plumbing.
"""
