"""slurmiso.atomic: the one atomic, durable file replacement."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any, List

import pytest

import slurmiso
from slurmiso import atomic


def test_writes_replaces_and_leaves_no_temp_file(tmp_path: Path) -> None:
    target = tmp_path / "f.json"
    atomic.write_atomic(str(target), "old")
    atomic.write_atomic(str(target), b"new\xc3\xa9")
    assert target.read_bytes() == b"new\xc3\xa9"
    assert os.listdir(tmp_path) == ["f.json"]


def test_mode_is_exact_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o077)
    try:
        atomic.write_atomic(str(tmp_path / "a"), "x", 0o644)
        atomic.write_atomic(str(tmp_path / "b"), "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a").st_mode) == 0o644
    assert stat.S_IMODE(os.stat(tmp_path / "b").st_mode) == 0o600  # open()'s 0666 less umask


def test_fsyncs_the_file_and_then_the_directory(tmp_path: Path, monkeypatch: Any) -> None:
    synced: List[str] = []
    real = os.fsync

    def spy(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    atomic.write_atomic(str(tmp_path / "f"), "x")
    assert synced == ["file", "dir"]


def test_not_durable_skips_the_fsyncs_only(tmp_path: Path, monkeypatch: Any) -> None:
    synced: List[int] = []
    monkeypatch.setattr(os, "fsync", synced.append)
    atomic.write_atomic(str(tmp_path / "f"), "x", 0o644, durable=False)
    assert synced == [] and (tmp_path / "f").read_text() == "x"
    assert stat.S_IMODE(os.stat(tmp_path / "f").st_mode) == 0o644
    assert os.listdir(tmp_path) == ["f"]


def test_failed_rename_keeps_the_old_file_and_removes_the_temp(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "inside").write_text("keep")
    with pytest.raises(OSError):
        atomic.write_atomic(str(tmp_path / "d"), "x")  # cannot replace a non-empty directory
    assert sorted(os.listdir(tmp_path)) == ["d"]
    assert (tmp_path / "d" / "inside").read_text() == "keep"


def test_no_other_module_renames_files_by_hand() -> None:
    """One implementation: every atomic write in the runtime package goes through atomic.py.

    Not yet converted, with the reason: config/cache.py (a cache, rewritten by the hook
    start-up work in parallel) and the sandbox (a development tool being moved out).
    """
    root = Path(slurmiso.__file__).parent
    allowed = {root / "atomic.py", root / "config" / "cache.py"}
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if p not in allowed
        and "sandbox" not in p.parts
        and ("os.replace(" in p.read_text() or "os.rename(" in p.read_text())
    ]
    assert offenders == []
