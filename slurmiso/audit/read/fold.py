"""The ``sacct -P`` fold under its old name: :func:`~slurmiso.audit.read.sacct.fold_parsable`.

There is one ``-P`` reader, :mod:`slurmiso.audit.read.sacct`; this module parses nothing. It
stays only because ``tests/unit/test_private_names.py`` names it as a real module in an
example; delete it when that example names another.
"""

from slurmiso.audit.read.sacct import fold_parsable

__all__ = ["fold_parsable"]
