"""Fold the exported cells of the chapters into one source text per module.

The cells come in book order (chapters as book.toml lists them, cells in notebook order). Each top-level statement
of a cell is one of:

- an import: it joins the module's one import block at the top, in PEP 8's groups (``__future__``, the standard
  library, third-party packages, rosellm_edu), sorted by module, one statement per module, and only with the names
  the folded code uses. Imports of ``rosellm_edu.book``, the tooling, and of the module itself (a later chapter's
  cell importing what an earlier chapter defined there) are dropped.
- a definition: a ``def``, ``async def``, ``class`` or an assignment to one name. A later definition of a name the
  module already has replaces the earlier text where the earlier one stood; the new definitions a chapter made
  before it go there too, ahead of it.
- a method: a function decorated ``@add_to_class(C)``. It is written into the body of class ``C`` without that
  decorator, in place of C's method of the same name if there is one, else at the end of the class. Redefining
  ``C`` as a whole drops the methods added to the earlier ``C``.
- anything else (a ``try:`` block, an ``if``): kept in order, never replaced.

Comment lines above a statement travel with it. Every top-level item, and every folded method, is preceded by a
comment naming the notebook and cell it came from, so that a traceback leads back to the cell.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from dataclasses import dataclass, field

PACKAGE = "rosellm_edu"
BOOK = f"{PACKAGE}.book"
COMMAND = f"python -m {BOOK}.export"
GENERATED = "# Generated from notebooks/"  # the first line of every generated file starts so
FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)
# Python 3.12+ tokenizes an f-string in parts, from FSTRING_START to FSTRING_END (3.11 has no such tokens).
FSTRING_START, FSTRING_END = getattr(tokenize, "FSTRING_START", None), getattr(tokenize, "FSTRING_END", None)


@dataclass
class Cell:
    notebook: str
    index: int  # 1-based position among all the notebook's cells, markdown cells included
    module: str
    body: str  # the source below the `#| export MODULE` line

    @property
    def origin(self) -> str:
        return f"notebooks/{self.notebook}, cell {self.index}"


@dataclass
class Item:
    origin: str
    text: str
    is_class: bool = False


@dataclass
class Module:
    notebooks: list[str] = field(default_factory=list)
    imports: dict[str, tuple[int, str]] = field(default_factory=dict)  # ast.unparse(import) -> its group, text
    items: list[Item] = field(default_factory=list)
    named: dict[str, Item] = field(default_factory=dict)
    fresh: dict[str, list[Item]] = field(default_factory=dict)  # notebook -> items it added after its last replace


def fold(cells: list[Cell]) -> dict[str, str]:
    """Module name -> its generated source, from cells in book order."""
    modules: dict[str, Module] = {}
    for cell in cells:
        module = modules.setdefault(cell.module, Module())
        if cell.notebook not in module.notebooks:
            module.notebooks.append(cell.notebook)
        fresh = module.fresh.setdefault(cell.notebook, [])
        for node, text in statements(cell):
            added, item = add(module, cell, node, text)
            if added:
                fresh.append(item)
            # a chapter's new helpers go before what it redefines with them (unless the chapter itself defined it)
            elif item is not None and fresh and item not in fresh:
                for new in fresh:
                    module.items.remove(new)
                at = module.items.index(item)
                module.items[at:at] = fresh
                fresh.clear()
    return {name: render(name, module) for name, module in modules.items()}


def statements(cell: Cell) -> list[tuple[ast.stmt, str]]:
    """Each top-level statement of the cell with its text, comments above it included."""
    try:
        tree = ast.parse(cell.body)
    except SyntaxError as error:
        raise ValueError(f"{cell.origin}: {error}") from error
    if not tree.body:
        return []
    lines = cell.body.split("\n")
    ends = [node.end_lineno for node in tree.body[:-1]] + [len(lines)]  # trailing comments join the last one
    result = []
    for start, end in zip([0] + ends[:-1], ends):
        text = trim_blank_lines("\n".join(lines[start:end]))
        body = ast.parse(text).body  # positions relative to the text, which is what folding edits
        if len(body) != 1:
            raise ValueError(f"{cell.origin}: write one top-level statement per line")
        result.append((body[0], text))
    return result


def add(module: Module, cell: Cell, node: ast.stmt, text: str) -> tuple[bool, Item | None]:
    """Fold one statement in. Returns (True, item) for a new top-level item, (False, item) for one it replaced."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        # a later chapter's cell may import what an earlier chapter put in this very module: not from itself here
        itself = isinstance(node, ast.ImportFrom) and not node.level and node.module == f"{PACKAGE}.{cell.module}"
        if not imports_book(node) and not itself:
            module.imports.setdefault(ast.unparse(node), (import_group(node), text))
        return False, None
    if (decorator := add_to_class_decorator(node)) is not None:
        add_method(module, cell, node, text, decorator)
        return False, None
    names = bound_names(node)
    item = Item(cell.origin, text, isinstance(node, ast.ClassDef))
    if len(names) == 1 and names[0] in module.named:
        old = module.named[names[0]]
        old.origin, old.text, old.is_class = item.origin, item.text, item.is_class
        return False, old
    module.items.append(item)
    if len(names) == 1:
        module.named[names[0]] = item
    return True, item


