"""The book's website (`make book`): every chapter of book.toml in order, the outputs as committed, no broken link,
nothing fetched from the web; and, in headless Chromium, the sidebar, the current chapter, the outline,
previous/next, the offline search, the figures and chapter 01's widget picture, both themes, nothing wider than 1280 px.
"""

import hashlib
import re
import subprocess
import sys
from base64 import b64decode
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import nbformat
import pytest

pytest.importorskip("sphinx", reason="the website needs the book extra: pip install -e .[book]")

from rosellm_edu.book import readme, site  # noqa: E402
from rosellm_edu.book.export import ROOT, load_book  # noqa: E402


class PageParser(HTMLParser):
    """The links, image sources, element ids, remote scripts and visible text of one page."""

    def __init__(self, text: str):
        super().__init__()
        self.links: list[str] = []
        self.images: list[str] = []
        self.ids: set[str] = set()
        self.remote: list[str] = []
        self.text: list[str] = []
        self._skip = 0
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "a" and attrs.get("href"):
            self.links.append(attrs["href"])
        if tag == "img":
            self.images.append(attrs["src"])
        if tag in ("script", "link", "img") and re.match(r"(https?:)?//", attrs.get("src") or "") or \
                tag == "link" and attrs.get("rel") == "stylesheet" and re.match(r"(https?:)?//", attrs["href"]):
            self.remote.append(attrs.get("src") or attrs["href"])
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


def text_of(page: Path) -> str:
    """The page's visible text, its white space collapsed."""
    return " ".join("".join(parse(page).text).split())


def page_of(out: Path, notebook: str) -> Path:
    return out / "notebooks" / Path(notebook).with_suffix(".html").name


def png_outputs(cell) -> list[bytes]:
    return [b64decode(o.data["image/png"]) for o in cell.outputs if "image/png" in o.get("data", {})]


def image_files(page: Path) -> dict[str, bytes]:
    """Each local <img> source of the page and the bytes it shows."""
    return {src: (page.parent / unquote(src)).read_bytes() for src in parse(page).images if not urlsplit(src).scheme}


def explorer_cell():
    notebook = nbformat.read(ROOT / "notebooks" / "01_token_generation.ipynb", as_version=4)
    return next(c for c in notebook.cells if c.cell_type == "code" and "NextTokenExplorer(" in c.source)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    site.build(out)
    return out


