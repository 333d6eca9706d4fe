"""The audit's figures: one per-attempt kernel (:mod:`.kernel`) that every reader feeds, the
aggregator that owns and merges its state (:mod:`.aggregate`), findings and the report dict.
Pure: records and journal digests in, data out; no I/O, no clock."""
