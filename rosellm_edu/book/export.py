"""Export the marked cells of the notebooks into the package.

    python -m rosellm_edu.book.export [--check]

A code cell whose first line is ``#| export MODULE`` (e.g. ``#| export engine.scheduler``) belongs to
``rosellm_edu/engine/scheduler.py``. The chapters are read in the order of book.toml, their cells in notebook
order, and each module's cells, from every chapter, are folded into one file (fold.py says how: a later chapter
replaces a definition in place or adds a method to a class). Each generated item names the cell it came from as
``notebooks/NOTEBOOK, cell N``, where N counts every cell of the notebook from 1, markdown cells included.
book.toml lists, for each chapter, exactly the modules its notebook exports to.

A code cell whose first line is ``%%cpp FILE`` (e.g. ``%%cpp quant.h``) is C++: the cells of one notebook that name
FILE, in order, make ``rosellm_edu/kernels/csrc/FILE``, each part under the cell it came from.

Without ``--check``, changed files are written and generated files that no notebook exports any more are
deleted. With ``--check``, nothing is written: it exits 1 and names every file that differs.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import nbformat

from rosellm_edu.book.fold import COMMAND, GENERATED, PACKAGE, Cell, fold

ROOT = Path(__file__).resolve().parents[2]
DIRECTIVE = "#| export"
CPP = "%%cpp"
CPP_GENERATED = "// Generated from notebooks/"   # the first line of every generated C++ file starts so


@dataclass
class Chapter:
    notebook: str
    title: str
    modules: list[str]
    appendix: bool = False   # a side topic of the chapter before it, in book order like the chapters
    summary: str = ""        # what it builds and what it measures, for the book's landing page


def load_book(root: Path = ROOT) -> tuple[str, list[Chapter]]:
    book = tomllib.loads((root / "book.toml").read_text())
    return book["title"], [Chapter(**c) for c in book["chapters"]]


def cell_module(source: str) -> str | None:
    """The module a cell exports to (`#| export MODULE` on its first line), or None."""
    first = source.partition("\n")[0]
    if not first.startswith(DIRECTIVE + " ") and first.rstrip() != DIRECTIVE:
        return None
    words = first[len(DIRECTIVE):].split()
    if len(words) != 1:
        raise ValueError(f"'{DIRECTIVE}' takes one module name, e.g. '{DIRECTIVE} sampler'")
    return words[0]


def exported_cells(notebook: str, root: Path = ROOT) -> list[Cell]:
    cells = []
    for index, cell in enumerate(nbformat.read(root / "notebooks" / notebook, as_version=4).cells, 1):
        if cell.cell_type != "code":
            continue
        try:
            module = cell_module(cell.source)
        except ValueError as error:
            raise ValueError(f"notebooks/{notebook}, cell {index}: {error}") from None
        if module is not None:
            cells.append(Cell(notebook, index, module, for_the_library(cell.source.partition("\n")[2], notebook)))
    return cells


def is_cpp(cell) -> bool:
    """Whether a notebook cell is C++: a code cell whose first line is `%%cpp FILE`."""
    return cell.cell_type == "code" and cell.source.partition("\n")[0].split(" ")[0] == CPP


def cpp_file(words: str) -> str:
    """The file name after `%%cpp`, checked: one name, ending in .h or .cpp."""
    if not re.fullmatch(r"\w+\.(h|cpp)", words.strip()):
        raise ValueError(f"'{CPP}' takes one file name such as quant.h or attention.cpp, not {words.strip()!r}")
    return words.strip()


def cpp_part(notebook: str, index: int | None, body: str) -> str:
    """One cell's part of a C++ file, under the cell it came from (index None: a cell that differs from the saved
    notebook, as a reader's edit does until it is saved)."""
    where = f"cell {index}" if index else "a cell not saved as it ran"
    return f"// notebooks/{notebook}, {where}\n{body.rstrip()}\n"


def cpp_text(notebook: str, parts: list[str]) -> str:
    """A generated C++ file: its header, then the parts of its cells, a blank line apart."""
    return (f"{CPP_GENERATED}{notebook} by `{COMMAND}`.\n"
            "// Do not edit: change the notebook's `%%cpp` cells and export again. Each part names its cell.\n\n"
            + "\n".join(parts))


