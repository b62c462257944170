"""Chapter snapshots: a reader of chapter N runs the package as the chapters before N left it, not the final one.

A notebook's first code cell calls ``open_chapter("03_continuous_batching.ipynb")``. From then on, importing a
generated module of rosellm_edu gives its text folded from the earlier chapters only, a module that only a later
chapter creates cannot be imported, and each ``#| export MODULE`` cell that runs without error puts what it
defined into ``rosellm_edu.MODULE``, so that the chapter's later cells and imports see its current code. A
``%%cpp FILE`` cell adds its text to the C++ file FILE of this session, which build_cpp finds before the package's.
Hand-written modules load from disk as usual; their imports of generated modules get the chapter's versions.
"""

from __future__ import annotations

import ast
import atexit
import importlib
import importlib.abc
import importlib.util
import linecache
import os
import shutil
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

import nbformat

from rosellm_edu.book.export import ROOT, cell_module, cpp_file, cpp_part, cpp_text, fold_chapters, load_book
from rosellm_edu.book.fold import BOOK, PACKAGE, bound_names, target_names


def module_sources(before: str | None, root: Path = ROOT) -> dict[str, str]:
    """Module name -> its generated text as folded from the chapters before notebook `before` (None: all)."""
    _, chapters = load_book(root)
    notebooks = [chapter.notebook for chapter in chapters]
    if before is not None and before not in notebooks:
        raise ValueError(f"{before} is not a chapter of book.toml")
    return fold_chapters(chapters[:notebooks.index(before)] if before else chapters, root)


class ChapterFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves rosellm_edu's generated modules as they stand when one chapter begins."""

    def __init__(self, notebook: str, root: Path = ROOT):
        self.notebook, self.root = notebook, root
        self.sources = module_sources(notebook, root)
        self.built_in: dict[str, str] = {}  # generated module -> the first chapter that exports to it
        for chapter in load_book(root)[1]:
            for module in chapter.modules:
                self.built_in.setdefault(module, chapter.notebook)

    def find_spec(self, fullname, path, target=None):
        name = fullname.removeprefix(PACKAGE + ".")
        if name == fullname or name not in self.built_in:
            return None  # not generated: the usual finders look on disk
        if name not in self.sources:
            raise ModuleNotFoundError(self.not_yet_built(fullname, self.built_in[name]), name=fullname)
        return importlib.util.spec_from_loader(fullname, self, origin=self.filename(name))

    def not_yet_built(self, fullname: str, chapter: str) -> str:
        if chapter == self.notebook:
            return f"{fullname} is built in this chapter ({chapter}), by an `#| export` cell that has not run yet"
        return f"{fullname} is built in chapter {chapter}, later than this one ({self.notebook})"

    def filename(self, name: str) -> str:
        return f"<{PACKAGE}/{name.replace('.', '/')}.py as of {self.notebook}>"

    def create_module(self, spec):
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__.removeprefix(PACKAGE + ".")
        source, filename = self.sources[name], self.filename(name)
        # Tracebacks and inspect.getsource (Triton's @jit needs it) read the lines from here.
        linecache.cache[filename] = (len(source), None, source.splitlines(keepends=True), filename)
        exec(compile(source, filename, "exec"), module.__dict__)


def open_chapter(notebook: str, root: Path = ROOT) -> None:
    """Run the rest of this notebook against the package as of its chapter (call it before importing anything
    of rosellm_edu but rosellm_edu.book). Calling it again replaces the previous chapter's finder."""
    finder = ChapterFinder(notebook, root)  # first, so that a wrong name changes nothing
    set_aside()
    install(finder)
    shell = ipython()
    if shell is not None:
        shell.events.register("post_run_cell", publish_ran_cell)  # IPython registers a callback only once
        shell.events.register("pre_run_cell", remember_cell)
        shell.register_magic_function(cpp, "cell")


@contextmanager
def package_as_of(notebook: str, root: Path = ROOT):
    """For tests: yield load("engine.llm_engine") -> that module as of the chapter; all is put back on exit."""
    finder = ChapterFinder(notebook, root)
    meta_path, aside = list(sys.meta_path), set_aside()
    install(finder)
    try:
        yield lambda name: importlib.import_module(f"{PACKAGE}.{name}")
    finally:
        sys.meta_path[:] = meta_path
        set_aside()
        bring_back(aside)


