"""Build the static HTML book: the executed notebooks in the order of book.toml, a contents page, navigation.

    python -m rosellm_edu.book.html [--out _build/book]

The notebooks are rendered as committed (with their outputs), not re-run. Links in a chapter that point to
another chapter's .ipynb are rewritten to its page; links to other files of the repository are rewritten
to stay valid from the output folder. A live widget needs a running kernel, so where an output carries both a
widget view and a picture (chapter 01's explorer leaves one beside its widget), the page shows the picture.
"""

from __future__ import annotations

import argparse
import html
import os
import re
import sys
import tomllib
from pathlib import Path

import jinja2
import nbformat
from nbconvert import HTMLExporter

from rosellm_edu.book.export import ROOT, Chapter, load_book

INDEX = "index.html"
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"

# The lab template with a navigation bar above and below each chapter.
CHAPTER_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{% block extra_css %}
<style>
  nav.book-nav { display: flex; justify-content: space-between; gap: 1em; padding: 0.6em 1em;
                 font-family: sans-serif; font-size: 0.95em; border-bottom: 1px solid #ddd; }
  nav.book-nav.bottom { border-top: 1px solid #ddd; border-bottom: none; margin-top: 2em; }
  nav.book-nav a { text-decoration: none; }
</style>
{% endblock extra_css %}
{% block body_header %}{{ super() }}{{ resources.book_nav | safe }}{% endblock body_header %}
{% block body_footer %}{{ resources.book_nav_bottom | safe }}{{ super() }}{% endblock body_footer %}
"""

INDEX_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8" />
<meta name="viewport" content="width=device-width, initial-scale=1.0">
<title>{title}</title>
<style>
  body {{ font-family: sans-serif; max-width: 48em; margin: 3em auto; padding: 0 1em; line-height: 1.5; }}
  ol {{ padding-left: 1.5em; }}
  li {{ margin: 0.4em 0; }}
  .file {{ color: #888; font-size: 0.85em; }}
</style>
</head>
<body>
<h1>{title}</h1>
<p>{description}</p>
<h2>Contents</h2>
<ol start="0">
{items}
</ol>
</body>
</html>
"""

HREF = re.compile(r'href="([^"]*)"')
EXTERNAL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*:|#|/)")  # a scheme, a fragment, or an absolute path


def page_name(notebook: str) -> str:
    return Path(notebook).with_suffix(".html").name


def nav_bar(chapters: list[Chapter], i: int, where: str) -> str:
    def link(j: int, arrow: str) -> str:
        if not 0 <= j < len(chapters):
            return "<span></span>"
        title = html.escape(chapters[j].title)
        return f'<a href="{page_name(chapters[j].notebook)}">{arrow.format(title)}</a>'

    return (f'<nav class="book-nav {where}">{link(i - 1, "&larr; {}")}'
            f'<a href="{INDEX}">Contents</a>{link(i + 1, "{} &rarr;")}</nav>')


def rewrite_links(page: str, notebook: Path, chapters: list[Chapter], out: Path) -> str:
    """Point links to chapter notebooks at their pages and links to repository files at those files."""
    in_book = {c.notebook for c in chapters}
    pages = {INDEX} | {page_name(c.notebook) for c in chapters}

    def rewrite(match: re.Match) -> str:
        href = html.unescape(match.group(1))
        path, hash_, fragment = href.partition("#")
        if EXTERNAL.match(href) or path in pages:  # the navigation bar's links are already pages
            return match.group(0)
        if path.endswith(".ipynb"):
            name = Path(path).name
            if name not in in_book:
                raise ValueError(f"{notebook.name} links to {path}, which book.toml does not list")
            new = page_name(name)
        else:
            target = (notebook.parent / path).resolve()
            if not target.exists():
                raise ValueError(f"{notebook.name} links to {path}, which does not exist")
            new = Path(os.path.relpath(target, out.resolve())).as_posix()
        return f'href="{html.escape(new + hash_ + fragment)}"'

    return HREF.sub(rewrite, page)


def chapter_exporter() -> HTMLExporter:
    loader = jinja2.DictLoader({"book_chapter.html.j2": CHAPTER_TEMPLATE})
    return HTMLExporter(extra_loaders=[loader], template_file="book_chapter.html.j2", embed_images=True)


def pictures_for_widgets(notebook: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Drop the widget view from every output that also carries a PNG of it, so that the static page shows the
    picture; with no widget view left, drop the saved widget state too (it would load the widget manager)."""
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
    for output in outputs:
        if WIDGET_VIEW in output.get("data", {}) and "image/png" in output.data:
            del output.data[WIDGET_VIEW]
    if not any(WIDGET_VIEW in o.get("data", {}) for o in outputs):
        notebook.metadata.pop("widgets", None)
    return notebook


def index_page(title: str, description: str, chapters: list[Chapter]) -> str:
    items = "\n".join(f'<li><a href="{page_name(c.notebook)}">{html.escape(c.title)}</a> '
                      f'<span class="file">{html.escape(c.notebook)}</span></li>' for c in chapters)
    return INDEX_PAGE.format(title=html.escape(title), description=html.escape(description), items=items)


def build(out: Path, root: Path = ROOT) -> list[Path]:
    """Write index.html and one page per chapter into out; return the pages written, contents first."""
    title, chapters = load_book(root)
    description = tomllib.loads((root / "book.toml").read_text()).get("description", "")
    out.mkdir(parents=True, exist_ok=True)
    exporter = chapter_exporter()
    pages = [out / INDEX]
    pages[0].write_text(index_page(title, description, chapters))
    for i, chapter in enumerate(chapters):
        notebook = root / "notebooks" / chapter.notebook
        resources = {"metadata": {"name": chapter.title, "path": str(notebook.parent)},
                     "book_nav": nav_bar(chapters, i, "top"), "book_nav_bottom": nav_bar(chapters, i, "bottom")}
        node = pictures_for_widgets(nbformat.read(notebook, as_version=4))
        body, _ = exporter.from_notebook_node(node, resources=resources)
        pages.append(out / page_name(chapter.notebook))
        pages[-1].write_text(rewrite_links(body, notebook, chapters, out))
    return pages


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "_build" / "book", help="output folder")
    args = parser.parse_args(argv)
    pages = build(args.out)
    print(f"wrote {len(pages)} pages; open {pages[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
