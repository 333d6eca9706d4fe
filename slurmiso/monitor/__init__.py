"""The monitor: telemetry + Slurm state -> pure decisions -> actions through Slurm.

Layout (one concern per module): :mod:`snapshot` (what the monitor sees, as data),
:mod:`policy` (thresholds and the monitor's memory), :mod:`actions` (the action kinds, one
table entry each: Slurm calls in :mod:`calls`, undo and reconcile in :mod:`undo`),
:mod:`decide` (the pure core) with its parts :mod:`gates` (signals, gates) and
:mod:`admission` (one strategy per mode, staggering), :mod:`exclusions` (per-node admission),
:mod:`caps` (qos-limit), :mod:`requeue` (the BeginTime release) and :mod:`relayout` (MIG),
:mod:`telemetry` (agents, Prometheus, files) over :mod:`slurmiso.exposition.scrape` (one
deadline per cycle), :mod:`gather` (a live snapshot), :mod:`apply` (actions through the Slurm
adapter), :mod:`loop` (cycles, lock, intent and state file), :mod:`report` (what-if totals,
status). The per-node metrics exporter is :mod:`slurmiso.agent`, which this package never
imports (nor it this one): they share only :mod:`slurmiso.exposition` and
:mod:`slurmiso.restraints`.
"""
