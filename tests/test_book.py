"""The static HTML book: every chapter of book.toml in order, a contents page, and no broken link."""

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import matplotlib.pyplot as plt
import nbformat
import numpy as np
import pytest

from rosellm_edu.book import html as book
from rosellm_edu.book.export import load_book


class PageParser(HTMLParser):
    """The links, element ids and visible text of one page."""

    def __init__(self, text: str):
        super().__init__()
        self.links: list[str] = []
        self.ids: set[str] = set()
        self.text: list[str] = []
        self._skip = 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.links += [attrs[a] for a in ("href", "src") if attrs.get(a)]
        if "id" in attrs:
            self.ids.add(attrs["id"])
        self._skip += tag in ("script", "style")

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style")

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)


def parse(page: Path) -> PageParser:
    return PageParser(page.read_text())


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    return out, book.build(out)


def test_one_page_per_chapter_in_book_toml_order(built):
    out, pages = built
    _, chapters = load_book()
    assert pages == [out / "index.html"] + [out / Path(c.notebook).with_suffix(".html").name for c in chapters]
    assert all(p.is_file() for p in pages)


def test_contents_page_links_every_chapter_in_order_with_its_title(built):
    out, pages = built
    title, chapters = load_book()
    index = parse(out / "index.html")
    assert [link for link in index.links if link.endswith(".html")] == [p.name for p in pages[1:]]
    text = " ".join(index.text)
    assert title in text and all(c.title in text for c in chapters)


def test_each_chapter_links_previous_contents_and_next(built):
    _, pages = built
    chapter_pages = pages[1:]
    for i, page in enumerate(chapter_pages):
        neighbours = {p.name for p in chapter_pages[max(i - 1, 0):i + 2]} - {page.name}
        assert {"index.html"} | neighbours <= set(parse(page).links)


def test_every_relative_link_resolves_and_none_points_to_a_notebook(built):
    _, pages = built
    for page in pages:
        for link in parse(page).links:
            url = urlsplit(link)
            if url.scheme:
                continue
            target = (page.parent / unquote(url.path)).resolve() if url.path else page
            assert target.is_file(), f"{page.name}: {link} does not resolve"
            assert target.suffix != ".ipynb", f"{page.name}: {link} still points to a notebook"
            if url.fragment and target.suffix == ".html":
                # as a browser does: the fragment as written, then percent-decoded
                ids = parse(target).ids
                assert url.fragment in ids or unquote(url.fragment) in ids, f"{page.name}: no anchor for {link}"


def test_chapter_pages_show_their_notebooks_outputs(built):
    out, _ = built
    _, chapters = load_book()
    for chapter in chapters:
        notebook = nbformat.read(book.ROOT / "notebooks" / chapter.notebook, as_version=4)
        outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
        assert outputs, f"{chapter.notebook} has no outputs: is it executed?"
        printed = [line.strip() for o in outputs if o.output_type == "stream" and o.name == "stdout"
                   for line in o.text.splitlines() if line.strip()]
        images = ["".join(o.data["image/png"].split()) for o in outputs if "image/png" in o.get("data", {})]
        page = out / book.page_name(chapter.notebook)
        text = " ".join(parse(page).text)
        assert [line for line in printed if line not in text] == [], f"{chapter.notebook}: printed lines missing"
        sources = set(parse(page).links)
        assert [i for i in images if f"data:image/png;base64,{i}" not in sources] == [], \
            f"{chapter.notebook}: plots missing"


# The link rewriting, on a two-chapter book built in a temporary directory.

def make_book(root: Path, first_markdown: str) -> Path:
    (root / "notebooks").mkdir(parents=True)
    (root / "pkg").mkdir()
    (root / "pkg" / "x.py").write_text("x = 1\n")
    plt.imsave(root / "notebooks" / "figure.png", np.eye(4))
    first = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(first_markdown)])
    second = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# B\n## Section two")])
    nbformat.write(first, root / "notebooks" / "01_a.ipynb")
    nbformat.write(second, root / "notebooks" / "02_b.ipynb")
    (root / "book.toml").write_text('title = "Tiny"\ndescription = "A tiny book."\n\n'
                                    '[[chapters]]\nnotebook = "01_a.ipynb"\ntitle = "A"\nmodules = []\n\n'
                                    '[[chapters]]\nnotebook = "02_b.ipynb"\ntitle = "B"\nmodules = []\n')
    return root


def test_links_to_chapters_become_pages_and_links_to_files_still_resolve(tmp_path):
    root = make_book(tmp_path / "src", "# A\nSee [the next chapter](02_b.ipynb#Section-two), "
                                       "[its code](../pkg/x.py) and [the web](https://example.org).\n\n"
                                       "![a figure](figure.png)")
    out = tmp_path / "out"
    book.build(out, root)
    page = parse(out / "01_a.html")
    assert "02_b.html#Section-two" in page.links
    assert "https://example.org" in page.links
    code = next(link for link in page.links if link.endswith("x.py"))
    assert (out / code).resolve() == (root / "pkg" / "x.py").resolve()
    assert any(link.startswith("data:image/png;base64,") for link in page.links)  # the figure is embedded
    assert "Tiny" in " ".join(parse(out / "index.html").text)


@pytest.mark.parametrize("link", ["03_missing.ipynb", "../pkg/missing.py"])
def test_a_link_to_a_missing_chapter_or_file_is_an_error_naming_it(tmp_path, link):
    root = make_book(tmp_path / "src", f"# A\n[broken]({link})")
    with pytest.raises(ValueError, match=link.split("/")[-1]):
        book.build(tmp_path / "out", root)


# Chapter 01's explorer: a live widget in JupyterLab, a picture in the static book.

def test_chapter_01_page_shows_the_explorers_picture_instead_of_the_live_widget(built):
    out, _ = built
    notebook = nbformat.read(book.ROOT / "notebooks" / "01_token_generation.ipynb", as_version=4)
    cell = next(c for c in notebook.cells if c.cell_type == "code" and "NextTokenExplorer(" in c.source)
    shown = [o.data for o in cell.outputs if book.WIDGET_VIEW in o.get("data", {})]
    assert shown and all("image/png" in data for data in shown), "the explorer's output carries no picture"
    page = out / "01_token_generation.html"
    links = set(parse(page).links)
    assert all(f"data:image/png;base64,{''.join(data['image/png'].split())}" in links for data in shown)
    assert book.WIDGET_VIEW not in page.read_text()  # no widget left for a manager that cannot load offline


def test_a_widget_view_without_a_picture_is_left_to_the_widget_manager():
    view = {book.WIDGET_VIEW: {"model_id": "m"}, "text/plain": "VBox()"}
    pictured = dict(view, **{"image/png": "iVBORw0KGgo="})
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[
        nbformat.v4.new_output("display_data", data=pictured), nbformat.v4.new_output("display_data", data=view)])],
        metadata={"widgets": {"state": {}}})
    outputs = book.pictures_for_widgets(notebook).cells[0].outputs
    assert book.WIDGET_VIEW not in outputs[0].data and book.WIDGET_VIEW in outputs[1].data
    assert "widgets" in notebook.metadata
