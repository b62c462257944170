"""The book's standard, checked on every chapter: cells a reader can hold, a recap, a box on production engines,
exercises, a picture, the machine named beside any timing, and no measured figure copied into prose."""

import json
import re
from pathlib import Path

import pytest

from rosellm_edu.book.export import load_book

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = [chapter.notebook for chapter in load_book()[1]]
MAX_CELL_LINES = 40
# A number with a unit that only a measurement produces: a time, a rate, a speed-up.
MEASURED = re.compile(r"\b\d[\d,]*(?:\.\d+)? ?(?:ms|µs|us|ns|s|tok/s|tokens/s|GB/s|GFLOP/s|TFLOP/s)\b"
                      r"|\b\d+(?:\.\d+)? ?[x×] (?:faster|slower)\b")
TIMES = re.compile(r"perf_counter|timeit|benchmark\.Timer|benchmarks\.(?:mixed|decode|sampler)|\btimed\(")


def cells(notebook: str, kind: str) -> list[str]:
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    return ["".join(cell["source"]) for cell in nb["cells"] if cell["cell_type"] == kind]


def outputs(notebook: str) -> list[dict]:
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    return [out for cell in nb["cells"] if cell["cell_type"] == "code" for out in cell.get("outputs", [])]


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_no_code_cell_is_longer_than_a_reader_can_hold(notebook):
    long = [(i, n) for i, src in enumerate(cells(notebook, "code")) if (n := len(src.splitlines())) > MAX_CELL_LINES]
    assert not long, f"{notebook}: code cells (index among code cells, lines) over {MAX_CELL_LINES}: {long}"


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_each_chapter_closes_with_a_recap_a_production_box_and_exercises(notebook):
    prose = "\n".join(cells(notebook, "markdown"))
    assert re.search(r"^## Recap", prose, re.M), notebook
    assert "How vLLM and SGLang do it" in prose, notebook
    assert re.search(r"^## Exercises", prose, re.M), notebook


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_each_chapter_has_a_picture(notebook):
    plotted = any("image/png" in out.get("data", {}) or "image/svg+xml" in out.get("data", {})
                  for out in outputs(notebook))
    drawn = any(re.search(r"!\[[^\]]*\]\(figures/[^)]+\.svg\)", src) for src in cells(notebook, "markdown"))
    assert plotted or drawn, notebook


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_a_chapter_that_times_anything_names_the_machine(notebook):
    code = "\n".join(cells(notebook, "code"))
    if TIMES.search(code):
        assert "machine_line()" in code, f"{notebook} times something but never prints machine_line()"


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_prose_quotes_no_measured_number(notebook):
    quoted = [m.group(0) for src in cells(notebook, "markdown") for m in MEASURED.finditer(src)]
    assert not quoted, f"{notebook}: prose copies measured figures {quoted}; point at the printed output instead"


README = ROOT / "README.md"
FIGURES_BLOCK = re.compile(r"<!-- figures:([\w-]+) -->\n.*?<!-- /figures:\1 -->", re.S)
# README's figures: MEASURED, plus sizes, shares and ratios.
README_FIGURE = re.compile(MEASURED.pattern + r"|\b\d[\d,]*(?:\.\d+)? ?(?:MB|GB|%)(?!\w)|\b\d+\.\d+x\b")
# How the book was made is not the book's business; neither is what someone once hoped a figure would be.
AUTHORING = re.compile(r"\btargets\b(?!')|\baimed (?:for|at)\b|\blent\b", re.I)


def readme_prose() -> str:
    """README without its generated figures blocks and without its code."""
    return re.sub(r"```.*?```", "", FIGURES_BLOCK.sub("", README.read_text()), flags=re.S)


def test_readme_figures_are_generated_from_the_data():
    from rosellm_edu.book import readme
    assert readme.main(["--check"]) == 0, "run python -m rosellm_edu.book.readme"


def test_readme_quotes_no_figure_outside_its_generated_blocks():
    quoted = [m.group(0) for m in README_FIGURE.finditer(readme_prose())]
    assert not quoted, f"README states figures that no JSON backs: {quoted}; put them in a figures block"


def test_every_figures_block_has_data_behind_it():
    from rosellm_edu.book import readme
    ms = readme.machines()
    assert ms, "notebooks/data holds no machine"
    for name in FIGURES_BLOCK.findall(README.read_text()):
        if name != "machines":
            assert any(m.data(name.replace("-", "_")) for m in ms), f"README's {name} block has no JSON"


def test_each_machine_gets_its_own_columns(tmp_path):
    import shutil
    from rosellm_edu.book import readme
    source = readme.machines()[0]
    for key, device in [("a-cpu-amx", "CPU A"), ("b-cpu-avx2", "CPU B")]:
        shutil.copytree(source.folder, tmp_path / key)
        record = json.loads((tmp_path / key / "machine.json").read_text()) | {"key": key, "device": device}
        (tmp_path / key / "machine.json").write_text(json.dumps(record))
    text = readme.render(README.read_text(), readme.machines(tmp_path))
    mixed = FIGURES_BLOCK.search(text[text.index("<!-- figures:mixed"):]).group(0)
    header = mixed.splitlines()[1]
    assert "CPU A" in header and "CPU B" in header, header


def test_the_data_of_each_machine_names_it():
    from rosellm_edu.book import readme
    for m in readme.machines():
        assert m.key == m.folder.name and m.record["device"], m.folder


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_no_authoring_words_in_the_prose(notebook):
    found = [m.group(0) for src in cells(notebook, "markdown") for m in AUTHORING.finditer(src)]
    assert not found, f"{notebook}: {found}"


def test_no_authoring_words_in_the_readme():
    found = [m.group(0) for m in AUTHORING.finditer(readme_prose())]
    assert not found, found


def test_chapter_00_maps_every_chapter_of_the_book():
    shown = "".join("".join(out.get("data", {}).get("text/markdown", "")) for out in outputs("00_the_model.ipynb"))
    missing = [c.title for c in load_book()[1] if c.title not in shown]
    assert not missing, f"chapter 00's map (its printed output) lacks {missing}: re-run the notebook"
