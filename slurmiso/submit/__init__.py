"""Submit-time policy: the job_submit/cli_filter Lua script and the SPANK plugstack line.

Both are generated from the slurmiso config (``slurmiso gen job-submit``, ``slurmiso gen
plugstack``) so the checks at ``sbatch`` time and the Prolog's classification never disagree.
"""