def imports_book(node: ast.Import | ast.ImportFrom) -> bool:
    def in_book(name: str) -> bool:
        return name == BOOK or name.startswith(BOOK + ".")

    if isinstance(node, ast.Import):
        return all(in_book(alias.name) for alias in node.names)
    if node.level:
        return False
    return in_book(node.module) or node.module == PACKAGE and all(alias.name == "book" for alias in node.names)


def import_group(node: ast.Import | ast.ImportFrom) -> int:
    """PEP 8's import groups, in order: __future__, the standard library, third-party packages, this package."""
    if isinstance(node, ast.ImportFrom) and node.level:
        return 3
    top = (node.module if isinstance(node, ast.ImportFrom) else node.names[0].name).partition(".")[0]
    return 0 if top == "__future__" else 1 if top in sys.stdlib_module_names else 3 if top == PACKAGE else 2


def add_to_class_decorator(node: ast.stmt) -> ast.Call | None:
    """The `@add_to_class(C)` decorating a function, if any."""
    for decorator in node.decorator_list if isinstance(node, FUNCTIONS) else []:
        if isinstance(decorator, ast.Call) and "add_to_class" in (getattr(decorator.func, "id", None),
                                                                 getattr(decorator.func, "attr", None)):
            return decorator
    return None


def bound_names(node: ast.stmt) -> list[str]:
    """The names a top-level def, class or assignment binds; none for a method added to a class."""
    if isinstance(node, (*FUNCTIONS, ast.ClassDef)):
        return [] if add_to_class_decorator(node) else [node.name]
    if isinstance(node, ast.Assign):
        return [name for target in node.targets for name in target_names(target)]
    if isinstance(node, ast.AnnAssign) and node.value is not None:
        return target_names(node.target)
    return []


def target_names(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, ast.Starred):
        return target_names(target.value)
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in target_names(element)]
    return []  # an attribute or a subscript binds no name


def add_method(module: Module, cell: Cell, node: ast.FunctionDef, text: str, decorator: ast.Call) -> None:
    class_name = ast.unparse(decorator.args[0]) if decorator.args else "?"
    item = module.named.get(class_name)
    if item is None or not item.is_class:
        raise ValueError(f"{cell.origin} adds method {node.name} to class {class_name}, "
                         f"which no earlier cell of module {cell.module} defines")
    lines = text.split("\n")
    del lines[decorator.lineno - 1:decorator.end_lineno]
    item.text = fold_method(item.text, node.name, "\n".join(lines), cell.origin)


def fold_method(class_text: str, name: str, method_text: str, origin: str) -> str:
    """The class with the method written into its body: in place of its method `name`, else at the end."""
    lines = class_text.split("\n")
    cls = ast.parse(class_text).body[0]
    indent = re.match(r"[ \t]*", lines[cls.body[0].lineno - 1]).group()
    new = [f"{indent}# {origin}"] + indented(method_text, indent)
    old = next((n for n in cls.body if isinstance(n, FUNCTIONS) and n.name == name), None)
    if old is None:
        lines[cls.end_lineno:cls.end_lineno] = [""] + new
        return "\n".join(lines)
    start = min([old.lineno] + [d.lineno for d in old.decorator_list]) - 1
    while start > cls.lineno and lines[start - 1].lstrip().startswith("#"):  # its comments go with it
        start -= 1
    lines[start:old.end_lineno] = new
    return "\n".join(lines)


def indented(text: str, indent: str) -> list[str]:
    """The lines of text, indented, except blank lines and those that begin inside a string literal."""
    verbatim = lines_inside_strings(text)
    return [line if i in verbatim or not line.strip() else indent + line
            for i, line in enumerate(text.split("\n"), 1)]


