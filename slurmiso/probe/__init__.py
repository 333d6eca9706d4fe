"""``slurmiso probe``: measure inference alone and beside training per pool mode, then pick the
softest isolation that holds the inference SLO.

The issue's rule is "rate-limit first, then quotas, then partition or dedicate": sharing costs
training nothing until it hurts inference, so the measurement, not a guess, says how far up that
ladder a site has to go. Modules, each named for what it does:

* :mod:`~slurmiso.probe.stats` — percentiles, error rate, step time from raw samples
* :mod:`~slurmiso.probe.contract` — what an ``--infer-cmd``/``--train-cmd`` prints, read back
* :mod:`~slurmiso.probe.workloads` — the built-in request loop and training loop (torch or CPU)
* :mod:`~slurmiso.probe.jobrun` — runs one workload where it was placed (local or Slurm job)
* :mod:`~slurmiso.probe.plan` — what each mode asks for (GRES, QoS, MPS limits) per class
* :mod:`~slurmiso.probe.local` / :mod:`~slurmiso.probe.slurm_run` — the two launchers
* :mod:`~slurmiso.probe.session` — one run: start, wait, collect, judge; clean up whatever happens
* :mod:`~slurmiso.probe.modes` — per mode solo, solo, together, into figures; every mode in turn
* :mod:`~slurmiso.probe.gpumem` — the GPU memory a run's processes held, sampled on the node
* :mod:`~slurmiso.probe.recommend` — the softest mode that holds the SLO
* :mod:`~slurmiso.probe.render` / :mod:`~slurmiso.probe.store` — text, JSON, HTML; saved results
"""
