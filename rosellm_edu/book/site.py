"""Build the book's website from the executed notebooks: Sphinx with sphinx-book-theme and MyST-NB.

    python -m rosellm_edu.book.site [--out _build/book]

book.toml is the one table of contents. Each build writes a Sphinx project into a temporary folder: a conf.py, a
landing page (index.md) with book.toml's chapters and their summaries and README's measured figures generated anew
from notebooks/data, copies of the notebooks as committed (their outputs are rendered, never re-run), and the
repository files their links point to (the site offers those as downloads). Any Sphinx warning, such as a link to a
missing chapter or file, fails the build with the warning's text.

A live widget needs a running kernel, so where an output carries both a widget view and a picture (chapter 01's
explorer leaves one beside its widget), the site shows the picture; a widget with no picture (a progress bar) is
left out. A `%%cpp FILE` cell is shown as what it is, C++ under its file's name. Nothing on a page is fetched
from the web, and search works from the folder opened as files.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import nbformat

from rosellm_edu.book import readme
from rosellm_edu.book.export import ROOT, Chapter, is_cpp, load_book

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
# README's sections whose figures the landing page shows, rendered again from notebooks/data.
FIGURE_SECTIONS = ["Performance on a CPU", "Performance on a GPU"]

CONF = {
    "extensions": ["myst_nb"],
    "html_theme": "sphinx_book_theme",
    "nb_execution_mode": "off",        # the committed outputs are the book; nothing is re-run
    "nb_merge_streams": True,
    "myst_heading_anchors": 3,         # [text](chapter.ipynb#a-section) links resolve
    "smartquotes": False,              # the text as the notebooks write it
    "html_copy_source": False,         # the notebooks are in the repository; the site need not carry them twice
    "html_show_sourcelink": False,
    "html_theme_options": {"show_toc_level": 2, "use_download_button": False, "show_navbar_depth": 1,
                           "footer_content_items": []},
    "exclude_patterns": ["_build"],
    "html_static_path": ["_static"],
    "html_css_files": ["book.css"],
}

# A wide table scrolls inside its block like wide code does, instead of running under the outline; code and
# outputs a little smaller, so that more of the chapters' 120-column lines fit at 1280 px.
CSS = """\
article.bd-article table { display: block; max-width: 100%; overflow-x: auto; }
article.bd-article div.cell pre, article.bd-article div.highlight pre { font-size: 0.8em; }
"""

LANDING = """\
# {title}

{description}

It starts from one forward pass written by hand and ends on an OpenAI-compatible server; on the way come a KV
cache, continuous batching, paged attention, CUDA graphs, a batched sampler, kernels, quantization, speculative
decoding and structured output. Each chapter asks one question, writes the simplest code that answers it, measures
why that is slow or wasteful, fixes it, and measures again in the same run. The code it writes is exported into the
companion package `rosellm_edu`, whose API is vLLM's (`from rosellm_edu import LLM, SamplingParams`).

**Who it is for**: programmers who read Python and a little PyTorch and want to know what happens inside an
engine such as vLLM or SGLang, and why each of its parts is there. Everything runs on a laptop CPU with a small
embedded model (SmolLM2-135M), so no GPU and no model download is needed.

## How to run it

```bash
make lab    # create .venv, install everything, open the notebooks in JupyterLab
make test   # run every test, and re-run every notebook against its outputs
make book   # build this website into _build/book
```

`make lab` prints the address to open (`http://127.0.0.1:8888/lab?token=...`); the pages here are the same
notebooks with the outputs of their last run.

## Contents

{contents}

{figures}
"""


def label(chapter: Chapter) -> str:
    """A chapter's entry in the sidebar: its number and book.toml's title."""
    number = chapter.notebook.split("_")[0]
    return f"{'Appendix ' if chapter.appendix else ''}{number} · {chapter.title}"


def docname(chapter: Chapter) -> str:
    return f"notebooks/{Path(chapter.notebook).stem}"


def toctree(chapters: list[Chapter]) -> str:
    entries = "\n".join(f"{label(c)} <{docname(c)}>" for c in chapters)
    return f"```{{toctree}}\n:hidden:\n:maxdepth: 1\n\n{entries}\n```\n"


def contents(chapters: list[Chapter]) -> str:
    return "\n".join(f"- **[{label(c)}]({docname(c)}.ipynb)**: {c.summary}" for c in chapters)


def readme_sections(text: str, names: list[str]) -> str:
    """README's `## NAME` sections, each to the next `## ` heading."""
    parts = re.split(r"(?m)^(?=## )", text)
    found = [p for p in parts if p.splitlines()[0][3:].strip() in names]
    if len(found) != len(names):
        raise ValueError(f"README.md lacks one of the sections {names}")
    return "".join(found)


