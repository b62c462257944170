"""What one export cell changes in a definition the book already has, as a unified diff.

A chapter that changes a few lines of a long method shows the diff (`show_changes`) and keeps the whole cell
collapsed below it. The diff is computed from the notebooks, so it is always the code as it stands: the definition
as the book leaves it just before that cell, against the same definition just after it.
"""

from __future__ import annotations

import ast
import difflib
import re
import textwrap
from pathlib import Path

from rosellm_edu.book.export import ROOT, exported_cells, load_book
from rosellm_edu.book.fold import Cell, fold

ORIGIN = re.compile(r"^\s*# notebooks/(.*), cell \d+$")


def show_changes(notebook: str, name: str, nth: int = -1, root: Path = ROOT) -> None:
    """Print how the `nth` export cell of `notebook` that defines `name` ("f", "Class" or "Class.method") changes it."""
    print(changes(notebook, name, nth, root))


def changes(notebook: str, name: str, nth: int = -1, root: Path = ROOT) -> str:
    cells = [cell for chapter in load_book(root)[1] for cell in exported_cells(chapter.notebook, root)]
    defining = [i for i, cell in enumerate(cells) if cell.notebook == notebook and defines(cell.body, name)]
    if not defining:
        raise ValueError(f"no export cell of {notebook} defines {name}")
    at = defining[nth]
    module = cells[at].module
    before_origin, before = definition(fold([c for c in cells[:at] if c.module == module]).get(module, ""), name)
    if before is None:
        raise ValueError(f"{name} is first defined in {cells[at].origin}: there is nothing to compare it with")
    _, after = definition(fold([c for c in cells[:at + 1] if c.module == module])[module], name)
    diff = difflib.unified_diff(before, after, f"{name}, as {before_origin} left it",   # no cell numbers: they
                                f"{name}, as {notebook} makes it", n=2, lineterm="")   # move as chapters grow
    return "\n".join(diff) or f"{name}: {notebook} leaves it as it was"


def defines(body: str, name: str) -> bool:
    """Whether a cell's top-level statements define `name`: the function or class, or the method, in its class or
    through @add_to_class."""
    owner, _, method = name.rpartition(".")
    for node in ast.parse(body).body:
        if not owner and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            if node.name == name:
                return True
        elif isinstance(node, ast.ClassDef) and node.name == owner:
            if any(getattr(item, "name", None) == method for item in node.body):
                return True
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == method:
            if any(ast.unparse(d) == f"add_to_class({owner})" for d in node.decorator_list):
                return True
    return False


def definition(source: str, name: str) -> tuple[str, list[str] | None]:
    """(the notebook it came from, its lines without the folder's origin comments) for `name` in a folded module,
    or ("", None) when the module has no such definition yet."""
    lines = source.splitlines()
    nodes = ast.parse(source).body
    for part in name.split("."):
        found = [n for n in nodes if getattr(n, "name", None) == part]
        if not found:
            return "", None
        node, nodes = found[0], getattr(found[0], "body", [])
    start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
    origin = next(m.group(1) for line in reversed(lines[:start]) if (m := ORIGIN.match(line)))   # the nearest above
    body = [line for line in lines[start:node.end_lineno] if not ORIGIN.match(line)]
    return origin, textwrap.dedent("\n".join(body)).splitlines()
