"""``slurmiso audit``: reports on isolation health, preemption cost and GPU use.

The pipeline is a stream, so a year of accounting fits in a few hundred MB::

    sacct (-P or --json) -> sacct.parse_*() -> AcctRecord --+
                                                             +-> analyze.Aggregator -> report dict
    journals -> digest.JournalDigest -----------------------+        |
                                                     findings / live +-> render_* (text, md,
                                                                           html, json, csv)

``analyze``, ``digest`` and ``findings`` are pure (records in, data out); ``collect`` and
``live`` are where Slurm, files and the GPU backend are touched.
"""

from __future__ import annotations
