"""The job's step file (training step times, wrapper/steps.py): named by the prolog
(slurmiso/jobfiles.py names it), removed by the epilog.

Like the events file it lives in the job's working directory and is written by the job's
wrapper as the job's user; the agent reads it as hostile input (agent/stepfile.py). The
epilog removes it and the program's report beside it, only when each is a regular file of
the job's uid (never through a symlink): a user cannot make root delete anything else.
Stdlib only: the hooks import it on every job.
"""

from __future__ import annotations

import logging
import os
import stat

from slurmiso.jobfiles import steps_report_path

log = logging.getLogger(__name__)


def remove(path: str, uid: int) -> None:
    """Remove the step file and the program's report beside it (the job is over)."""
    folder = os.path.dirname(path)
    try:
        dir_fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        for name in (os.path.basename(path), os.path.basename(steps_report_path(path))):
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode) and (uid < 0 or st.st_uid == uid):
                    os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.info("could not remove the job's step file %s: %s", name, exc)
    finally:
        os.close(dir_fd)