def test_make_book_builds_the_site_with_this_module():
    recipe = subprocess.run(["make", "-n", "book"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert "-m rosellm_edu.book.site --out _build/book" in recipe


def test_landing_page_lists_every_chapter_in_book_order_with_its_title_and_summary(built):
    title, chapters = load_book()
    index = parse(built / "index.html")
    pages = [page_of(built, c.notebook).relative_to(built).as_posix() for c in chapters]
    listed = [link for link in index.links if link in pages]
    assert list(dict.fromkeys(listed)) == pages
    text = text_of(built / "index.html")
    assert title in text
    for chapter in chapters:
        assert chapter.summary, f"book.toml: {chapter.notebook} has no summary"
        summary = re.sub(r"`([^`]*)`", r"\1", chapter.summary)  # the page shows code spans without backticks
        assert chapter.title in text and summary in text, chapter.notebook
    assert "make lab" in text


def test_landing_page_shows_readmes_figures_from_the_benchmark_data(built):
    text = text_of(built / "index.html")
    machines = readme.machines()
    assert machines and all(m.key in text for m in machines)  # the machines table, rendered from machine.json
    rendered = readme.render_mixed(machines)
    cells = [c.strip() for line in rendered.splitlines() if line.startswith("| ") and "---" not in line
             for c in line.strip("|").split("|") if re.search(r"\d", c)]
    assert cells and [c for c in cells if c.replace("`", "") not in text] == []


def test_a_cpp_cell_shows_as_cpp_under_its_files_name(built):
    page = page_of(built, "09_attention_kernels.ipynb")
    assert page.read_text().count('<div class="highlight-cpp') > 10 and "%%cpp vectors.h" in text_of(page)


def test_every_relative_link_resolves_to_a_page_or_file_and_anchor(built):
    for page in [built / "index.html", *(page_of(built, c.notebook) for c in load_book()[1])]:
        for link in parse(page).links:
            url = urlsplit(link)
            if url.scheme:
                continue
            target = (page.parent / unquote(url.path)).resolve() if url.path else page
            assert target.is_file(), f"{page.name}: {link} does not resolve"
            assert target.suffix != ".ipynb", f"{page.name}: {link} still points to a notebook"
            if url.fragment and target.suffix == ".html":
                ids = parse(target).ids
                assert url.fragment in ids or unquote(url.fragment) in ids, f"{page.name}: no anchor for {link}"


def test_no_page_loads_anything_from_the_web(built):
    for page in built.rglob("*.html"):
        assert parse(page).remote == [], f"{page.relative_to(built)} loads {parse(page).remote}"


def test_chapter_pages_show_their_notebooks_printed_lines_and_plots(built):
    for chapter in load_book()[1]:
        notebook = nbformat.read(ROOT / "notebooks" / chapter.notebook, as_version=4)
        outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.outputs]
        assert outputs, f"{chapter.notebook} has no outputs: is it executed?"
        printed = [" ".join(line.split()) for o in outputs if o.output_type == "stream" and o.name == "stdout"
                   for line in o.text.splitlines() if line.strip()]
        page = page_of(built, chapter.notebook)
        text = text_of(page)
        assert [line for line in printed if line not in text] == [], f"{chapter.notebook}: printed lines missing"
        shown = {hashlib.sha256(b).digest() for b in image_files(page).values()}
        plots = [b for cell in notebook.cells if cell.cell_type == "code" for b in png_outputs(cell)]
        assert [p for p in plots if hashlib.sha256(p).digest() not in shown] == [], f"{chapter.notebook}: plots missing"


def test_chapter_01_shows_the_explorers_picture_and_no_widget(built):
    pictures = png_outputs(explorer_cell())
    assert pictures, "the explorer's output carries no picture"
    page = page_of(built, "01_token_generation.ipynb")
    assert all(p in image_files(page).values() for p in pictures)
    assert site.WIDGET_VIEW not in page.read_text() and "html-manager" not in page.read_text()


def test_a_widget_keeps_its_picture_and_a_widget_without_one_is_left_out():
    view = {site.WIDGET_VIEW: {"model_id": "m"}, "text/plain": "VBox()"}
    pictured = dict(view, **{"image/png": "iVBORw0KGgo="})
    text = nbformat.v4.new_output("stream", name="stdout", text="kept\n")
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(outputs=[
        nbformat.v4.new_output("display_data", data=pictured), nbformat.v4.new_output("display_data", data=view),
        text, nbformat.v4.new_output("execute_result", data={"text/plain": "1"}, execution_count=1)])],
        metadata={"widgets": {"state": {}}})
    outputs = site.without_live_widgets(notebook).cells[0].outputs
    assert [o.get("data", {}).keys() - {"text/plain"} for o in outputs] == [{"image/png"}, set(), set()]
    assert outputs[1].text == "kept\n" and outputs[2].data == {"text/plain": "1"}
    assert "widgets" not in notebook.metadata


def test_a_cpp_cell_becomes_a_cpp_block_and_other_cells_stay():
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("%%cpp k.h\nint a();"),
                                               nbformat.v4.new_code_cell("%%time\nx = 1")])
    cells = site.cpp_as_cpp(notebook).cells
    assert (cells[0].cell_type, cells[0].source) == ("markdown", "`%%cpp k.h`\n```cpp\nint a();\n```")
    assert (cells[1].cell_type, cells[1].source) == ("code", "%%time\nx = 1")


# A two-chapter book in a temporary directory: links between chapters, to files, and broken ones.

