"""The checkpoint contract between the wrapper and any program, in any language.

1. The wrapper exports ``SLURMISO_CKPT_SIGNAL`` (e.g. ``USR2``), ``SLURMISO_CKPT_DIR`` and
   ``SLURMISO_CKPT_MARKER`` (a file path inside ``<ckpt dir>/.slurmiso/``).
2. When asked (the signal) - or whenever it likes, e.g. every N steps - the program writes a
   checkpoint to a **new** path, makes it durable, and only then reports it by writing the
   marker **atomically**: write ``<marker>.tmp``, then rename it onto ``<marker>``. Content:
   JSON ``{"path": "...", "step": 123}`` (``step`` optional) or just the path as text.
3. The wrapper accepts a report only when the path it names exists; it then records it in
   ``.slurmiso/latest.json`` (atomically), which is what ``SLURMISO_RESUME`` offers next time.

So a program that crashes while writing its checkpoint never reported it, and the previous
good checkpoint stays the one offered. Reports are told apart by the marker's content and
modification time, so the marker is never deleted (deleting races a program reporting twice).
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from dataclasses import dataclass
from typing import Optional, Tuple

from slurmiso.atomic import write_atomic

log = logging.getLogger(__name__)

META_DIR = ".slurmiso"
MARKER_NAME = "marker.json"


def meta_dir(ckpt_dir: str) -> str:
    return os.path.join(ckpt_dir, META_DIR)


def marker_path(ckpt_dir: str) -> str:
    return os.path.join(meta_dir(ckpt_dir), MARKER_NAME)


@dataclass(frozen=True)
class Report:
    """One checkpoint the program says it finished."""

    path: str
    step: Optional[int]
    ident: str  # tells this report from the previous one


class BadMarker(ValueError):
    """The marker exists but cannot be understood (written non-atomically, or garbage)."""


def write_marker(marker: str, path: str, step: Optional[int] = None) -> None:
    """Report ``path`` the way the contract says (used by tests and non-helper programs)."""
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    body = {"path": os.path.abspath(path), "step": step, "pid": os.getpid()}
    write_atomic(marker, json.dumps(body))


def read_marker(marker: str) -> Optional[Report]:
    """The report in ``marker``; None when there is none; BadMarker when unreadable."""
    try:
        with open(marker, "rb") as fh:
            st = os.fstat(fh.fileno())
            raw = fh.read(64 * 1024)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise BadMarker(f"cannot read {marker}: {exc.strerror}") from None
    ident = f"{st.st_ino}:{st.st_mtime_ns}:{zlib.crc32(raw):08x}"
    text = raw.decode("utf-8", "replace").strip()
    if not text:
        raise BadMarker(f"{marker} is empty (write it to a temp file, then rename)")
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            raise BadMarker(f"{marker} is not complete JSON (write, then rename)") from None
        path = data.get("path") if isinstance(data, dict) else None
        if not isinstance(path, str) or not path:
            raise BadMarker(f'{marker} has no "path" string')
        step = data.get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else None
    else:
        path, step = text.splitlines()[0].strip(), None
    if not os.path.isabs(path):
        path = os.path.join(os.path.dirname(os.path.dirname(marker)), path)
    return Report(path=os.path.normpath(path), step=step, ident=ident)


def checkpoint_bytes(path: str) -> int:
    """Size of a checkpoint file, or of everything under a checkpoint directory."""
    if os.path.isdir(path):
        total = 0
        for root, _dirs, files in os.walk(path):
            for name in files:
                try:
                    total += os.lstat(os.path.join(root, name)).st_size
                except OSError:
                    pass
        return total
    return os.path.getsize(path)


def verify(report: Report) -> Tuple[bool, int, str]:
    """(ok, bytes, reason): a report counts only when the path it names exists."""
    if not os.path.exists(report.path):
        return False, 0, f"the program reported {report.path}, which does not exist"
    try:
        return True, checkpoint_bytes(report.path), ""
    except OSError as exc:
        return False, 0, f"cannot read the reported checkpoint {report.path}: {exc.strerror}"


class MarkerWatcher:
    """Polls the marker; :meth:`poll` returns each new report once."""

    def __init__(self, marker: str, last_ident: Optional[str] = None) -> None:
        self.marker = marker
        self.last_ident = last_ident
        self.last_error = ""

    def poll(self) -> Optional[Report]:
        try:
            report = read_marker(self.marker)
        except BadMarker as exc:  # maybe mid-write by a non-atomic writer: try again later
            if str(exc) != self.last_error:
                log.debug("%s", exc)
            self.last_error = str(exc)
            return None
        if report is None or report.ident == self.last_ident:
            return None
        self.last_ident = report.ident
        self.last_error = ""
        return report
