"""Static MIG layouts: plan (pure), apply (through a GpuBackend), and the GRES list Slurm sees.

``plan`` decides what must change to reach a mig-parted style layout (assert, then act: a
second ``apply`` plans nothing); ``apply`` executes a plan and journals each step; ``gres``
turns the node's instances into ``gres.conf`` entries in the one order the prolog also uses
to map ``SLURM_JOB_GPUS`` to MIG devices.
"""