def make_book(root: Path, first_markdown: str) -> Path:
    (root / "notebooks" / "data").mkdir(parents=True)
    (root / "pkg").mkdir()
    (root / "pkg" / "x.py").write_text("x = 1\n")
    (root / "README.md").write_text("# Tiny\n\n" + "".join(f"## {s}\n\nNone yet.\n\n" for s in site.FIGURE_SECTIONS))
    first = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(first_markdown)])
    second = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# B\n## Section two")])
    nbformat.write(first, root / "notebooks" / "01_a.ipynb")
    nbformat.write(second, root / "notebooks" / "02_b.ipynb")
    (root / "book.toml").write_text('title = "Tiny"\ndescription = "A tiny book."\n\n'
                                    '[[chapters]]\nnotebook = "01_a.ipynb"\ntitle = "A"\nmodules = []\n'
                                    'summary = "The first."\n\n'
                                    '[[chapters]]\nnotebook = "02_b.ipynb"\ntitle = "B"\nmodules = []\n')
    return root


def test_links_to_chapters_become_pages_and_links_to_files_become_downloads(tmp_path):
    root = make_book(tmp_path / "src", "# A\nSee [the next chapter](02_b.ipynb#section-two), "
                                       "[its code](../pkg/x.py) and [the web](https://example.org).")
    out = tmp_path / "out"
    site.build(out, root)
    page = parse(out / "notebooks" / "01_a.html")
    assert "02_b.html#section-two" in page.links
    assert "https://example.org" in page.links
    code = next(link for link in page.links if link.endswith("x.py"))
    assert (out / "notebooks" / code).read_text() == "x = 1\n"
    assert "The first." in text_of(out / "index.html")


