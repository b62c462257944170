"""The book's standard, checked on every chapter: cells a reader can hold, a recap, a box on production engines,
exercises (one of them a prediction checked against a measurement), a picture, the machine named beside any
timing, no measured figure copied into prose, and a length a newcomer can finish. Appendices hold side topics: they
are listed in book.toml right after their chapter, executed and exported like the chapters."""

import json
import re
from pathlib import Path

import pytest

from rosellm_edu.book.export import load_book

ROOT = Path(__file__).resolve().parents[1]
BOOK = load_book()[1]
CHAPTERS = [chapter.notebook for chapter in BOOK if not chapter.appendix]
APPENDICES = [chapter.notebook for chapter in BOOK if chapter.appendix]
MAX_CELL_LINES = 40
MAX_CHAPTER_WORDS = 3_500          # prose (markdown) per numbered chapter
MAX_BOOK_WORDS = 55_000            # prose of the whole book, appendices included
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


@pytest.mark.parametrize("notebook", CHAPTERS + APPENDICES)
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


@pytest.mark.parametrize("notebook", CHAPTERS + APPENDICES)
def test_a_chapter_that_times_anything_names_the_machine(notebook):
    code = "\n".join(cells(notebook, "code"))
    if TIMES.search(code):
        assert "machine_line()" in code, f"{notebook} times something but never prints machine_line()"


@pytest.mark.parametrize("notebook", CHAPTERS + APPENDICES)
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
            data = {"gpu": "gpu_engine"}.get(name, name.replace("-", "_"))     # the GPU run writes one file a part
            assert any(m.data(data) for m in ms), f"README's {name} block has no JSON"


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


@pytest.mark.parametrize("notebook", CHAPTERS + APPENDICES)
def test_no_authoring_words_in_the_prose(notebook):
    found = [m.group(0) for src in cells(notebook, "markdown") for m in AUTHORING.finditer(src)]
    assert not found, f"{notebook}: {found}"


def test_no_authoring_words_in_the_readme():
    found = [m.group(0) for m in AUTHORING.finditer(readme_prose())]
    assert not found, found


def test_chapter_00_maps_every_chapter_of_the_book():
    shown = "".join("".join(out.get("data", {}).get("text/markdown", "")) for out in outputs("00_the_model.ipynb"))
    missing = [c.title for c in BOOK if c.title not in shown]
    assert not missing, f"chapter 00's map (its printed output) lacks {missing}: re-run the notebook"


def prose_words(notebook: str) -> int:
    return sum(len(src.split()) for src in cells(notebook, "markdown"))


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_a_chapter_is_short_enough_to_finish(notebook):
    words = prose_words(notebook)
    assert words <= MAX_CHAPTER_WORDS, f"{notebook}: {words} words of prose; move side topics to an appendix or cut"


def test_the_whole_book_is_short_enough_to_finish():
    words = sum(prose_words(c.notebook) for c in BOOK)
    assert words < MAX_BOOK_WORDS, f"the book has {words} words of prose, appendices included"


def test_every_notebook_is_in_the_book_in_order_and_each_appendix_follows_its_chapter():
    on_disk = sorted(p.name for p in (ROOT / "notebooks").glob("*.ipynb"))
    assert [c.notebook for c in BOOK] == on_disk, "book.toml must list every notebook, in file-name order"
    for chapter in BOOK:
        number = chapter.notebook.split("_")[0]
        assert bool(re.fullmatch(r"\d\d[a-z]", number)) == chapter.appendix, \
            f"{chapter.notebook}: appendices are named NNa_..., after chapter NN, with appendix = true"
        if chapter.appendix:
            assert number[:2] in [c.notebook[:2] for c in BOOK if not c.appendix], f"{chapter.notebook}: no chapter"


@pytest.mark.parametrize("notebook", APPENDICES)
def test_an_appendix_names_its_chapter_is_executed_and_ends_with_a_recap(notebook):
    prose = "\n".join(cells(notebook, "markdown"))
    assert re.search(rf"\b[Cc]hapter {notebook[:2]}\b", prose), f"{notebook} never names chapter {notebook[:2]}"
    assert re.search(r"^## Recap", prose, re.M), notebook
    nb = json.loads((ROOT / "notebooks" / notebook).read_text())
    unrun = [i for i, c in enumerate(nb["cells"]) if c["cell_type"] == "code" and c["execution_count"] is None]
    assert not unrun, f"{notebook}: code cells {unrun} were never executed; run the appendix top to bottom"


@pytest.mark.parametrize("notebook", CHAPTERS)
def test_each_chapter_has_an_exercise_that_checks_a_prediction_against_a_measurement(notebook):
    import importlib
    exercises = importlib.import_module(f"rosellm_edu.exercises.ch{notebook[:2]}")
    predicting = [name for name in dir(exercises)
                  if name.startswith("check_") and getattr(getattr(exercises, name), "predicts", False)]
    assert predicting, f"{notebook}: no exercise asks for a prediction and measures it (checker(..., predicts=True))"
