"""No import circle among the sandbox's modules, checked from the imports themselves.

Every module of ``slurmiso_sandbox`` is parsed with :mod:`ast`, so an import inside a function
counts: a lazy import that closes a circle is still a circle (``roots`` once imported
``cluster`` lazily for apt, and ``protect`` a private of ``demo``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import slurmiso_sandbox
from tests.unit.test_layering import cycles

PACKAGE = "slurmiso_sandbox"
ROOT = Path(slurmiso_sandbox.__file__).parent
MODULES = {p.stem for p in ROOT.glob("*.py") if p.stem != "__init__"}


def sandbox_imports(source: str) -> List[Tuple[str, int]]:
    """The ``slurmiso_sandbox`` modules ``source`` imports, anywhere in it, with lines."""
    out: List[Tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(a.name.split(".")[1], node.lineno) for a in node.names
                    if a.name.startswith(f"{PACKAGE}.")]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if module == PACKAGE or (node.level and not module):  # from . import x
                out += [(a.name, node.lineno) for a in node.names]
            elif node.level:  # from .x import y
                out.append((module.split(".")[0], node.lineno))
            elif module.startswith(f"{PACKAGE}."):
                out.append((module.split(".")[1], node.lineno))
    return [(m, line) for m, line in out if m in MODULES]


def import_graph() -> Tuple[Dict[str, Set[str]], Dict[Tuple[str, str], str]]:
    graph: Dict[str, Set[str]] = {}
    where: Dict[Tuple[str, str], str] = {}
    for path in sorted(ROOT.glob("*.py")):
        for target, line in sandbox_imports(path.read_text()):
            if target != path.stem:
                graph.setdefault(path.stem, set()).add(target)
                where.setdefault((path.stem, target), f"{PACKAGE}/{path.name}:{line}")
    return graph, where


def test_no_import_circle_among_sandbox_modules() -> None:
    graph, where = import_graph()
    found = cycles(graph)
    detail = [f"{at}: {src} -> {dst}" for (src, dst), at in sorted(where.items())
              if any(src in comp and dst in comp for comp in found)]
    assert not found, f"import circles {found}:\n" + "\n".join(detail)


def test_the_parser_sees_every_kind_of_sandbox_import() -> None:
    source = (
        "import os\n"
        "import slurmiso_sandbox.layout\n"
        "from slurmiso_sandbox import procs, guard as g\n"
        "from slurmiso_sandbox.roots import Root\n"
        "from . import state\n"
        "from .files import checkout\n"
        "def f():\n"
        "    from slurmiso_sandbox.cluster import up\n"
        "from slurmiso import errors\n"
    )
    found = {m for m, _ in sandbox_imports(source)}
    assert found == {"layout", "procs", "guard", "roots", "state", "files", "cluster"}


def test_the_cluster_is_split_by_concern() -> None:
    """The orchestrator stays short: each concern has its module (issue 34, item 5)."""
    assert {"services", "packages", "cgroups", "munge", "database", "scenes"} <= MODULES
    assert len((ROOT / "cluster.py").read_text().splitlines()) < 400
