"""The layering the code claims, checked from the imports themselves.

Every module of ``slurmiso`` is parsed with :mod:`ast` (so imports inside functions and under
``TYPE_CHECKING`` count: a lazy import is still a dependency). Units are the subpackages
(``config``, ``isolation``, ...) and the top-level modules (``errors``, ``units``, ...).
Two rules: no cycle among units, and nothing outside ``slurmiso/cli`` imports the CLI (the
CLI is the thinnest layer; ``slurmiso/__main__.py`` is its entry point). Inside each subpackage,
no cycle among its modules either, but for the few lazy ones listed with their reason; the node
agent and the monitor meet only in leaves (``exposition``, ``restraints``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterable, List, Set, Tuple

import slurmiso

ROOT = Path(slurmiso.__file__).parent
#: Entry points allowed to import the CLI.
CLI_ENTRY_POINTS = {"slurmiso.__main__"}

Edge = Tuple[str, str, str]  # (importing module, imported module, "file:line")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> List[Tuple[str, int]]:
    """Every ``slurmiso`` module ``path`` imports, anywhere in the file, with its line."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
    return imports_in(path.read_text(), package)


def imports_in(source: str, package: str) -> List[Tuple[str, int]]:
    """The ``slurmiso`` modules ``source`` (a module of ``package``) imports, with lines."""
    out: List[Tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.append((target, node.lineno))
            # ``from slurmiso import cli`` imports the module slurmiso.cli
            out.extend((f"{target}.{a.name}", node.lineno) for a in node.names)
    return [(t, line) for t, line in out if t == "slurmiso" or t.startswith("slurmiso.")]


def unit_of(module: str) -> str:
    """``slurmiso.isolation.mps`` -> ``isolation``; ``slurmiso.errors`` -> ``errors``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def all_edges() -> List[Edge]:
    units = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    units |= {p.stem for p in ROOT.glob("*.py")}
    edges: List[Edge] = []
    for path in sorted(ROOT.rglob("*.py")):
        src = module_name(path)
        for target, line in imports_of(path):
            if unit_of(target) in units:
                edges.append((src, target, f"{path.relative_to(ROOT.parent)}:{line}"))
    return edges


def cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components of more than one node (Tarjan), each sorted."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def unit_graph(edges: Iterable[Edge]) -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {}
    for src, dst, _ in edges:
        a, b = unit_of(src), unit_of(dst)
        if a and b and a != b:
            graph.setdefault(a, set()).add(b)
    return graph


def test_no_package_cycles() -> None:
    edges = all_edges()
    found = cycles(unit_graph(edges))
    detail = [
        f"{where}: {src} -> {dst}"
        for comp in found
        for src, dst, where in edges
        if unit_of(src) in comp and unit_of(dst) in comp and unit_of(src) != unit_of(dst)
    ]
    assert not found, f"package cycles {found}:\n" + "\n".join(detail)


def test_library_never_imports_the_cli() -> None:
    bad = [
        f"{where}: {src} imports {dst}"
        for src, dst, where in all_edges()
        if unit_of(dst) == "cli" and unit_of(src) != "cli" and src not in CLI_ENTRY_POINTS
    ]
    assert not bad, "library code imports the CLI:\n" + "\n".join(bad)


def test_the_parser_sees_lazy_relative_and_type_only_imports() -> None:
    """The checks above can fail: the parser finds every kind of import they rely on."""
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from slurmiso.slurm.jobenv import JobEnv\n"
        "def f():\n"
        "    from ..cli.reconcile import run\n"
        "    import slurmiso.audit.live\n"
        "    from slurmiso import cli\n"
        "import os\n"
    )
    found = {t for t, _ in imports_in(source, "slurmiso.monitor")}
    assert {"slurmiso.slurm.jobenv", "slurmiso.cli.reconcile", "slurmiso.audit.live",
            "slurmiso.cli"} <= found
    assert not any(t == "os" for t in found)
    assert [unit_of(t) for t in ("slurmiso.cli.reconcile", "slurmiso.errors")] == ["cli", "errors"]


def test_cycle_finder_reports_a_cycle_and_only_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}, "d": {"a", "c"}}) == []
    assert cycles({"hooks": {"isolation"}, "isolation": {"hooks"}}) == [["hooks", "isolation"]]


def test_backend_abilities_are_declared_not_probed() -> None:
    """Callers read ``backend.capabilities``; no ``getattr(backend, ...)`` probe and no test
    of a backend's name remain (the sandbox, a development tool, is left out)."""
    probes = []
    for path in sorted(ROOT.rglob("*.py")):
        if "sandbox" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr") and node.args
                    and "backend" in ast.unparse(node.args[0])):
                probes.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
            if (isinstance(node, ast.Compare) and "name" in ast.unparse(node.left)
                    and any(isinstance(c, ast.Constant) and c.value in ("sim", "nvml")
                            for c in node.comparators)):
                probes.append(f"{path.relative_to(ROOT.parent)}:{node.lineno}")
    assert probes == []


#: Leaf modules: shared by sides that must not import each other, so they import nothing of
#: slurmiso themselves (and stay cheap on the hooks' start-up path).
LEAVES = ("slurmiso/jobfiles.py", "slurmiso/pids.py", "slurmiso/sluid.py")


def test_leaf_modules_import_nothing_of_slurmiso() -> None:
    bad = [f"{leaf}:{line} imports {target}" for leaf in LEAVES
           for target, line in imports_of(ROOT.parent / leaf)]
    assert bad == []



