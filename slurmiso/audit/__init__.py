"""``slurmiso audit``: reports on isolation health, preemption cost and GPU use.

The pipeline is a stream, so a year of accounting fits in a few hundred MB::

    read/      sacct -P  --(fold: lexing)------------------+
               sacct --json, records (sacct, sacct_json) --+--> figures/kernel, one call
               a large file: parallel parts, merged        |    per attempt, into
               journals --> digest.JournalDigest ----------+    figures/aggregate.Aggregator
               the live cluster: live                           --> findings, report dict
    render/    the report dict as text, Markdown, HTML, JSON, CSV

``figures`` is pure (records and digests in, data out); ``read`` is where Slurm, files and
the GPU backend are touched (``collect``, ``live``); ``render`` computes no figure.
"""

from __future__ import annotations
