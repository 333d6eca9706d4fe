"""Per-job GPU isolation: one module per pool mode behind the :class:`Isolation` interface.

The prolog/epilog (:mod:`slurmiso.hooks`) build a :class:`Context` for the job and call the
pool mode's handler; handlers act on the GPU through the injected backend and describe what
they did in the job's record so the epilog (or ``reconcile``) can undo exactly that.
"""