def lines_inside_strings(text: str) -> set[int]:
    """The (1-based) lines that begin inside a multi-line string: indenting them would change the string. A
    docstring's lines are indented with the code: its text is read through inspect.cleandoc."""
    inside, fstrings, previous = set(), [], tokenize.NEWLINE
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        statement = previous in (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)   # a docstring: indent it
        if token.type not in (tokenize.NL, tokenize.COMMENT):
            previous = token.type
        if token.type == tokenize.STRING and not statement:
            inside.update(range(token.start[0] + 1, token.end[0] + 1))
        elif token.type == FSTRING_START:
            fstrings.append(token.start[0])
        elif token.type == FSTRING_END:
            inside.update(range(fstrings.pop() + 1, token.end[0] + 1))
    return inside


def trim_blank_lines(text: str) -> str:
    lines = text.split("\n")
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return "\n".join(lines)


def render(name: str, module: Module) -> str:
    notebooks = ", ".join(f"notebooks/{notebook}" for notebook in module.notebooks)
    header = (f"# Generated from {notebooks} by `{COMMAND}`.\n"
              "# Do not edit: change the notebooks' `#| export` cells and export again. Each item names its cell\n"
              "# (cells counted from 1 in their notebook, markdown cells included).\n")
    items = [f"# {item.origin}\n{without_new_markers(item.text)}" for item in module.items]
    imports = import_block(module, used_names("\n".join(items)))
    text = header + "\n" + "\n\n\n".join(part for part in [imports, *items] if part) + "\n"
    try:
        compile(text, f"{PACKAGE}.{name}", "exec")
    except SyntaxError as error:
        raise ValueError(f"module {name}, as folded from {notebooks}, is not valid Python: {error}") from error
    return text


def used_names(text: str) -> set[str]:
    """Every name the code reads."""
    return {node.id for node in ast.walk(ast.parse(text)) if isinstance(node, ast.Name)}


def import_block(module: Module, used: set[str]) -> str:
    """The module's imports in PEP 8's groups, each module's names in one statement, and only the names the folded
    code still uses: an import that a replaced definition needed goes with it."""
    kept: dict[tuple[int, str, int | None], list[ast.alias]] = {}   # (group, module, level; None: `import`)
    for group, text in module.imports.values():
        node = ast.parse(text).body[0]
        future = isinstance(node, ast.ImportFrom) and node.module == "__future__"
        for alias in node.names:
            if future or (alias.asname or alias.name.partition(".")[0]) in used:
                plain = isinstance(node, ast.Import)
                key = (group, alias.name, None) if plain else (group, node.module, node.level)
                if alias.name not in [a.name for a in kept.setdefault(key, [])]:
                    kept[key].append(alias)
    lines = {g: [] for g in range(4)}
    for (group, name, level), aliases in kept.items():
        aliases = sorted(aliases, key=lambda alias: alias.name)
        statement = ast.Import(aliases) if level is None else ast.ImportFrom(name, aliases, level)
        lines[group].append(wrapped(ast.unparse(statement)))
    by_module = lambda line: (line.startswith("from "), line.split()[1])  # noqa: E731  isort's order
    return "\n\n".join("\n".join(sorted(group, key=by_module)) for group in lines.values() if group)


def wrapped(line: str, width: int = 120) -> str:
    """A long `from x import a, b, ...` in parentheses, continued under the first name."""
    if len(line) <= width or " import " not in line:
        return line
    head, names = line.split(" import ", 1)
    lines, current = [], f"{head} import ("
    for name in names.split(", "):
        if len(current) + len(name) + 2 > width:
            lines.append(current.rstrip())
            current = " " * (len(head) + len(" import ("))
        current += name + ", "
    return "\n".join(lines + [current[:-2] + ")"])


def without_new_markers(text: str) -> str:
    """The text without the `# NEW` comments and the "NEW:" / "(NEW)" marks in docstrings that tell a chapter's
    reader what changed: the package has no before. `# NEW: why` keeps its why; a line that was only the marker
    goes; a sentence that began with "NEW: " goes on capitalised."""
    original = text.split("\n")
    lines = list(original)
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT and (new := re.match(r"# NEW\b:?\s*", token.string)):
            row, col = token.start
            why = token.string[new.end():]
            lines[row - 1] = (lines[row - 1][:col] + (f"# {why}" if why else "")).rstrip()
    text = "\n".join(line for line, was in zip(lines, original) if line or not was.lstrip().startswith("#"))
    text = re.sub(r"(?<=\. )NEW: ([a-z])", lambda m: m[1].upper(), text)
    return re.sub(r" ?\(NEW\)|\bNEW: ?", "", text)
