"""Where a requeued job resumes from: ``<ckpt dir>/.slurmiso/latest.json`` and the env.

``latest.json`` names the last checkpoint the program *reported complete* and the wrapper
found on disk. It is replaced atomically (temp file, fsync, rename, fsync of the directory),
so a wrapper SIGKILLed at the end of the grace leaves the old version or the new one, never
half of one. On read, a record that does not parse, or whose checkpoint has since vanished,
is not offered: the program then starts fresh rather than from something broken.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional

from slurmiso.atomic import write_atomic
from slurmiso.errors import UsageError
from slurmiso.wrapper.checkpoint_protocol import Report, marker_path, meta_dir

log = logging.getLogger(__name__)

LATEST_NAME = "latest.json"
SCHEMA = 1


@dataclass(frozen=True)
class Latest:
    path: str
    step: Optional[int]
    bytes: int
    ident: str
    restart_count: int
    ts: float


def default_ckpt_dir(env: Dict[str, str], job_id: str, cwd: str) -> str:
    """``$SLURMISO_CKPT_DIR``, else ``<cwd>/slurmiso-ckpt/<job id or 'local'>``.

    Slurm keeps the job id across requeues, so the directory is found again on restart.
    """
    explicit = env.get("SLURMISO_CKPT_DIR", "")
    if explicit:
        return os.path.abspath(explicit)
    return os.path.join(cwd, "slurmiso-ckpt", job_id or "local")


class CheckpointStore:
    """The checkpoint directory's ``.slurmiso`` metadata."""

    def __init__(self, ckpt_dir: str) -> None:
        self.ckpt_dir = os.path.abspath(ckpt_dir)
        self.meta_dir = meta_dir(self.ckpt_dir)
        self.latest_path = os.path.join(self.meta_dir, LATEST_NAME)
        self.marker = marker_path(self.ckpt_dir)

    def ensure(self) -> None:
        try:
            os.makedirs(self.meta_dir, exist_ok=True)
        except OSError as exc:
            raise UsageError(
                f"cannot create the checkpoint directory {self.meta_dir}: {exc.strerror}",
                hint="pass --ckpt-dir on a filesystem the job can write (and that survives "
                "a requeue to another node)",
            ) from None

    def read(self) -> Optional[Latest]:
        """The last good checkpoint, or None (none yet, unreadable, or gone from disk)."""
        try:
            with open(self.latest_path, encoding="utf-8") as fh:
                data = json.load(fh)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable %s (%s); starting fresh", self.latest_path, exc)
            return None
        try:
            latest = Latest(
                path=str(data["path"]),
                step=data.get("step") if isinstance(data.get("step"), int) else None,
                bytes=int(data.get("bytes", 0)),
                ident=str(data.get("ident", "")),
                restart_count=int(data.get("restart_count", 0)),
                ts=float(data.get("ts", 0.0)),
            )
        except (KeyError, TypeError, ValueError):
            log.warning("ignoring malformed %s; starting fresh", self.latest_path)
            return None
        if not os.path.exists(latest.path):
            log.warning(
                "the last recorded checkpoint %s no longer exists; not offering it",
                latest.path,
            )
            return None
        return latest

    def record(self, report: Report, size: int, restart_count: int) -> Latest:
        """Make ``report`` the checkpoint offered on the next start (atomic, durable)."""
        latest = Latest(
            path=report.path,
            step=report.step,
            bytes=size,
            ident=report.ident,
            restart_count=restart_count,
            ts=round(time.time(), 3),
        )
        body: Dict[str, Any] = {"schema": SCHEMA, **latest.__dict__}
        self.ensure()
        write_atomic(self.latest_path, json.dumps(body))
        return latest


def resume_env(
    store: CheckpointStore,
    latest: Optional[Latest],
    restart_count: int,
    ckpt_signal: str,
    rank: int,
) -> Dict[str, str]:
    """The variables the program reads (documented in docs/checkpoint.md)."""
    env = {
        "SLURMISO_WRAPPED": "1",
        "SLURMISO_CKPT_DIR": store.ckpt_dir,
        "SLURMISO_CKPT_MARKER": store.marker,
        "SLURMISO_CKPT_SIGNAL": ckpt_signal,
        "SLURMISO_CKPT_RANK": str(rank),
        "SLURMISO_RESTART_COUNT": str(restart_count),
        "SLURMISO_RESUME": latest.path if latest else "",
    }
    if latest and latest.step is not None:
        env["SLURMISO_RESUME_STEP"] = str(latest.step)
    return env
