"""Where the host rung's cgroup writes happen: a narrow writer protocol, the real file
writer and an in-memory fake that models the kernel's keyed files.

    >>> writer = FileCgroupWriter(["/sys/fs/cgroup/system.slice/slurmstepd.scope/job_42"])
    >>> apply_plan(writer, plan)      # doctest: +SKIP

Both writers refuse, before touching anything, a path outside the Slurm-found cgroup roots
they were built with, a path through a symlink, and any file outside
:data:`~slurmiso.host.rate_limit.WRITABLE` (so never ``memory.max``). If a step fails
halfway, :func:`apply_plan` puts back every knob it already changed before raising.
"""

from __future__ import annotations

import logging
import os
from typing import Dict, Iterable, List, Protocol, Tuple

from slurmiso.errors import HostLimitError, HostLimitRefused
from slurmiso.host.rate_limit import (
    WRITABLE,
    CgroupWrite,
    Plan,
    Step,
)

log = logging.getLogger("slurmiso")

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class CgroupWriter(Protocol):
    """Writes one value to one cgroup file, or raises :class:`HostLimitError`."""

    def write(self, change: CgroupWrite) -> None: ...


def check_path(roots: Tuple[str, ...], path: str) -> None:
    """Refuse ``path`` unless it is a writable file name strictly under one of ``roots``,
    spelled canonically (no ``..``, no doubled ``/``) and with no symlink on the way."""
    name = os.path.basename(path)
    if name not in WRITABLE:
        raise HostLimitRefused(f"refused to write {path}: {name!r} is not a host-rung file")
    if not os.path.isabs(path) or os.path.normpath(path) != path:
        raise HostLimitRefused(f"refused to write {path}: not a canonical absolute path")
    if not any(path.startswith(root.rstrip("/") + "/") for root in roots):
        raise HostLimitRefused(f"refused to write {path}: outside the job's Slurm cgroup")
    if os.path.realpath(path) != path:
        raise HostLimitRefused(f"refused to write {path}: a symlink lies on its path")


def _roots(roots: Iterable[str]) -> Tuple[str, ...]:
    out = tuple(roots)
    for root in out:
        if not os.path.isabs(root) or os.path.normpath(root) != root or root == "/":
            raise HostLimitRefused(f"refused cgroup root {root!r}: not a canonical directory")
    return out


class FileCgroupWriter:
    """Writes cgroupfs files for real: the file must exist (no create) and is opened
    without following a symlink, narrowing the gap between check and write."""

    def __init__(self, roots: Iterable[str]) -> None:
        self.roots = _roots(roots)

    def write(self, change: CgroupWrite) -> None:
        check_path(self.roots, change.path)
        try:
            # O_TRUNC as a shell's ">" does: cgroupfs ignores it, a plain file needs it
            fd = os.open(change.path, os.O_WRONLY | os.O_TRUNC | _NOFOLLOW | _CLOEXEC)
            try:
                os.write(fd, change.value.encode("ascii"))
            finally:
                os.close(fd)
        except (OSError, UnicodeEncodeError) as err:
            raise HostLimitError(f"error writing {change.value!r} to {change.path}: {err}"
                                 ) from err


class FakeCgroupWriter:
    """In-memory cgroup files for tests, with the kernel's write semantics: single-value
    files are replaced; ``io.weight`` lines and ``io.max`` keys are updated per device."""

    def __init__(self, roots: Iterable[str], files: Dict[str, str]) -> None:
        self.roots = _roots(roots)
        self.files = dict(files)
        self.log: List[CgroupWrite] = []
        self.fail_on: Dict[str, str] = {}

    def write(self, change: CgroupWrite) -> None:
        check_path(self.roots, change.path)
        if change.path not in self.files:
            raise HostLimitError(f"error writing to {change.path}: no such file")
        if change.path in self.fail_on:
            raise HostLimitError(f"error writing to {change.path}: {self.fail_on[change.path]}")
        self.log.append(change)
        name = os.path.basename(change.path)
        current = self.files[change.path]
        if name == "io.weight":
            self.files[change.path] = _set_line(current, change.value, merge=False)
        elif name == "io.max":
            self.files[change.path] = _set_line(current, change.value, merge=True)
        else:
            self.files[change.path] = change.value.strip() + "\n"


def _set_line(text: str, written: str, merge: bool) -> str:
    """Update the line keyed like ``written`` (``default``/``MAJ:MIN``), as the kernel does."""
    key, _, rest = written.strip().partition(" ")
    lines = [line for line in text.splitlines() if line.strip()]
    for i, line in enumerate(lines):
        if line.split()[0] == key:
            if merge:
                fields = dict(p.partition("=")[::2] for p in line.split()[1:])
                fields.update(dict(p.partition("=")[::2] for p in rest.split()))
                rest = " ".join(f"{k}={v}" for k, v in fields.items())
            lines[i] = f"{key} {rest}"
            return "\n".join(lines) + "\n"
    if merge:
        fields = {"rbps": "max", "wbps": "max", "riops": "max", "wiops": "max"}
        fields.update(dict(p.partition("=")[::2] for p in rest.split()))
        rest = " ".join(f"{k}={v}" for k, v in fields.items())
    return "\n".join(lines + [f"{key} {rest}"]) + "\n"


def _undo(writer: CgroupWriter, steps: Iterable[Step]) -> List[str]:
    """Write every restore of ``steps`` (last step first); the failures, as text."""
    failures: List[str] = []
    for step in reversed(list(steps)):
        for change in step.restore:
            try:
                writer.write(change)
            except HostLimitError as err:
                failures.append(str(err))
    return failures


def apply_plan(writer: CgroupWriter, plan: Plan) -> None:
    """Apply each step in order; on a failure, undo what was applied, then raise."""
    done: List[Step] = []
    for step in plan.steps:
        try:
            for change in step.apply:
                writer.write(change)
        except HostLimitError as err:
            failures = _undo(writer, done + [step])
            if failures:
                log.error("host rung: undo after a failed limit also failed: %s",
                          "; ".join(failures))
            raise HostLimitError(f"error limiting {step.knob}: {err.message}") from err
        done.append(step)


def restore_plan(writer: CgroupWriter, plan: Plan) -> None:
    """Put every knob back as it was read; tries them all, then raises if any failed."""
    failures = _undo(writer, plan.steps)
    if failures:
        raise HostLimitError("error restoring host limits: " + "; ".join(failures))