def publish_cell(source: str, namespace: dict) -> ModuleType | None:
    """Copy what an `#| export MODULE` cell defined (defs, classes, assigned names; not methods added to a class,
    not imports) from the namespace it ran in into rosellm_edu.MODULE. Returns that module; None for other cells."""
    name = cell_module(source)
    if name is None:
        return None
    module = imported_or_new(f"{PACKAGE}.{name}")
    for node in ast.parse(source.partition("\n")[2]).body:
        extended = target_names(node.target) if isinstance(node, ast.AugAssign) else []   # NAMES += ...
        for bound in bound_names(node) + extended:
            if bound in namespace:
                rebind(getattr(module, bound, None), namespace[bound])
                setattr(module, bound, namespace[bound])
    return module


def rebind(old, new) -> None:
    """Point every rosellm_edu module that imported `old` by name at `new`, so that a class a chapter redefines
    (SamplingParams gaining a field, say) is the one the earlier chapters' code uses from then on."""
    if old is None or old is new:
        return
    for name in package_modules():
        module = sys.modules[name]
        for attr, value in list(vars(module).items()):
            if value is old:
                setattr(module, attr, new)


def imported_or_new(fullname: str) -> ModuleType:
    """The module as the earlier chapters left it, else a new empty one, attached to its package."""
    try:
        return importlib.import_module(fullname)
    except ModuleNotFoundError as error:
        if error.name != fullname:
            raise
    module = ModuleType(fullname)
    sys.modules[fullname] = module
    parent, _, child = fullname.rpartition(".")
    setattr(importlib.import_module(parent), child, module)
    return module


def publish_ran_cell(result) -> None:
    """IPython's post_run_cell callback."""
    if result.success:
        publish_cell(result.info.raw_cell, ipython().user_ns)


cpp_parts: dict[str, dict[str, str]] = {}   # C++ file -> its cells' parts by cell id, in the order they first ran
running_cell = None                          # IPython's ExecutionInfo of the cell running now


def remember_cell(info) -> None:
    """IPython's pre_run_cell callback: the cell about to run (its text, and its id where the front end sends one)."""
    global running_cell
    running_cell = info


def cpp(line: str, cell: str) -> None:
    """%%cpp FILE: this cell's text is a part of the C++ file FILE, after the parts of the cells that ran before it
    (running a cell again replaces its part). The file, as the exporter would write it from the cells as they ran,
    goes to a folder of this session named by ROSELLM_EDU_CPP_CELLS, where build_cpp looks first."""
    file = cpp_file(line)
    if "ROSELLM_EDU_CPP_CELLS" not in os.environ:
        os.environ["ROSELLM_EDU_CPP_CELLS"] = folder = tempfile.mkdtemp(prefix="rosellm_edu_cpp_")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
    finder = next(f for f in sys.meta_path if isinstance(f, ChapterFinder))
    raw = running_cell.raw_cell.rstrip() if running_cell else None
    saved = [c.source.rstrip() for c in nbformat.read(finder.root / "notebooks" / finder.notebook, as_version=4).cells]
    index = saved.index(raw) + 1 if raw in saved else None
    parts = cpp_parts.setdefault(file, {})
    parts[getattr(running_cell, "cell_id", None) or raw or cell] = cpp_part(finder.notebook, index, cell)
    text = cpp_text(finder.notebook, list(parts.values()))
    Path(os.environ["ROSELLM_EDU_CPP_CELLS"], file).write_text(text, encoding="utf-8")


def ipython():
    """The running IPython shell, or None (without importing IPython where nothing has)."""
    module = sys.modules.get("IPython")
    return module.get_ipython() if module else None


def install(finder: ChapterFinder) -> None:
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, ChapterFinder)]
    sys.meta_path.insert(0, finder)


def package_modules() -> list[str]:
    """The imported rosellm_edu.* modules, but for the package itself and this tooling."""
    return [name for name in sys.modules
            if name.startswith(PACKAGE + ".") and name != BOOK and not name.startswith(BOOK + ".")]


def set_aside() -> dict[str, ModuleType]:
    """Remove the package's modules from sys.modules (so that they are imported again); return them."""
    aside = {name: sys.modules.pop(name) for name in package_modules()}
    for name, module in aside.items():
        parent, _, child = name.rpartition(".")
        if getattr(sys.modules.get(parent), child, None) is module:
            delattr(sys.modules[parent], child)  # else `from rosellm_edu import engine` finds the old one
    return aside


def bring_back(aside: dict[str, ModuleType]) -> None:
    sys.modules.update(aside)
    for name, module in aside.items():
        parent, _, child = name.rpartition(".")
        if parent in sys.modules:
            setattr(sys.modules[parent], child, module)