def test_the_wrapper_meets_the_hooks_only_through_the_contract_module() -> None:
    """What the wrapper writes and the epilog reads is named once, in slurmiso/jobfiles.py:
    the wrapper imports nothing of the hooks (issue 27)."""
    bad = [f"{where}: {src} imports {dst}" for src, dst, where in all_edges()
           if unit_of(src) == "wrapper" and unit_of(dst) == "hooks"]
    assert bad == []


#: Units both the agent and the monitor read.
SHARED_LEAVES = ("exposition", "restraints")


def test_the_agent_and_the_monitor_meet_only_in_leaves() -> None:
    """The node agent (``slurmiso/agent``) and the controller (``slurmiso/monitor``) never
    import each other (the CLI hands the monitor the agent's reader for ``--telemetry
    local``); what both read is in leaves that import neither (issue 34)."""
    sides = {"agent", "monitor"}
    bad = [f"{where}: {src} imports {dst}" for src, dst, where in all_edges()
           if {unit_of(src), unit_of(dst)} == sides]
    bad += [f"{where}: {src} imports {dst}" for src, dst, where in all_edges()
            if unit_of(src) in SHARED_LEAVES and unit_of(dst) in sides]
    assert bad == []



def eager_imports_in(source: str, package: str) -> List[Tuple[str, int]]:
    """The ``slurmiso`` modules ``source`` imports when it is imported: at module level,
    neither inside a function nor under ``if TYPE_CHECKING:``."""
    stmts: List[ast.stmt] = []
    todo = list(ast.parse(source).body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            stmts.append(node)
        elif isinstance(node, ast.Try):
            todo.extend(node.body + node.orelse + node.finalbody)
            todo.extend(stmt for handler in node.handlers for stmt in handler.body)
        elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
            todo.extend(node.body + node.orelse)
    eager = {n.lineno for n in stmts}
    return [(t, line) for t, line in imports_in(source, package) if line in eager]


def module_graph(eager_only: bool = False) -> Dict[str, Set[str]]:
    """Module -> the tree's modules it imports (not its own ancestors, which Python imports
    first anyway)."""
    modules = {module_name(p) for p in ROOT.rglob("*.py")}
    graph: Dict[str, Set[str]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        src = module_name(path)
        if eager_only:
            package = src if path.name == "__init__.py" else src.rsplit(".", 1)[0]
            found = eager_imports_in(path.read_text(), package)
        else:
            found = imports_of(path)
        graph[src] = {t for t, _ in found
                      if t in modules and t != src and not src.startswith(t + ".")}
    return graph


def package_cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Cycles among the modules of each subpackage of ``slurmiso`` (nested ones included),
    each reported once."""
    packages = sorted(module_name(p) for p in ROOT.rglob("__init__.py")
                      if p.parent != ROOT)
    found: List[List[str]] = []
    for pkg in packages:
        inside = {m: {t for t in ts if t.startswith(pkg + ".")}
                  for m, ts in graph.items() if m.startswith(pkg + ".")}
        found += [c for c in cycles(inside) if c not in found]
    return found


#: Module cycles inside a subpackage that are allowed, each closed only by a lazy or
#: type-only import (checked below), with why it is there.
LAZY_CYCLES: Dict[Tuple[str, ...], str] = {
    ("slurmiso.audit.figures.aggregate", "slurmiso.audit.figures.kernel"):
        "the kernel names the Aggregator it feeds in annotations only (TYPE_CHECKING)",
    ("slurmiso.gpu.backend", "slurmiso.gpu.protocols"):
        "backend re-exports the protocols on first use, so the hooks never import typing's "
        "Protocol machinery at start-up",
    ("slurmiso.gpu.catalogue", "slurmiso.gpu.profiles"):
        "profiles loads the model tables of the catalogue on first use, off the hooks' "
        "start-up path",
}


def test_no_module_cycles_inside_a_subpackage() -> None:
    found = package_cycles(module_graph())
    unlisted = [c for c in found if tuple(c) not in LAZY_CYCLES]
    assert unlisted == [], f"module cycles inside a subpackage: {unlisted}"
    stale = [c for c in LAZY_CYCLES if list(c) not in found]
    assert stale == [], f"listed in LAZY_CYCLES but gone (remove them): {stale}"


def test_the_allowed_cycles_are_lazy() -> None:
    """Counting only the imports that run at import time, no subpackage has a cycle: each
    listed one is closed by a lazy or type-only import."""
    assert package_cycles(module_graph(eager_only=True)) == []


def test_eager_imports_leave_out_functions_and_type_checking() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "from slurmiso.errors import SlurmisoError\n"
        "if TYPE_CHECKING:\n"
        "    from slurmiso.slurm.jobenv import JobEnv\n"
        "try:\n"
        "    import slurmiso.units\n"
        "except ImportError:\n"
        "    pass\n"
        "def f():\n"
        "    from slurmiso.audit import live\n"
    )
    assert {t for t, _ in eager_imports_in(source, "slurmiso.monitor")} == {
        "slurmiso.errors", "slurmiso.errors.SlurmisoError", "slurmiso.units"}


def test_the_module_cycle_finder_sees_a_cycle_inside_a_subpackage() -> None:
    graph = {"slurmiso.monitor.a": {"slurmiso.monitor.b"},
             "slurmiso.monitor.b": {"slurmiso.monitor.a", "slurmiso.errors"},
             "slurmiso.errors": {"slurmiso.monitor.a"}}
    assert package_cycles(graph) == [["slurmiso.monitor.a", "slurmiso.monitor.b"]]
