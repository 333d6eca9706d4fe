"""``<dir>/run/sandbox.json``: what ``up`` recorded about a sandbox dir.

    recorded(root).get("slurm")   # the release, port base, plain GPU, cgroup, munged pid

A dir made for one release or cgroup version is not reused for another: the choices read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

from slurmiso_sandbox import files, layout


def recorded(root: str) -> Dict[str, Any]:
    """What ``up`` recorded in the dir ``root`` ({} when nothing, or unreadable)."""
    try:
        data = json.loads(Path(root, "run", "sandbox.json").read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def record(site: layout.Site, **updates: Any) -> None:
    """Update the record with ``updates`` (the file is rewritten only when it changes)."""
    data = recorded(site.root)
    data.update(updates)
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    files.write_if_changed(site.path("run", "sandbox.json"), text, 0o644)


def plain_spec(site: layout.Site) -> str:
    """The ``--plain-gpu`` a site was made with ("" for the default models)."""
    plain = [n for n in site.nodes if n.mode in layout.PLAIN_MODES]
    if not plain or all(n.gpu_model == d.gpu_model for n, d in zip(plain, (
            d for d in layout.NODES if d.mode in layout.PLAIN_MODES))):
        return ""
    n = plain[0]
    return f"{n.gpu_model}:{n.gpu_memory_mb}M" if n.gpu_memory_mb else n.gpu_model
