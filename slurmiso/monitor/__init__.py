"""The monitor: telemetry + Slurm state -> pure decisions -> actions through Slurm.

Layout (one concern per module): :mod:`snapshot` (what the monitor sees, as data),
:mod:`policy` (thresholds and the monitor's memory), :mod:`decide` (the pure core) and
:mod:`relayout` (its MIG part), :mod:`telemetry` (agents, Prometheus, files), :mod:`gather`
(a live snapshot), :mod:`apply` (actions through the Slurm adapter), :mod:`loop` (cycles,
lock, state file), :mod:`agent` (the per-node metrics exporter).
"""
