"""slurmiso: policy and per-job GPU isolation for Slurm clusters that mix inference and training.

Slurm stays the scheduler; slurmiso adds job classes, isolation in Prolog/Epilog, checkpoint on
preemption, a monitor and an audit. Importing the package does no work: hooks import it on every
job start.
"""

__version__ = "0.1.0"
