"""Export the marked cells of the notebooks into the package.

A code cell whose first line is ``#| export MODULE`` (e.g. ``#| export models.llama``) is copied into
``rosellm_edu/models/llama.py``. Cells that name the same module are joined in notebook order. The notebooks,
in the order of ``book.toml``, are the single source: ``python -m rosellm_edu.export`` regenerates the
modules and ``python -m rosellm_edu.export --check`` fails when the committed package differs.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "rosellm_edu"
DIRECTIVE = "#| export"


@dataclass
class Chapter:
    notebook: str
    title: str
    modules: list[str]


def load_book(root: Path = ROOT) -> tuple[str, list[Chapter]]:
    book = tomllib.loads((root / "book.toml").read_text())
    return book["title"], [Chapter(**c) for c in book["chapters"]]


def exported_cells(notebook: Path) -> dict[str, list[str]]:
    """Module name -> the sources of the cells exported to it, in notebook order."""
    cells: dict[str, list[str]] = {}
    for cell in nbformat.read(notebook, as_version=4).cells:
        first, _, body = cell.source.partition("\n")
        if cell.cell_type != "code" or not first.startswith(DIRECTIVE):
            continue
        module = first[len(DIRECTIVE):].strip()
        if not module:
            raise ValueError(f"{notebook.name}: '{DIRECTIVE}' needs a module name, e.g. '{DIRECTIVE} sampler'")
        cells.setdefault(module, []).append(body.strip("\n"))
    return cells


def module_path(module: str, package: Path = PACKAGE) -> Path:
    return package.joinpath(*module.split(".")).with_suffix(".py")


def render(notebook: str, sources: list[str]) -> str:
    header = (f"# Generated from notebooks/{notebook} by `python -m rosellm_edu.export`.\n"
              "# Edit the notebook, not this file.\n")
    return header + "\n" + "\n\n\n".join(sources) + "\n"


def generate(root: Path = ROOT) -> dict[Path, str]:
    """Every generated module's path and text, checked against the modules book.toml promises."""
    _, chapters = load_book(root)
    files: dict[Path, str] = {}
    for chapter in chapters:
        cells = exported_cells(root / "notebooks" / chapter.notebook)
        if sorted(cells) != sorted(chapter.modules):
            raise ValueError(f"{chapter.notebook} exports {sorted(cells)} but book.toml lists {sorted(chapter.modules)}")
        for module, sources in cells.items():
            path = module_path(module, root / "rosellm_edu")
            if path in files:
                raise ValueError(f"module {module} is exported by more than one notebook")
            files[path] = render(chapter.notebook, sources)
    return files


def stale_modules(root: Path = ROOT) -> list[Path]:
    """Generated modules whose committed text differs from what the notebooks export."""
    return [p for p, text in generate(root).items() if not p.exists() or p.read_text() != text]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the package differs from the notebooks")
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_modules()
        for path in stale:
            print(f"out of date: {path.relative_to(ROOT)} (run `python -m rosellm_edu.export`)")
        return 1 if stale else 0
    for path, text in generate().items():
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
