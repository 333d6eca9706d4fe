"""Shared test helpers. Integration fixtures live in tests/integration/conftest.py."""

from __future__ import annotations

import os
import shutil
import sys
from typing import List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _private_config_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests run as root: keep the hooks' config cache out of /run (see config/cache.py)."""
    os.environ["SLURMISO_CACHE_DIR"] = str(tmp_path_factory.mktemp("config-cache"))


#: What ``needs_toolchain("cc")`` accepts as a C compiler (the tests build with whichever).
C_COMPILERS = ("gcc", "cc")


def _reason(mark: pytest.Mark) -> str:
    reason = mark.kwargs.get("reason", "")
    if not reason:
        raise pytest.UsageError(f"@pytest.mark.{mark.name} needs reason=...: say what it is for")
    return str(reason)


def _missing_tool(tool: str) -> bool:
    names = C_COMPILERS if tool == "cc" else (tool,)
    return all(shutil.which(name) is None for name in names)


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    """``needs_root(reason=...)`` and ``needs_toolchain(TOOL..., reason=...)`` (pyproject.toml
    registers them): a run without root or without the tools skips those tests, each with
    what it lacks and why, so a user's ``pytest -ra`` lists what only CI (root, with a
    compiler) checked."""
    root = os.geteuid() == 0
    for item in items:
        for mark in item.iter_markers("needs_root"):
            if not root:
                item.add_marker(pytest.mark.skip(reason=f"needs root: {_reason(mark)}"))
        for mark in item.iter_markers("needs_toolchain"):
            missing = [t for t in (mark.args or ("cc",)) if _missing_tool(t)]
            if missing:
                names = ["a C compiler (gcc or cc)" if t == "cc" else t for t in missing]
                why = f"needs {' and '.join(names)} on PATH: {_reason(mark)}"
                item.add_marker(pytest.mark.skip(reason=why))
