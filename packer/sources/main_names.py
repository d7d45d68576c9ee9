"""Which of the program's ``__main__`` names a worker process can import.

A worker started by spawn or forkserver imports the program's script again as ``__mp_main__``,
without running its ``if __name__ == "__main__":`` block, so an object pickled by reference to a
class or function defined inside that block, or in a script read from stdin (``python -``),
cannot be unpickled there ("Can't get attribute 'U' on <module '__mp_main__'>", a worker's
traceback). :func:`pickle_and_main_names` lists the ``__main__`` names an object's pickle refers to;
:func:`importable_in_workers` says whether the script defines them all at its top level.
"""

from __future__ import annotations

import ast
import io
import sys
import types
from multiprocessing.reduction import ForkingPickler
from typing import Any

__all__ = ["pickle_and_main_names", "importable_in_workers"]


class _Recording(ForkingPickler):
    """ForkingPickler noting each class or function of ``__main__`` it pickles by reference."""

    def __init__(self, file: Any, protocol: int | None = None) -> None:
        super().__init__(file, protocol)
        self.main_names: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) and getattr(obj, "__module__", None) == "__main__":
            self.main_names.add(obj.__qualname__.split(".", 1)[0])
        return NotImplemented


def pickle_and_main_names(obj: Any) -> tuple[bytes, set[str]]:
    """``obj``'s pickle as a worker is sent it, and the top-level ``__main__`` names it refers to."""
    buffer = io.BytesIO()
    pickler = _Recording(buffer)
    pickler.dump(obj)
    return buffer.getvalue(), pickler.main_names


def importable_in_workers(names: set[str]) -> bool:
    """Whether re-importing the program's script (as a worker does) defines every one of ``names``:
    it is a file, and each is bound at its top level outside ``if __name__ == "__main__":``.
    A script that does not parse is given the benefit of the doubt."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if not path:
        return not names
    try:
        with open(path, "rb") as script:  # ('<stdin>' for ``python -``: none)
            source = script.read()
    except OSError:
        return not names
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return True
    return names <= _top_level_names(tree.body)


def _top_level_names(body: list[ast.stmt]) -> set[str]:
    """The names a module's statements bind when it is imported (not run as the main program)."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".", 1)[0] for alias in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for target in targets for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, ast.If):
            if not _is_main_guard(node.test):
                names |= _top_level_names(node.body)
            names |= _top_level_names(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, node.orelse, node.finalbody, *(handler.body for handler in node.handlers)):
                names |= _top_level_names(part)
        elif isinstance(node, (ast.With, ast.For, ast.While)):
            names |= _top_level_names(node.body) | _top_level_names(getattr(node, "orelse", []))
    return names


def _is_main_guard(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))