def cpp_sources(chapters: list[Chapter], root: Path = ROOT) -> dict[Path, str]:
    """Each generated C++ file's path and text, from the `%%cpp FILE` cells of the one notebook that writes it."""
    parts: dict[str, list[str]] = {}
    writer: dict[str, str] = {}
    for chapter in chapters:
        for index, cell in enumerate(nbformat.read(root / "notebooks" / chapter.notebook, as_version=4).cells, 1):
            if not is_cpp(cell):
                continue
            first, _, body = cell.source.partition("\n")
            try:
                file = cpp_file(first[len(CPP):])
            except ValueError as error:
                raise ValueError(f"notebooks/{chapter.notebook}, cell {index}: {error}") from None
            if writer.setdefault(file, chapter.notebook) != chapter.notebook:
                raise ValueError(f"{file} is written by {writer[file]} and {chapter.notebook}: one notebook a file")
            parts.setdefault(file, []).append(cpp_part(chapter.notebook, index, body))
    return {root / PACKAGE / "kernels" / "csrc" / file: cpp_text(writer[file], texts) for file, texts in parts.items()}


def for_the_library(body: str, notebook: str) -> str:
    """A cell's text as the package keeps it: "this chapter" names the chapter (fold drops the "NEW" marks)."""
    number = notebook.split("_")[0]
    return re.sub(r"\b(t|T)his (chapter|appendix)\b", lambda m: f"{'cC'[m[1] == 'T']}hapter {number}"
                  if m[2] == "chapter" else f"{'aA'[m[1] == 'T']}ppendix {number}", body)


def fold_chapters(chapters: list[Chapter], root: Path = ROOT) -> dict[str, str]:
    """Module name -> its source as these chapters leave it, checked against the modules book.toml lists."""
    cells = []
    for chapter in chapters:
        found = exported_cells(chapter.notebook, root)
        exported = sorted({cell.module for cell in found})
        if exported != sorted(chapter.modules):
            raise ValueError(f"{chapter.notebook} exports {exported} but book.toml lists {sorted(chapter.modules)}")
        cells += found
    return fold(cells)


def module_path(module: str, root: Path = ROOT) -> Path:
    return root.joinpath(PACKAGE, *module.split(".")).with_suffix(".py")


def generate(root: Path = ROOT) -> dict[Path, str]:
    """Every generated module's path and text."""
    _, chapters = load_book(root)
    modules = {module_path(module, root): text for module, text in fold_chapters(chapters, root).items()}
    return modules | cpp_sources(chapters, root)


def generated_on_disk(root: Path = ROOT) -> list[Path]:
    """The files under rosellm_edu/ whose first line marks them as generated."""
    def first_line(path: Path) -> str:
        with path.open(encoding="utf-8") as file:
            return file.readline()

    python = [p for p in (root / PACKAGE).rglob("*.py") if first_line(p).startswith(GENERATED)]
    cpp = [p for p in (root / PACKAGE / "kernels" / "csrc").glob("*") if first_line(p).startswith(CPP_GENERATED)]
    return sorted(python + cpp)


def differences(files: dict[Path, str], root: Path = ROOT) -> dict[Path, str]:
    """Each file on disk that differs from the generated `files` -> how it differs."""
    found = {path: "missing" if not path.exists() else "out of date"
             for path, text in files.items() if not path.exists() or path.read_text(encoding="utf-8") != text}
    found |= {path: "no longer exported" for path in generated_on_disk(root) if path not in files}
    return found


def export(root: Path = ROOT) -> list[str]:
    """Write the changed modules and delete the ones no notebook exports any more; say what was done."""
    files, done = generate(root), []
    for path, how in differences(files, root).items():
        if how == "no longer exported":
            path.unlink()
            done.append(f"deleted {path.relative_to(root)}: no notebook exports it any more")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(files[path], encoding="utf-8")
            done.append(f"wrote {path.relative_to(root)}")
    return done


def main(argv: list[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the package differs from the notebooks")
    args = parser.parse_args(argv)
    if not args.check:
        for line in export(root):
            print(line)
        return 0
    found = differences(generate(root), root)
    for path, how in found.items():
        print(f"{how}: {path.relative_to(root)} (run `{COMMAND}`)")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
