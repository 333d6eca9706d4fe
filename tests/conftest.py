"""Shared test helpers. Integration fixtures live in tests/integration/conftest.py."""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


import pytest  # noqa: E402


@pytest.fixture(autouse=True, scope="session")
def _private_config_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests run as root: keep the hooks' config cache out of /run (see config/cache.py)."""
    os.environ["SLURMISO_CACHE_DIR"] = str(tmp_path_factory.mktemp("config-cache"))
