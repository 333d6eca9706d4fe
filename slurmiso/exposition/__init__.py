"""What the node agent writes and the monitor reads: the leaves both sides share.

:mod:`text` (the Prometheus text format, parsed), :mod:`gpu_series` (the GPU series' names),
:mod:`job_series` (the per-job series: names, labels, reasons and their reader),
:mod:`histogram` (quantiles over a window of counter readings), :mod:`scrape` (HTTP GETs under
one deadline). Nothing here imports the agent or the monitor (``tests/unit/test_layering.py``).
"""
