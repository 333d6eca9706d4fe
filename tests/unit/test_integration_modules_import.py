"""The sandbox tests must at least import: a rename in the library breaks them silently where
no sandbox runs (unit-only runs), so import each one here."""

from __future__ import annotations

import importlib
import os

import pytest

FOLDER = os.path.join(os.path.dirname(os.path.dirname(__file__)), "integration")
MODULES = sorted(f[:-3] for f in os.listdir(FOLDER) if f.startswith("test_") and f.endswith(".py"))


@pytest.mark.parametrize("name", MODULES)
def test_integration_module_imports(name: str) -> None:
    module = importlib.import_module(f"tests.integration.{name}")
    assert any(n.startswith("test_") for n in dir(module))
