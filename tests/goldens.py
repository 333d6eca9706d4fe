"""Golden files: compared, never written by a test run unless ``UPDATE_GOLDEN=1``.

A missing golden fails like a differing one, so a deleted or never-committed file cannot turn
a test green. ``UPDATE_GOLDEN=1 make unit`` rewrites them all; review the diff, then commit.
"""

from __future__ import annotations

import os
import warnings


def check_golden(path: str, text: str) -> None:
    """Assert ``text`` equals the file at ``path``; write it only when ``UPDATE_GOLDEN=1``."""
    if os.environ.get("UPDATE_GOLDEN") == "1":
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        warnings.warn(f"golden file {path} rewritten (UPDATE_GOLDEN=1); review it", stacklevel=2)
        return
    assert os.path.exists(path), f"golden file {path} is missing (UPDATE_GOLDEN=1 writes it)"
    with open(path, encoding="utf-8") as fh:
        assert text == fh.read(), (f"{path} differs from what the code generates "
                                   "(UPDATE_GOLDEN=1 rewrites it; review the diff)")
