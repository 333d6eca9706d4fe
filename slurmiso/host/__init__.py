"""Host figures per job (cgroup) and per node (PSI, NICs), the contention diagnosis, and
the planning half of the host rate-limit rung.

    >>> from slurmiso.host.cgroup_figures import read_v2
    >>> figs = read_v2("/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42")  # doctest: +SKIP
    >>> figs.cpu.usage_usec, figs.pressure.cpu  # doctest: +SKIP

Every figure that could not be read is ``None``: a zero would read as calm to the ladder.
See docs/host-contention.md for what is read, from where, and what cgroup v1 lacks.
"""