def landing_page(root: Path, title: str, chapters: list[Chapter]) -> str:
    description = tomllib.loads((root / "book.toml").read_text()).get("description", "")
    figures = readme_sections((root / "README.md").read_text(), FIGURE_SECTIONS)
    figures = readme.render(figures, readme.machines(root / "notebooks" / "data"))
    return LANDING.format(title=title, description=description, contents=contents(chapters), figures=figures) + "\n" + toctree(chapters)


def without_live_widgets(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook as a static page can show it. A widget needs a kernel (or its manager from the web), so an
    output that carries a picture beside its widget view keeps the picture, and one with no picture (a progress
    bar, whose text is its "0%" start) is left out; the saved widget state goes too."""
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = [static_output(o) for o in cell.outputs if not is_widget_only(o)]
    notebook.metadata.pop("widgets", None)
    return notebook


def cpp_as_cpp(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Each %%cpp cell (C++, no outputs) as a block highlighted as C++, under the line that names its file."""
    for index, cell in enumerate(notebook.cells):
        if is_cpp(cell):
            first, _, body = cell.source.partition("\n")
            notebook.cells[index] = nbformat.v4.new_markdown_cell(f"`{first}`\n```cpp\n{body}\n```")
    return notebook


def is_widget_only(output: nbformat.NotebookNode) -> bool:
    data = output.get("data", {})
    return WIDGET_VIEW in data and not any(key.startswith("image/") for key in data)


def static_output(output: nbformat.NotebookNode) -> nbformat.NotebookNode:
    output.get("data", {}).pop(WIDGET_VIEW, None)
    return output


LINK = re.compile(r"\]\(([^)\s#]+)")
EXTERNAL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|/)")


def linked_files(markdown: str, folder: Path, root: Path) -> set[Path]:
    """Repository files (not notebooks) that the markdown links to from folder, relative to root."""
    found = set()
    for link in LINK.findall(markdown):
        target = (folder / link).resolve()
        if EXTERNAL.match(link) or link.endswith(".ipynb") or not target.is_file():
            continue  # a missing file is left for Sphinx to report
        if target.is_relative_to(root.resolve()):
            found.add(target.relative_to(root.resolve()))
    return found


def stage(src: Path, root: Path) -> None:
    """Write the Sphinx project into src: conf.py, index.md, the notebooks and the files they link to."""
    title, chapters = load_book(root)
    (src / "conf.py").write_text(f"project = {title!r}\nhtml_title = project\n"
                                 + "".join(f"{key} = {value!r}\n" for key, value in CONF.items()))
    (src / "_static").mkdir()
    (src / "_static" / "book.css").write_text(CSS)
    index = landing_page(root, title, chapters)
    (src / "index.md").write_text(index)
    files = linked_files(index, root, root)
    (src / "notebooks").mkdir()
    for chapter in chapters:
        notebook = nbformat.read(root / "notebooks" / chapter.notebook, as_version=4)
        nbformat.write(cpp_as_cpp(without_live_widgets(notebook)), src / "notebooks" / chapter.notebook)
        markdown = "\n".join(c.source for c in notebook.cells if c.cell_type == "markdown")
        files |= linked_files(markdown, root / "notebooks", root)
    for file in files:
        (src / file).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / file, src / file)


def build(out: Path, root: Path = ROOT) -> Path:
    """Build the site into out; return its landing page. Raises RuntimeError with Sphinx's warnings, if any.

    out is emptied first, so that no page of a chapter book.toml no longer lists stays behind; a folder that holds
    anything but an earlier build (Sphinx's .buildinfo) is refused."""
    if out.is_dir() and any(out.iterdir()):
        if not (out / ".buildinfo").is_file():
            raise RuntimeError(f"{out} is not empty and holds no earlier build of the book: empty it or choose another")
        shutil.rmtree(out)
    with tempfile.TemporaryDirectory(prefix="rosellm-book-") as tmp:
        src, warnings = Path(tmp) / "src", Path(tmp) / "warnings.txt"
        src.mkdir()
        stage(src, root)
        # Sphinx in its own process: it registers its nodes once per process, so a second build in one would warn
        done = subprocess.run([sys.executable, "-m", "sphinx", "-b", "html", "-q", "-E", "--no-color", "--keep-going",
                               "-d", str(Path(tmp) / "doctrees"), "-w", str(warnings), str(src), str(out)],
                              capture_output=True, text=True)
        if done.returncode or warnings.read_text():
            raise RuntimeError(f"the book did not build cleanly:\n{warnings.read_text()}{done.stderr}")
    return out / "index.html"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "book", help="output folder")
    args = parser.parse_args(argv)
    index = build(args.out)
    print(f"open {index}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
