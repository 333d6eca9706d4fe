"""The hooks' config cache: only ever faster, never different, never user-writable."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

from slurmiso.config import cache, load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "etc", "slurmiso.yaml")

pytestmark = pytest.mark.needs_root(reason="the config cache is used by root only")


def test_second_load_comes_from_cache_and_edits_invalidate_it(tmp_path: Any, monkeypatch: Any) -> None:
    monkeypatch.setenv("SLURMISO_CACHE_DIR", str(tmp_path / "cache"))
    cfg_path = tmp_path / "c.yaml"
    shutil.copy(EXAMPLE, cfg_path)
    first = load_config(str(cfg_path))
    assert cache.lookup(str(cfg_path)) is not None
    second = load_config(str(cfg_path))
    assert [c.name for c in second.classes] == [c.name for c in first.classes]
    text = cfg_path.read_text().replace("thread_percentage: 60", "thread_percentage: 55")
    cfg_path.write_text(text)
    assert cache.lookup(str(cfg_path)) is None  # size/mtime changed: stale entry ignored
    third = load_config(str(cfg_path))
    assert third.job_class("train").mps.thread_percentage == 55  # type: ignore[union-attr]


def test_cache_in_a_group_writable_dir_is_ignored(tmp_path: Any, monkeypatch: Any) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    os.chmod(folder, 0o777)
    monkeypatch.setenv("SLURMISO_CACHE_DIR", str(folder))
    load_config(EXAMPLE)
    assert os.listdir(folder) == []
    assert cache.lookup(EXAMPLE) is None


def test_cached_config_is_still_validated(tmp_path: Any, monkeypatch: Any) -> None:
    import json

    monkeypatch.setenv("SLURMISO_CACHE_DIR", str(tmp_path / "cache"))
    cfg_path = tmp_path / "c.yaml"
    shutil.copy(EXAMPLE, cfg_path)
    load_config(str(cfg_path))
    (entry,) = list((tmp_path / "cache").iterdir())
    data = json.loads(entry.read_text())
    data["data"]["classes"][0]["mps"]["thread_percentage"] = 150
    entry.write_text(json.dumps(data))
    from slurmiso.errors import ConfigError

    with pytest.raises(ConfigError, match="150"):
        load_config(str(cfg_path))


def test_the_cache_is_written_by_the_one_atomic_write(tmp_path: Any, monkeypatch: Any) -> None:
    """store() goes through slurmiso.atomic.write_atomic (fsync of file and directory, an
    exclusive random temp name), owner-only, and leaves no temp file behind."""
    from slurmiso import atomic

    folder = tmp_path / "cache"
    monkeypatch.setenv("SLURMISO_CACHE_DIR", str(folder))
    calls = []
    real = atomic.write_atomic

    def spy(path: str, data: Any, mode: Any = None) -> None:
        calls.append((path, mode))
        real(path, data, mode)

    monkeypatch.setattr(atomic, "write_atomic", spy)
    cfg_path = tmp_path / "c.yaml"
    shutil.copy(EXAMPLE, cfg_path)
    load_config(str(cfg_path))
    (entry,) = list(folder.iterdir())
    assert calls == [(str(entry), 0o600)]
    assert os.stat(entry).st_mode & 0o777 == 0o600
    assert cache.lookup(str(cfg_path)) is not None