def test_a_rebuild_leaves_no_page_behind_and_a_folder_of_other_files_is_refused(tmp_path):
    root = make_book(tmp_path / "src", "# A")
    out = tmp_path / "out"
    site.build(out, root)
    (root / "notebooks" / "02_b.ipynb").rename(root / "notebooks" / "02_c.ipynb")
    (root / "book.toml").write_text((root / "book.toml").read_text().replace("02_b", "02_c"))
    site.build(out, root)
    assert (out / "notebooks" / "02_c.html").is_file() and not (out / "notebooks" / "02_b.html").exists()
    (other := tmp_path / "other").mkdir()
    (other / "notes.txt").write_text("mine")
    with pytest.raises(RuntimeError, match="holds no earlier build"):
        site.build(other, root)
    assert (other / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("link", ["03_missing.ipynb", "../pkg/missing.py"])
def test_a_link_to_a_missing_chapter_or_file_fails_the_build_naming_it(tmp_path, link):
    root = make_book(tmp_path / "src", f"# A\n[broken]({link})")
    with pytest.raises(RuntimeError, match=re.escape(link.split("/")[-1].removesuffix(".ipynb"))):
        site.build(tmp_path / "out", root)


# In headless Chromium, as the project's other browser test launches it.

@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed")
    sys.path.insert(0, str(Path(__file__).parent))
    from test_widgets_browser import CHROMIUM, CHROMIUM_ARGS
    if not Path(CHROMIUM).is_file():
        pytest.skip(f"Chromium not found at {CHROMIUM} (apt-get install chromium)")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(60_000)
    yield page
    page.close()


def sidebar_entries(page) -> list[str]:
    return [" ".join(t.split()) for t in page.locator("nav.bd-docs-nav li.toctree-l1 > a").all_inner_texts()]


def test_landing_page_sidebar_lists_the_whole_book_in_order(built, page):
    page.goto((built / "index.html").as_uri())
    _, chapters = load_book()
    assert sidebar_entries(page) == [site.label(c) for c in chapters]


def test_a_chapter_page_marks_itself_links_its_neighbours_and_outlines_its_sections(built, page):
    _, chapters = load_book()
    i = [c.notebook for c in chapters].index("01_token_generation.ipynb")
    page.goto(page_of(built, chapters[i].notebook).as_uri())
    assert sidebar_entries(page) == [site.label(c) for c in chapters]
    current = page.locator("nav.bd-docs-nav li.current > a")
    assert " ".join(current.inner_text().split()) == site.label(chapters[i])
    neighbours = [page_of(built, chapters[j].notebook).name for j in (i - 1, i + 1)]
    links = page.locator("footer .prev-next-area a").evaluate_all("as => as.map(a => a.getAttribute('href'))")
    assert links == neighbours
    outline = page.locator("nav.page-toc a").evaluate_all("as => as.map(a => a.getAttribute('href'))")
    assert len(outline) > 3 and all(page.locator(f"section[id='{h[1:]}']").count() == 1 for h in outline)
    anchors = page.locator("section > h2 > a.headerlink").evaluate_all(  # each heading links to itself
        "as => as.map(a => [a.getAttribute('href'), a.closest('section').id])")
    assert len(anchors) > 3 and all(href == f"#{section}" for href, section in anchors)


def test_figures_and_the_widgets_picture_are_shown(built, page):
    chapter = page_of(built, "01_token_generation.ipynb")
    page.goto(chapter.as_uri())
    page.wait_for_load_state("load")
    widths = dict(page.locator("article img").evaluate_all(
        "imgs => imgs.map(i => [i.getAttribute('src'), i.naturalWidth])"))
    files = image_files(chapter)
    plots = [src for src in widths if src.endswith(".png")]
    assert plots and all(widths[src] > 0 for src in plots)
    pictures = png_outputs(explorer_cell())
    widget = [src for src in widths if files.get(src) in pictures]
    assert widget and all(widths[src] > 0 for src in widget)
    assert any(src.endswith(".svg") and widths[src] > 0 for src in widths), "the diagram in markdown is not shown"


def test_pages_fit_1280_px_and_wide_code_scrolls_inside_its_block(built, page):
    for notebook in ["07a_server_hardening.ipynb", "11_weight_only_quantization.ipynb"]:
        page.goto(page_of(built, notebook).as_uri())
        assert page.evaluate("document.documentElement.scrollWidth") <= 1280, notebook
        wide = page.locator("article pre").evaluate_all(
            "ps => ps.filter(p => p.scrollWidth > p.clientWidth).map(p => getComputedStyle(p).overflowX)")
        assert wide and set(wide) <= {"auto", "scroll"}, notebook
    page.goto((built / "index.html").as_uri())
    assert page.evaluate("document.documentElement.scrollWidth") <= 1280
    tables = page.locator("article table").evaluate_all(  # README's figures: wider than the column, they scroll
        "ts => ts.map(t => [t.scrollWidth > t.parentElement.clientWidth, getComputedStyle(t).overflowX])")
    assert tables and all(overflow in ("auto", "scroll") for wide, overflow in tables if wide)


def test_the_theme_switch_gives_a_dark_page(built, page):
    page.goto((built / "index.html").as_uri())
    background = "getComputedStyle(document.body).backgroundColor"
    light = page.evaluate(background)
    page.locator("button.theme-switch-button:visible").first.click()
    page.locator("button.theme-change-button[data-mode='dark']:visible").first.click()
    assert page.evaluate("document.documentElement.dataset.theme") == "dark"
    assert page.evaluate(background) != light


def test_search_finds_the_one_chapter_that_holds_a_word(built, page):
    word = "Leviathan"  # chapter 12 cites Leviathan et al.; no other notebook names them
    holders = [c.notebook for c in load_book()[1] if word.lower() in (ROOT / "notebooks" / c.notebook).read_text().lower()]
    assert holders == ["12_speculative_decoding.ipynb"], holders
    page.goto((built / "search.html").as_uri() + f"?q={word}")
    results = page.locator("#search-results ul.search li a")
    results.first.wait_for()
    found = {Path(urlsplit(href).path).name for href in results.evaluate_all("as => as.map(a => a.href)")}
    assert found == {page_of(built, holders[0]).name}
