"""A real Slurm cluster on one machine for tests and demos: ``slurmiso sandbox up``.

A development tool, kept out of the runtime ``slurmiso`` package: it apt-installs Slurm,
MariaDB and munge and starts their daemons, which must never happen on a site's controller by
accident (:mod:`.guard` refuses hosts with a Slurm or munge setup it did not create). It runs
from a source checkout, or from the ``slurmiso-sandbox`` Debian package beside ``slurmiso``.

:mod:`.layout` describes it (pure), :mod:`.cluster` runs it, :mod:`.accounting` holds the
database and slurmdbd contents, :mod:`.procs` the process plumbing.
"""
