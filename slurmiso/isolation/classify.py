"""Moved: the classifier is the config's (slurmiso/config/classify.py).

Kept only for slurmiso/audit/figures/aggregate.py, which another change owns this round:
delete this file once that import names slurmiso.config.classify.
"""

from slurmiso.config.classify import classify

__all__ = ["classify"]
