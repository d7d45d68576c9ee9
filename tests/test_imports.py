"""Imports: no cycles in ``packer/`` or ``readers/``, and training jobs import ``readers`` alone
(it must not pull in the conversion side).

The cycle check reads the source with :mod:`ast` (nothing is imported): every ``import`` and
``from ... import`` statement, at the top of a module or inside a function (a lazy import is
still an import: ``A`` calling into ``B`` that calls back into ``A`` is the same cycle), relative
imports resolved, ``from pkg import sub`` counted as importing the submodule ``pkg.sub``.
Imports under ``if TYPE_CHECKING:`` never run and are left out.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

CONVERSION_ONLY = ["click", "cv2", "packer"]  # (torch itself imports tqdm when installed)
ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("packer", "readers")


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` (both dotted names), at ``where`` (``path:line``)."""

    source: str
    target: str
    where: str


def module_files(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` file of ``packages`` under ``root``."""
    modules: dict[str, Path] = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _type_checking_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes inside ``if TYPE_CHECKING:`` blocks."""
    hidden: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and (
            (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
        ):
            hidden.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    return hidden


def imported_names(name: str, path: Path) -> list[tuple[tuple[str, ...], int]]:
    """What module ``name`` (file ``path``) imports, with the line: for each imported name, the
    absolute dotted names it may be, most specific first (``from X import y``: the submodule
    ``X.y`` if there is one, else ``X``, whose attribute ``y`` is)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    hidden = _type_checking_only(tree)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found: list[tuple[tuple[str, ...], int]] = []
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            found += [((alias.name,), node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                assert node.level <= len(package), f"{path}:{node.lineno}: relative import beyond the top package"
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found += [((f"{base}.{alias.name}", base) if alias.name != "*" else (base,), node.lineno) for alias in node.names]
    return found


def import_graph(root: Path = ROOT, packages: tuple[str, ...] = PACKAGES) -> list[Edge]:
    """The import edges between the modules of ``packages`` (imports of anything else are dropped).
    ``import a.b.c`` goes to the longest prefix that is one of our modules (the parent packages
    it also runs are not edges: every submodule would otherwise import its own package)."""
    modules = module_files(root, packages)
    edges: dict[tuple[str, str], Edge] = {}
    for name, path in modules.items():
        for candidates, line in imported_names(name, path):
            target = next((c for c in candidates if c in modules), candidates[-1])
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and (name, target) not in edges:
                edges[name, target] = Edge(name, target, f"{path.relative_to(root)}:{line}")
    return list(edges.values())


def import_cycles(edges: list[Edge]) -> list[tuple[list[str], list[Edge]]]:
    """Every group of modules that import each other (each strongly connected component of more
    than one module; Tarjan's algorithm): its sorted members and one cycle through them."""
    graph: dict[str, list[Edge]] = {}
    for edge in edges:
        graph.setdefault(edge.source, []).append(edge)
        graph.setdefault(edge.target, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:  # recursion depth is bounded by the number of modules
        index[node] = low[node] = len(index)
        stack.append(node)
        for edge in graph[node]:
            if edge.target not in index:
                visit(edge.target)
                low[node] = min(low[node], low[edge.target])
            elif edge.target in stack:
                low[node] = min(low[node], index[edge.target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [(sorted(component), _one_cycle(graph, component)) for component in components]


def _one_cycle(graph: dict[str, list[Edge]], component: set[str]) -> list[Edge]:
    """A shortest cycle through the component's first module (breadth-first back to it)."""
    start = min(component)
    came: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for edge in graph[node]:
                if edge.target not in component:
                    continue
                if edge.target == start:
                    path = [edge]
                    while path[0].source != start:
                        path.insert(0, came[path[0].source])
                    return path
                if edge.target not in came:
                    came[edge.target] = edge
                    following.append(edge.target)
        frontier = following
    raise AssertionError(f"no cycle through {start} in {sorted(component)}")  # pragma: no cover - Tarjan found one


def describe(cycle: list[Edge]) -> str:
    """``a -> b -> a (a.py:3, b.py:9)``."""
    names = " -> ".join([cycle[0].source] + [edge.target for edge in cycle])
    return f"{names} ({', '.join(edge.where for edge in cycle)})"


def report(cycles: list[tuple[list[str], list[Edge]]]) -> str:
    """One line per group: its members, then one of its cycles with the lines that import."""
    return "\n".join(f"{{{', '.join(members)}}}: {describe(cycle)}" for members, cycle in cycles)


def test_no_import_cycles_in_packer_or_readers():
    """A cycle means a third module is missing (STYLE.md: "No import cycles")."""
    edges = import_graph()
    assert any(e.source == "packer.api" for e in edges) and any(e.source.startswith("readers.") for e in edges)
    cycles = import_cycles(edges)
    assert not cycles, "modules that import each other (a third module is missing):\n" + report(cycles)


def test_the_scan_finds_lazy_and_relative_imports_and_their_cycles(tmp_path):
    """The scanner itself, on a made-up package: a lazy import inside a function closes a cycle,
    ``from . import sub`` is the submodule, TYPE_CHECKING imports are left out."""
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import run\n")
    (pkg / "a.py").write_text("from .sub import b\n\ndef run():\n    return b.go()\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("import os\n\ndef go():\n    from ..a import run\n    return run\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import run\nfrom . import sub\n")
    edges = import_graph(tmp_path, ("pkg",))
    assert {(e.source, e.target) for e in edges} == {
        ("pkg", "pkg.a"), ("pkg.a", "pkg.sub.b"), ("pkg.sub.b", "pkg.a"), ("pkg.c", "pkg.sub"),
    }
    assert report(import_cycles(edges)) == "{pkg.a, pkg.sub.b}: pkg.a -> pkg.sub.b -> pkg.a (pkg/a.py:1, pkg/sub/b.py:4)"


def test_readers_never_import_the_conversion_side():
    """Statically, lazy imports included: no module of ``readers/`` imports packer, click or cv2."""
    modules = module_files(ROOT, ("readers",))
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {target}"
        for name, path in modules.items()
        for candidates, line in imported_names(name, path)
        for target in candidates[-1:]
        if target.split(".")[0] in CONVERSION_ONLY
    ]
    assert not found, "\n".join(found)


def loaded_after(code: str) -> set[str]:
    probe = f"import sys, json\n{code}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_readers_import_nothing_from_the_conversion_side():
    modules = loaded_after("import readers\nfrom readers import LMDBDataset, Normalize\nLMDBDataset, Normalize")
    assert "readers.lmdb" in modules and "torch" in modules
    assert not [m for m in CONVERSION_ONLY if m in modules]


def test_importing_readers_is_lazy():
    modules = loaded_after("import readers")
    assert "torch" not in modules and "lmdb" not in modules


def test_the_cli_does_not_import_torch():
    modules = loaded_after("from packer.cli import cli\nimport packer.info")
    assert "torch" not in modules


def test_a_reader_asked_of_packer_names_the_readers_package():
    """``packer.LMDBDataset`` (a newcomer's guess) said only "no attribute"."""
    import packer

    with pytest.raises(AttributeError, match=r"the reading side is the top-level package 'readers' \(from readers import LMDBDataset\)"):
        packer.LMDBDataset
    assert not hasattr(packer, "no_such_name")


def test_an_extras_install_hint_names_this_checkout():
    """``pip install 'packer[gpu]'`` outside the checkout installs PyPI's 'packer', another
    project (a newcomer walkthrough): the hints name the checkout, editable."""
    from readers.extras import install_hint
    from readers.nvjpeg import GPU_EXTRA

    root = Path(__file__).resolve().parents[1]
    assert install_hint("ray") == f"pip install -e '{root}[ray]'" and GPU_EXTRA == install_hint("gpu")
