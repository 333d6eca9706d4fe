"""The node agent (``slurmiso agent``): what one node tells the monitor, as Prometheus
metrics.

Layout: :mod:`serve` (the registry, the server, ``--once``) over :mod:`gpus` (the node's GPUs
and the jobs holding them, :mod:`gpu_owners` for processes), :mod:`job_signals` (each job's
own figures: :mod:`endpoint` reads an inference server's answer, :mod:`port_owners` checks
who listens on its port, :mod:`stepfile` reads a training job's steps),
:mod:`restraint_watch` (the ladder's restraints while no monitor is alive) and
:mod:`http_server` (the agent's own HTTP server). It shares only leaves with the monitor
(:mod:`slurmiso.exposition`, :mod:`slurmiso.restraints`), never imports it.
"""
