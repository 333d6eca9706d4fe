"""No module of ``slurmiso`` reads another module's underscore names.

A leading underscore says "only this module relies on it": a second module that imports
``_name`` (or reads ``module._name``) turns a private detail into an interface nobody
declared, and the owner's next change breaks it silently (the audit's fused reader once
reached into five such names). Every module is parsed with :mod:`ast`, imports inside
functions included; dunder names (``__version__``) are public by convention.

Two forms are checked: ``from slurmiso.x import _y`` (relative imports resolved) and
``m._y`` where ``m`` is bound to a ``slurmiso`` module by an import (``import slurmiso.x as
m``, ``from slurmiso import x``, ``import slurmiso.x`` then ``slurmiso.x._y``).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set, Tuple

import slurmiso

ROOT = Path(slurmiso.__file__).parent

#: Reads allowed, each "module: module._name" (or "module: from x import _name"): none. A
#: shared detail gets a public name in the module that owns it (issue 34).
ALLOWED: Set[str] = set()


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_module(name: str) -> bool:
    """Whether the dotted ``slurmiso`` name is a module or package of the tree."""
    path = ROOT.parent.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def resolve(node: ast.ImportFrom, package: str) -> Optional[str]:
    """The absolute module a ``from ... import`` names (None: not ``slurmiso``)."""
    if node.level:
        base = package.split(".")
        if node.level > 1:
            base = base[: len(base) - node.level + 1]
        mod = ".".join(base + ([node.module] if node.module else []))
    else:
        mod = node.module or ""
    return mod if mod == "slurmiso" or mod.startswith("slurmiso.") else None


def dotted(node: ast.expr) -> Optional[str]:
    """``a.b.c`` for a chain of names and attributes, else None."""
    parts: List[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def violations_in(source: str, mod: str, package: str) -> List[Tuple[str, int]]:
    """(what is read, line) for each underscore name ``source`` reads from another module."""
    tree = ast.parse(source)
    aliases: Dict[str, str] = {}  # local name -> the slurmiso module it is bound to
    found: List[Tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = resolve(node, package)
            if target is None:
                continue
            for alias in node.names:
                if private(alias.name) and target != mod:
                    found.append((f"from {target} import {alias.name}", node.lineno))
                elif is_module(f"{target}.{alias.name}"):
                    aliases[alias.asname or alias.name] = f"{target}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "slurmiso" or alias.name.startswith("slurmiso."):
                    if alias.asname:
                        aliases[alias.asname] = alias.name
                    else:  # ``import slurmiso.x.y`` binds ``slurmiso``; chains are read whole
                        aliases["slurmiso"] = "slurmiso"
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not private(node.attr):
            continue
        chain = dotted(node.value)
        if chain is None:
            continue
        head, _, rest = chain.partition(".")
        if head not in aliases:
            continue
        target = aliases[head] + ("." + rest if rest else "")
        if is_module(target) and target != mod:
            found.append((f"{target}.{node.attr}", node.lineno))
    return found


def all_violations() -> List[Tuple[str, str]]:
    """("module: what it reads", "file:line") over the whole package."""
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        mod = module_name(path)
        package = mod if path.name == "__init__.py" else mod.rsplit(".", 1)[0]
        for what, line in violations_in(path.read_text(), mod, package):
            out.append((f"{mod}: {what}", f"{path.relative_to(ROOT.parent)}:{line}"))
    return out


def test_no_module_reads_another_modules_private_names() -> None:
    found = all_violations()
    new = [f"{where}: {what}" for what, where in found if what not in ALLOWED]
    assert not new, "private names read across modules:\n" + "\n".join(new)


def test_the_allow_list_only_shrinks() -> None:
    stale = ALLOWED - {what for what, _ in all_violations()}
    assert not stale, "fixed, so delete from ALLOWED:\n" + "\n".join(sorted(stale))


def test_the_checker_sees_each_form() -> None:
    source = (
        "import slurmiso.audit.read.digest as fold\n"
        "import slurmiso.audit.read.digest\n"
        "from slurmiso.audit.read import parallel\n"
        "from slurmiso.audit.read.sacct import _repair, __doc__\n"
        "from .sibling import _hidden\n"
        "def f(x):\n"
        "    from slurmiso.config import _lazy\n"
        "    return (fold._CACHE, slurmiso.audit.read.digest._HOURS, parallel._merge, x._own,\n"
        "            fold.__name__, fold.public)\n"
    )
    got = sorted(what for what, _ in violations_in(source, "slurmiso.demo.mod", "slurmiso.demo"))
    assert got == sorted([
        "from slurmiso.audit.read.sacct import _repair",
        "from slurmiso.demo.sibling import _hidden", "from slurmiso.config import _lazy",
        "slurmiso.audit.read.digest._CACHE", "slurmiso.audit.read.digest._HOURS",
        "slurmiso.audit.read.parallel._merge"])
