"""Reading the audit's inputs: ``sacct -P``/``--json`` (files, pipes, the live query), the
node journals, and the live cluster. Nothing here computes a figure: a row becomes an
:class:`~slurmiso.audit.read.sacct.AcctRecord`, or is lexed by :mod:`.fold` straight into the
per-attempt kernel of :mod:`slurmiso.audit.figures.kernel`."""
