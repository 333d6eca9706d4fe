"""A real Slurm cluster on one machine for tests and demos: ``slurmiso sandbox up``.

A development tool, kept out of the runtime ``slurmiso`` package: it apt-installs Slurm,
MariaDB and munge and starts their daemons, which must never happen on a site's controller by
accident (:mod:`.guard` refuses hosts with a Slurm or munge setup it did not create). It runs
from a source checkout, or from the ``slurmiso-sandbox`` Debian package beside ``slurmiso``.

:mod:`.layout` describes it (pure) and :mod:`.sites` makes it for this machine. :mod:`.cluster`
orders the steps of ``up``, ``down`` and ``status``; they live in :mod:`.packages` (apt, test
user), :mod:`.files` (configs, device stand-ins, simulated GPUs), :mod:`.munge`,
:mod:`.cgroups` (version, v2 namespace), :mod:`.database` (MariaDB), :mod:`.services` (the
daemons) and :mod:`.accounting` (what slurmdbd holds); :mod:`.roots` holds other Slurm
releases, :mod:`.procs` the process plumbing. :mod:`.demo` and :mod:`.protect` are scenes on
the running cluster, sharing :mod:`.scenes`.
"""
